"""Tensor files off the training thread: the ordered, bounded file queue (msprobe/engine/tensor_files.py)
on plain arrays, and the tensor dump with real MindSpore where the user overwrites a recorded tensor
while its file is still queued."""
from __future__ import annotations

import ctypes
import os
import threading
import zlib

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

import msprobe.dump
from conftest import only_step_dir
from msprobe.engine.tensor_files import FileQueue, overlaps, storage_ranges
from msprobe.mindspore import PrecisionDebugger
from msprobe.tensors.stats import crc32_hex


def _queue(limit=1 << 20):
    failures, errors = [], []
    queue = FileQueue(on_failure=lambda: failures.append, on_error=lambda: errors.append, limit=limit)
    return queue, failures, errors


def test_jobs_finish_in_order_and_lines_follow_their_files(tmp_path):
    queue, failures, errors = _queue()
    done = []

    def then(i, paths):
        assert all(os.path.exists(p) for p in paths)  # a job's continuation runs after its files
        done.append(i)

    for i in range(40):
        files = [(str(tmp_path / f"{i}.{k}.npy"), np.full((50,), i * 10 + k, np.float32)) for k in range(3)]
        queue.submit(files, lambda i=i, paths=[p for p, _ in files]: then(i, paths))
    queue.drain()
    assert done == list(range(40))
    assert not failures and not errors
    assert np.load(str(tmp_path / "7.2.npy")).tolist() == [72.0] * 50
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".npy-")]  # no temporary file left
    assert not queue.busy


def test_submit_waits_while_the_queue_is_full(tmp_path):
    """Back-pressure: with the writer blocked, a submit beyond the byte limit waits until a job is done."""
    queue, _, _ = _queue(limit=1000)
    block = threading.Event()
    queue.submit([], block.wait)                      # the writer thread is busy with this job
    queue.submit([(str(tmp_path / "a.npy"), np.zeros(200, np.float32))])  # 800 bytes queued
    submitted = threading.Event()

    def producer():
        queue.submit([(str(tmp_path / "b.npy"), np.zeros(200, np.float32))])  # would be 1600 bytes
        submitted.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not submitted.wait(0.5)                    # held back while the queue is full
    block.set()
    assert submitted.wait(10)
    thread.join()
    queue.drain()
    assert os.path.exists(tmp_path / "a.npy") and os.path.exists(tmp_path / "b.npy")


def test_first_failed_write_drops_the_rest_and_is_reported_once(tmp_path):
    queue, failures, errors = _queue()
    block = threading.Event()
    ran = []
    queue.submit([], block.wait)
    queue.submit([(str(tmp_path / "missing" / "a.npy"), np.zeros(4))], lambda: ran.append("a"))
    queue.submit([(str(tmp_path / "b.npy"), np.zeros(4))], lambda: ran.append("b"))
    block.set()
    queue.drain()
    assert len(failures) == 1 and isinstance(failures[0], OSError)
    assert ran == [] and not os.path.exists(tmp_path / "b.npy")   # nothing after the failure
    queue.submit([(str(tmp_path / "c.npy"), np.zeros(4))])
    queue.drain()
    assert not os.path.exists(tmp_path / "c.npy") and len(failures) == 1
    assert not errors and not queue.busy


def test_drain_runs_the_jobs_itself_without_the_writer_thread(tmp_path):
    queue, _, _ = _queue()
    queue.close()                                     # the thread ends (as at exit)
    queue._ensure_thread = lambda: None               # a late job, and no thread to write it
    queue.submit([(str(tmp_path / "late.npy"), np.arange(3))])
    queue.drain()
    assert np.load(str(tmp_path / "late.npy")).tolist() == [0, 1, 2]


def test_crc32_of_large_arrays_equals_zlib():
    rng = np.random.default_rng(0)
    for n in (1, 7, 4096, 1 << 20):
        arr = rng.standard_normal(n).astype(np.float32)
        assert crc32_hex(arr) == f"{zlib.crc32(arr.tobytes()):08x}"
    view = rng.standard_normal((300, 200))[:, ::3]    # non-contiguous: hashed in C order
    assert crc32_hex(view) == f"{zlib.crc32(np.ascontiguousarray(view).tobytes()):08x}"


