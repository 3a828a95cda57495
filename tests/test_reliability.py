"""Reliability: multi-rank runs (msrun), never overwriting an earlier run, bad paths and limits (long
names, full disk), threads, fork and memory with ``gc.disable()``. Real MindSpore on CPU, no mocks.

The msrun test starts two worker processes plus msrun's scheduler (~30-40 s); it is marked ``slow``.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import msprobe.dump
from conftest import build_mlp, load_step, only_step_dir, run_steps, write_config
from msprobe.engine.config import ConfigError
from msprobe.mindspore import PrecisionDebugger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
VENV_BIN = os.path.dirname(sys.executable)


def _script_env():
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# =============================================================================================== 1. msrun
@pytest.fixture(scope="module")
def msrun_out(tmp_path_factory):
    """One ``msrun`` launch of tests/scripts/dp_worker.py with 2 workers (all three phases)."""
    msrun = os.path.join(VENV_BIN, "msrun")
    if not os.path.exists(msrun):
        pytest.skip("msrun is not installed next to this Python")
    out = tmp_path_factory.mktemp("msrun")
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [msrun, "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", f"--log_dir={out / 'log'}", "--join=True",
           "--cluster_time_out=90", os.path.join(SCRIPTS, "dp_worker.py"), str(out / "dump")]
    (out / "dump").mkdir()
    proc = subprocess.run(cmd, cwd=str(out), env=env, capture_output=True, text=True, timeout=240)
    logs = "\n".join(open(p, errors="replace").read()[-3000:] for p in glob.glob(str(out / "log" / "*.log")))
    assert proc.returncode == 0, f"msrun failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{logs}"
    for rank in (0, 1):
        assert (out / "dump" / f"result_rank{rank}.json").exists(), logs
    return out / "dump"


def _result(out, rank) -> dict:
    with open(out / f"result_rank{rank}.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.slow
def test_msrun_each_rank_dumps_its_own_data(msrun_out):
    main = msrun_out / "main"
    found = [(s, r) for s, r, _ in msprobe.dump.iter_step_dirs(str(main))]
    assert found == [(0, "rank0"), (0, "rank1"), (1, "rank0"), (1, "rank1")]
    results = {r: _result(msrun_out, r) for r in (0, 1)}
    # data parallel really ran: same parameters on both ranks, different local losses
    assert results[0]["params"] == results[1]["params"]
    assert results[0]["loss"] != results[1]["loss"]
    dumps = {(s, r): msprobe.dump.load(str(main / f"step{s}" / f"rank{r}")) for s in (0, 1) for r in (0, 1)}
    for (step, rank), dump in dumps.items():
        assert dump.complete
        res = results[rank]
        # gradients averaged with mint.distributed.all_reduce (in place): input = this rank's local
        # gradient (read before the collective), output = the sum over ranks (the written tensor)
        for i in range(4):
            body = dump.data[f"MintDistributed.all_reduce.{i}.forward"]
            arg = body["input_args"][0]
            assert arg["Max"] == pytest.approx(res["local_grad_max"][step][i], rel=1e-6)
            assert arg["Min"] == pytest.approx(res["local_grad_min"][step][i], rel=1e-6)
            out = body["output"][0]
            assert out["shape"] == arg["shape"]
            assert out["Max"] == pytest.approx(res["reduced_grad_max"][step][i], rel=1e-6)
        # the loss averaged with the ops.AllReduce Primitive held by the model
        prim = dump.data["Primitive.allreduce.AllReduce.0.forward"]
        assert prim["input_args"][0]["Max"] == pytest.approx(res["loss"][step], rel=1e-6)
        assert prim["output"][0]["Max"] == pytest.approx(2 * res["mean_loss"][step], rel=1e-6)
        assert "Functional.relu.0.forward" in dump.data and "Functional.mse_loss.0.backward" in dump.data
    for step in (0, 1):
        a, b = dumps[(step, 0)].data, dumps[(step, 1)].data
        assert set(a) == set(b)
        # rank-specific inputs give rank-specific statistics
        assert a["Functional.relu.0.forward"]["input_args"][0] != b["Functional.relu.0.forward"]["input_args"][0]
        assert (a["MintDistributed.all_reduce.0.forward"]["input_args"][0]
                != b["MintDistributed.all_reduce.0.forward"]["input_args"][0])
        # ... and the collective's result is the same on both
        assert (a["MintDistributed.all_reduce.0.forward"]["output"][0]
                == b["MintDistributed.all_reduce.0.forward"]["output"][0])


@pytest.mark.slow
def test_msrun_rank_filter(msrun_out):
    found = [(s, r) for s, r, _ in msprobe.dump.iter_step_dirs(str(msrun_out / "rank1"))]
    assert found == [(0, "rank1")]
    assert os.listdir(msrun_out / "rank1" / "step0") == ["rank1"]
    assert "MintDistributed.all_reduce.0.forward" in msprobe.dump.load(
        str(msrun_out / "rank1" / "step0" / "rank1")).data


@pytest.mark.slow
def test_msrun_late_init_ends_in_rank_dir(msrun_out):
    """start() before communication.init(): step 0 was opened as proc{pid} and is renamed to rank{N}
    at the next start/stop/step; msrun's scheduler process (which runs the script too) dumps nothing."""
    late = msrun_out / "late"
    for step in (0, 1):
        assert sorted(os.listdir(late / f"step{step}")) == ["rank0", "rank1"]
    for rank in (0, 1):
        d0 = msprobe.dump.load(str(late / "step0" / f"rank{rank}"))
        assert d0.complete
        assert set(d0.data) == {"Functional.relu.0.forward", "Functional.relu.1.forward",
                                "Tensor.__add__.0.forward"}
        # x = RANK_ID - 1 (msrun's env, the only id known before init()): this process's own values
        rank_env = _result(msrun_out, rank)["rank_id_env"]
        assert d0.data["Functional.relu.0.forward"]["input_args"][0]["Max"] == rank_env - 1.0
        assert d0.data["Functional.relu.1.forward"]["input_args"][0]["Max"] == float(rank_env)
        assert d0.header["dump_data_dir"] is None
        d1 = msprobe.dump.load(str(late / "step1" / f"rank{rank}"))
        assert set(d1.data) == {"Functional.relu.0.forward"}


