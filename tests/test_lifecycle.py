"""start / stop / step lifecycle, step numbering, directory layout and crash safety (real MindSpore)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, nn, ops

import msprobe.dump
from conftest import build_mlp, hook_count, mlp_batch, only_step_dir, run_steps, write_config, write_config_with_dump
from msprobe.read.report import EMPTY_REASON
from msprobe.engine.runtime import NO_MODEL_REASON as NO_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _x():
    return Tensor(np.array([-1.0, 0.5, 2.0], np.float32))


def _steps_present(dump_dir):
    return sorted(n for n in os.listdir(dump_dir) if n.startswith("step"))


def test_step_filter(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics", step=[1, 3])
    run_steps(build_mlp(), debugger, 4)
    assert _steps_present(dump_dir) == ["step1", "step3"]
    for step in (1, 3):
        data = msprobe.dump.load(only_step_dir(dump_dir, step)).data
        assert "Functional.relu.0.forward" in data and "Functional.relu.0.backward" in data


def test_configured_steps_the_run_never_reached_are_named_at_close(make_debugger, dump_dir, caplog):
    debugger = make_debugger(task="statistics", step=[1, 3, 7, 9])
    run_steps(build_mlp(), debugger, 4)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        debugger.service.close()
        debugger.service.close()  # at exit again: said once
    said = [r.getMessage() for r in caplog.records if "nothing was dumped for configured step" in r.getMessage()]
    assert said == ["msprobe: nothing was dumped for configured step(s) [7, 9]: no start() ran in them "
                    "(the step counter stood at 4 at the end; steps count from 0, one per step() call)"]
    assert _steps_present(dump_dir) == ["step1", "step3"]


def test_set_init_step(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")
    debugger.set_init_step(5)
    x = _x()
    for _ in range(2):
        debugger.start()
        ops.relu(x)
        debugger.stop()
        debugger.step()
    assert _steps_present(dump_dir) == ["step5", "step6"]
    for step in (5, 6):
        assert list(msprobe.dump.load(only_step_dir(dump_dir, step)).data) == ["Functional.relu.0.forward"]


def test_segmented_start_stop_keeps_counting(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")
    x = _x()
    debugger.start()
    ops.relu(x)
    debugger.stop()
    ops.relu(x * 10)            # between segments: not recorded, not counted
    x2 = x * 2
    debugger.start()
    ops.relu(x2)
    debugger.stop()
    mid = msprobe.dump.load(only_step_dir(dump_dir, 0))   # stop() wrote the files so far
    assert list(mid.data) == ["Functional.relu.0.forward", "Functional.relu.1.forward"]
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))
    assert dump.complete
    assert list(dump.data) == ["Functional.relu.0.forward", "Functional.relu.1.forward"]
    assert dump.data["Functional.relu.0.forward"]["output"][0]["Max"] == 2.0
    assert dump.data["Functional.relu.1.forward"]["output"][0]["Max"] == 4.0
    assert _steps_present(dump_dir) == ["step0"]


def _windows_per_step(debugger, net, steps: int, windows: int, call_step: bool) -> None:
    """``steps`` iterations of ``windows`` start/forward+backward/stop windows each, one SGD update
    per iteration (gradient accumulation when ``windows`` > 1); ``step()`` after each iteration
    when ``call_step``."""
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    x, y = mlp_batch()
    grad_fn = ms.value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, opt.parameters)
    for _ in range(steps):
        total = None
        for _ in range(windows):
            debugger.start(net)
            _, grads = grad_fn(x, y)
            total = grads if total is None else tuple(t + g for t, g in zip(total, grads))
            debugger.stop()
        opt(total)
        if call_step:
            debugger.step()


def _step_reminders(caplog) -> list:
    return [r.getMessage() for r in caplog.records if "call debugger.step()" in r.getMessage()]


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_a_loop_without_step_is_pointed_out_once(make_debugger, dump_dir, caplog, level):
    """start()/stop() per training iteration without step(): everything goes into step 0 (as
    before), and one WARNING says why and what to call, naming the Parameter the optimizer changed."""
    debugger = make_debugger(task="statistics", level=level)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _windows_per_step(debugger, build_mlp(), steps=4, windows=1, call_step=False)
        debugger.step()
    said = _step_reminders(caplog)
    assert len(said) == 1, said
    assert "Parameters changed between two start() calls of step 0 (4 of the 4 smallest ones compared changed: " in said[0]
    assert "every iteration until the next step() is written into step 0's directory" in said[0]
    assert _steps_present(dump_dir) == ["step0"]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_one_forgotten_step_is_pointed_out_at_the_next_window(make_debugger, dump_dir, caplog, level):
    """A training step whose step() is missing: the next iteration's start() (the step's second
    window) already sees the optimizer's update (the Parameters are read at the step's first window)."""
    debugger = make_debugger(task="statistics", level=level)
    net = build_mlp()
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _windows_per_step(debugger, net, steps=1, windows=1, call_step=True)
        _windows_per_step(debugger, net, steps=2, windows=1, call_step=False)
        debugger.step()
    said = _step_reminders(caplog)
    assert len(said) == 1 and "Parameters changed between two start() calls of step 1" in said[0], said
    assert _steps_present(dump_dir) == ["step0", "step1"]


def test_gradient_accumulation_windows_are_not_pointed_out(make_debugger, dump_dir, caplog):
    """Several start()/stop() windows in one step without an optimizer update between them (gradient
    accumulation) are legitimate: no reminder."""
    debugger = make_debugger(task="statistics", level="L0")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _windows_per_step(debugger, build_mlp(), steps=2, windows=4, call_step=True)
    assert _step_reminders(caplog) == []
    assert _steps_present(dump_dir) == ["step0", "step1"]


def test_many_windows_without_a_model_are_pointed_out(make_debugger, dump_dir, caplog):
    """Without a model there are no Parameters to compare: the reminder comes at the 8th window of
    one step, saying what happened."""
    from msprobe.mindspore.step_windows import MANY_WINDOWS

    debugger = make_debugger(task="statistics", level="L1")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for _ in range(MANY_WINDOWS + 2):
            debugger.start()
            ops.relu(_x())
            debugger.stop()
        debugger.step()
    said = _step_reminders(caplog)
    assert len(said) == 1 and f"start() was called {MANY_WINDOWS} times in step 0 without step()" in said[0]


def test_backward_after_stop_is_recorded(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")

    def forward(x):
        debugger.start()
        y = ops.mul(ops.relu(x), 3)
        debugger.stop()               # start - forward - stop - backward - step
        return y.sum()

    dx = ms.grad(forward)(_x())
    debugger.step()
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    assert "Functional.relu.0.backward" in data and "Functional.mul.0.backward" in data
    mul_bwd = data["Functional.mul.0.backward"]
    assert mul_bwd["input"][0]["Max"] == mul_bwd["input"][0]["Min"] == 1.0
    assert mul_bwd["output"][0]["Max"] == 3.0
    relu_bwd = data["Functional.relu.0.backward"]["output"][0]
    assert relu_bwd["Max"] == float(dx.asnumpy().max()) == 3.0 and relu_bwd["Min"] == 0.0
    assert "Tensor.sum.0.forward" not in data        # after stop(): not recorded


def _parameter_hook_spy(mp):
    """Count ``Parameter.register_hook`` registrations and their removals (MindSpore still does the
    work): returns ``(registered ids, removed ids)``."""
    from mindspore import Parameter
    from mindspore.common.hook_handle import _TensorHookHandle

    registered, removed = [], []
    register, remove = Parameter.register_hook, _TensorHookHandle.remove

    def spy_register(self, hook):
        handle = register(self, hook)
        registered.append(handle.id)
        return handle

    def spy_remove(self):
        if self.id in registered:  # not the hooks on the outputs of recorded calls
            removed.append(self.id)
        return remove(self)

    mp.setattr(Parameter, "register_hook", spy_register)
    mp.setattr(_TensorHookHandle, "remove", spy_remove)
    return registered, removed


def _grad_entries(dump_dir, step) -> list:
    return sorted(e for e in msprobe.dump.load(only_step_dir(dump_dir, step)).data if ".parameters_grad." in e)


def test_parameter_hooks_stay_while_parked_and_record_only_their_steps(make_debugger, dump_dir):
    """L0, steps 0-2 dumped: the parameter-gradient hooks are registered once, at step 0's first Cell
    call under a gradient, and removed at the last step's step(). A dumped step that makes no Cell
    call under a gradient records none, even when a backward reaches the Parameters (step 1); a
    backward after stop() is recorded (step 2)."""
    net = build_mlp()
    params = net.trainable_params()
    x, y = mlp_batch()
    debugger = make_debugger(task="statistics", level="L0", step=[0, 1, 2])
    with pytest.MonkeyPatch.context() as mp:
        registered, removed = _parameter_hook_spy(mp)
        run_steps(net, debugger, 1)
        assert len(registered) == len(params) and not removed     # kept for step 1
        trained = _grad_entries(dump_dir, 0)
        assert trained == ["Cell.fc1.Dense.parameters_grad.0", "Cell.fc2.Dense.parameters_grad.0"]

        debugger.start(net)
        net(x)                                                   # forward only
        ms.grad(lambda a: (net.fc1.weight * a).sum(), None, [net.fc1.weight])(Tensor(2.0, ms.float32))
        debugger.stop()
        debugger.step()
        assert _grad_entries(dump_dir, 1) == [] and not removed

        def forward(a, b):
            debugger.start(net)
            loss = ops.mse_loss(net(a), b)
            debugger.stop()                                      # start - forward - stop - backward - step
            return loss

        ms.value_and_grad(forward, None, params)(x, y)
        debugger.step()
        assert _grad_entries(dump_dir, 2) == trained
        assert len(registered) == len(params) and sorted(removed) == sorted(registered)   # the dump ended


def test_parameter_hooks_are_removed_before_a_step_not_dumped(make_debugger, dump_dir):
    """L0, steps 0 and 2 dumped: the hooks registered in step 0 are removed at its step() (the capture
    is not parked for step 1) and registered again in step 2; step 1 runs without them."""
    net = build_mlp()
    params = net.trainable_params()
    debugger = make_debugger(task="statistics", level="L0", step=[0, 2])
    with pytest.MonkeyPatch.context() as mp:
        registered, removed = _parameter_hook_spy(mp)
        run_steps(net, debugger, 1)
        assert len(registered) == len(params) and sorted(removed) == sorted(registered)
        run_steps(net, debugger, 2)
        assert len(registered) == 2 * len(params) and sorted(removed) == sorted(registered)
    assert _grad_entries(dump_dir, 2) == _grad_entries(dump_dir, 0) != []


def test_stop_without_start_and_double_start(make_debugger, dump_dir):
    relu = ops.relu
    # step 0 is the last dumped step: its stop() removes the wrappers (before another dumped step
    # they stay installed, passing calls through: test_parked_install.py)
    debugger = make_debugger(task="statistics", step=[0])
    debugger.stop()                   # no-op
    assert not os.path.exists(os.path.join(dump_dir, "step0"))
    debugger.start()
    debugger.start()                  # no-op: nothing installed twice
    assert ops.relu.__wrapped__ is relu
    ops.relu(_x())
    debugger.stop()
    assert ops.relu is relu
    debugger.stop()
    debugger.step()
    assert list(msprobe.dump.load(only_step_dir(dump_dir, 0)).data) == ["Functional.relu.0.forward"]


def test_exception_between_start_and_stop(make_debugger, dump_dir, caplog):
    relu = ops.relu
    debugger = make_debugger(task="statistics", step=[0, 1])
    x = _x()
    with pytest.raises(ZeroDivisionError):
        debugger.start()
        ops.relu(x)
        1 / 0                          # the user's step fails; stop() is skipped
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        debugger.step()               # closes step 0; step 1 is dumped too: the wrappers stay
    said = [r.getMessage() for r in caplog.records if "without stop" in r.getMessage()
            or "no stop()" in r.getMessage()]
    assert len(said) == 1 and "step 0" in said[0] and "abnormal" in said[0]
    assert ops.relu.__wrapped__ is relu and not debugger.service.runtime.capturing()
    ops.relu(x)                        # between the steps: passed through, recorded nowhere
    x2 = x * 2
    debugger.start()
    ops.relu(x2)
    debugger.stop()                   # the last dumped step: the wrappers are removed
    assert ops.relu is relu
    debugger.step()
    assert _steps_present(dump_dir) == ["step0", "step1"]
    d0 = msprobe.dump.load(only_step_dir(dump_dir, 0))
    d1 = msprobe.dump.load(only_step_dir(dump_dir, 1))
    assert d0.complete and d1.complete
    # the interrupted step says so; the next one does not
    assert "stop()" in d0.header["abnormal"] and "abnormal" not in d1.header
    assert list(d0.data) == ["Functional.relu.0.forward"] == list(d1.data)
    assert d0.data["Functional.relu.0.forward"]["output"][0]["Max"] == 2.0
    assert d1.data["Functional.relu.0.forward"]["output"][0]["Max"] == 4.0
    lines = msprobe.dump.summarize(dump_dir).splitlines()
    assert "ABNORMAL" in next(line for line in lines if "step0/" in line)
    assert "ABNORMAL" not in next(line for line in lines if "step1/" in line)


def test_extra_info_false(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics", extra_info=False)
    run_steps(build_mlp(), debugger, 1)
    d = only_step_dir(dump_dir, 0)
    assert sorted(os.listdir(d)) == ["dump.json"]
    assert msprobe.dump.load(d).data


def test_stack_and_construct_json(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")
    x = _x()
    debugger.start()
    for _ in range(2):
        ops.relu(x)                   # same call site twice: one stack group
    ops.gelu(x)
    debugger.stop()
    debugger.step()
    d = only_step_dir(dump_dir, 0)
    with open(os.path.join(d, "stack.json"), encoding="utf-8") as f:
        stacks = json.load(f)
    with open(os.path.join(d, "construct.json"), encoding="utf-8") as f:
        assert json.load(f) == {}
    assert list(stacks) == ["0", "1"]
    names0, frames0 = stacks["0"]
    assert names0 == ["Functional.relu.0.forward", "Functional.relu.1.forward"]
    assert stacks["1"][0] == ["Functional.gelu.0.forward"]
    me = os.path.abspath(__file__)
    assert frames0[0].startswith(f"File {me}, line ") and "ops.relu(x)" in frames0[0]
    assert not any("/msprobe/" in f and "/tests/" not in f for f in frames0)
    loaded = msprobe.dump.load(d)
    assert loaded.stacks["Functional.relu.1.forward"] == frames0


def test_directory_names(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")
    debugger.start()
    ops.relu(_x())
    debugger.stop()
    debugger.step()
    debugger.start(rank_id=3)
    ops.relu(_x())
    debugger.stop()
    debugger.step()
    assert os.listdir(os.path.join(dump_dir, "step0")) == [f"proc{os.getpid()}"]
    assert os.listdir(os.path.join(dump_dir, "step1")) == ["rank3"]


def test_structure_task(make_debugger, dump_dir):
    debugger = make_debugger(task="structure", level="mix")
    run_steps(build_mlp(), debugger, 1)
    d = only_step_dir(dump_dir, 0)
    dump = msprobe.dump.load(d)
    assert dump.data == {} and dump.header["task"] == "structure"
    with open(os.path.join(d, "stack.json"), encoding="utf-8") as f:
        stacks = json.load(f)
    names = [n for group in stacks.values() for n in group[0]]
    assert "Functional.relu.0.forward" in names and "Cell.fc1.Dense.forward.0" in names
    assert dump.construct["Functional.relu.0.forward"] is None or "Cell" in str(
        dump.construct["Functional.relu.0.forward"])
    assert not os.path.exists(os.path.join(d, "dump_tensor_data"))


def test_sigkill_mid_step_leaves_loadable_journal(tmp_path):
    dump_path = str(tmp_path / "dump")
    cfg = write_config(tmp_path, task="tensor", dump_path=dump_path)
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {ROOT!r})
        import mindspore as ms
        import numpy as np
        from mindspore import Tensor, ops
        ms.set_device("CPU"); ms.runtime.launch_blocking()
        from msprobe.mindspore import PrecisionDebugger
        debugger = PrecisionDebugger({cfg!r})
        debugger.start()
        x = Tensor(np.array([-1.0, 0.5, 2.0], np.float32))
        ops.relu(x)
        ops.gelu(x)
        debugger.service.runtime.flush()
        ops.relu(x * 2)                       # recorded but never flushed: lost
        os.kill(os.getpid(), 9)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    d = only_step_dir(dump_path, 0)
    assert not os.path.exists(os.path.join(d, "dump.json"))
    dump = msprobe.dump.load(d)
    assert dump.complete is False
    assert list(dump.data) == ["Functional.relu.0.forward", "Functional.gelu.0.forward"]
    leaf = dump.data["Functional.relu.0.forward"]["output"][0]
    assert leaf["Max"] == 2.0 and (dump.load_tensor(leaf) == np.array([0, 0.5, 2], np.float32)).all()
    assert dump.stacks["Functional.relu.0.forward"]


def test_unhandled_exception_marks_step_abnormal_and_reaches_user(tmp_path):
    """An exception that ends the program: records so far are flushed into dump.json, the step is
    marked abnormal with the exception, and the user sees the exception unchanged (exit code, text)."""
    script = tmp_path / "boom.py"
    dump = tmp_path / "dump"
    script.write_text(textwrap.dedent(f"""
        import numpy as np, mindspore as ms
        from mindspore import ops, Tensor
        ms.set_device("CPU"); ms.runtime.launch_blocking()
        from msprobe.mindspore import PrecisionDebugger
        debugger = PrecisionDebugger(dump_path={str(dump)!r}, level="L1")
        debugger.start()
        ops.relu(Tensor(np.ones(3, np.float32)))
        raise RuntimeError("boom in the user's step")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "RuntimeError: boom in the user's step" in out.stderr
    d = msprobe.dump.load(only_step_dir(str(dump), 0))
    assert d.complete and list(d.data) == ["Functional.relu.0.forward"]
    assert "RuntimeError: boom in the user's step" in d.header["abnormal"]