def test_tensor_overwritten_while_its_file_is_queued_keeps_the_recorded_value(tmp_path):
    """A CPU tensor is read in place through its data pointer. The user writes into it (``x[:] = 5``,
    the guard flushes first) while the writer thread is held: the .npy file still holds the value the
    call saw, as do the statistics."""
    ms.set_device("CPU")
    dump_path = str(tmp_path / "dump")
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor")
    x = Tensor(np.array([-1.0, 0.5, 2.0, 3.0], np.float32))
    debugger.start()
    runtime = debugger.service.runtime
    queue = runtime._file_queue()
    with queue._run:                                  # the writer thread cannot write yet
        out = ops.relu(x)
        x[:] = 5.0                                    # in place: the pending batch is read first
        assert queue.busy                             # its files wait for the writer thread
    debugger.stop()
    debugger.step()
    assert x.asnumpy().tolist() == [5.0] * 4 and out.asnumpy().tolist() == [0, 0.5, 2, 3]
    dump = msprobe.dump.load(only_step_dir(dump_path, 0))
    assert dump.complete
    leaf = dump.data["Functional.relu.0.forward"]["input_args"][0]
    assert leaf["Max"] == 3.0 and leaf["Min"] == -1.0
    assert dump.load_tensor(leaf).tolist() == [-1.0, 0.5, 2.0, 3.0]
    debugger.service.close()


@pytest.mark.parametrize("launch_blocking", [True, False])
def test_tensor_dump_of_a_training_step_matches_the_tensors(tmp_path, launch_blocking):
    """Every file named by dump.json exists at stop() and holds the tensor's values (both launch
    modes: asynchronous launch reads tensors through ``asnumpy``, whose memory is the tensor's)."""
    import subprocess
    import sys
    import textwrap

    dump_path = str(tmp_path / "dump")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {root!r})
        import mindspore as ms, numpy as np
        from mindspore import Tensor, nn, ops
        ms.set_device("CPU")
        if {launch_blocking!r}:
            ms.runtime.launch_blocking()
        from msprobe.mindspore import PrecisionDebugger
        ms.set_seed(0)
        net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
        opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
        grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, net.trainable_params())
        rng = np.random.RandomState(0)
        x = Tensor(rng.randn(4, 8).astype(np.float32)); y = Tensor(rng.randn(4, 4).astype(np.float32))
        debugger = PrecisionDebugger(dump_path={dump_path!r}, level="L1", task="tensor")
        for _ in range(2):
            debugger.start(net)
            loss, grads = grad_fn(x, y)
            opt(grads)
            debugger.stop()
            debugger.step()
        print("DONE")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    for step in (0, 1):
        dump = msprobe.dump.load(only_step_dir(dump_path, step))
        assert dump.complete
        checked = 0
        for entry, body in dump.data.items():
            for value in body.values():
                for leaf in _tensor_leaves(value):
                    arr = dump.load_tensor(leaf)
                    assert list(arr.shape) == leaf["shape"], entry
                    if arr.size and arr.dtype.kind == "f" and np.isfinite(arr).all():
                        assert float(arr.max()) == leaf["Max"] and float(arr.min()) == leaf["Min"], entry
                    checked += 1
        assert checked > 20


def _tensor_leaves(value):
    if isinstance(value, dict) and "data_name" in value:
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensor_leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _tensor_leaves(v)


def test_file_thread_ends_with_the_dump_and_holds_nothing(tmp_path):
    """The file thread ends once the debugger has dumped its last configured step, and a debugger
    dropped while its thread runs is collected (the thread holds the dump state weakly)."""
    import gc
    import weakref

    ms.set_device("CPU")
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1", task="tensor", step=[0])
    debugger.start()
    ops.relu(Tensor(np.ones(3, np.float32)))
    debugger.stop()
    thread = debugger.service.runtime._files._thread
    assert thread.is_alive()
    debugger.step()                                   # the last configured step: the dump is done
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert os.listdir(os.path.join(only_step_dir(str(tmp_path / "a"), 0), "dump_tensor_data"))

    other = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1", task="tensor")
    other.start()
    ops.relu(Tensor(np.ones(3, np.float32)))
    other.stop()
    runtime = weakref.ref(other.service.runtime)
    thread = other.service.runtime._files._thread
    assert thread.is_alive()
    del other
    gc.collect()
    assert runtime() is None
    thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.mark.parametrize("compiled", [True, False])
