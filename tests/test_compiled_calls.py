"""The compiled per-call path (``hotpath.ext.Recorder`` for the common case of a recorded call,
``hotpath.ext.CallWrapper`` for Tensor methods): it behaves like the Python code it stands for. A
Tensor-method wrapper binds and reads like the original method; the user's exception reaches the user
unchanged with the call's inputs recorded; a failure of the tool while hooking a call's gradients is written
once to ``dump_error_info.log`` and the call's result is the user's. Real MindSpore, CPU."""
from __future__ import annotations

import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, ops

from msprobe.capture.backward import BackwardProbe
from msprobe.tensors import hotpath
from conftest import load_step

pytestmark = pytest.mark.skipif(hotpath.ext is None or not hasattr(hotpath.ext, "Recorder"),
                                reason="the compiled per-call path is not built")


def _x():
    return Tensor(np.arange(-3, 3, dtype=np.float32).reshape(2, 3))


def test_tensor_method_wrapper_binds_like_the_original(make_debugger):
    original = Tensor.abs
    x = _x()
    debugger = make_debugger(task="statistics", level="L1", step=[0])
    debugger.start()
    try:
        wrapper = Tensor.abs
        assert isinstance(wrapper, hotpath.ext.CallWrapper)
        assert wrapper.__wrapped__ is original and wrapper.__name__ == original.__name__
        bound = x.abs
        np.testing.assert_array_equal(bound().asnumpy(), np.abs(x.asnumpy()))
        np.testing.assert_array_equal(Tensor.abs(x).asnumpy(), np.abs(x.asnumpy()))
        np.testing.assert_array_equal((x + x).asnumpy(), 2 * x.asnumpy())
    finally:
        debugger.stop()
        debugger.step()
    assert Tensor.abs is original
    _, dump = load_step(debugger.config.dump_path, 0)
    names = set(dump.data)
    assert {"Tensor.abs.0.forward", "Tensor.abs.1.forward", "Tensor.__add__.0.forward"} <= names, names
    assert dump.data["Tensor.abs.0.forward"]["output"][0]["shape"] == [2, 3]


def test_user_exception_of_a_tensor_method_reaches_the_user_unchanged(make_debugger):
    x = _x()
    try:
        x.reshape((5, 7))
    except Exception as exc:  # the tool-off error, compared below
        expected = (type(exc), str(exc))
    else:
        pytest.fail("reshape to a wrong size did not raise")
    debugger = make_debugger(task="statistics", level="L1", step=[0])
    debugger.start()
    with pytest.raises(expected[0]) as info:
        x.reshape((5, 7))
    assert str(info.value) == expected[1]
    y = x.abs()  # recording goes on after the user's exception
    debugger.stop()
    debugger.step()
    directory, dump = load_step(debugger.config.dump_path, 0)
    entry = dump.data["Tensor.reshape.0.forward"]
    assert entry["input_args"][0]["shape"] == [2, 3] and "output" not in entry
    assert dump.data["Tensor.abs.0.forward"]["output"][0]["shape"] == [2, 3]
    assert y.shape == (2, 3)
    assert not os.path.exists(os.path.join(directory, "dump_error_info.log"))


def _relu_abs_step(make_debugger):
    """``(x, grad_fn, gradients without the tool, L1 statistics debugger of step 0)`` of a loss made of
    ``ops.relu``, ``Tensor.abs`` (twice), ``Tensor.__mul__`` and ``Tensor.sum``."""
    x = _x()

    def loss(a):
        return (ops.relu(a) * a.abs() * a.abs()).sum()

    grad_fn = ms.value_and_grad(loss)
    expected = [t.asnumpy() for t in grad_fn(x)]
    return x, grad_fn, expected, make_debugger(task="statistics", level="L1", step=[0])


def test_tool_failure_in_the_compiled_backward_registration_is_reported_once_and_training_goes_on(
        make_debugger, monkeypatch):
    """The compiled recorder observes a call's output itself (its ``_grad_node``, then that node's
    ``register_hook``): when reading the node raises, each API's failure is written once to
    dump_error_info.log, its forward is still recorded, and the gradients are those of a run without the
    tool."""
    if hotpath.ext is None:
        pytest.skip("compiled per-call path not built")
    x, grad_fn, expected, debugger = _relu_abs_step(make_debugger)
    assert getattr(debugger.service.recorder.fast_record, "observe_here", False)

    def refused(self):
        raise RuntimeError("hook refused")

    monkeypatch.setattr(ms.Tensor, "_grad_node", property(refused))
    debugger.start()
    got = [t.asnumpy() for t in grad_fn(x)]
    debugger.stop()
    debugger.step()
    monkeypatch.undo()
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    directory, dump = load_step(debugger.config.dump_path, 0)
    with open(os.path.join(directory, "dump_error_info.log"), encoding="utf-8") as f:
        log = f.read()
    for api in ("Tensor.abs", "Functional.relu"):
        assert log.count(f"failed to record {api}") == 1, log
        assert "hook refused" in log
        assert dump.data[f"{api}.0.forward"]["output"][0]["shape"] == [2, 3]  # the forward is recorded
    assert not any(name.endswith(".backward") for name in dump.data)


def test_tool_failure_in_the_backward_registration_is_reported_once_and_training_goes_on(make_debugger,
                                                                                       monkeypatch):
    x, grad_fn, expected, debugger = _relu_abs_step(make_debugger)
    failures = []
    real = BackwardProbe.observe

    def failing(self, args, out, mark=None):
        if self.entry != "Tensor.abs.1.backward":
            failures.append(self.entry)
            raise RuntimeError("hook refused")
        return real(self, args, out, mark)

    monkeypatch.setattr(BackwardProbe, "observe", failing)
    fast = debugger.service.recorder.fast_record
    if hasattr(fast, "observe_here"):  # the compiled recorder: observe every call through BackwardProbe.observe
        monkeypatch.setattr(fast, "observe_here", False)
    debugger.start()
    got = [t.asnumpy() for t in grad_fn(x)]
    debugger.stop()
    debugger.step()
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert failures == ["Functional.relu.0.backward", "Tensor.abs.0.backward", "Tensor.__mul__.0.backward",
                        "Tensor.__mul__.1.backward", "Tensor.sum.0.backward"]
    directory, dump = load_step(debugger.config.dump_path, 0)
    with open(os.path.join(directory, "dump_error_info.log"), encoding="utf-8") as f:
        log = f.read()
    for api in ("Tensor.abs", "Functional.relu"):
        assert log.count(f"failed to record {api}: RuntimeError('hook refused')") == 1, log
        assert dump.data[f"{api}.0.forward"]["output"][0]["shape"] == [2, 3]  # the forward is recorded
    assert "Tensor.abs.0.backward" not in dump.data and "Tensor.abs.1.backward" in dump.data
