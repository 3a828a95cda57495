"""The tool's promises to the program it observes (real MindSpore, CPU):

* a failure of the user's computation reaches the user with its type and message, under MindSpore's
  default asynchronous launch (where the failure surfaces at a later synchronisation or tensor
  read, possibly the tool's) and with ``launch_blocking``;
* nothing of the user's (Cells, Parameters) is kept alive after ``step()``, process-wide settings
  are given back when the debugger is done, and a sweep over many models stays flat in memory;
* records reach the disk within a second of their call even when the program makes no further call
  (a hang), so a ``kill -9`` loses nothing older;
* the seed's ``dump.json is at …`` message is shown without any logging configuration, and an empty
  step's ``empty_reason`` names only causes that happened;
* ``with debugger.dump(model):`` / ``with debugger:`` are start/stop; the block's exception reaches the
  caller unchanged, and README's example of them runs as written.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
import weakref

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import msprobe.dump
from conftest import build_mlp, mlp_batch, only_step_dir
from msprobe.mindspore import PrecisionDebugger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def _env():
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run(script: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _prelude(blocking: bool) -> str:
    return textwrap.dedent(f"""
        import os, sys, time
        import numpy as np, mindspore as ms
        from mindspore import ops, Tensor
        ms.set_device("CPU")
        if {blocking!r}:
            ms.runtime.launch_blocking()
        from msprobe.mindspore import PrecisionDebugger
    """)


# ============================================================================ user failures
_ADD_LOOP = """
debugger = PrecisionDebugger(dump_path={dump!r}, level="L1") if {tool!r} else None
if debugger:
    debugger.start()
a = Tensor(np.ones((4, 3), np.float32))
b = Tensor(np.ones((4, 3), np.float32))
bad = Tensor(np.ones((5, 2), np.float32))
i = -1
try:
    for i in range(400):
        y = ops.add(a, bad if i == 299 else b)
    y.shape          # a synchronisation: without the tool the failure surfaces here at the latest
    print("NO ERROR")
except Exception as exc:
    print("CAUGHT", type(exc).__name__, str(exc).splitlines()[0])
    print("AT", i)
if debugger:
    debugger.stop()
    debugger.step()