_ENDED_AT_EXIT = ("the program ended while the step was recording (no stop() after start(): the script "
                  "ended, or sys.exit() or SystemExit); records up to that point are kept")


@pytest.mark.parametrize("mode, level, end, code, abnormal", [
    ("PYNATIVE_MODE", "L0", "raise SystemExit(3)", 3, _ENDED_AT_EXIT),
    ("PYNATIVE_MODE", "L0", "pass", 0, _ENDED_AT_EXIT),
    ("GRAPH_MODE", "L0", "pass", 0, _ENDED_AT_EXIT),
    ("GRAPH_MODE", "mix", "sys.exit(3)", 3, _ENDED_AT_EXIT),
    ("GRAPH_MODE", "L0", "raise RuntimeError('boom')", 1, "the program ended with RuntimeError: boom"),
    ("GRAPH_MODE", "mix", "debugger.step()", 0, None),   # GRAPH_MODE: step() alone ends a step
])
def test_program_ending_without_stop_marks_step_abnormal(tmp_path, mode, level, end, code, abnormal):
    """SystemExit (which no excepthook sees), an uncaught exception or the script's end while a step
    records, in PyNative and in GRAPH_MODE (the compiled network ran): the step written at exit
    keeps its records and is marked abnormal; the exit code is the program's."""
    script = tmp_path / "end.py"
    dump = tmp_path / "dump"
    script.write_text(textwrap.dedent(f"""
        import sys
        import numpy as np, mindspore as ms
        from mindspore import nn, Tensor
        ms.set_device("CPU"); ms.runtime.launch_blocking(); ms.set_context(mode=ms.{mode})
        from msprobe.mindspore import PrecisionDebugger
        net = nn.SequentialCell([nn.Dense(6, 3), nn.ReLU()])
        debugger = PrecisionDebugger(dump_path={str(dump)!r}, level={level!r})
        debugger.start(net)
        net(Tensor(np.ones((2, 6), np.float32)))
        {end}
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == code, out.stderr[-2000:]
    d = msprobe.dump.load(only_step_dir(str(dump), 0))
    assert d.complete and list(d.data) == ["Cell.0.Dense.forward.0", "Cell.1.ReLU.forward.0"]
    assert d.header.get("abnormal") == abnormal


@pytest.mark.parametrize("mode, level, normal", [
    ("GRAPH_MODE", "L1", True),
    ("GRAPH_MODE", "L0", True),
    ("GRAPH_MODE", "mix", True),
    ("PYNATIVE_MODE", "L1", False),   # PyNative: step() without stop() means stop() was skipped
])
def test_step_alone_ends_a_graph_mode_step_at_every_level(tmp_path, mode, level, normal):
    """The README's static-graph loop, start(model) -> ms.grad(model)(x) -> step() without stop():
    in GRAPH_MODE every level writes each step as a normal one (no "abnormal", no WARNING); under
    PyNative the same loop marks each step abnormal and says so once."""
    script = tmp_path / "loop.py"
    dump = tmp_path / "dump"
    script.write_text(textwrap.dedent(f"""
        import numpy as np, mindspore as ms
        from mindspore import nn, Tensor
        ms.set_context(mode=ms.{mode}); ms.set_device("CPU")
        from msprobe.mindspore import PrecisionDebugger
        debugger = PrecisionDebugger(dump_path={str(dump)!r}, level={level!r})
        model = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 3))
        for _ in range(2):
            debugger.start(model)
            ms.grad(model)(Tensor(np.ones((2, 4), np.float32)))
            debugger.step()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    said = out.stderr.count("step() was called while step 0 was still recording (no stop() after start())")
    assert said == (0 if normal else 1), out.stderr[-2000:]
    for step in (0, 1):
        d = msprobe.dump.load(only_step_dir(str(dump), step))
        assert d.complete and d.data  # L1 in GRAPH_MODE: the compiled Jit.after_grad call
        if normal:
            assert "abnormal" not in d.header
        else:
            assert d.header["abnormal"].startswith("step() called without stop()")
    summary = msprobe.dump.summarize(str(dump))
    assert ("ABNORMAL" in summary) != normal