# =============================================================================================== 2. rerun
def _one_step(dump_path, value, rank_id=None):
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor")
    debugger.start(rank_id=rank_id)
    ops.relu(Tensor(np.full((3,), value, np.float32)))
    debugger.stop()
    debugger.step()


@pytest.mark.no_format_check  # the earlier runs' directories hold placeholder dump.json files ("{}")
def test_rankless_run_moves_dead_process_dirs_aside(tmp_path, caplog):
    """Without a rank each run writes step{N}/proc{pid}: an earlier run's proc directory (its process
    gone) is moved aside, a running process's is left alone, and readers see one run."""
    dump_path = str(tmp_path / "dump")
    step0 = os.path.join(dump_path, "step0")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_dir = os.path.join(step0, f"proc{int(dead.stdout)}")
    alive_dir = os.path.join(step0, f"proc{os.getppid()}")   # pytest's parent process runs
    for d in (dead_dir, alive_dir):
        os.makedirs(d)
        open(os.path.join(d, "dump.json"), "w").write("{}")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _one_step(dump_path, 3.0)
    moved = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
    names = sorted(os.listdir(step0))
    (aside,) = [n for n in names if n.startswith(os.path.basename(dead_dir) + ".previous-")]
    # different pid directories: nothing could be overwritten, and the message says so
    assert moved == [f"msprobe: {dead_dir} holds a dump from an earlier run (process {int(dead.stdout)} no "
                     f"longer runs); nothing of it would be overwritten, but it was moved to "
                     f"{os.path.join(step0, aside)} so that readers of {step0} do not mix it with this run (this run "
                     f"writes {os.path.join(step0, f'proc{os.getpid()}')})"]
    assert f"proc{os.getpid()}" in names and os.path.basename(alive_dir) in names
    assert os.path.basename(dead_dir) not in names
    assert any(n.startswith(os.path.basename(dead_dir) + ".previous-") for n in names)