print("DONE")
"""


def _caught(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(("CAUGHT", "NO ERROR")))


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "launch_blocking"])
def test_user_failure_reaches_user_with_type_and_message(tmp_path, blocking):
    """400 ``ops.add`` calls, the 300th with shapes that cannot broadcast: with the tool at L1 the
    program catches the same ValueError (type and message) as without it, nothing is logged as a
    tool failure, and the calls before it are in the dump."""
    dump = str(tmp_path / "dump")
    runs = {}
    for tool in (False, True):
        proc = _run(_prelude(blocking) + _ADD_LOOP.format(dump=dump, tool=tool))
        assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
        runs[tool] = proc
    reference = _caught(runs[False].stdout)
    assert reference.startswith("CAUGHT ValueError For 'Add'"), runs[False].stdout
    assert _caught(runs[True].stdout) == reference
    assert "failed to record" not in runs[True].stderr + runs[True].stdout
    d = only_step_dir(dump, 0)
    assert not os.path.exists(os.path.join(d, "dump_error_info.log"))
    data = msprobe.dump.load(d).data
    for k in range(299):  # every call before the failing one, with its output
        assert data[f"Functional.add.{k}.forward"]["output"][0]["Max"] == 2.0
    if blocking:  # the failing call raised at once: its inputs are recorded, no output
        assert "output" not in data["Functional.add.299.forward"]


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "launch_blocking"])
def test_failure_found_by_the_flush_is_raised_at_stop(tmp_path, blocking):
    """An asynchronous failure of an operation the tool does not hook (a Primitive without
    ``start(model)``) that only the tool's flush at ``stop()`` synchronises: ``stop()`` raises it,
    after writing the files; the next step records normally."""
    script = _prelude(blocking) + textwrap.dedent(f"""
        debugger = PrecisionDebugger(dump_path={str(tmp_path / "dump")!r}, level="L1")
        a = Tensor(np.ones((4, 3), np.float32))
        debugger.start()
        ops.relu(a)
        try:
            z = ops.Add()(a, Tensor(np.ones((5, 2), np.float32)))   # not hooked
            ops.relu(a)
            debugger.stop()
            print("NO ERROR")
        except ValueError as exc:
            print("CAUGHT", type(exc).__name__, str(exc).splitlines()[0])
        debugger.step()
        debugger.start()
        ops.relu(a)
        debugger.stop()
        debugger.step()
        print("DONE")
    """)
    proc = _run(script)
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    assert "CAUGHT ValueError For 'Add'" in proc.stdout
    step0 = msprobe.dump.load(only_step_dir(str(tmp_path / "dump"), 0))
    assert step0.complete and "Functional.relu.0.forward" in step0.data
    if not blocking:  # the failure surfaced in the tool's synchronisation
        assert "Functional.relu.1.forward" in step0.data
    step1 = msprobe.dump.load(only_step_dir(str(tmp_path / "dump"), 1))
    assert list(step1.data) == ["Functional.relu.0.forward"]


def test_failure_met_by_the_flush_thread_is_raised_at_the_next_call(tmp_path):
    """Asynchronous launch: an unhooked operation fails, the program pauses, and the background
    flush's synchronisation meets the failure: the program's next recorded call raises it."""
    script = _prelude(False) + textwrap.dedent(f"""
        debugger = PrecisionDebugger(dump_path={str(tmp_path / "dump")!r}, level="L1")
        a = Tensor(np.ones((4, 3), np.float32))
        debugger.start()
        ops.relu(a)
        ops.Add()(a, Tensor(np.ones((5, 2), np.float32)))   # not hooked; fails asynchronously
        time.sleep(1.5)                                       # the flush thread synchronises
        try:
            ops.relu(a)
            print("NO ERROR")
        except ValueError as exc:
            print("CAUGHT", type(exc).__name__, str(exc).splitlines()[0])
        debugger.stop()
        debugger.step()
        print("DONE")
    """)
    proc = _run(script)
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    assert "CAUGHT ValueError For 'Add'" in proc.stdout
    data = msprobe.dump.load(only_step_dir(str(tmp_path / "dump"), 0)).data
    assert data["Functional.relu.0.forward"]["output"][0]["Max"] == 1.0


# ============================================================================ hang and kill
@pytest.mark.parametrize("blocking", [False, True], ids=["async", "launch_blocking"])
def test_records_reach_disk_during_a_hang(tmp_path, blocking):
    """A program records some calls, then hangs (sleeps forever); 1.5 s later it is killed with
    SIGKILL: every record is in the journal, with its statistics and its ``.npy`` file."""
    dump = str(tmp_path / "dump")
    script = _prelude(blocking) + textwrap.dedent(f"""
        debugger = PrecisionDebugger(dump_path={dump!r}, level="L1", task="tensor")
        debugger.start()
        x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        y = ops.relu(x - 5)
        z = ops.matmul(y, ops.transpose(x, (1, 0)))
        w = ops.softmax(z)
        print("READY", flush=True)
        while True:
            time.sleep(60)       # a collective that never returns
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), proc.stderr.read()[-3000:]
        time.sleep(1.5)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    d = only_step_dir(dump, 0)
    loaded = msprobe.dump.load(d)
    assert loaded.complete is False  # the journal of a killed process
    names = ["Tensor.__sub__.0.forward", "Functional.relu.0.forward", "Functional.transpose.0.forward",
             "Functional.matmul.0.forward", "Functional.softmax.0.forward"]
    assert [n for n in loaded.data if n in names] == names
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected = {"Functional.relu.0.forward": np.maximum(x - 5, 0)}
    expected["Functional.matmul.0.forward"] = expected["Functional.relu.0.forward"] @ x.T
    for name, value in expected.items():
        leaf = loaded.data[name]["output"][0]
        assert leaf["Max"] == float(value.max())
        np.testing.assert_array_equal(loaded.load_tensor(leaf), value)
    streamed = {piece.entry for piece in msprobe.dump.iter_entries(d)}
    assert set(names) <= streamed


# ============================================================================ nothing kept
@pytest.mark.parametrize("level", ["L1", "L0", "mix"])
def test_network_not_kept_alive_after_step(make_debugger, level):
    """After start(net) / forward+backward / stop() / step() and ``del net``, the net, its Cells and
    its Parameters are freed although the debugger lives on; a new net is then captured."""
    debugger = make_debugger(task="statistics", level=level)

    def one_step():
        net = build_mlp()
        x, _ = mlp_batch()
        grad_fn = ms.grad(lambda a: ops.sum(net(a) ** 2), None, net.trainable_params())
        debugger.start(net)
        grad_fn(x)
        debugger.stop()
        debugger.step()
        return weakref.ref(net), weakref.ref(net.fc1), weakref.ref(net.fc1.weight)

    refs = one_step()
    gc.collect()
    assert [r() is None for r in refs] == [True, True, True]
    refs = one_step()   # a second model under the same debugger is captured as the first
    gc.collect()
    assert all(r() is None for r in refs)
    first = msprobe.dump.load(only_step_dir(debugger.config.dump_path, 0)).data
    second = msprobe.dump.load(only_step_dir(debugger.config.dump_path, 1)).data
    assert sorted(first) == sorted(second) and first