def test_gc_threshold_widened_only_while_capturing(make_debugger, dump_dir):
    """gc_window: the gen-0 threshold is raised from start() to stop() and restored exactly; a value
    the user sets meanwhile is kept; steps that are not dumped change nothing."""
    import gc

    from msprobe.engine.gc_window import CAPTURE_GEN0

    before = gc.get_threshold()
    assert before[0] < CAPTURE_GEN0
    debugger = make_debugger(task="statistics", level="L1", step=[0, 1])
    try:
        debugger.start()
        assert gc.get_threshold() == (CAPTURE_GEN0,) + before[1:]
        ops.relu(Tensor(np.ones(3, np.float32)))
        debugger.stop()
        assert gc.get_threshold() == before
        debugger.step()
        debugger.start()
        gc.set_threshold(900, 5, 5)            # the user's own setting during the step wins
        debugger.stop()
        assert gc.get_threshold() == (900, 5, 5)
        debugger.step()
        gc.set_threshold(*before)
        debugger.start()                       # step 2 is not dumped: nothing installed
        assert gc.get_threshold() == before
        debugger.stop()
    finally:
        gc.set_threshold(*before)


def test_records_of_a_step_are_freed_before_the_gc_window_closes(make_debugger, dump_dir):
    """gc_window: stop() writes the step's files and frees its records (the writer's live mirror of
    the journal) before it restores the gen-0 threshold, so no young collection finds them alive and
    promotes them towards the oldest generation (whose full collections walk MindSpore's heap)."""
    import gc

    net = build_mlp()
    x, y = mlp_batch()
    params = net.trainable_params()
    grad_fn = ms.value_and_grad(lambda data, label: ops.mse_loss(net(data), label), None, params)
    debugger = make_debugger(task="statistics", level="mix", step=[0, 1, 2])
    before_gc = gc.get_threshold()
    for step in range(3):
        measured = step == 2  # steps 0 and 1 build what lives for the run (plans, patches, caches)
        if measured:
            gc.collect()
            gc.disable()  # counted without a collection in between
        try:
            before = len(gc.get_objects())
            debugger.start(net)
            grad_fn(x, y)
            during = len(gc.get_objects())
            debugger.stop()
            after = len(gc.get_objects())
        finally:
            gc.enable()
        assert gc.get_threshold() == before_gc
        debugger.step()
    assert during - before > 300                    # the step's records, pending and replayed
    assert after - before < (during - before) / 10  # freed by stop(), the window closed after that