def _steps(dump_path, steps):
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="statistics")
    for step in range(steps):
        debugger.start(rank_id=0)
        ops.relu(Tensor(np.full((3,), float(step), np.float32)))
        debugger.stop()
        debugger.step()
    debugger.close()


def test_a_rerun_of_many_steps_says_the_moves_in_two_lines(tmp_path, caplog):
    """A rerun into the same dump_path moves one directory per step aside: the first move is said at
    once, and one line at the end of the run counts them, naming the first and where they are."""
    dump_path = str(tmp_path / "dump")
    _steps(dump_path, 6)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _steps(dump_path, 6)
    said = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
    first = os.path.join(dump_path, "step0", "rank0")
    (aside,) = [n for n in os.listdir(os.path.join(dump_path, "step0")) if n != "rank0"]
    assert len(said) == 2 and said[0].startswith(f"msprobe: {first} already holds a dump"), said
    assert said[1] == (f"msprobe: this run moved 6 directories an earlier run left aside, each to "
                       f"{{name}}.previous-{{time}} beside it (the first: {first} to "
                       f"{os.path.join(dump_path, 'step0', aside)}; under {dump_path})")
    assert all(len(os.listdir(os.path.join(dump_path, f"step{s}"))) == 2 for s in range(6))


def test_second_run_moves_earlier_dump_aside(tmp_path, caplog):
    dump_path = str(tmp_path / "dump")
    _one_step(dump_path, 1.0, rank_id=0)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _one_step(dump_path, 2.0, rank_id=0)
    entries = sorted(os.listdir(os.path.join(dump_path, "step0")))
    assert len(entries) == 2 and entries[0] == "rank0"
    assert re.fullmatch(r"rank0\.previous-\d{8}-\d{6}", entries[1]), entries
    new, old = (os.path.join(dump_path, "step0", e) for e in entries)
    warning = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
    assert len(warning) == 1 and new in warning[0] and old in warning[0]
    # readers see the newest run only; the earlier one is intact beside it
    assert [(s, r) for s, r, _ in msprobe.dump.iter_step_dirs(dump_path)] == [(0, "rank0")]
    for path, value in ((new, 2.0), (old, 1.0)):
        dump = msprobe.dump.load(path)
        leaf = dump.data["Functional.relu.0.forward"]["output"][0]
        assert leaf["Max"] == value
        assert (dump.load_tensor(leaf) == value).all()
    # a third run: both earlier dumps are kept (a second .previous directory)
    _one_step(dump_path, 3.0, rank_id=0)
    assert len(os.listdir(os.path.join(dump_path, "step0"))) == 3


# =============================================================================================== 3. paths, limits
def test_dump_path_with_spaces_and_plus(tmp_path):
    parent = tmp_path / "my dumps+v1"
    parent.mkdir()
    dump_path = str(parent / "run 1+2")
    losses, _ = run_steps(build_mlp(), PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor"), 1)
    dump = msprobe.dump.load(only_step_dir(dump_path, 0))
    leaf = dump.data["Functional.relu.0.forward"]["output"][0]
    assert dump.load_tensor(leaf).max() == pytest.approx(leaf["Max"])


def test_dump_path_parent_missing(tmp_path):
    bad = str(tmp_path / "missing" / "dump")
    with pytest.raises(ConfigError) as err:
        PrecisionDebugger(dump_path=bad, level="L1")
    assert "dump_path" in str(err.value) and bad in str(err.value)
    assert not os.path.exists(tmp_path / "missing")


@pytest.mark.parametrize("below", [("sub",), ("sub", "dump")])
def test_dump_path_under_a_file_says_it_is_a_file(tmp_path, below):
    afile = tmp_path / "afile"
    afile.write_text("x")
    bad = str(afile.joinpath(*below))
    with pytest.raises(ConfigError) as err:
        PrecisionDebugger(dump_path=bad, level="L1")
    text = str(err.value)
    assert text.startswith("config field 'dump_path'") and repr(bad) in text
    assert f"{str(afile)!r} is a file, not a directory" in text and "does not exist" not in text
    assert afile.read_text() == "x"


def test_dump_path_that_is_a_file_says_so(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError) as err:
        PrecisionDebugger(dump_path=str(afile), level="L1")
    text = str(err.value)
    assert text.startswith("config field 'dump_path'") and repr(str(afile)) in text
    assert f"{str(afile)!r} is an existing file, not a directory" in text and "Errno" not in text
    assert text.endswith("allowed: a writable directory (existing or to be created)")
    assert afile.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="runs as root: root ignores directory permissions, so a "
                                              "chmod 555 parent is still writable")
