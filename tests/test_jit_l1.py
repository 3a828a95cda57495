"""jit at L1 (seed, 动态图场景 notes): an ast-jit function is one Jit entry (forward and backward);
a bytecode-jit function is one Jit entry too, compiled as without the tool (its body, run API by API,
would compute other bits); MindSpore's objects are restored at stop().
At L0 a jit function running a whole training step (ast or bytecode capture) is said (WARNING, the empty
step's reason)."""
import logging

import numpy as np
import mindspore as ms
import pytest
from mindspore import nn, ops, Tensor

import msprobe.dump
from conftest import load_step
from msprobe.read.report import read_report
from msprobe.capture import jit as jit_capture
from msprobe.mindspore import PrecisionDebugger


@ms.jit(capture_mode="ast")
def scaled_relu(x):
    return ops.relu(x) * 2


@ms.jit(capture_mode="bytecode")
def relu_plus_sin(x):
    return ops.relu(x) * 2 + ops.sin(x)


def _only_dir(path):
    dirs = [p for _, _, p in msprobe.dump.iter_step_dirs(path)]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_ast_jit_is_one_entry_with_backward(tmp_path):
    w = ms.Parameter(Tensor(np.ones(3, np.float32)), name="w")
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    grad_fn = ms.value_and_grad(lambda a: scaled_relu(a * w).sum(), None, [w])
    scaled_relu(x)  # compiled before start(): still recorded as one Jit entry
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    debugger.start()
    _, (gw,) = grad_fn(x)
    debugger.stop()
    debugger.step()
    data = msprobe.dump.load(_only_dir(str(tmp_path / "d"))).data
    jit_names = sorted(n for n in data if n.startswith("Jit."))
    assert jit_names == ["Jit.scaled_relu.0.backward", "Jit.scaled_relu.0.forward"]
    assert not any(n.startswith("Functional.relu") for n in data)  # the inside ran compiled
    fwd = data["Jit.scaled_relu.0.forward"]
    assert fwd["output"][0]["Max"] == 6.0 and fwd["output"][0]["Min"] == 0.0
    bwd = data["Jit.scaled_relu.0.backward"]
    assert bwd["input"][0]["Max"] == 1.0                      # d(sum)/d(out) = 1
    assert bwd["output"][0]["Max"] == 2.0 and bwd["output"][0]["Min"] == 0.0  # 2 where x*w > 0
    assert np.array_equal(gw.asnumpy(), np.array([2.0, 0.0, 6.0], np.float32))


class JitDense(nn.Cell):
    """A Cell whose ``construct`` is compiled (``@ms.jit``): recorded as ``Jit.JitDense.{n}``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 2, weight_init="ones")

    @ms.jit
    def construct(self, x):
        return self.fc(x)


def test_jit_entry_stack_starts_at_the_users_call(tmp_path):
    """A Jit entry's stack starts, like an API's, at the line that called the compiled function or
    Cell: MindSpore's jit wrapper (and its Cell call) are left out, at L1 and mix."""
    import os

    x = Tensor(np.array([[1.0, -2.0, 3.0]], np.float32))
    here = os.path.abspath(__file__)
    for level in ("L1", "mix"):
        net = JitDense()
        path = str(tmp_path / level)
        debugger = PrecisionDebugger(dump_path=path, level=level)
        debugger.start(net)
        scaled_relu(x)
        net(x)
        debugger.stop()
        debugger.step()
        debugger.close()
        stacks = msprobe.dump.load_stacks(_only_dir(path))
        for entry, source in (("Jit.scaled_relu.0.forward", "scaled_relu(x)"), ("Jit.JitDense.0.forward", "net(x)")):
            innermost = stacks[entry][0]
            assert innermost.startswith(f"File {here}, line ") and innermost.endswith(f"\n {source}"), (
                level, entry, stacks[entry][:2])