def test_model_sweep_memory_stays_flat(tmp_path):
    """100 models (~1 MB of Parameters each) one after another under one debugger at mix level:
    RSS after model 10 and after model 100 differ by less than 10 MB (a model kept per step would
    add ~100 MB)."""
    rss = {}
    procs = {mode: subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "model_sweep_worker.py"),
                                     str(tmp_path / mode), "100", "mix", mode], env=_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode in ("on", "off")}  # at the same time: each measures its own RSS
    for mode, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        rss[mode] = json.loads(next(l for l in stdout.splitlines() if l.startswith("RSS "))[4:])
    mb = 1 << 20
    growth = rss["on"][-1] - rss["on"][9]
    assert growth < 10 * mb, f"RSS grew {growth / mb:.1f} MB over models 10-100"
    assert len(os.listdir(str(tmp_path / "on"))) == 100


def test_process_state_given_back_when_done(make_debugger):
    """sys.excepthook is chained while a debugger runs and restored once it has dumped its last
    configured step (its flush thread ends then too); the gen-0 GC threshold is the user's again
    after stop()."""
    gc.collect()  # debuggers of earlier tests are gone, and with them their hook
    before_hook, before_gc = sys.excepthook, gc.get_threshold()
    assert not getattr(before_hook, "_msprobe", False)
    debugger = make_debugger(task="statistics", level="L1", step=[0])
    assert sys.excepthook is not before_hook
    debugger.start()
    ops.relu(Tensor(np.ones(3, np.float32)))
    debugger.stop()
    assert gc.get_threshold() == before_gc
    flusher = debugger.service.runtime._timer.thread   # started by the step's first record
    debugger.step()
    assert sys.excepthook is before_hook
    flusher.join(timeout=5)                             # the flush thread ends with the dump
    assert not flusher.is_alive()
    # a debugger dropped before it is done gives the hook back too
    other = PrecisionDebugger(dump_path=debugger.config.dump_path + "_2", level="L1")
    assert sys.excepthook is not before_hook
    del other
    gc.collect()
    assert sys.excepthook is before_hook


# ============================================================================ messages
def test_dump_location_is_shown_without_logging_setup(tmp_path):
    """The seed prints ``dump.json is at <path>`` once per dumped step; no logging configured."""
    dump = str(tmp_path / "dump")
    script = _prelude(True) + textwrap.dedent(f"""
        debugger = PrecisionDebugger(dump_path={dump!r}, level="L1")
        for _ in range(2):
            debugger.start()
            ops.relu(Tensor(np.ones(3, np.float32)))
            debugger.stop()
            debugger.step()
    """)
    proc = _run(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = [line for line in proc.stdout.splitlines() if " is at " in line]
    assert shown == [f"dump.json is at {only_step_dir(dump, 0)}", f"dump.json is at {only_step_dir(dump, 1)}"]


def test_dump_location_goes_through_configured_logging(tmp_path):
    dump = str(tmp_path / "dump")
    script = "import logging\nlogging.basicConfig(level=logging.INFO)\n" + _prelude(True) + textwrap.dedent(f"""
        debugger = PrecisionDebugger(dump_path={dump!r}, level="L1")
        debugger.start()
        ops.relu(Tensor(np.ones(3, np.float32)))
        debugger.stop()
        debugger.step()
    """)
    proc = _run(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " is at " not in proc.stdout
    assert f"INFO:msprobe:msprobe: dump.json is at {only_step_dir(dump, 0)}" in proc.stderr


def test_a_failed_call_is_recorded_with_forward_outputs_only(make_debugger, dump_dir):
    """A step whose only hooked call raised (its output never existed), recording forward outputs
    only: the call's entry holds its ``error`` (what stands for the output), so the step is not empty
    and no data_mode is blamed."""
    debugger = make_debugger(task="statistics", level="L1",
                             section={"data_mode": ["forward", "output"]})
    debugger.start()
    with pytest.raises(ValueError) as info:
        ops.add(Tensor(np.ones((4, 3), np.float32)), Tensor(np.ones((5, 2), np.float32)))
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))
    assert "empty_reason" not in dump.header
    message = str(info.value).strip().splitlines()[0]
    assert dump.data == {"Functional.add.0.forward": {"error": f"the call raised ValueError: {message}"}}

    debugger = make_debugger(task="statistics", level="L1", dump_path=dump_dir + "_2")
    debugger.start()
    ops.relu(Tensor(np.ones(3, np.float32)))
    debugger.stop()
    debugger.step()
    assert "empty_reason" not in msprobe.dump.load(only_step_dir(dump_dir + "_2", 0)).header