def test_batch_writes_the_bytes_of_numpy_save_and_stops_at_the_first_failure(tmp_path, monkeypatch, compiled):
    import io

    from msprobe.format import npy

    if not compiled:
        monkeypatch.setattr(npy, "_npy_files", None)
    elif npy._npy_files is None:
        pytest.skip("msprobe.format._npy_files is not built")
    arrays = [np.float32(3).reshape(()), np.arange(12, dtype=np.int64).reshape(3, 4), np.zeros((0, 5), np.float16),
              np.ones((2, 3), np.bool_), (np.arange(6) + 1j).astype(np.complex64),
              np.arange(24, dtype=">f4").reshape(2, 3, 4), np.asfortranarray(np.arange(12.0).reshape(3, 4)),
              np.arange(10, dtype=np.uint8)[::2], np.random.default_rng(0).standard_normal(300_000)]
    items = [(str(tmp_path / f"{i}.npy"), a) for i, a in enumerate(arrays)]
    npy.save_npy_batch(items)
    for path, arr in items:
        expected = io.BytesIO()
        np.save(expected, arr, allow_pickle=False)
        with open(path, "rb") as f:
            assert f.read() == expected.getvalue(), path
    bad = [(str(tmp_path / "x.npy"), np.ones(3)), (str(tmp_path / "no" / "y.npy"), np.ones(3)),
           (str(tmp_path / "z.npy"), np.ones(3))]
    with pytest.raises(FileNotFoundError) as info:
        npy.save_npy_batch(bad)
    assert info.value.filename == bad[1][0]
    names = set(os.listdir(tmp_path))
    assert "x.npy" in names and "z.npy" not in names and not [n for n in names if n.endswith(".tmp")]
    with pytest.raises(TypeError):  # checked before anything is written
        npy.save_npy_batch([(str(tmp_path / "w.npy"), np.ones(2)), (str(tmp_path / "o.npy"), np.array([None]))])
    assert not os.path.exists(tmp_path / "w.npy")


def test_batch_writes_each_path_as_its_own_file_and_replaces_existing_files(tmp_path):
    """One array named by several files of a batch gives a file of its own per path (one inode each,
    so rewriting one of them changes no other); a path that exists already is replaced, whichever way
    the file is made; no temporary file is left."""
    from msprobe.format import npy

    if npy._npy_files is None:
        pytest.skip("msprobe.format._npy_files is not built")
    shared, twin = np.arange(1000, dtype=np.float32), np.arange(1000, dtype=np.float32)
    (tmp_path / "b.npy").write_bytes(b"stale")
    (tmp_path / "d.npy").write_bytes(b"stale")
    names = ["a.npy", "b.npy", "c.npy", "d.npy", "e.npy", "f.npy"]
    arrays = [shared, shared, twin, shared, shared.reshape(10, 100), shared]
    npy.save_npy_batch([(str(tmp_path / n), arr) for n, arr in zip(names, arrays)])
    assert len({os.stat(tmp_path / n).st_ino for n in names}) == len(names)
    assert all(os.stat(tmp_path / n).st_nlink == 1 for n in names)
    for n, arr in zip(names, arrays):
        assert np.array_equal(np.load(str(tmp_path / n)), arr) and np.load(str(tmp_path / n)).shape == arr.shape
    np.save(str(tmp_path / "a.npy"), np.zeros(3, np.float32))  # a user rewrites one dumped file
    assert np.array_equal(np.load(str(tmp_path / "f.npy")), shared)
    assert sorted(os.listdir(tmp_path)) == names


def test_large_jobs_are_written_by_the_writer_thread_in_order_while_drain_waits(tmp_path):
    """Jobs larger than one chunk: ``drain`` waits while the writer thread writes them (the draining
    thread writes none), and every continuation runs after all of its job's files, in submission
    order."""
    from msprobe.engine import tensor_files

    queue, failures, errors = _queue(limit=64 << 20)
    done = []
    files_per_job = 3 * tensor_files.CHUNK_FILES + 5

    def then(i, paths):
        assert all(os.path.exists(p) for p in paths)
        done.append(i)

    for i in range(6):
        files = [(str(tmp_path / f"{i}.{k}.npy"), np.full((64,), i * 1000 + k, np.int32))
                 for k in range(files_per_job)]
        queue.submit(files, lambda i=i, paths=[p for p, _ in files]: then(i, paths))
    written_by = []
    save = tensor_files.save_npy_batch
    tensor_files.save_npy_batch = lambda chunk: (written_by.append(threading.get_ident()), save(chunk))
    try:
        queue.drain()
    finally:
        tensor_files.save_npy_batch = save
    assert threading.get_ident() not in written_by
    assert done == list(range(6)) and not failures and not errors and not queue.busy
    assert np.load(str(tmp_path / f"4.{files_per_job - 1}.npy")).tolist() == [4000 + files_per_job - 1] * 64