def test_dump_path_parent_read_only(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(ConfigError) as err:
            PrecisionDebugger(dump_path=str(parent / "dump"), level="L1")
        assert "dump_path" in str(err.value)
    finally:
        parent.chmod(0o755)


def _assert_long_names(dump, entry_prefix, expected_by_entry):
    entries = [e for e in dump.data if e.startswith(entry_prefix)]
    assert entries
    for entry in entries:
        for leaf in (leaf for key in ("input_args", "output") for leaf in dump.data[entry].get(key, [])):
            name = leaf["data_name"]
            assert len(name.encode()) <= 255 and name.endswith(".npy")
            assert len(entry.encode()) > 255  # the full name stays in dump.json
            assert os.path.exists(dump.tensor_path(leaf))
            arr = dump.load_tensor(leaf)
            assert arr.max() == pytest.approx(leaf["Max"]) and arr.min() == pytest.approx(leaf["Min"])
    for entry, value in expected_by_entry.items():
        np.testing.assert_allclose(dump.load_tensor(dump.data[entry]["output"][0]), value, rtol=1e-6)


def test_long_custom_api_prefix_shortens_file_names(tmp_path):
    prefix = "P" * 260
    dump_path = str(tmp_path / "dump")
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor")
    debugger.register_custom_api(ops, "relu", prefix)
    try:
        x = Tensor(np.array([-1.0, 0.5, 2.0], np.float32))
        debugger.start()
        ops.relu(x)
        ops.relu(x * 3)   # same long prefix, different call number: a different (unique) file
        debugger.stop()
        debugger.step()
    finally:
        debugger.restore_custom_api(ops, "relu")
    dump = msprobe.dump.load(only_step_dir(dump_path, 0))
    _assert_long_names(dump, prefix, {f"{prefix}.relu.0.forward": [0, 0.5, 2.0],
                                      f"{prefix}.relu.1.forward": [0, 1.5, 6.0]})
    names = {leaf["data_name"] for e in dump.data if e.startswith(prefix)
             for leaf in dump.data[e]["output"]}
    assert len(names) == 2


class _Holder(nn.Cell):
    def __init__(self, attr):
        super().__init__()
        setattr(self, attr, nn.Dense(3, 2, weight_init="ones", bias_init="zeros"))
        self._attr = attr

    def construct(self, x):
        return getattr(self, self._attr)(x)


def test_long_cell_path_shortens_file_names(tmp_path):
    attr = "layer_" + "x" * 250
    net = _Holder(attr)
    dump_path = str(tmp_path / "dump")
    debugger = PrecisionDebugger(dump_path=dump_path, level="L0", task="tensor")
    debugger.start(net)
    net(Tensor(np.array([[1.0, 2.0, 3.0]], np.float32)))
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_path, 0))
    entry = f"Cell.{attr}.Dense.forward.0"
    assert entry in dump.data
    _assert_long_names(dump, f"Cell.{attr}", {entry: [[6.0, 6.0]]})