def test_bytecode_jit_is_one_entry_compiled_as_without_the_tool(tmp_path):
    """L1: a bytecode-capture function is one ``Jit`` entry whose output is the compiled function's,
    its inside (run with the tool's wrappers off) has no entry, and the patched context is given
    back at ``close()``."""
    enter, exit_ = jit_capture.PIJitCaptureContext.__enter__, jit_capture.PIJitCaptureContext.__exit__
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    expected = relu_plus_sin(x).asnumpy()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0])
    debugger.start()
    out = relu_plus_sin(x)
    again = ops.relu(x)  # the wrappers are back after the region
    debugger.stop()
    debugger.step()
    debugger.close()
    assert out.asnumpy().tobytes() == expected.tobytes() and again.asnumpy()[0] == 1.0
    data = msprobe.dump.load(_only_dir(str(tmp_path / "d"))).data
    assert sorted(data) == ["Functional.relu.0.forward", "Jit.relu_plus_sin.0.forward"]
    assert data["Jit.relu_plus_sin.0.forward"]["output"][0]["Max"] == float(expected.max())
    assert jit_capture.PIJitCaptureContext.__enter__ is enter
    assert jit_capture.PIJitCaptureContext.__exit__ is exit_


def test_jit_compiled_before_start_is_a_jit_entry_and_listed(make_debugger, dump_dir):
    f = scaled_relu                   # an ast-jit function
    x = Tensor(np.array([-1.0, 0.5, 2.0], np.float32))
    f(x)                              # compiles before the dump starts
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start()
    y = f(x)
    debugger.stop()
    debugger.step()
    d, dump = load_step(dump_dir)
    assert "Jit.scaled_relu.0.forward" in dump.data
    assert not any(k.startswith("Functional.relu") for k in dump.data)  # the inside is compiled
    out = dump.data["Jit.scaled_relu.0.forward"]["output"][0]
    assert out["Max"] == float(y.asnumpy().max()) == 4.0
    regions = read_report(d, "coverage.json")["compiled_regions"]
    assert [r["entry"] for r in regions] == ["Jit.scaled_relu.0.forward"]
    assert "not captured" in regions[0]["note"]


@pytest.mark.parametrize("capture_mode", ["ast", "bytecode"])
def test_a_training_step_in_a_jit_function_at_l0_is_said(make_debugger, dump_dir, caplog, capture_mode):
    """PyNative, L0: value_and_grad and the optimizer inside one jit function (compiled from its source
    or its bytecode) run compiled, the Cells with the tool's hooks off; one WARNING names the function,
    each empty step's reason and coverage.json too."""
    ms.set_seed(1)
    net = nn.SequentialCell(nn.Dense(4, 3), nn.ReLU(), nn.Dense(3, 2))
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    opt = nn.SGD(net.trainable_params(), 0.1)
    grad_fn = ms.value_and_grad(loss_net, None, opt.parameters)

    @ms.jit(capture_mode=capture_mode)
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        return ops.depend(loss, opt(grads))

    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    y = Tensor(np.ones((2, 2), np.float32))
    debugger = make_debugger(task="statistics", level="L0")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for _ in range(2):
            debugger.start(net)
            train_step(x, y)
            debugger.stop()
            debugger.step()
    said = [r.getMessage() for r in caplog.records if "train_step" in r.getMessage()]
    assert said == ["msprobe: level L0: the mindspore.jit function train_step ran compiled, so the Cells "
                    "called inside it are not recorded (level mix records each call as one "
                    "Jit.train_step.{n} entry; level L2 records its kernels)"]
    for step in (0, 1):
        d, dump = load_step(dump_dir, step)
        assert read_report(d, "coverage.json") == {"jit_functions_not_recorded": [
            {"function": "train_step", "note": said[0][len("msprobe: "):]}]}
        assert dump.data == {}
        assert dump.header["empty_reason"] == ("no recorded call between start() and stop() in this step: "
                                               + said[0][len("msprobe: "):])