def test_empty_reason_names_an_asynchronous_failure(tmp_path):
    """Asynchronous launch, forward outputs only: the step's only hooked call gets the output of a
    failed (unhooked) operation, so its output cannot exist; empty_reason names MindSpore's error
    and does not blame data_mode, which selected that output."""
    dump = str(tmp_path / "dump")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": dump,
                               "statistics": {"data_mode": ["forward", "output"]}}))
    script = _prelude(False) + textwrap.dedent(f"""
        debugger = PrecisionDebugger({str(cfg)!r})
        a = Tensor(np.ones((4, 3), np.float32))
        debugger.start()
        try:
            ops.relu(ops.Add()(a, Tensor(np.ones((5, 2), np.float32))))
        except ValueError:
            print("CAUGHT")
        debugger.stop()
        debugger.step()
    """)
    proc = _run(script)
    assert proc.returncode == 0 and "CAUGHT" in proc.stdout, proc.stderr[-3000:]
    reason = msprobe.dump.load(only_step_dir(dump, 0)).header["empty_reason"]
    assert reason.startswith("1 hooked call ran in this step, but the program's computation failed "
                             "(ValueError: For 'Add', input1.shape and input2.shape need to broadcast")
    assert "selected none" not in reason and "tool failed" not in reason


def test_an_asynchronous_failure_between_windows_reaches_the_program():
    """Asynchronous launch: an operation of the user's that fails between two start()/stop() windows
    of one step, its result never read, is raised to the program inside the second window as without
    the tool (the tool reads the model's Parameters at that start() to tell windows from steps)."""
    script = _prelude(False) + textwrap.dedent("""
        import tempfile
        from mindspore import nn
        tool = sys.argv[1] == "on"
        net = nn.Dense(3, 2)
        x = Tensor(np.ones((4, 3), np.float32))
        debugger = PrecisionDebugger(dump_path=tempfile.mkdtemp(), level="L0") if tool else None
        if tool:
            debugger.start(net)
        net(x)
        if tool:
            debugger.stop()
        bad = ops.Add()(x, Tensor(np.ones((5, 2), np.float32)))  # fails asynchronously, never read
        try:
            if tool:
                debugger.start(net)
            net(x).asnumpy()
            if tool:
                debugger.stop()
            print("NO ERROR")
        except ValueError as exc:
            print("CAUGHT", str(exc).splitlines()[0])
        if tool:
            debugger.step()
    """)
    lines = {}
    for mode in ("off", "on"):
        proc = subprocess.run([sys.executable, "-c", script, mode], env=_env(), capture_output=True,
                              text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines[mode] = [line for line in proc.stdout.splitlines() if line.startswith(("CAUGHT", "NO ERROR"))]
    assert lines["off"][0].startswith("CAUGHT For 'Add'"), lines
    assert lines["on"] == lines["off"]


# ============================================================================ context manager
def test_with_blocks_are_start_and_stop(make_debugger, dump_dir):
    """``with debugger.dump(net):`` and ``with debugger:`` record what start()/stop() record; an
    exception in the block reaches the caller unchanged and the hooks are removed."""
    net = build_mlp()
    debugger = make_debugger(task="statistics", level="mix")
    x, y = mlp_batch()
    debugger.start(net)                                     # step 0: start/stop/step
    ops.mse_loss(net(x), y)
    debugger.stop()
    debugger.step()
    with debugger.dump(net):                                # step 1
        ops.mse_loss(net(x), y)
    debugger.step()
    with debugger:                                          # step 2: the model given earlier
        ops.mse_loss(net(x), y)
    debugger.step()
    with pytest.raises(ZeroDivisionError, match="user's"):
        with debugger:
            raise ZeroDivisionError("the user's error")
    assert not debugger.service.active and ops.relu.__module__.startswith("mindspore")
    debugger.step()
    with open(os.path.join(only_step_dir(dump_dir, 3), "dump.json"), encoding="utf-8") as f:
        assert "ZeroDivisionError" in json.load(f)["abnormal"]     # the dump says the step failed
    forward = [n for n in msprobe.dump.load(only_step_dir(dump_dir, 0)).data if ".forward" in n]
    for step in (1, 2):
        data = msprobe.dump.load(only_step_dir(dump_dir, step)).data
        assert [n for n in data if ".forward" in n] == forward


class _FailingHead(nn.Cell):
    """Dense(4, 2) whose forward raises the user's own error when ``fail`` is set."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 2)
        self.fail = False
        self.raised = None

    def construct(self, h):
        if self.fail:
            self.raised = ValueError("the user's forward failed")
            raise self.raised
        return self.fc(h)


def _train_with_blocks(debugger, steps: int, fail_at: int):
    """SGD steps of build_mlp() + _FailingHead, each inside ``with debugger.dump(net):`` (tool-off
    when ``debugger`` is None); step ``fail_at`` raises in the head's forward. That forward runs
    outside ``value_and_grad``: in MindSpore 2.10 two ``value_and_grad`` calls whose forward raised
    leave the process's PyNative state broken (``Tensor[1]`` then raises TypeError), tool on or off."""
    net = nn.SequentialCell(build_mlp(), _FailingHead())
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=0.1)
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
    x, _ = mlp_batch()
    y = Tensor(np.ones((4, 2), np.float32))
    losses, grads, caught = [], [], None
    for step in range(steps):
        net[1].fail = step == fail_at
        block = debugger.dump(net) if debugger is not None else contextlib.nullcontext()
        try:
            with block:
                if step == fail_at:
                    net(x)
                loss, g = grad_fn(x, y)
                opt(g)
        except ValueError as exc:
            caught = exc
        else:
            losses.append(loss.asnumpy().copy())
            grads.append([t.asnumpy().copy() for t in g])
        if debugger is not None:
            debugger.step()
    return losses, grads, caught, net[1].raised