def _limited_fsize(limit):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # else the kernel kills the writer
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_full_disk_switches_dump_off_and_training_goes_on(tmp_path):
    """RLIMIT_FSIZE (128 KB per file) stands for a full disk: step 2 writes a 256 KB .npy (EFBIG)."""
    dump_path = str(tmp_path / "dump")
    env = _script_env()
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "disk_full_worker.py"), dump_path],
                          preexec_fn=_limited_fsize(128 * 1024), env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DONE" in proc.stdout
    losses = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("LOSSES "))[7:])
    # the training itself is unaffected: same losses as without any limit or tool
    ref_losses = json.loads(subprocess.run(
        [sys.executable, "-c", _REFERENCE_LOSSES], env=env, capture_output=True, text=True,
        timeout=120).stdout.strip().splitlines()[-1])
    assert losses == ref_losses
    errors = [l for l in proc.stderr.splitlines() if "writing the dump failed" in l]
    assert len(errors) == 1, proc.stderr[-3000:]       # ONE clear error, not one per tensor
    assert "switched off" in errors[0]
    assert sorted(os.listdir(dump_path)) == ["step0", "step1", "step2"]   # nothing after the failure
    for step in (0, 1):
        dump = msprobe.dump.load(only_step_dir(dump_path, step))
        assert dump.complete and "Functional.mse_loss.0.forward" in dump.data
    step2 = only_step_dir(dump_path, 2)
    dump = msprobe.dump.load(step2)
    assert dump.complete is False
    # what was flushed before the failure is there and loads (the 1st relu, journaled by the flush
    # deadline during the pause); the batch that failed (the big relu) is not
    leaf = dump.data["Functional.relu.0.forward"]["input_args"][0]
    assert dump.load_tensor(leaf).tolist() == [-3, -2, -1, 0, 1, 2]
    assert "Primitive.matmul.MatMul.0.backward" in dump.data
    assert "Functional.relu.1.forward" not in dump.data
    with open(os.path.join(step2, "dump_error_info.log"), encoding="utf-8") as f:
        assert "writing the dump failed" in f.read()
    # no truncated .npy left behind
    assert all(os.path.getsize(p) < 128 * 1024 for p in glob.glob(os.path.join(step2, "dump_tensor_data", "*")))


_REFERENCE_LOSSES = """
import mindspore as ms, numpy as np, json
ms.set_device("CPU"); ms.runtime.launch_blocking()
from mindspore import Tensor, nn, ops
ms.set_seed(0)
net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
params = net.trainable_params(); opt = nn.SGD(params, learning_rate=0.1)
rng = np.random.RandomState(0)
x = Tensor(rng.randn(4, 8).astype(np.float32)); y = Tensor(rng.randn(4, 4).astype(np.float32))
grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
losses = []
for _ in range(6):
    loss, grads = grad_fn(x, y); opt(grads); losses.append(float(loss.asnumpy()))
print(json.dumps(losses))
"""


# =============================================================================================== 4. concurrency
class _Mul(nn.Cell):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def construct(self, x):
        return ops.mul(x, self.scale)


