"""Tensor files written off the training thread (task ``tensor``, ``tensor_list``).

A flush (:mod:`msprobe.engine.flush`) reads each tensor once on the thread that flushes: statistics,
CRC-32, and a host array for every ``.npy`` file of the batch. Creating and writing those files (a
file creation costs 0.01-0.4 ms on this kind of disk, more than reading the data) is left to one
daemon thread, ``msprobe-files``, through :class:`FileQueue`:

* A *job* is one flushed batch: its files, then what to do once they are on disk (append the batch's
  journal lines). A job's files are written in chunks (:data:`CHUNK_FILES`, :data:`CHUNK_BYTES`),
  each with the GIL released; every file of a job is written before the next job's first one, and
  the continuations run in submission order, so a journal line never names a file that is not
  written yet, and batches reach the journal in flush order.
* The queue is bounded (:data:`QUEUE_BYTES` of host arrays): :meth:`FileQueue.submit` blocks while it
  is full (back-pressure on the flushing thread), so memory stays bounded however fast a program
  records. An array is released as soon as its file is written.
* :meth:`FileQueue.drain` returns when every submitted job is done. It waits for the writer thread
  and writes no file itself while that thread runs (on two cores a second writer in the training
  thread cost the training thread 40-190 ms of CPU per TinyLM step and shortened no wait when other
  processes used the cores: creating a file is kernel CPU either way); when the thread is gone
  (process exit, a closed queue) the caller writes the chunks itself. The runtime drains at
  ``stop()``/``step()``, before renaming a step directory and at exit (``atexit``); the flush
  thread's deadline plus one job bounds how long a record waits for the disk.
* The first failed write (``OSError``: disk full, file too large) removes that file's partial
  temporary file, drops the jobs not yet finished (their journal lines are not written: what the
  journal names exists) and is reported once through ``on_failure``.

No copy on the training thread: an array may read a tensor's memory in place
(:func:`msprobe.tensors.stats.views_live_tensor`: the view keeps the tensor alive, so that memory is
neither freed nor reused before the file is written). The program may still change such a tensor in
place before its file is written; whatever may do that (an in-place operation, a compiled region
that assigns tensors) first calls :meth:`FileQueue.protect` (the runtime's flush before a mutation),
which copies the arrays of the files not written yet that read memory the mutation may write (all of
them unless the caller names what it may write) and waits for the chunks being written that may read
that memory. Every other array is the tool's own memory.
"""
from __future__ import annotations

import bisect
import collections
import os
import sys
import threading

import numpy as np

from msprobe.format.npy import save_npy_batch
from msprobe.tensors.stats import views_live_tensor

#: bytes of host arrays queued at most (a single larger batch is still accepted when the queue is empty)
QUEUE_BYTES = 128 << 20
#: files written by one call into the writer (the GIL released): at most this many ... (small: a
#: mutation may wait for the chunk being written, :meth:`FileQueue.protect`)
CHUNK_FILES = 8
#: ... and this many bytes once the chunk holds a file
CHUNK_BYTES = 2 << 20
_ALIGN = 64  # bytes: alignment of each copy inside a block made by FileQueue.protect


class _Job:
    """One submitted batch: ``files`` (``[(path, array)]``, ``None`` once taken by a writer), which
    of them read a tensor's memory in place, the continuation, and how far its writing is."""

    __slots__ = ("files", "views", "then", "next", "active", "ticket", "dropped")

    def __init__(self, files: list, then):
        self.files = list(files)
        self.views = [views_live_tensor(arr) for _, arr in self.files]
        self.then = then
        self.next = 0          # index of the first file no writer has taken
        self.active = 0        # chunks of this job being written
        self.ticket = -1       # submission number: continuations run in this order
        self.dropped = False   # after a failed write: nothing more of it is done


