"""first-diff on calls whose tensor inputs agree while a scalar argument differs (real MindSpore, CPU,
PyNative, level L1): the reason says which argument differs, and such a call does not outrank an
earlier entry whose inputs already differ (both are values from outside the dump)."""
from __future__ import annotations

import os

import numpy as np

from mindspore import Tensor, nn, ops

from conftest import write_config_with_dump
from msprobe.compare import first_divergence
from test_compare import cli


class Scaled(nn.Cell):
    """``relu(x)``, then ``ones * factor`` with ``factor`` a Python number."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def construct(self, x):
        return ops.relu(x).sum() + (ops.ones((2,)) * self.factor).sum()


def _dump(root, name, factor, data):
    from msprobe.mindspore import PrecisionDebugger

    path = write_config_with_dump(os.path.join(str(root), name), level="L1")
    debugger = PrecisionDebugger(path)
    net = Scaled(factor)
    debugger.start(net)
    net(Tensor(np.full((2, 3), data, np.float32)))
    debugger.stop()
    debugger.step()
    return os.path.join(str(root), name, "dump")


def test_a_differing_scalar_argument_is_said_and_an_earlier_differing_input_comes_first(tmp_path):
    golden = _dump(tmp_path, "golden", 1, 0.5)
    (found,) = first_divergence(_dump(tmp_path, "factor", 2, 0.5), golden)
    assert found.entry == "Tensor.__mul__.0.forward" and found.kind == "divergence", found
    assert found.reason() == ("tensor inputs agree, a scalar argument differs (input.1: value 2 vs 1), "
                              "outputs do not (forward)")
    (found,) = first_divergence(_dump(tmp_path, "both", 2, 0.7), golden)
    assert found.entry == "Functional.relu.0.forward" and found.kind == "input", found
    out = cli("first-diff", str(tmp_path / "factor" / "dump"), golden, check_code=1).stdout
    assert "a scalar argument differs (input.1: value 2 vs 1)" in out, out