class _Net(nn.Cell):
    """``relu(x * scale)`` with the multiplication in a sub-Cell. No Parameters: MindSpore 2.10 itself
    crashes (SIGSEGV, without msprobe) when two threads run Cells holding Parameters concurrently."""

    def __init__(self, scale):
        super().__init__()
        self.mul = _Mul(scale)

    def construct(self, x):
        return ops.relu(self.mul(x))


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_two_threads_two_cells(tmp_path, level):
    calls = 25
    scales, base = (2.0, 3.0), (0.0, 1000.0)      # thread t runs nets[t] on base[t] + i in call i
    nets = [_Net(s) for s in scales]
    dump_path = str(tmp_path / "dump")
    debugger = PrecisionDebugger(dump_path=dump_path, level=level, task="statistics")
    debugger.start(nets)
    errors = []
    barrier = threading.Barrier(2)

    def run(t):
        try:
            barrier.wait()
            for i in range(calls):
                nets[t](Tensor(np.full((2, 4), base[t] + i, np.float32)))
        except Exception as exc:  # reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(t,)) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    debugger.stop()
    debugger.step()
    assert not errors
    path = only_step_dir(dump_path, 0)
    with open(os.path.join(path, "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]       # valid JSON
    with open(os.path.join(path, "construct.json"), encoding="utf-8") as f:
        construct = json.load(f)
    with open(os.path.join(path, "stack.json"), encoding="utf-8") as f:
        assert json.load(f)

    def thread_of(value):
        return 0 if value < 1000 else 1

    if level in ("L0", "mix"):
        # each Cell ran in one thread, in order: call k of Cell t saw input base[t] + k
        for t in (0, 1):
            for k in range(calls):
                body = data[f"Cell.{t}.mul._Mul.forward.{k}"]
                assert body["input_args"][0]["Max"] == base[t] + k
                assert body["output"][0]["Max"] == scales[t] * (base[t] + k)
    if level in ("L1", "mix"):
        # ops.mul calls of both threads share one counter: every number exactly once, and each
        # record's output belongs to its own input (and, in mix, to its own thread's Cell)
        muls = {k: v for k, v in data.items() if k.startswith("Functional.mul.")}
        assert sorted(muls) == sorted(f"Functional.mul.{n}.forward" for n in range(2 * calls))
        seen = set()
        for name, body in muls.items():
            x = body["input_args"][0]["Max"]
            t = thread_of(x)
            assert body["input_args"][0]["Min"] == x                  # one call's tensor, not a mix
            assert body["input_args"][1]["value"] == scales[t]
            assert body["output"][0]["Max"] == scales[t] * x
            seen.add(x)
            if level == "mix":
                parent = construct[name]
                assert re.fullmatch(rf"Cell\.{t}\.mul\._Mul\.forward\.\d+", parent), (name, parent)
                assert data[parent]["input_args"][0]["Max"] == x
        assert seen == {b + i for b in base for i in range(calls)}
        relus = [v for k, v in data.items() if k.startswith("Functional.relu.")]
        assert len(relus) == 2 * calls
        for body in relus:
            x = body["input_args"][0]["Max"]
            assert body["output"][0]["Max"] == x and x / scales[thread_of(x)] in seen


def test_fork_child_writes_nothing(tmp_path):
    """After start(), a multiprocessing 'fork' child calls ops (and even stop/step), and an os.fork
    child runs msprobe's exit handler: neither writes a byte into the parent's dump nor crashes.

    Runs in a fresh process (tests/scripts/fork_worker.py): forking the pytest process after many
    MindSpore threads have run can deadlock inside MindSpore itself."""
    dump_path = str(tmp_path / "dump")
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "fork_worker.py"), dump_path],
                          env=_script_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:])
    assert result["mp_child_value"] == [1.0, 3.0]
    assert result["mp_child_exitcode"] == 0
    assert result["fork_child_status"] == 0
    assert result["before"] and any(k.endswith("dump.journal") for k in result["before"])
    assert result["after_mp_child"] == result["before"]       # not a byte written by the children
    assert result["after_fork_child"] == result["before"]
    assert os.listdir(dump_path) == ["step0"]
    assert len(os.listdir(os.path.join(dump_path, "step0"))) == 1   # no proc{child pid} directory
    dump = msprobe.dump.load(only_step_dir(dump_path, 0))
    assert dump.complete
    assert sorted(e for e in dump.data if "relu" in e) == ["Functional.relu.0.forward",
                                                           "Functional.relu.1.forward"]
    assert dump.data["Functional.relu.1.forward"]["output"][0]["Max"] == 4.0


def _rss_series(dump_path, steps, *extra):
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gc_memory_worker.py"), dump_path,
                           str(steps), *extra], env=_script_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GC_ENABLED False" in proc.stdout
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RSS "))[4:])


