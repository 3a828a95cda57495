"""first-diff and compare on a net with a nested Cell: Conv2d -> Dense -> Block(LayerNorm, Dense ``fc``,
GELU, Dropout) -> Dense head, trained with Adam (real MindSpore, CPU, PyNative, two steps). One run
changes one element of ``b1.fc.weight`` by a relative 1e-3 (the difference starts at the nested Dense
Cell, whose parameter differs), another computes in Float16 (``to_float``; the Parameters stay
Float32): the levels must agree on which of the two a run pair is."""
from __future__ import annotations

import csv
import glob
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from conftest import write_config
from msprobe.compare import first_divergence
from test_compare import cli


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((16,))
        self.fc = nn.Dense(16, 16)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p=0.0)

    def construct(self, x):
        return self.drop(self.act(self.fc(self.norm(x))))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, pad_mode="same", weight_init="normal", has_bias=True)
        self.flat = nn.Flatten()
        self.fc0 = nn.Dense(2 * 4 * 4, 16)
        self.b1 = Block()
        self.head = nn.Dense(16, 3)

    def construct(self, x):
        return self.head(self.b1(self.fc0(self.flat(self.conv(x)))))


def _dump(root, name, level, change=None, fp16=False, steps=2):
    from msprobe.mindspore import PrecisionDebugger

    ms.set_seed(3)
    np.random.seed(3)
    net = Net()
    if change:
        w = net.b1.fc.weight.asnumpy().copy()
        w.flat[5] *= np.float32(1 + 1e-3)
        net.b1.fc.weight.set_data(Tensor(w))
    if fp16:
        net.to_float(ms.float16)
    dump_path = os.path.join(str(root), name)
    os.makedirs(os.path.join(str(root), name + "_cfg"), exist_ok=True)
    debugger = PrecisionDebugger(write_config(os.path.join(str(root), name + "_cfg"), level=level,
                                              dump_path=dump_path))
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    rng = np.random.RandomState(11)
    x = Tensor(rng.randn(4, 1, 4, 4).astype(np.float32))
    y = Tensor(rng.randn(4, 3).astype(np.float32))

    def forward(data, label):
        out = net(data)
        return ((out.astype(ms.float32) - label) ** 2).mean()

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    for _ in range(steps):  # Adam, as the user's training loop
        debugger.start(net)
        opt(grad_fn(x, y)[1])
        debugger.stop()
        debugger.step()
    return dump_path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("nested")
    out = {}
    for level in ("L0", "mix", "L1"):
        out[(level, "base")] = _dump(root, f"{level}_base", level)
        out[(level, "changed")] = _dump(root, f"{level}_changed", level, change=True)
    for level in ("mix", "L1"):
        out[(level, "fp16")] = _dump(root, f"{level}_fp16", level, fp16=True)
    return out


@pytest.mark.parametrize("level", ["L0", "mix"])
@pytest.mark.parametrize("exact", [False, True])
def test_the_nested_cell_whose_weight_changed_is_named(runs, level, exact):
    target, golden = runs[(level, "changed")], runs[(level, "base")]
    found = first_divergence(target, golden, exact=exact)[0]
    assert found.entry == "Cell.b1.fc.Dense.forward.0", found
    assert found.kind == "input" and found.differing_parameters(exact=True) == ["parameters.weight"], found
    out = cli("first-diff", target, golden, "--step", "0", *(["--exact"] if exact else []),
              check_code=1).stdout
    assert out.splitlines()[0].endswith("Cell.b1.fc.Dense.forward.0"), out
    assert "its parameters already differ (parameters.weight" in out, out


def test_compare_summary_names_what_first_diff_names(runs, tmp_path):
    """``msprobe compare`` runs first-diff's rule in its own pass: its summary and its printed line
    name the nested Cell too (the CSV's ``source`` is the error-gain verdict of each entry)."""
    target, golden = runs[("mix", "changed")], runs[("mix", "base")]
    out = cli("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path), "--step", "0").stdout
    assert "first divergence (as msprobe first-diff): Cell.b1.fc.Dense.forward.0" in out, out
    (summary,) = glob.glob(str(tmp_path / "compare_summary_*.json"))
    import json
    (item,) = json.load(open(summary, encoding="utf-8"))["results"]
    assert item["first_divergence"]["entry"] == "Cell.b1.fc.Dense.forward.0"
    assert item["first_divergence"]["parameters_differ"] == ["parameters.weight"]
    with open(item["csv"], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    named = [r for r in rows if r["NPU Name"].startswith("Cell.b1.fc.Dense.forward.0.")]
    assert named and {r["Entry Result"] for r in named} <= {"pass", "propagated"}


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_float16_against_float32_is_a_difference_of_precision_at_every_level(runs, level):
    """The Float32 parameter gradients (recorded at mix) are computed from Float16 values: they
    carry Float16 rounding, and are not blamed unless they amplify it more than entry.gain times."""
    target, golden = runs[(level, "fp16")], runs[(level, "base")]
    found = first_divergence(target, golden)
    assert [f.kind for f in found] == ["precision", "precision"], [(f.kind, f.entry) for f in found]
    assert {f.entry for f in found} == {"Primitive.layer_norm.LayerNorm.0.forward"}
    out = cli("first-diff", target, golden, check_code=0).stdout
    assert "first divergence" not in out and "first difference of precision (step 0" in out, out
    if level == "mix":
        from msprobe.compare import compare
        rows = [r for r in compare(target, golden, step=[0]) if ".parameters_grad." in r["NPU Name"]]
        assert rows and any(r["Result"] == "error" for r in rows)            # Float32 tolerance exceeded
        assert {r["Entry Result"] for r in rows} == {"propagated"}, rows      # but only carried


def test_agreeing_within_tolerance_while_differing_bitwise_is_said(runs, tmp_path):
    loose = tmp_path / "loose.yaml"
    loose.write_text("groups:\n  float32: {warning: 1.0, error: 2.0}\n")
    target, golden = runs[("mix", "changed")], runs[("mix", "base")]
    out = cli("first-diff", target, golden, "--thresholds", str(loose), check_code=0).stdout
    assert out.splitlines()[0] == ("the runs agree within tolerance but differ bitwise "
                                   "(--exact names where they first differ)"), out
    same = cli("first-diff", golden, golden, check_code=0).stdout
    assert same.splitlines()[0] == "the runs agree within tolerance", same
