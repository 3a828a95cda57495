"""Flush: turns pending tensor slots into finished leaf records (statistics layer entry point).

This is the only place that reads tensor data. It runs at flush points (batch full, before an in-place
operation, ``stop()``, ``step()``, exit, and the background deadline of :class:`FlushTimer`), never
per hooked call: a batch synchronises the device once, then on CPU reads every tensor as a zero-copy
view of its memory.

Failures of the user's computation: under MindSpore's asynchronous launch an operation that fails
(e.g. shapes that cannot broadcast) returns normally and its error is raised by the next
synchronisation or read of its output, which may be the tool's. Such an exception belongs to the
user: :func:`materialize` returns it (it never swallows it) and the runtime raises it, unchanged, to
the user's code.
"""
from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from msprobe.engine.writer import encode_lines
from msprobe.format.journal import Replay, encode_json
from msprobe.format.npy import check_saveable
from msprobe.tensors import hotpath, stats

def encode_batch(records: list) -> tuple:
    """``(text, resolved, non_finite)`` of journal lines, as every writer of the run encodes a
    flushed batch (the contract of :func:`msprobe.engine.writer.encode_lines`): in C when
    :mod:`msprobe.tensors.hotpath` runs (``hotpath.ext``, read at each call), else that function."""
    ext = hotpath.ext
    if ext is not None:
        return ext.encode_lines(records, encode_json)
    return encode_lines(records)


def replay_batch(state: Replay, lines: list) -> None:
    """Apply resolved journal ``lines`` to the writer's live :class:`~msprobe.format.journal.Replay`
    ``state`` (:meth:`Replay.apply_all`): the common line kinds in C when
    :mod:`msprobe.tensors.hotpath` runs, the same effect; the writer's ``line_replayer``."""
    ext = hotpath.ext
    if ext is not None and type(state) is Replay:  # a subclass's handlers are Python's to call
        ext.replay_lines(state, lines)
    else:
        state.apply_all(lines)


#: how often one synchronisation is retried after it raised (MindSpore reports a failure once)
_SYNC_RETRIES = 3


def wait_for_device():
    """Wait for every queued MindSpore operation (``PyNativeExecutor.sync``).

    Returns:
        ``None``, or the exception the synchronisation raised: an operation of the user's failed
        asynchronously. MindSpore reports it once; the synchronisation is then repeated so the
        rest of the queue is finished before tensors are read.
    """
    executor = stats.pynative_executor()
    failure = None
    for _ in range(_SYNC_RETRIES):
        try:
            executor.sync()
            return failure
        except Exception as exc:  # the user's operation failed: handed back, never swallowed
            if failure is None:
                failure = exc
    return failure


_MINDSPORE_DIR = None


def raised_by_mindspore(exc: BaseException) -> bool:
    """True when ``exc`` was raised inside MindSpore (its innermost frame is in the ``mindspore``
    package): reading a user's tensor (``dtype``, ``shape``, data) raises this way when the operation
    that produced it failed under asynchronous launch."""
    global _MINDSPORE_DIR
    if _MINDSPORE_DIR is None:
        import mindspore

        _MINDSPORE_DIR = os.path.dirname(os.path.abspath(mindspore.__file__)) + os.sep
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_MINDSPORE_DIR)


def materialize(slots, *, md5: bool, tensor_dir: str | None, on_error, release: bool = True,
                counts: tuple = (), files: list | None = None):
    """Fill ``slot.leaf`` for every slot (statistics, optional CRC-32, optional ``.npy`` file).

    Args:
        slots: iterable of :class:`msprobe.tensors.records.TensorSlot`.
        md5: add ``"md5"``: CRC-32 of the tensor bytes as 8 hex digits.
        tensor_dir: directory for ``.npy`` files of slots with a ``data_name``.
        on_error: ``callable(str)`` told about a tensor the tool could not read; its leaf then has
            null statistics and an ``"error"`` field (as has the output of a failed operation,
            which is not reported as the tool's error).
        counts: optional statistics to add (``NanCount``, ... :data:`msprobe.engine.config.COUNT_ITEMS`).
        release: drop the slots' tensors when done; ``False`` leaves that to the caller
            (:func:`release_tensors`; watch mode saves a producer's tensors after the batch).
        files: a list to which the ``.npy`` files are appended as ``(path, numpy.ndarray)`` instead
            of being written here (:class:`msprobe.engine.tensor_files.FileQueue` writes them later).
            Each array is the tool's own memory or a zero-copy view of a tensor's memory that keeps
            the tensor alive (:func:`msprobe.tensors.stats.views_live_tensor`; the file queue copies
            it before the program may change the tensor, :meth:`~msprobe.engine.tensor_files.FileQueue.protect`);
            any other view is copied. One array per tensor, however many files name it.

    Returns:
        ``None``, or the exception MindSpore raised for a failed operation of the user's while the
        batch was synchronised (:func:`wait_for_device`). The batch is still recorded (the failed
        operation's outputs get an ``"error"`` leaf); the caller raises the exception to the user.

    Raises:
        OSError: a ``.npy`` file could not be written (disk full); no truncated file is left.
            Only when ``files`` is ``None``.
    """
    # The same tensor object often appears several times in one batch (an API's output is the next
    # API's input). Nothing can change it within a batch (the mutation guard flushes before in-place
    # ops; Parameters are snapshots), so it is read and reduced once. Keyed by id(): the slots keep
    # every tensor alive until the batch is done, so ids are not reused meanwhile.
    seen: dict = {}
    prefix = os.path.join(tensor_dir, "") if tensor_dir else None  # + data_name: the file's path
    failure = None
    zero_copy = False
    if any(slot.type_name != "numpy.ndarray" for slot in slots):
        failure = wait_for_device()
        zero_copy = stats.host_memory_readable()
    if zero_copy and not counts and hotpath.ext is not None:
        hotpath.ext.fill(slots, md5)  # plain CPU tensors in C; the loop below does the rest
    for slot in slots:
        if slot.leaf is not None:
            continue
        leaf = {"type": slot.type_name, "dtype": slot.dtype, "shape": slot.shape}
        try:
            known = seen.get(id(slot.tensor))
            if known is None:
                if slot.type_name == "numpy.ndarray":
                    arr, stored = slot.tensor, "native"
                else:
                    arr, stored = stats.to_host(slot.tensor, zero_copy)
                known = seen[id(slot.tensor)] = _HostValue(arr, stored, stats.compute_stats(arr, counts=counts))
            leaf.update(known.stats)
            if slot.data_name and prefix:
                path = prefix + slot.data_name
                if files is None:
                    stats.save_npy(path, known.arr)
                else:
                    files.append((path, known.kept()))
                leaf["data_name"] = slot.data_name
                if known.stored != "native":
                    leaf["stored_as"] = known.stored
            if md5:
                if known.md5 is None:
                    known.md5 = stats.crc32_hex(known.arr)
                leaf["md5"] = known.md5
        except OSError:  # the disk is full or not writable: the runtime switches the dump off
            if slot.data_name and tensor_dir:  # no truncated .npy left behind
                try:
                    os.remove(os.path.join(tensor_dir, slot.data_name))
                except OSError:
                    pass
            raise
        except Exception as exc:  # a tensor that cannot be read must not break the training step
            leaf.update({"Max": None, "Min": None, "Mean": None, "Norm": None})
            if failure is not None and raised_by_mindspore(exc):
                # not the tool's failure (dump_error_info.log is for those): the leaf says it
                leaf["error"] = f"no value: the operation that produced it failed ({exc!r})"
            else:
                leaf["error"] = repr(exc)
                on_error(f"could not read tensor for {slot.data_name or slot.dtype}: {exc!r}")
        slot.leaf = leaf
    if release:  # release the tensors only now: ids must stay unique while ``seen`` is used
        release_tensors(slots)
    return failure