class FileQueue:
    """Ordered, bounded queue of ``.npy`` writes with one writer thread.

    Args:
        on_failure: ``weakref.WeakMethod`` (or a reference-like ``callable() -> callable | None``)
            of ``callable(OSError)`` told about the first failed write (then nothing more is
            written); called on the thread that ran the job. Held weakly so that the thread does
            not keep its owner alive.
        on_error: the same for ``callable(Exception)``, told about any other exception raised by a
            job's continuation (the job's files are written; the queue goes on).
        limit: bytes of queued arrays above which :meth:`submit` waits.
    """

    def __init__(self, on_failure, on_error, limit: int = QUEUE_BYTES):
        self._on_failure = on_failure
        self._on_error = on_error
        self._limit = limit
        self._jobs: collections.deque = collections.deque()  # jobs with files not all written
        self._queued = 0                   # bytes of files no writer has taken yet
        self._unfinished = 0               # jobs submitted and not finished
        self._views = 0                    # files no writer has taken that read a tensor's memory
        self._writing_views = 0            # chunks being written that read a tensor's memory
        #: chunks being written that read a tensor's memory: chunk number -> the arrays reading it
        self._in_flight: dict = {}
        self._chunks = 0                   # chunks taken so far (their numbers)
        self._active = 0                   # chunks being written
        self._reporting = 0                # failed writes whose ``on_failure`` has not returned yet
        self._tickets = 0                  # jobs submitted so far
        self._next_then = 0                # ticket of the next continuation to run
        self._cond = threading.Condition()
        self._run = threading.Lock()       # held while a writer takes work (holding it stops writing)
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._spare = None                 # block of memory for protect's copies, reused when free
        #: set by the first failed write; nothing is written after it
        self.failed = False

    @property
    def busy(self) -> bool:
        """Jobs are queued or running: a batch without files must queue behind them (order)."""
        return self._unfinished > 0

    @property
    def holds_views(self) -> bool:
        """Files not written yet read a tensor's memory in place: call :meth:`protect` before that
        tensor may change."""
        return bool(self._views or self._writing_views)

    def submit(self, files: list, then=None) -> None:
        """Queue ``files`` (``[(path, numpy.ndarray)]``, written in this order), then run ``then()``
        (no arguments) once all of them are on disk. Waits while :data:`QUEUE_BYTES` are queued.

        An array must stay unchanged until written: the tool's own memory, or a view of a tensor's
        memory that keeps the tensor alive (:func:`msprobe.tensors.stats.views_live_tensor`; call
        :meth:`protect` before anything may change that tensor). After a failed write the job is
        dropped (``then`` is not run)."""
        if self.failed:
            return
        job = _Job(files, then)
        size = sum(arr.nbytes for _, arr in job.files)
        with self._cond:
            while self._queued and self._queued + size > self._limit and not self.failed:
                if not self._thread_alive():  # no thread to make room: the caller writes
                    self._cond.release()
                    try:
                        worked = self._work()
                    finally:
                        self._cond.acquire()
                    if worked:
                        continue
                self._cond.wait(0.5)
            if self.failed:
                return
            job.ticket = self._tickets
            self._tickets += 1
            self._jobs.append(job)
            self._queued += size
            self._views += sum(job.views)
            self._unfinished += 1
            self._closed = False
            self._cond.notify_all()
        self._ensure_thread()

    def protect(self, written=None) -> None:
        """Make the files not written yet independent of tensors that may change: copy now (on the
        calling thread) every queued array that reads memory which may change, and wait until the
        chunks being written at the call that read such memory are written (not for the chunks
        taken later: what they read of that memory is a copy). Call before an in-place operation or
        a compiled region that may assign tensors runs. Cheap when nothing queued reads a tensor's
        memory.

        Args:
            written: ``None`` (anything may change: every array reading a tensor's memory is
                copied), or a callable without arguments returning the tensors that may change
                (an iterable of MindSpore tensors, or ``None`` for anything); only the arrays whose
                bytes lie in the storage of one of them (:func:`storage_ranges`: a view's whole
                storage, so every tensor sharing that memory) are copied. Called only when
                something queued reads a tensor's memory; an exception it raises counts as
                ``None``.
        """
        if not self.holds_views:
            return
        ranges = None
        if written is not None:
            try:
                tensors = written()
                ranges = storage_ranges(tensors) if tensors is not None else None
            except Exception:  # the tool's own reading failed: copy everything, as without ``written``
                ranges = None
        with self._cond:
            originals: dict = {}  # id -> array to copy (alive until the end: ids stay unique)
            for job in self._jobs:
                for i in range(job.next, len(job.files)):
                    if job.views[i]:
                        arr = job.files[i][1]
                        if ranges is None or overlaps(arr, ranges):
                            originals[id(arr)] = arr
            copies = self._copy(list(originals.values()))
            for job in self._jobs:
                for i in range(job.next, len(job.files)):
                    if job.views[i]:
                        path, arr = job.files[i]
                        copy = copies.get(id(arr))
                        if copy is not None:
                            job.files[i] = (path, copy)  # one copy per tensor
                            job.views[i] = False
                            self._views -= 1
            waited = [number for number, arrays in self._in_flight.items()
                      if ranges is None or any(overlaps(arr, ranges) for arr in arrays)]
            for number in waited:
                while number in self._in_flight:
                    self._cond.wait()

    def _copy(self, arrays: list) -> dict:
        """``{id(array): copy}`` for :meth:`protect`: the copies are carved out of one block of
        memory (the spare block of the previous call when no copy made in it is still queued:
        memory already mapped is filled ~3x faster than fresh allocations, which fault in every
        page)."""
        offsets, need = [], 0
        for arr in arrays:
            offsets.append(need)
            need += -(-arr.nbytes // _ALIGN) * _ALIGN
        # the spare block is free when only ``_spare`` and getrefcount's argument refer to it
        # (each copy made in it is a view of it)
        if self._spare is not None and self._spare.nbytes >= need and sys.getrefcount(self._spare) == 2:
            block = self._spare
        else:
            block = np.empty(max(need, 1), np.uint8)
            self._spare = block if need <= self._limit else None
        out = {}
        for arr, start in zip(arrays, offsets):
            copy = block[start:start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
            np.copyto(copy, arr, casting="no")
            out[id(arr)] = copy
        return out

    def drain(self) -> None:
        """Return when every job submitted before the call is done (written or dropped). While the
        writer thread runs the calling thread only waits for it; without that thread (process
        exit, a closed queue), or called on it, it writes the chunks itself."""
        if os.getpid() != self._pid:
            return  # a forked child never writes (the parent's thread and lock state are not its own)
        while True:
            # alone: no writer thread, or this is it (a finalizer run by a collection on that thread)
            alone = not self._thread_alive() or threading.current_thread() is self._thread
            if alone and self._work():
                continue
            with self._cond:
                if not self._unfinished and not self._active and not self._reporting:
                    return  # a failure is reported before: the caller sees the dump switched off
                if not alone or not self._has_work():
                    self._cond.wait(0.5)

    def cancel(self) -> None:
        """Drop every job not yet started and accept no more (the dump was switched off)."""
        with self._cond:
            self.failed = True
            self._drop()

    def close(self) -> None:
        """Write what is queued, then end the writer thread (a later :meth:`submit` starts a new
        one)."""
        self.drain()
        with self._cond:
            self._closed = True
            self._spare = None
            self._cond.notify_all()

    # ------------------------------------------------------------------ internals
    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and os.getpid() == self._pid

    def _ensure_thread(self) -> None:
        if self._thread_alive() or os.getpid() != self._pid:
            return
        with self._cond:
            if self._thread_alive() or self._closed:
                return
            self._thread = threading.Thread(target=self._loop, name="msprobe-files", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            if self._work():
                continue
            with self._cond:
                if self._closed and not self._jobs:
                    return
                if not self._has_work():
                    self._cond.wait()

    def _has_work(self) -> bool:
        """Call with the condition held: the oldest job has a file no writer has taken (or none at
        all, then it is to be finished)."""
        if not self._jobs or self.failed:
            return False
        job = self._jobs[0]
        return job.next < len(job.files) or not job.active

    def _work(self) -> bool:
        """Write the next chunk of the oldest job, or finish a job whose files are all written.
        False when this thread has nothing to do now (nothing queued, or the rest of the oldest job
        is being written by another thread)."""
        with self._run:
            with self._cond:
                if not self._has_work():
                    return False
                job = self._jobs[0]
                if job.next == len(job.files):  # a job without files
                    self._jobs.popleft()
                    chunk = None
                else:
                    chunk, views, number = self._take(job)
        if chunk is not None:
            failure = None
            if not self.failed:
                try:
                    save_npy_batch(chunk)  # atomic per file: a failed write leaves no partial file
                except OSError as exc:  # disk full, file too large, directory gone: nothing more
                    failure = exc
            del chunk  # the arrays are released as soon as their files are written
            with self._cond:
                job.active -= 1
                self._active -= 1
                self._writing_views -= views
                self._in_flight.pop(number, None)
                done = (failure is None and not job.dropped and not job.active
                        and job.next == len(job.files))
                if done:
                    self._jobs.popleft()  # the oldest job (only it is written)
                if failure is not None:
                    self._reporting += 1
                self._cond.notify_all()
            if failure is not None:
                try:
                    self._fail(failure)
                finally:
                    with self._cond:
                        self._reporting -= 1
                        self._cond.notify_all()
            if not done:
                return True
        self._finish(job)
        return True

    def _take(self, job: _Job):
        """Call with the condition held: the next chunk of ``job``, whether it reads a tensor's
        memory (0 or 1) and its number (a key of ``_in_flight`` while it is written, if it reads a
        tensor's memory)."""
        start = end = job.next
        size = 0
        while end < len(job.files) and end - start < CHUNK_FILES and (end == start or size < CHUNK_BYTES):
            size += job.files[end][1].nbytes
            end += 1
        chunk = job.files[start:end]
        job.files[start:end] = [None] * (end - start)
        views = sum(job.views[start:end])
        number = self._chunks
        self._chunks += 1
        if views:
            self._in_flight[number] = [arr for (_, arr), view in zip(chunk, job.views[start:end]) if view]
        job.next = end
        job.active += 1
        self._active += 1
        self._queued -= size
        self._views -= views
        views = 1 if views else 0
        self._writing_views += views
        self._cond.notify_all()  # room for a waiting submit
        return chunk, views, number

    def _finish(self, job: _Job) -> None:
        """Run the continuation of ``job`` (all its files are written) after those of the jobs
        submitted before it."""
        with self._cond:
            while self._next_then != job.ticket:
                self._cond.wait()
        try:
            if job.then is not None and not self.failed:
                try:
                    job.then()
                except OSError as exc:
                    self._fail(exc)
                except Exception as exc:  # the tool's own failure in the continuation: reported, queue goes on
                    _call(self._on_error, exc)
        finally:
            with self._cond:
                self._next_then += 1
                self._unfinished -= 1
                self._cond.notify_all()

    def _fail(self, exc: OSError) -> None:
        with self._cond:
            first = not self.failed
            self.failed = True
            self._drop()
        if first:
            _call(self._on_failure, exc)

    def _drop(self) -> None:
        """Call with the condition held."""
        for job in self._jobs:
            job.dropped = True
        self._unfinished -= len(self._jobs)
        self._jobs.clear()
        self._queued = 0
        self._views = 0
        self._cond.notify_all()


def _call(ref, exc: BaseException) -> None:
    """Call the callable behind the weak reference ``ref`` with ``exc`` (nothing when it is gone)."""
    target = ref()
    if target is not None:
        target(exc)


def storage_ranges(tensors) -> list:
    """Sorted, disjoint ``[(start, end)]`` byte addresses (end exclusive) covering the storage of each
    tensor in ``tensors`` (an iterable of MindSpore tensors, ``Tensor.untyped_storage()``): the whole
    memory a view shares with its base and every other view of it. Empty storages are left out.
    Raises what ``untyped_storage`` raises (a tensor without host memory), ``AttributeError`` for an
    object that is not a tensor."""
    spans = []
    for t in tensors:
        storage = t.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
        if size:
            spans.append((start, start + size))
    spans.sort()
    merged: list = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def overlaps(arr: np.ndarray, ranges: list) -> bool:
    """True when a byte of ``arr`` (its extent, ``numpy.byte_bounds``: strided arrays too) lies in one
    of ``ranges`` (:func:`storage_ranges`'s sorted, disjoint ``[(start, end)]``)."""
    low, high = np.byte_bounds(arr)
    if high <= low:
        return False
    i = bisect.bisect_left(ranges, (high,)) - 1  # the last range starting before ``high``
    return i >= 0 and ranges[i][1] > low

