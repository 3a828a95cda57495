"""Tensor files written off the training thread (task ``tensor``, ``tensor_list``).

A flush (:mod:`msprobe.engine.flush`) reads each tensor once on the thread that flushes: statistics,
CRC-32, and a host array for every ``.npy`` file of the batch. Creating and writing those files (a
file creation costs ~0.1-0.5 ms on this kind of disk, more than reading the data) is left to one
daemon thread, ``msprobe-files``, through :class:`FileQueue`:

* A *job* is one flushed batch: its files, then what to do once they are on disk (append the batch's
  journal lines). Jobs run one at a time in the order they were submitted, so a journal line never
  names a file that is not written yet, and batches reach the journal in flush order.
* The queue is bounded (:data:`QUEUE_BYTES` of host arrays): :meth:`FileQueue.submit` blocks while it
  is full (back-pressure on the flushing thread), so memory stays bounded however fast a program
  records.
* :meth:`FileQueue.drain` returns when every submitted job is done; the caller runs queued jobs itself
  (in order), so it also works when the thread is gone (process exit, ``fork``). The runtime drains at
  ``stop()``/``step()``, before renaming a step directory and at exit (``atexit``); the flush thread's
  deadline plus one job bounds how long a record waits for the disk.
* The first failed write (``OSError``: disk full, file too large) removes that job's partial file,
  drops the jobs not yet run (their journal lines are not written: what the journal names exists) and
  is reported once through ``on_failure``.

The arrays handed over must not change until written: :func:`msprobe.engine.flush.materialize` copies
those that view a tensor's memory (the user may overwrite the tensor after the flush).
"""
from __future__ import annotations

import collections
import os
import threading

from msprobe.format.npy import save_npy_batch

#: bytes of host arrays queued at most (a single larger batch is still accepted when the queue is empty)
QUEUE_BYTES = 128 << 20


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
        self._jobs: collections.deque = collections.deque()
        self._queued = 0                   # bytes of arrays in queued (not yet started) jobs
        self._unfinished = 0               # jobs submitted and not finished
        self._cond = threading.Condition()
        self._run = threading.Lock()       # held while one job runs: jobs finish in order
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: set by the first failed write; nothing is written after it
        self.failed = False

    @property
    def busy(self) -> bool:
        """Jobs are queued or running: a batch without files must queue behind them (order)."""
        return self._unfinished > 0

    def submit(self, files: list, then=None) -> None:
        """Queue ``files`` (``[(path, numpy.ndarray)]``, written in this order), then run ``then()``
        (no arguments) once all of them are on disk. Waits while :data:`QUEUE_BYTES` are queued.

        The arrays must stay unchanged until written (pass copies of memory the user may change).
        After a failed write the job is dropped (``then`` is not run)."""
        if self.failed:
            return
        size = sum(arr.nbytes for _, arr in files)
        with self._cond:
            while self._queued and self._queued + size > self._limit and not self.failed:
                if not self._thread_alive():  # no thread to make room: the caller runs the oldest job
                    self._cond.release()
                    try:
                        self._run_one()
                    finally:
                        self._cond.acquire()
                    continue
                self._cond.wait(0.5)
            if self.failed:
                return
            self._jobs.append((files, then, size))
            self._queued += size
            self._unfinished += 1
            self._closed = False
            self._cond.notify_all()
        self._ensure_thread()

    def drain(self) -> None:
        """Return when every job submitted before the call is done (written or dropped). The calling
        thread runs queued jobs itself, in order, instead of waiting for the writer thread."""
        if os.getpid() != self._pid:
            return  # a forked child never writes (the parent's thread and lock state are not its own)
        while self._run_one():
            pass
        with self._run:  # a job the writer thread started is finished
            pass

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
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed and not self._jobs:
                    return
            self._run_one()

    def _run_one(self) -> bool:
        """Run the oldest queued job (under the run lock, so jobs finish in order). False when there
        was none."""
        with self._run:
            with self._cond:
                if not self._jobs:
                    return False
                files, then, size = self._jobs.popleft()
                self._queued -= size
                self._cond.notify_all()
            try:
                self._run_job(files, then)
            finally:
                with self._cond:
                    self._unfinished -= 1
                    self._cond.notify_all()
        return True

    def _run_job(self, files: list, then) -> None:
        if self.failed:
            return
        try:
            save_npy_batch(files)  # atomic per file: a failed write leaves no partial file
        except OSError as exc:  # disk full, file too large, directory gone: nothing more is written
            self._fail(exc)
            return
        if then is None:
            return
        try:
            then()
        except OSError as exc:
            self._fail(exc)
        except Exception as exc:  # the tool's own failure in the continuation: reported, queue goes on
            _call(self._on_error, exc)

    def _fail(self, exc: OSError) -> None:
        with self._cond:
            self.failed = True
            self._drop()
        _call(self._on_failure, exc)

    def _drop(self) -> None:
        """Call with the condition held."""
        self._unfinished -= len(self._jobs)
        self._jobs.clear()
        self._queued = 0
        self._cond.notify_all()


def _call(ref, exc: BaseException) -> None:
    """Call the callable behind the weak reference ``ref`` with ``exc`` (nothing when it is gone)."""
    target = ref()
    if target is not None:
        target(exc)
