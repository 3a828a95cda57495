"""PrecisionDebugger.close(): the pending files are written, every wrapper, Primitive hook, Cell hook
and patch is removed (the network runs MindSpore's own objects again), a second close() does nothing,
and a closed debugger refuses to start with a clear RuntimeError (a new one dumps again). Real
MindSpore, CPU, PyNative."""
from __future__ import annotations

import sys

import pytest
from mindspore import Tensor, mint, nn, ops

import msprobe.dump
from conftest import build_mlp, hook_count, mlp_batch, only_step_dir, run_steps


def _mindspore_objects(net):
    """What the tool may replace: functions, Tensor methods, Cell class attributes, the Primitive
    classes of ``net``'s Cells, and the hooks registered on its Cells."""
    return {"ops.relu": ops.relu, "mint.mul": mint.mul, "Tensor.__mul__": Tensor.__mul__,
            "nn.Cell": dict(vars(nn.Cell)),
            "primitives": [type(net.fc1.matmul), type(net.fc1.bias_add)], "cell hooks": hook_count(net)}


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_close_between_steps_writes_and_removes_everything(tmp_path, level):
    from msprobe.mindspore import PrecisionDebugger

    net = build_mlp()
    before = _mindspore_objects(net)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)   # step: [] (every step)
    run_steps(net, debugger, 1)
    assert ops.relu is not before["ops.relu"]        # parked for the next step, as without close()
    debugger.close()
    assert _mindspore_objects(net) == before
    d = msprobe.dump.load(only_step_dir(tmp_path / "dump", 0))
    assert d.complete and "Functional.relu.0.forward" in d.data and "abnormal" not in d.header
    debugger.close()                                  # again: nothing
    debugger.stop()                                   # does nothing after close()
    with pytest.raises(RuntimeError, match=r"start\(\) on a closed PrecisionDebugger .*create a new"):
        debugger.start(net)
    with pytest.raises(RuntimeError, match=r"step\(\) on a closed PrecisionDebugger"):
        debugger.step()
    with pytest.raises(RuntimeError, match=r"dump\(\) on a closed PrecisionDebugger"):
        debugger.dump(net)                            # at the call, before any with statement
    assert _mindspore_objects(net) == before
    again = PrecisionDebugger(dump_path=str(tmp_path / "again"), level=level)   # a new one dumps
    run_steps(net, again, 1)
    again.close()
    assert "Functional.relu.0.forward" in msprobe.dump.load(only_step_dir(tmp_path / "again", 0)).data
    assert _mindspore_objects(net) == before


def test_close_after_an_exception_in_the_step(tmp_path):
    """close() in a ``finally:`` while the step is still recording (mix: Cell hooks installed): the
    step is written, marked abnormal, the hooks are removed and the exception reaches the caller."""
    from msprobe.mindspore import PrecisionDebugger

    net = build_mlp()
    x, _ = mlp_batch()
    before = _mindspore_objects(net)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    failure = ValueError("the user's step failed")
    with pytest.raises(ValueError) as caught:
        try:
            debugger.start(net)
            net(x)
            assert hook_count(net) > 0 and ops.relu is not before["ops.relu"]
            raise failure
        finally:
            debugger.close()
    assert caught.value is failure
    assert _mindspore_objects(net) == before
    d = msprobe.dump.load(only_step_dir(tmp_path / "dump", 0))
    assert "Cell.fc1.Dense.forward.0" in d.data and "close() was called" in d.header["abnormal"]


def test_close_restores_a_custom_api(tmp_path):
    from msprobe.mindspore import PrecisionDebugger

    module = sys.modules[__name__]
    original = module.my_scale
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    debugger.register_custom_api(module, "my_scale", "Custom")
    assert module.my_scale is not original
    debugger.start()
    module.my_scale(Tensor([1.0, 2.0]))
    debugger.stop()
    debugger.step()
    debugger.close()
    assert module.my_scale is original
    assert "Custom.my_scale.0.forward" in msprobe.dump.load(only_step_dir(tmp_path / "dump", 0)).data
    with pytest.raises(RuntimeError, match=r"register_custom_api\(\) on a closed"):
        debugger.register_custom_api(module, "my_scale", "Custom")


def my_scale(x):
    return x * 2