class _HostValue:
    """One tensor of a batch on the host: its array, how it is stored, statistics, CRC-32, and the
    array handed to the file queue (made once however many files name it)."""

    __slots__ = ("arr", "stored", "stats", "md5", "_kept")

    def __init__(self, arr, stored: str, tensor_stats: dict):
        self.arr, self.stored, self.stats, self.md5, self._kept = arr, stored, tensor_stats, None, None

    def kept(self) -> np.ndarray:
        """``arr`` for the file queue: itself when the tool owns it or when it views a tensor's memory
        and keeps the tensor alive (no copy on this thread: the queue copies it only if the tensor
        may change before its file is written), else a copy (memory nothing keeps)."""
        if self._kept is None:
            check_saveable(self.arr)
            keep = owns_memory(self.arr) or stats.views_live_tensor(self.arr)
            self._kept = self.arr if keep else np.array(self.arr)
        return self._kept


def owns_memory(arr: np.ndarray) -> bool:
    """True when ``arr``'s memory belongs to the tool (a copy or conversion it made), false when it is
    a view of memory it does not own (a tensor's, through ``data_ptr`` or ``asnumpy``)."""
    while isinstance(arr, np.ndarray):
        if arr.base is None:
            return arr.flags.owndata
        arr = arr.base
    return False


def release_tensors(slots) -> None:
    """Drop the slots' references to tensors (after :func:`materialize` with ``release=False``)."""
    for slot in slots:
        slot.tensor = None


class FlushTimer:
    """A daemon thread that flushes a runtime's pending records once the oldest is ``delay``
    seconds old, so records reach the disk although the program makes no further call (a hang in
    a collective, a long host-side pause) and a later ``kill -9`` loses nothing older than
    ``delay`` plus one flush.

    It holds the runtime weakly (the thread ends when the runtime is collected or :meth:`close` is
    called) and calls ``runtime.flush_due(delay)``, which does nothing while another flush runs.
    Not inherited by a forked child (threads do not survive ``fork``); the child never writes.

    Args:
        runtime: the :class:`msprobe.engine.runtime.Runtime` to flush.
        delay: seconds (float > 0).
    """

    def __init__(self, runtime, delay: float):
        self.delay = delay
        self._wake = threading.Event()
        self._closed = False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=_timer_loop, args=(weakref.ref(runtime), self),
                                        name="msprobe-flush", daemon=True)
        self._thread.start()
        weakref.finalize(runtime, self.close)  # the runtime is gone: the thread ends

    @property
    def alive(self) -> bool:
        return not self._closed and os.getpid() == self._pid and self._thread.is_alive()

    def wake(self) -> None:
        """A record was queued into an empty batch: start counting its deadline."""
        self._wake.set()

    def close(self) -> None:
        """End the thread (it finishes the flush it may be running)."""
        self._closed = True
        self._wake.set()

    @property
    def thread(self) -> threading.Thread:
        return self._thread


def _timer_loop(ref, timer: FlushTimer) -> None:
    while not timer._closed:
        timer._wake.wait()
        timer._wake.clear()
        while not timer._closed:
            runtime = ref()
            if runtime is None:
                return
            wait = runtime.flush_due(timer.delay)
            del runtime  # never keep the runtime alive while sleeping
            if wait is None:  # nothing pending: sleep until the next record
                break
            timer._wake.wait(wait)
            timer._wake.clear()