_ASYNC_SCRIPT = """
import sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import mindspore as ms
ms.set_device("CPU")
if {blocking!r}:
    ms.runtime.launch_blocking()
from conftest import build_mlp, mlp_batch, run_steps
from msprobe.mindspore import PrecisionDebugger
run_steps(build_mlp(), PrecisionDebugger({cfg!r}), steps=2, batch=mlp_batch())
"""


def test_default_async_pipeline_dumps_the_same_values(tmp_path):
    """Without launch_blocking (MindSpore's default asynchronous PyNative launch) the flush waits once
    per batch and then reads tensor memory directly: the dump equals the synchronous run's, value
    for value, gradients included (mix level: Cells, APIs, Primitives)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    dumps = {}
    for blocking in (True, False):
        dump_path = str(tmp_path / f"dump_{blocking}")
        cfg = write_config_with_dump(tmp_path / f"cfg_{blocking}", task="statistics", level="mix",
                                     dump_path=dump_path)
        script = _ASYNC_SCRIPT.format(root=ROOT, tests=tests, blocking=blocking, cfg=cfg)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        dumps[blocking] = [msprobe.dump.load(only_step_dir(dump_path, s)).data for s in (0, 1)]
    for sync_data, async_data in zip(dumps[True], dumps[False]):
        assert len(sync_data) > 20 and any(".backward." in n for n in sync_data)
        assert sync_data == async_data


def test_rank_left_out_by_config_says_so_once(make_debugger, dump_dir, caplog, tmp_path):
    """A single process is rank 0: a rank list without 0 dumps nothing, and one WARNING says why;
    summarize on a missing path says the path is missing."""
    debugger = make_debugger(task="statistics", level="L1", rank=[1])
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for _ in range(2):
            debugger.start()
            ops.relu(Tensor(np.ones(2, np.float32)))
            debugger.stop()
            debugger.step()
    said = [r.getMessage() for r in caplog.records if "rank list" in r.getMessage()]
    assert len(said) == 1 and "rank 0" in said[0] and "[1]" in said[0]
    assert not list(msprobe.dump.iter_step_dirs(dump_dir))
    with pytest.raises(msprobe.dump.DumpFormatError, match="no such directory"):
        msprobe.dump.summarize(str(tmp_path / "nowhere"))


def test_stack_ids_per_rendered_stack(tmp_path):
    """Two calls on one line (different instructions) share one stack.json group; line numbers are
    what frame.f_lineno says; frames inside msprobe are left out."""
    import sys as _sys

    from msprobe.engine.stacks import StackTable

    table = StackTable()

    def here():
        return table.current(), _sys._getframe(1).f_lineno

    (a, line_a), (b, line_b) = here(), here()   # one line, two call instructions
    assert a == b and line_a == line_b
    frame = table.rendered[a]
    assert frame[0].startswith(f"File {os.path.abspath(__file__)}, line ") and "in here," in frame[0]
    assert f"line {line_a}, in test_stack_ids_per_rendered_stack" in frame[1] and "here()" in frame[1]


@pytest.mark.parametrize("level", ["L1", "L0", "mix"])
def test_the_debugger_does_not_keep_a_dropped_model_alive(make_debugger, level):
    """The user drops the model after training: the live debugger must not keep it (it holds the
    model weakly); a later start() without a model then needs one again at L0/mix."""
    import gc
    import weakref

    net = nn.SequentialCell(nn.Dense(4, 4), nn.ReLU())
    debugger = make_debugger(task="statistics", level=level)
    grad = ms.value_and_grad(lambda x: net(x).sum(), None, net.trainable_params())
    debugger.start(net)
    grad(Tensor(np.ones((2, 4), np.float32)))
    debugger.stop()
    debugger.step()
    ref = weakref.ref(net)
    del net, grad
    gc.collect()
    assert ref() is None
    if level != "L1":
        with pytest.raises(ValueError, match="needs the model"):
            debugger.start()


def _api_objects():
    return (ops.relu, mint.mul, Tensor.__add__, Tensor.__mul__, Tensor.add_, Tensor.copy_)


def test_idle_steps_install_nothing(make_debugger, dump_dir):
    net = build_mlp()
    x, y = mlp_batch()
    prim_type = type(net.fc1.matmul)
    originals, hooks = _api_objects(), hook_count(net)
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, net.trainable_params())
    debugger = make_debugger(task="statistics", level="mix", step=[5])
    for step in range(7):
        debugger.start(net)
        idle = step != 5
        assert (_api_objects() == originals) is idle
        assert (hook_count(net) == hooks) is idle
        assert (type(net.fc1.matmul) is prim_type) is idle
        grad_fn(x, y)
        debugger.stop()
        assert _api_objects() == originals and hook_count(net) == hooks
        debugger.step()
    assert sorted(os.listdir(dump_dir)) == ["step5"]


class _ReluNet(nn.Cell):
    """Dense -> ReLU Cell (its ReLU Primitive) -> ops.relu twice -> mint.mul: many calls, two relu APIs."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Dense(4, 3), nn.ReLU()

    def construct(self, x):
        return mint.mul(ops.relu(ops.relu(self.act(self.fc(x)))), 2.0)


