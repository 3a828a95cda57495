"""``coverage.json`` lists calls the dump cannot see: an API bound to a module-level name before
``start()`` (``from mindspore.ops import relu``) is called through that name, not through the wrapped
attribute; it is listed with its module, API and reason, and one WARNING names it. Real MindSpore, CPU.

This module binds ``relu`` at import on purpose, so it holds no other test (every dump of this module
reports that name)."""
from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops import relu  # bound before start(): calls through this name are not captured

from conftest import load_step
from msprobe.read.report import read_report


class EarlyBound(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)

    def construct(self, x):
        return relu(self.fc(x))       # the module-level name bound before start()


def test_name_bound_before_start_is_listed_in_coverage(make_debugger, dump_dir, caplog):
    ms.set_seed(0)
    net = EarlyBound()
    x = Tensor(np.ones((2, 4), np.float32))
    debugger = make_debugger(task="statistics", level="L1")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        debugger.start(net)
        net(x)
        ops.relu(x)                   # through the module attribute: captured
        debugger.stop()
        debugger.step()
    d, dump = load_step(dump_dir)
    assert [k for k in dump.data if "relu" in k] == ["Functional.relu.0.forward"]  # the gap is real
    cov = read_report(d, "coverage.json")
    item = next(i for i in cov["not_captured"] if i["name"] == "relu")
    assert item["module"] == __name__ and item["api"] == "Functional.relu"
    assert item["call_as"] == "mindspore.ops.relu" and "before start()" in item["reason"]
    assert any("not captured" in r.getMessage() and "'relu'" in r.getMessage() for r in caplog.records)
