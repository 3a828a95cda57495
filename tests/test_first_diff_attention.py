"""first-diff on an attention block (q/k/v Dense, softmax) trained with SGD (real MindSpore, CPU,
PyNative). The gradient of the key projection's bias is mathematically zero (softmax does not change
when a row of its input is shifted), so its statistics are rounding noise of the gradients that
produced it: a Float16 run against a Float32 one must be a difference of precision, not a difference
at that near-zero gradient. Two runs initialised with different seeds inside a wrapping Cell are
named where they part, without claiming the difference stays within tolerance before the wrapping
Cell."""
from __future__ import annotations

import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

from conftest import write_config
from msprobe.compare import first_divergence
from test_compare import cli


class Attention(nn.Cell):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Dense(8, 8), nn.Dense(8, 8), nn.Dense(8, 8)
        self.o = nn.Dense(8, 4)

    def construct(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)) * 0.35, -1)
        return self.o(ops.matmul(scores, v))


class Wrapper(nn.Cell):
    def __init__(self):
        super().__init__()
        self.net = Attention()

    def construct(self, x):
        return self.net(x)


def _dump(root, name, level, fp16=False, seed=3, wrapped=False):
    from msprobe.mindspore import PrecisionDebugger

    ms.set_seed(seed)
    np.random.seed(seed)
    net = Wrapper() if wrapped else Attention()
    if fp16:
        net.to_float(ms.float16)
    dump_path = os.path.join(str(root), name)
    os.makedirs(dump_path + "_cfg", exist_ok=True)
    debugger = PrecisionDebugger(write_config(dump_path + "_cfg", level=level, dump_path=dump_path))
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-2)
    rng = np.random.RandomState(11)
    x = Tensor(rng.randn(2, 6, 8).astype(np.float32))
    y = Tensor(rng.randn(2, 6, 4).astype(np.float32))

    def forward(data, label):
        return ((net(data).astype(ms.float32) - label) ** 2).mean()

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    debugger.start(net)
    opt(grad_fn(x, y)[1])
    debugger.stop()
    debugger.step()
    return dump_path


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_near_zero_bias_gradient_in_float16_is_a_difference_of_precision(tmp_path, level):
    """The key bias gradient (Norm about 1e-5 in Float16, 1e-9 in Float32) is judged against the scale
    of its entry's other tensors, with Float16's tolerance there: first-diff says the runs differ in
    precision and exits 0; --exact still names a bitwise difference."""
    target = _dump(tmp_path, f"{level}_fp16", level, fp16=True)
    golden = _dump(tmp_path, f"{level}_fp32", level)
    found = first_divergence(target, golden)
    assert [(f.step, f.kind) for f in found] == [(0, "precision")], [(f.kind, f.entry) for f in found]
    out = cli("first-diff", target, golden, "--step", "0", check_code=0).stdout
    assert out.startswith("first difference of precision (step 0"), out
    assert [f.kind for f in first_divergence(target, golden, exact=True)] != ["precision"]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_no_claim_of_tolerance_kept_when_the_named_entry_already_fails(tmp_path, level):
    """Different seeds: the first Dense's parameters already fail the thresholds, so the finding does
    not say the difference stays within tolerance up to the wrapping Cell."""
    target = _dump(tmp_path, f"{level}_seed4", level, seed=4, wrapped=True)
    golden = _dump(tmp_path, f"{level}_seed3", level, wrapped=True)
    found = first_divergence(target, golden)[0]
    named = "Cell.net.q.Dense.forward.0" if level == "L0" else "Primitive.matmul.MatMul.0.forward"
    assert found.entry == named and found.kind == "input", found
    assert found.exceeds_at is None, found.exceeds_at
    out = cli("first-diff", target, golden, "--step", "0", check_code=1).stdout
    assert "stays within tolerance" not in out and "its parameters already differ (" in out, out


def test_inputs_are_said_to_agree_only_when_equal():
    """A difference whose inputs pass the thresholds but are not bitwise equal says so."""
    from msprobe.compare.divergence import Finding

    rec = {"record": "input.0", "result": "pass", "bitwise_equal": False}
    out = {"record": "output.0", "result": "error", "bitwise_equal": False}
    found = Finding("divergence", 0, "", "Primitive.add.Add.0.forward", records=[rec, out])
    assert found.reason() == "inputs differ within tolerance, outputs do not agree (forward)"
    found.records[0] = dict(rec, bitwise_equal=True)
    assert found.reason() == "inputs agree, outputs do not (forward)"


def _grad_dump(root, name, bias_max, weight_max=1.3e-3):
    """A one-entry L0 dump: the parameter gradients of a Dense Cell (weight Norm 5e-3, bias ~1e-10)."""
    import json

    def leaf(shape, top, low, mean, norm):
        return [{"type": "mindspore.Tensor", "dtype": "Float32", "shape": shape, "Max": top, "Min": low,
                 "Mean": mean, "Norm": norm}]

    directory = os.path.join(str(root), name, "step0", "rank0")
    os.makedirs(directory)
    grads = {"bias": leaf([16], bias_max, -5.09e-11, -2.3e-12, 9.66e-11),
             "weight": leaf([16, 16], weight_max, -1.08e-3, -1.6e-9, 5.22e-3)}
    with open(os.path.join(directory, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L0", "framework": "mindspore", "dump_data_dir": None,
                   "schema": "msprobe-mindspore/2", "data": {"Cell.k.Dense.parameters_grad.0": grads}}, f)
    return os.path.join(str(root), name)


def test_a_near_zero_parameter_gradient_is_judged_against_its_entrys_scale(tmp_path):
    """Same precision on both sides (GRAPH_MODE against PyNative sums in another order): a bias
    gradient of ~1e-10 next to a weight gradient of Norm 5e-3 differing by 5e-12 is rounding noise at
    the entry's scale, not a difference; one differing at the weight gradient's scale still is."""
    golden = _grad_dump(tmp_path, "golden", 4.00e-11)
    assert first_divergence(_grad_dump(tmp_path, "noise", 4.55e-11), golden) == []
    out = cli("first-diff", str(tmp_path / "noise"), golden, check_code=0).stdout
    assert "agree within tolerance" in out, out
    (found,) = first_divergence(_grad_dump(tmp_path, "real", 4.00e-11, weight_max=1.4e-3), golden)
    assert found.entry == "Cell.k.Dense.parameters_grad.0"
    assert [r["record"] for r in found.records if r["result"] != "pass"] == ["weight"]
