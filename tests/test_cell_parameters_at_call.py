"""A Cell's recorded ``parameters`` are the values its call began with: ``nn.BatchNorm1d`` in
training updates ``moving_mean``/``moving_variance`` in place during its forward, and its forward
entry holds the values from before that update (as the BatchNorm Primitive's inputs 3 and 4 at mix
do). PyNative and GRAPH_MODE, statistics and tensor task. Real MindSpore, CPU."""
from __future__ import annotations

import glob
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import msprobe.dump
from msprobe.mindspore import PrecisionDebugger


class BnNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.bn = nn.BatchNorm1d(4, momentum=0.5)

    def construct(self, x):
        return self.bn(self.fc(x)).sum()


def _moving(net):
    return {p.name.rsplit(".", 1)[-1]: p.asnumpy().copy() for p in net.bn.get_parameters()
            if "moving" in p.name}


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("level", ["L0", "mix"])
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_batchnorm_parameters_are_the_values_before_its_forward(tmp_path, mode, level, task):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        dump_path = os.path.join(str(tmp_path), "dump")
        debugger = PrecisionDebugger(dump_path=dump_path, level=level, task=task)
        ms.set_seed(0)
        net = BnNet()
        net.set_train(True)
        x = Tensor(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32) * 3 + 2)
        before = _moving(net)
        debugger.start(net)
        ms.grad(net)(x)
        debugger.stop()
        debugger.step()
        after = _moving(net)
        debugger.close()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert all(not np.array_equal(before[k], after[k]) for k in before)   # the forward updated them
    (d,) = glob.glob(os.path.join(dump_path, "**", "step0", "*"), recursive=True)
    dump = msprobe.dump.load(d)
    params = dump.data["Cell.bn.BatchNorm1d.forward.0"]["parameters"]
    for name, value in before.items():
        leaf = params[name]
        as64 = value.astype(np.float64)
        assert (leaf["Max"], leaf["Min"]) == (float(value.max()), float(value.min())), (name, leaf, value)
        assert leaf["Mean"] == pytest.approx(as64.mean(), rel=1e-12)
        assert leaf["Norm"] == pytest.approx(np.sqrt((as64 ** 2).sum()), rel=1e-12)
        assert (leaf["Max"], leaf["Min"]) != (float(after[name].max()), float(after[name].min()))
        if task == "tensor":
            np.testing.assert_array_equal(dump.load_tensor(leaf), value)
