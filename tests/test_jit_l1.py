"""jit at L1 (seed, 动态图场景 notes): an ast-jit function is one Jit entry (forward and backward);
a bytecode-jit function's body is dumped API by API; MindSpore's objects are restored at stop()."""
import numpy as np
import mindspore as ms
from mindspore import ops, Tensor

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


def test_bytecode_jit_body_is_dumped_per_api_and_restored(tmp_path):
    enter, exit_ = jit_capture.PIJitCaptureContext.__enter__, jit_capture.PIJitCaptureContext.__exit__
    x = Tensor(np.array([1.0, -2.0, 3.0], np.float32))
    expected = relu_plus_sin(x).asnumpy()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0])  # stop() ends it
    debugger.start()
    out = relu_plus_sin(x)
    debugger.stop()
    debugger.step()
    assert np.array_equal(out.asnumpy(), expected)
    names = set(msprobe.dump.load(_only_dir(str(tmp_path / "d"))).data)
    assert {"Functional.relu.0.forward", "Functional.sin.0.forward", "Tensor.__mul__.0.forward",
            "Tensor.__add__.0.forward"} <= names
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