def test_empty_reason_at_l1_counts_only_the_calls_a_list_can_name(make_debugger, dump_dir, caplog):
    """At L1 a ``list`` narrows what is hooked to the APIs its items can name. A training step whose
    list selects no call says how many calls of how many such APIs ran (not "N hooked calls ran",
    read as the step's whole count); a list that names no API at all is said at start() in a WARNING."""
    net, x = _ReluNet(), Tensor(np.ones((2, 4), np.float32))
    grad = ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())
    debugger = make_debugger(task="statistics", level="L1", section={"list": ["Functional.relu.7"]})
    debugger.start(net)
    grad(x)
    debugger.stop()
    debugger.step()
    reason = msprobe.dump.load(only_step_dir(dump_dir, 0)).header["empty_reason"]
    # hooked: Functional.relu (ops.relu) and MintFunctional.relu, whose names hold 'Functional.relu.7'
    # for call number 7; two calls of ops.relu ran, none numbered 7
    assert reason == ("2 calls of the 2 APIs and Primitives the config's list can name ran in this step "
                      "(at level L1 only those are hooked), but the config's list ['Functional.relu.7'] "
                      "selected none of them")

    debugger = make_debugger(task="statistics", level="L1", section={"list": ["Primitive.bias_add"]},
                             dump_path=dump_dir + "_2")
    debugger.start(net)
    mint.mul(x, 2.0)                           # a call the list cannot name: not hooked; Dense's
    # BiasAdd Primitive (Primitive.bias_add.BiasAdd), the one it names, is not called
    debugger.stop()
    debugger.step()
    reason = msprobe.dump.load(only_step_dir(dump_dir + "_2", 0)).header["empty_reason"]
    assert reason == ("none of the 1 APIs and Primitives the config's list ['Primitive.bias_add'] can name "
                      "(at level L1 only those are hooked) was called between start() and stop()")

    debugger = make_debugger(task="statistics", level="L1", section={"list": ["no_such_name"]},
                             dump_path=dump_dir + "_3")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        debugger.start(net)
        grad(x)
        debugger.stop()
        debugger.start(net)
        debugger.stop()
    said = [r.getMessage() for r in caplog.records if "names no API" in r.getMessage()]
    assert said == ["msprobe: the config's list ['no_such_name'] names no API or Primitive that level L1 "
                    "hooks (an item is a substring of entry names such as 'Functional.relu.0.forward'; "
                    "at L1 only the APIs an item can name are hooked): nothing is dumped"]   # once