def test_gc_disabled_memory_stays_flat(tmp_path):
    """gc.disable() in the user script, ``step: [0]``, 50 steps: RSS after step 1 stays flat (the
    tool leaves no reference cycles behind that only the collector could free)."""
    rss = _rss_series(str(tmp_path / "dump"), 50)
    base = _rss_series(str(tmp_path / "off"), 50, "off")
    growth, base_growth = rss[-1] - rss[1], base[-1] - base[1]
    mb = 1 << 20
    assert growth < 4 * mb, f"RSS grew {growth / mb:.2f} MB over steps 1-49 with the tool"
    assert growth - base_growth < 2 * mb, (growth / mb, base_growth / mb)
    assert os.listdir(str(tmp_path / "dump")) == ["step0"]


@pytest.mark.slow
def test_msrun_watch_names_the_rank_that_produced_the_nan(msrun_out):
    """Watch mode under msrun: rank 1 makes a NaN at step 1; rank 0 only receives it through the
    gradients' all-reduce. Rank 1's anomalies.json names the op, rank 0's names the collective and
    says the value came from another rank."""
    watch = msrun_out / "watch"
    found = {}
    for rank in (0, 1):
        with open(watch / "step1" / f"rank{rank}" / "anomalies.json", encoding="utf-8") as f:
            found[rank] = json.load(f)
        assert found[rank]["step"] == 1 and found[rank]["rank"] == rank and found[rank]["kind"] == "nan"
        assert (watch / f"watch_heartbeat.rank{rank}.json").exists()
    assert found[1]["producer"] == "Functional.log.0.forward" and found[1]["via_collective"] is False
    assert found[0]["producer"].startswith("MintDistributed.all_reduce.") and found[0]["via_collective"] is True
    assert not (watch / "step2").exists()        # after the anomaly, nothing more is written


def _npy_bytes(directory) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(directory, "dump_tensor_data", "*.npy")))


def test_tensor_budget_switches_to_statistics(make_debugger, dump_dir, caplog):
    budget_mb = 0.01                  # 10485 bytes; each call saves 2 x 1024 bytes of float32 data
    debugger = make_debugger(task="tensor", level="L1", step=[0, 1], section={"tensor_budget_mb": budget_mb})
    x = Tensor(np.linspace(-1, 1, 256).astype(np.float32))
    with caplog.at_level(logging.INFO, logger="msprobe"):
        for _ in range(2):
            debugger.start()
            for _ in range(300):      # one API called many times in a Python loop
                ops.relu(x)
            debugger.stop()
            debugger.step()
    d0, dump0 = load_step(dump_dir, 0)
    d1, dump1 = load_step(dump_dir, 1)
    assert len(dump0.data) == 300 and len(dump1.data) == 300           # every call still recorded
    saved = [k for k, v in dump0.data.items() if "data_name" in v["output"][0]]
    assert saved == [f"Functional.relu.{k}.forward" for k in range(len(saved))] and 4 <= len(saved) <= 6
    files = glob.glob(os.path.join(d0, "dump_tensor_data", "*.npy"))
    saved_bytes = len(files) * (1024 + 128)   # .npy headers (128 bytes each) count too
    assert saved_bytes - 1152 < budget_mb * 2**20 <= saved_bytes     # stops at the value that crosses
    assert _npy_bytes(d0) == saved_bytes and _npy_bytes(d1) == 0
    last = dump1.data["Functional.relu.299.forward"]["output"][0]
    assert last["Max"] == 1.0 and last["Min"] == 0.0 and "data_name" not in last
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "tensor_budget_mb" in m] == [
        f"msprobe: tensor_budget_mb=0.01 (10.2 KB) reached: {saved_bytes / 1024:.1f} KB of .npy files saved, "
        "the last recorded value's 1.1 KB included; the dump switches to statistics for the rest of the run "
        "(no more .npy files)"]
    assert sum("step 0 wrote" in m and "2 configured steps" in m for m in messages) == 1


@pytest.mark.parametrize("bad", [-1, 0, "10", True])
def test_tensor_budget_validated(tmp_path, bad):
    from msprobe.mindspore import PrecisionDebugger

    path = write_config(tmp_path, task="tensor", dump_path=str(tmp_path / "d"), section={"tensor_budget_mb": bad})
    with pytest.raises(ConfigError, match="tensor.tensor_budget_mb"):
        PrecisionDebugger(path)