def test_queued_files_read_the_tensors_in_place_until_a_mutation_copies_them(tmp_path):
    """No copy on the training thread: while the writer is held, the queued arrays read the tensors'
    memory (and keep the tensors alive); an in-place operation (the guard's flush) copies them first,
    so the file holds the value the call saw; a tensor that is not changed is written from its own
    memory."""
    from msprobe.tensors.stats import views_live_tensor

    ms.set_device("CPU")
    dump_path = str(tmp_path / "dump")
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor")
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    debugger.start()
    runtime = debugger.service.runtime
    queue = runtime._file_queue()
    with queue._run:                                  # the writer thread cannot write yet
        y = ops.abs(x)
        runtime.flush(wait=False)                     # read, files queued (as the batch rules do)
        queued = [arr for job in queue._jobs for _, arr in job.files]
        assert queued and all(views_live_tensor(arr) for arr in queued)
        assert queue.holds_views and runtime.has_pending
        x[1] = 7.0                                    # in place: the guard protects the queued files
        assert not queue.holds_views
        assert not any(views_live_tensor(arr) for job in queue._jobs for _, arr in job.files)
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_path, 0))
    body = dump.data["Functional.abs.0.forward"]
    assert dump.load_tensor(body["input_args"][0]).tolist() == [1.0, -2.0, 3.0]
    assert dump.load_tensor(body["output"][0]).tolist() == [1.0, 2.0, 3.0]
    assert x.asnumpy().tolist() == [1.0, 7.0, 3.0] and y.asnumpy().tolist() == [1.0, 2.0, 3.0]
    debugger.service.close()