def _empty_reason_of_one_step(make_debugger, dump_path, item, net, run) -> str:
    """``empty_reason`` of one L1 step dumped with ``list: [item]``: ``start(net)``, ``run()``, ``stop()``,
    ``step()``, then the step's ``dump.json`` read back."""
    debugger = make_debugger(task="statistics", level="L1", section={"list": [item]}, dump_path=dump_path)
    debugger.start(net)
    run()
    debugger.stop()
    debugger.step()
    return msprobe.dump.load(only_step_dir(dump_path, 0)).header["empty_reason"]


def test_empty_reason_at_l1_counts_compiled_optimizer_calls_apart(make_debugger, dump_dir):
    """A compiled jit call (the optimizer's update) is hooked whatever the list: with a list that
    names no API, the empty reason counts it as such, not as a call of "the 0 APIs" the list names."""
    net, x = _ReluNet(), Tensor(np.ones((2, 4), np.float32))
    opt = nn.Adam(net.trainable_params(), 0.01)
    grad = ms.value_and_grad(lambda v: net(v).sum(), None, opt.parameters)

    def train_step():
        _, grads = grad(x)
        opt(grads)

    reason = _empty_reason_of_one_step(make_debugger, dump_dir, "no_such_name", net, train_step)
    assert reason == ("1 compiled jit call (Jit.Adam) ran in this step; the config's list names none of "
                      "the APIs and Primitives level L1 hooks, so no other call was hooked, but the "
                      "config's list ['no_such_name'] selected none of them")
    reason = _empty_reason_of_one_step(make_debugger, dump_dir + "_2", "Functional.relu.7", net, train_step)
    assert reason.startswith("2 calls of the 2 APIs and Primitives the config's list can name and 1 compiled "
                             "jit call (Jit.Adam) ran in this step (at level L1 only those are hooked)"), reason