def test_with_block_on_a_training_network(make_debugger, dump_dir):
    """Three training steps of a real network, each ``with debugger.dump(net):``; the second one
    raises in a Cell's forward. Losses and gradients are bit-identical to tool-off, the exception is
    the user's own object with its traceback, each step directory holds its files, and the failed
    step's dump keeps what ran before the failure and says why it ended."""
    off_losses, off_grads, _, _ = _train_with_blocks(None, 3, fail_at=1)
    debugger = make_debugger(task="statistics", level="mix")
    losses, grads, caught, raised = _train_with_blocks(debugger, 3, fail_at=1)
    assert [a.tobytes() for a in losses] == [a.tobytes() for a in off_losses]
    assert [[a.tobytes() for a in g] for g in grads] == [[a.tobytes() for a in g] for g in off_grads]
    assert caught is raised and str(caught) == "the user's forward failed"
    raise_frame = traceback.extract_tb(caught.__traceback__)[-1]
    assert raise_frame.name == "construct" and raise_frame.line == "raise self.raised"
    assert not debugger.service.active and ops.relu.__module__.startswith("mindspore")
    for step in range(3):
        d = only_step_dir(dump_dir, step)
        assert {"dump.json", "stack.json", "construct.json"} <= set(os.listdir(d)), os.listdir(d)
    ok = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    assert "Cell.1.fc.Dense.forward.0" in ok and "Cell.1.fc.Dense.backward.0" in ok
    assert set(msprobe.dump.load(only_step_dir(dump_dir, 2)).data) == set(ok)
    with open(os.path.join(only_step_dir(dump_dir, 1), "dump.json"), encoding="utf-8") as f:
        failed = json.load(f)
    assert "ValueError: the user's forward failed" in failed["abnormal"]
    assert "Cell.0.fc1.Dense.forward.0" in failed["data"]           # recorded before the failure
    assert not any(name.startswith("Cell.1.fc.") for name in failed["data"])


def test_readme_with_block_example_runs(tmp_path):
    """The script of README's "`with` blocks" section, run as written: three step directories, the
    user's exception caught by the user, the failed step marked abnormal with its records kept."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("### `with` blocks\n"):]
    script = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "caught: my step failed" in proc.stdout
    dump = str(tmp_path / "with_dump")
    assert [msprobe.dump.load(only_step_dir(dump, step)).complete for step in range(3)] == [True] * 3
    with open(os.path.join(only_step_dir(dump, 2), "dump.json"), encoding="utf-8") as f:
        failed = json.load(f)
    assert failed["abnormal"].startswith("the with-block raised RuntimeError: my step failed")
    assert "Cell.0.Dense.forward.0" in failed["data"]