class _Assigner(nn.Cell):
    """A Cell whose compiled ``construct`` assigns its Parameter (an optimizer's update in small)."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    @ms.jit
    def construct(self, value):
        ops.assign(self.weight, value)
        return value


def test_compiled_cell_copies_only_the_queued_files_reading_memory_it_may_write(tmp_path):
    """Before a Cell's compiled ``construct`` runs, the queued files that read its Parameters' memory
    (here a view of the weight made by ``reshape``) are copied, so they hold the value before the
    assignment; files reading memory the region cannot write (``abs`` of a plain tensor) keep
    reading it in place, with no copy on the training thread."""
    from msprobe.tensors.stats import views_live_tensor

    ms.set_device("CPU")
    dump_path = str(tmp_path / "dump")
    weight = Parameter(Tensor(np.array([1.0, 2.0, 3.0, 4.0], np.float32)), name="weight")
    assigner = _Assigner(weight)
    x = Tensor(np.array([-5.0, 6.0], np.float32))
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor")
    debugger.start()
    runtime = debugger.service.runtime
    queue = runtime._file_queue()
    with queue._run:                                  # the writer thread cannot write yet
        viewed = ops.reshape(weight, (2, 2))          # shares the weight's memory
        ops.abs(x)
        runtime.flush(wait=False)
        queued = {path: arr for job in queue._jobs for path, arr in job.files}
        assert any(os.path.basename(p).startswith("Functional.reshape.0.forward.output")
                   and views_live_tensor(a) for p, a in queued.items())
        assigner(Tensor(np.zeros(4, np.float32)))     # compiled region: assigns the weight
        after = {path: arr for job in queue._jobs for path, arr in job.files if path in queued}
        kept = sorted(os.path.basename(p) for p, a in after.items() if views_live_tensor(a))
        copied = sorted(os.path.basename(p) for p, a in after.items() if not views_live_tensor(a))
        assert kept == ["Functional.abs.0.forward.input.0.npy", "Functional.abs.0.forward.output.0.npy"]
        assert "Functional.reshape.0.forward.output.0.npy" in copied
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_path, 0))
    assert dump.load_tensor(dump.data["Functional.reshape.0.forward"]["output"][0]).tolist() == \
        [[1.0, 2.0], [3.0, 4.0]]
    body = dump.data["Functional.abs.0.forward"]
    assert dump.load_tensor(body["input_args"][0]).tolist() == [-5.0, 6.0]
    assert dump.load_tensor(body["output"][0]).tolist() == [5.0, 6.0]
    assert weight.asnumpy().tolist() == [0.0] * 4
    debugger.service.close()


def test_a_compiled_cell_may_write_its_parameters_and_arguments_a_jit_function_anything():
    from msprobe.capture.jit import _cell_writes

    weight = Parameter(Tensor(np.ones(2, np.float32)), name="weight")
    x, y = Tensor(np.zeros(2, np.float32)), Tensor(np.zeros(3, np.float32))
    assert _cell_writes(None, (x,), {}) is True       # a jit function: any Parameter it reaches
    written = _cell_writes(_Assigner(weight), ([x],), {"value": y})
    assert sorted(id(t) for t in written()) == sorted(map(id, (weight, x, y)))


def test_storage_ranges_cover_views_and_overlaps_reads_byte_bounds():
    base = Tensor(np.arange(12, dtype=np.float32))
    view = ops.reshape(base, (3, 4))
    other = Tensor(np.ones(3, np.float32))
    ranges = storage_ranges([view, other, base])
    start = base.untyped_storage().data_ptr()
    assert (start, start + 48) in ranges and len(ranges) == 2
    inside = np.frombuffer((ctypes.c_char * 8).from_address(start + 40), np.uint8)
    assert overlaps(inside, ranges)
    assert not overlaps(np.zeros(4, np.float32), ranges)
    assert not overlaps(np.zeros(0, np.float32), ranges)
    assert ranges == sorted(ranges) and storage_ranges([]) == []


def test_protect_copies_into_one_block_reused_once_its_files_are_written():
    queue, _, _ = _queue()
    arrays = [np.arange(10, dtype=np.float32), np.arange(6.0).reshape(2, 3), np.float16(2.5).reshape(())]
    first = queue._copy(arrays)
    for arr in arrays:
        copy = first[id(arr)]
        assert copy.dtype == arr.dtype and copy.shape == arr.shape and copy.tobytes() == arr.tobytes()
        assert copy.base is queue._spare and copy.flags.c_contiguous
    block = id(queue._spare)
    second = queue._copy(arrays)                      # the first copies are still queued
    assert id(queue._spare) != block
    block = id(queue._spare)
    del first, second                                 # written: the block is free
    third = queue._copy(arrays)
    assert id(queue._spare) == block and third[id(arrays[0])].tolist() == list(range(10))


def test_protect_waits_only_for_the_chunks_being_written_that_may_read_the_changed_memory(tmp_path, monkeypatch):
    """A chunk being written from a tensor the coming mutation cannot write does not hold the
    mutation up; one that may read the changed memory does, until it is written."""
    from msprobe.engine import tensor_files
    from msprobe.tensors.stats import to_host

    ms.set_device("CPU")
    a, b = Tensor(np.arange(4, dtype=np.float32)), Tensor(np.arange(4, dtype=np.float32) + 10)
    view_a, view_b = to_host(a, zero_copy=True)[0], to_host(b, zero_copy=True)[0]
    assert tensor_files.views_live_tensor(view_a) and tensor_files.views_live_tensor(view_b)
    writing, release, written = threading.Event(), threading.Event(), threading.Event()
    save = tensor_files.save_npy_batch

    def held(chunk):                                  # the writer thread is held inside b's chunk
        writing.set()
        release.wait(5)
        save(chunk)
        written.set()

    monkeypatch.setattr(tensor_files, "save_npy_batch", held)
    queue, failures, errors = _queue()
    queue.submit([(str(tmp_path / "b.npy"), view_b)])
    assert writing.wait(30)
    queue.submit([(str(tmp_path / "a.npy"), view_a)])
    queue.protect(lambda: [a])                        # returns at once: b's chunk cannot read a
    assert not written.is_set()
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (queue.protect(lambda: [b]), returned.set()))
    waiter.start()
    assert not returned.wait(0.3)                     # b's chunk is still being written
    release.set()
    waiter.join(30)
    assert returned.is_set()
    queue.drain()
    assert np.load(str(tmp_path / "a.npy")).tolist() == [0, 1, 2, 3]
    assert np.load(str(tmp_path / "b.npy")).tolist() == [10, 11, 12, 13]
    assert not failures and not errors