def test_step_without_hooked_ops_is_explicitly_empty(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start(rank_id=1)         # this rank runs no hooked op in the step
    _ = 1 + 1
    debugger.stop()
    debugger.step()
    d = only_step_dir(dump_dir, 0)
    assert os.path.basename(d) == "rank1"
    with open(os.path.join(d, "dump.json"), encoding="utf-8") as f:
        doc = json.load(f)
    reason = EMPTY_REASON + NO_MODEL   # start() without a model
    assert doc["data"] == {} and doc["empty_reason"] == reason
    dump = msprobe.dump.load(d)
    assert dump.data == {} and dump.header["empty_reason"] == reason


def test_summary_of_an_empty_step_says_why_it_is_empty(make_debugger, dump_dir):
    """An empty step's summary line gives the ``empty_reason`` of its dump.json, not an empty list of
    prefixes."""
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start()
    debugger.stop()
    debugger.step()
    d = only_step_dir(dump_dir, 0)
    reason = msprobe.dump.load(d).header["empty_reason"]
    (line,) = [line for line in msprobe.dump.summarize(dump_dir).splitlines() if "step0/" in line]
    assert line == f"  step0/{os.path.basename(d)}: 0 entries ({reason})", line


def test_empty_step_without_a_model_at_l1_says_cells_need_start_model(make_debugger, dump_dir, caplog):
    """A net of Cells (nn.Dense, nn.ReLU) run after start() without a model records nothing at L1: the
    empty reason and one console WARNING say that Primitives inside Cells need start(model); with the
    model the same step is recorded."""
    net, x = nn.SequentialCell([nn.Dense(4, 3), nn.ReLU()]), Tensor(np.ones((2, 4), np.float32))
    debugger = make_debugger(task="statistics", level="L1")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for model in (None, None, net):
            debugger.start(model)
            net(x)
            debugger.stop()
            debugger.step()
    reason = msprobe.dump.load(only_step_dir(dump_dir, 0)).header["empty_reason"]
    assert reason == EMPTY_REASON + NO_MODEL and "recorded only with start(model)" in reason
    said = [r.getMessage() for r in caplog.records if "start(model)" in r.getMessage()]
    assert said == [f"msprobe: step 0: {reason}"]
    assert msprobe.dump.load(only_step_dir(dump_dir, 2)).data


def test_empty_reason_says_when_filters_selected_nothing(make_debugger, dump_dir):
    """Calls ran but a list matched none: the empty step says so, not "no recorded call"."""
    debugger = make_debugger(task="statistics", level="L1", section={"list": ["Functional.no_such_api"]})
    debugger.start()
    ops.relu(Tensor(np.ones(3, np.float32)))   # not wrapped: the list can never match it
    x = Tensor(np.ones(3, np.float32))
    debugger.stop()
    debugger.step()
    doc = msprobe.dump.load(only_step_dir(dump_dir, 0)).header
    assert doc["empty_reason"] == EMPTY_REASON    # nothing hooked ran at all

    debugger = make_debugger(task="statistics", level="L1", section={"scope": [
        "Functional.relu.5.forward", "Functional.relu.6.forward"]}, dump_path=dump_dir + "_2")
    debugger.start()
    ops.relu(x)
    ops.relu(x)                                # relu.0 and relu.1: outside the scope
    debugger.stop()
    debugger.step()
    reason = msprobe.dump.load(only_step_dir(dump_dir + "_2", 0)).header["empty_reason"]
    assert reason.startswith("2 hooked calls ran in this step") and "selected none" in reason


def test_summary_keeps_the_first_line_of_a_multiline_abnormal_reason(make_debugger, dump_dir):
    """MindSpore's errors carry its C++ stack on further lines: the summary's ABNORMAL note keeps the
    first line; dump.json keeps the whole text."""
    debugger = make_debugger(task="statistics", step=[0])
    a, b = Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones((2, 3), np.float32))
    with pytest.raises((ValueError, RuntimeError)) as raised:
        with debugger.dump():
            ops.relu(a)
            ops.matmul(a, b)                     # shapes (2, 3) @ (2, 3): MindSpore refuses
    debugger.step()
    assert "\n" in str(raised.value).strip()   # the message really is multi-line
    d = msprobe.dump.load(only_step_dir(dump_dir, 0))
    assert str(raised.value) in d.header["abnormal"]
    (line,) = [line for line in msprobe.dump.summarize(dump_dir).splitlines() if "step0/" in line]
    first = str(raised.value).strip().splitlines()[0].strip()
    assert line.endswith(f"(ABNORMAL: the with-block raised {type(raised.value).__name__}: {first} ... "
                         "(full text: dump.json \"abnormal\"))"), line
