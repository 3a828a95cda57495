"""``anomalies.json``: the first producer of a non-finite value (inputs finite, output not) of a step,
also when the user's step raises, inside a compiled ``mindspore.jit`` region (named by the region),
and at L0 and mix (the API inside the Cell is named); a finite step writes no report. Real MindSpore,
CPU, PyNative."""
from __future__ import annotations

import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import msprobe.dump
from conftest import load_step
from msprobe.compare import nan_producer
from msprobe.read.report import read_report


def test_anomalies_written_when_the_user_step_raises(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics", level="L1")
    x = Tensor(np.array([1.0, 2.0], np.float32))
    with pytest.raises(RuntimeError, match="user step"):
        debugger.start()
        for _ in range(5):
            ops.exp(x * 100.0)        # exp(200) overflows float32: five producers of Inf
        raise RuntimeError("user step failed")
    debugger.step()
    d, dump = load_step(dump_dir)
    report = read_report(d, "anomalies.json")
    assert report["producers"] == [f"Functional.exp.{k}.forward" for k in range(5)]
    assert report["first_producer"] == "Functional.exp.0.forward" and report["step"] == 0
    assert any("test_anomalies.py" in frame for frame in report["stack"])
    assert dump.data["Functional.exp.0.forward"]["output"][0]["Max"] == float("inf")


def log_shift(x):
    return ops.log(x - 10)


def test_nan_inside_jit_region_names_the_region(make_debugger, dump_dir):
    f = ms.jit(log_shift)
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start()
    f(Tensor(np.array([1.0], np.float32)))
    debugger.stop()
    debugger.step()
    d, _ = load_step(dump_dir)
    report = read_report(d, "anomalies.json")
    assert report["first_producer"] == "Jit.log_shift.0.forward"
    assert "compiled" in report["note"]
    assert "Jit.log_shift.0.forward" in msprobe.dump.summarize(dump_dir)


class LogShift(nn.Cell):
    def construct(self, h):
        return ops.log(h - 5)


class NanNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Dense(8, 8)
        self.b = LogShift()
        self.c = nn.Dense(8, 8)
        self.d = nn.ReLU()

    def construct(self, x):
        return self.d(self.c(self.b(self.a(x))))


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_first_nan_producer_is_the_cell_that_made_it(make_debugger, dump_dir, level):
    ms.set_seed(0)
    net = NanNet()
    x = Tensor(np.ones((2, 8), np.float32))
    debugger = make_debugger(task="statistics", level=level)
    debugger.start(net)
    net(x)
    debugger.stop()
    debugger.step()
    d, dump = load_step(dump_dir)
    report = read_report(d, "anomalies.json")
    # first_non_finite follows the order values were made: at mix the log inside the Cell returns
    # (NaN) before the Cell does, so both fields name it
    first_made = "Functional.log.0.forward" if level == "mix" else "Cell.b.LogShift.forward.0"
    assert report["first_non_finite"] == first_made and report["step"] == 0
    if level == "mix":   # the Cell and the API inside it that made the NaN: the API is named
        assert report["producers"] == ["Cell.b.LogShift.forward.0", "Functional.log.0.forward"]
        assert report["first_producer"] == "Functional.log.0.forward"
        assert dump.construct["Functional.log.0.forward"] == "Cell.b.LogShift.forward.0"
    else:
        assert report["producers"] == ["Cell.b.LogShift.forward.0"]
        assert report["first_producer"] == "Cell.b.LogShift.forward.0"
    assert report["stack"] and any("test_anomalies.py" in frame for frame in report["stack"])
    assert "Cell.c.Dense.forward.0" not in report["producers"]   # NaN in, NaN out: a consumer
    text = msprobe.dump.summarize(dump_dir)
    assert "first producer of a non-finite value (inputs finite, output not): step0/" in text
    assert text.rstrip().endswith(report["first_producer"])


class SqrtGrad(nn.Cell):
    """A custom bprop that makes a NaN from finite values: ``sqrt(dout - 10)``."""

    def construct(self, x):
        return x * 2

    def bprop(self, x, out, dout):
        return (ops.sqrt(dout - 10.0),)


class BpropNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.sg = SqrtGrad()

    def construct(self, x):
        return self.sg(self.fc(x)).sum()


@pytest.mark.parametrize("watch", [False, True])
def test_a_nan_made_in_a_custom_bprop_is_named_in_that_cells_backward(make_debugger, dump_dir, watch):
    """The calls a Cell's custom bprop makes run in that Cell's backward: construct.json gives them
    its backward entry as parent, so the NaN producer among them is named with that Cell (anomalies,
    first-diff's Cell path, watch mode's "cell")."""
    ms.set_seed(0)
    net = BpropNet()
    debugger = make_debugger(task="statistics", level="mix", **({"watch": {}} if watch else {}))
    debugger.start(net)
    ms.value_and_grad(net, None, net.trainable_params())(Tensor(np.ones((2, 4), np.float32)))
    debugger.stop()
    debugger.step()
    d, dump = load_step(dump_dir)
    bwd = "Cell.sg.SqrtGrad.backward.0"
    assert dump.construct["Tensor.__sub__.0.forward"] == dump.construct["Functional.sqrt.0.forward"] == bwd
    assert dump.construct["Tensor.__mul__.0.forward"] == "Cell.sg.SqrtGrad.forward.0"
    assert dump.construct[bwd] is None and dump.construct["Tensor.sum.0.forward"] is None
    report = read_report(d, "anomalies.json")
    assert report["first_producer"] == "Functional.sqrt.0.forward"
    if watch:
        assert report["producer"] == "Functional.sqrt.0.forward" and report["cell"] == bwd
    (found,) = nan_producer(dump_dir)
    assert found.entry == "Functional.sqrt.0.forward" and found.cell_path == [bwd]


def test_finite_step_writes_no_reports(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start()
    ops.relu(Tensor(np.ones(3, np.float32)))
    debugger.stop()
    debugger.step()
    d, dump = load_step(dump_dir)
    assert not os.path.exists(os.path.join(d, "anomalies.json"))
    assert "empty_reason" not in json.load(open(os.path.join(d, "dump.json"), encoding="utf-8"))


class NanBetweenCells(nn.Cell):
    """The NaN is made by ``ops.log`` in the root's own code, between two Cells (unrecorded at L0)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Dense(8, 8)
        self.c = nn.Dense(8, 8)
        self.d = nn.ReLU()

    def construct(self, x):
        return self.d(self.c(ops.log(self.a(x) - 100.0)))


def test_gradients_of_a_call_fed_nan_are_not_producers(make_debugger, dump_dir):
    """A Cell's parameter gradients (and a backward entry) count their forward call's inputs as
    inputs: a NaN that came in through the forward is propagated, not produced, by the backward."""
    from msprobe.compare import nan_producer

    ms.set_seed(0)
    net = NanBetweenCells()
    grad_fn = ms.value_and_grad(lambda x: net(x).mean(), None, net.trainable_params())
    debugger = make_debugger(task="statistics", level="L0")
    debugger.start(net)
    grad_fn(Tensor(np.ones((2, 8), np.float32)))
    debugger.stop()
    debugger.step()
    d, dump = load_step(dump_dir)
    assert any(not np.isfinite(v) for v in dump.data["Cell.c.Dense.parameters_grad.0"]["weight"][0].values()
               if isinstance(v, float))                                     # the gradient is NaN ...
    report = read_report(d, "anomalies.json")
    assert report["first_non_finite"] == "Cell.c.Dense.forward.0" and report["first_producer"] is None
    assert nan_producer(dump_dir) == []                                     # ... but not produced there


class Outer(nn.Cell):
    """``Outer(Inner(log(x - 100)))`` then a Cell fed the NaN: three levels of nesting at mix."""

    def __init__(self):
        super().__init__()
        self.inner = nn.SequentialCell(nn.Dense(8, 8), LogShift())
        self.after = nn.Dense(8, 8)

    def construct(self, x):
        return self.after(self.inner(x))


def test_first_non_finite_is_the_first_value_made_at_mix(make_debugger, dump_dir):
    """At mix the first non-finite value made is the API's output, before the two Cells around it
    return theirs (they come first in dump.json, recorded when they start); ``msprobe.dump.summarize``
    names the same entry. At L1 there are no Cells and the order is plain execution order."""
    ms.set_seed(0)
    net = Outer()
    debugger = make_debugger(task="statistics", level="mix")
    debugger.start(net)
    net(Tensor(np.ones((2, 8), np.float32)))
    debugger.stop()
    debugger.step()
    d, dump = load_step(dump_dir)
    names = list(dump.data)
    assert names.index("Cell.inner.SequentialCell.forward.0") < names.index("Functional.log.0.forward")
    report = read_report(d, "anomalies.json")
    assert report["first_non_finite"] == report["first_producer"] == "Functional.log.0.forward"
    assert "first entry with a non-finite value: step0/" in msprobe.dump.summarize(dump_dir)
    assert f"{os.path.basename(d)}: Functional.log.0.forward\n" in msprobe.dump.summarize(dump_dir)
