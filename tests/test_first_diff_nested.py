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


def _dump(root, name, level, change=None, fp16=False, steps=2, optimizer=nn.Adam, lr=1e-3):
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
    opt = optimizer(net.trainable_params(), learning_rate=lr)
    rng = np.random.RandomState(11)
    x = Tensor(rng.randn(4, 1, 4, 4).astype(np.float32))
    y = Tensor(rng.randn(4, 3).astype(np.float32))

    def forward(data, label):
        out = net(data)
        return ((out.astype(ms.float32) - label) ** 2).mean()

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    for _ in range(steps):  # Adam by default, as the user's training loop
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
    for level in ("L0", "mix", "L1"):
        out[(level, "fp16")] = _dump(root, f"{level}_fp16", level, fp16=True)
    return out


#: the MatMul of ``b1.fc`` (the second Dense called): at mix, the call that takes the changed weight
FC_MATMUL = "Primitive.matmul.MatMul.1.forward"


@pytest.mark.parametrize("level", ["L0", "mix"])
@pytest.mark.parametrize("exact", [False, True])
def test_the_nested_cell_whose_weight_changed_is_named(runs, level, exact):
    """At L0 the Dense Cell whose weight changed is named; at mix the deepest entry, the MatMul inside
    it that takes that weight, with the Cell in its Cell path."""
    target, golden = runs[(level, "changed")], runs[(level, "base")]
    found = first_divergence(target, golden, exact=exact)[0]
    named = "Cell.b1.fc.Dense.forward.0" if level == "L0" else FC_MATMUL
    assert found.entry == named, found
    if level == "L0":
        assert found.kind == "input" and found.differing_parameters(exact=True) == ["parameters.weight"], found
        said = "its parameters already differ (parameters.weight"
    else:
        assert found.cell_path == ["Cell.b1.Block.forward.0", "Cell.b1.fc.Dense.forward.0"], found
        assert found.parameters_of == "Cell.b1.fc.Dense.forward.0" and found.kind == "input", found
        assert found.differing_parameters(exact=True) == [
            "input.1 = parameters.weight of Cell.b1.fc.Dense.forward.0"], found
        said = "its parameters already differ (input.1 = parameters.weight of Cell.b1.fc.Dense.forward.0: "
    out = cli("first-diff", target, golden, "--step", "0", *(["--exact"] if exact else []),
              check_code=1).stdout
    assert out.splitlines()[0].endswith(named), out
    assert said in out, out


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_compare_and_first_diff_give_the_same_answer(runs, tmp_path, level):
    """``msprobe compare`` runs first-diff's rule in its own pass: on one pair of dumps its printed
    line and its summary name what ``first-diff`` names, with the same label. Its CSV's ``Gain
    Verdict`` is per entry (``grows``: the error grows there more than ``entry.gain`` times): here the
    first such entry is another one, and the column says so by its name, not "source"."""
    target, golden = runs[(level, "changed")], runs[(level, "base")]
    (found,) = [f for f in first_divergence(target, golden, step=[0])]
    diff = cli("first-diff", target, golden, "--step", "0", check_code=1).stdout.splitlines()[0]
    out = cli("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path), "--step", "0").stdout
    assert diff.startswith("first difference (step 0 ") and diff.endswith(f": {found.entry}"), diff
    assert f"; first difference (as msprobe first-diff): {found.entry} (forward; its parameters already " \
           f"differ: {', '.join(found.differing_parameters())}" in out, out
    assert "divergence" not in out and "divergence" not in diff
    (summary,) = glob.glob(str(tmp_path / "compare_summary_*.json"))
    import json
    (item,) = json.load(open(summary, encoding="utf-8"))["results"]
    assert (item["first_difference"]["entry"], item["first_difference"]["label"]) == (found.entry, "first difference")
    as_json = json.loads(cli("first-diff", target, golden, "--step", "0", "--json", check_code=1).stdout)
    assert [(d["entry"], d["label"]) for d in as_json["divergences"]] == [(found.entry, "first difference")]
    assert item["first_difference"]["parameters_differ"] == found.differing_parameters()
    assert "first_source_entry" not in item
    with open(item["csv"], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert "Entry Result" not in rows[0] and {r["Gain Verdict"] for r in rows} <= {"pass", "grows", "carried"}
    named = [r for r in rows if r["NPU Name"].startswith(found.entry + ".")]
    assert named and {r["Gain Verdict"] for r in named} <= {"pass", "carried"}
    grows = [r["NPU Name"] for r in rows if r["Gain Verdict"] == "grows"]
    assert grows and not grows[0].startswith(found.entry + "."), grows


@pytest.mark.parametrize("level", ["L0", "mix", "L1"])
def test_float16_against_float32_is_a_difference_of_precision_at_every_level(runs, level):
    """The Float32 parameter gradients (recorded at L0 and mix) are computed from Float16 values: they
    carry Float16 rounding, and are not blamed unless they amplify it more than entry.gain times. After
    the first update (step 1) the Float32 Parameters differ by what the Float16 gradients made them
    differ, within Float16's tolerance: every level says the runs differ in precision, naming the
    two runs' dtypes."""
    target, golden = runs[(level, "fp16")], runs[(level, "base")]
    found = first_divergence(target, golden)
    assert [(f.step, f.kind) for f in found] == [(0, "precision"), (1, "precision")], \
        [(f.kind, f.entry) for f in found]
    # mix, L1: the cast of a Float16 value to Float32 (its output judged as Float32); LayerNorm's
    # near-zero mean output agrees within Float16's rounding of the scale of its inputs
    first = {"L0": "Cell.head.Dense.parameters_grad.0"}.get(level, "Tensor.to.2.forward")
    assert found[0].entry == first, found[0].entry
    assert all("the runs differ in precision (target Float16, golden Float32)" in f.reason() for f in found)
    out = cli("first-diff", target, golden, check_code=0).stdout
    assert "divergence" not in out and "first difference of precision (step 0" in out, out
    assert "first difference of precision (step 1" in out, out
    if level == "L0":  # a parameter-gradient entry is shown with the path of its Cell call
        assert found[0].cell_path == ["Cell.head.Dense.backward.0"], found[0].cell_path
        assert "  Cell path: Cell.head.Dense.backward.0\n" in out, out
        shown = cli("show", target, first, "--step", "0", check_code=0).stdout
        assert "Cell path: Cell.head.Dense.backward.0\n" in shown, shown
    if level == "mix":
        from msprobe.compare import compare
        rows = [r for r in compare(target, golden, step=[0]) if ".parameters_grad." in r["NPU Name"]]
        assert rows and any(r["Result"] == "error" for r in rows)            # Float32 tolerance exceeded
        assert {r["Gain Verdict"] for r in rows} == {"carried"}, rows      # but only carried


def test_after_updates_every_level_says_the_runs_differ_in_precision(tmp_path):
    """SGD with a large learning rate: after an update the Float32 Parameters of the Float16 run
    differ from the Float32 run's by more than Float32's tolerance, within Float16's. Every level
    gives the same verdict at every step: a difference of precision (at L0 a Cell's own
    ``parameters.*`` differ, at L1 a MatMul's ``input.1``, at mix both: not "its parameters already
    differ" at one level and "of precision" at another)."""
    kinds = {}
    for level in ("L0", "mix", "L1"):
        base = _dump(tmp_path, f"{level}_sgd", level, steps=3, optimizer=nn.SGD, lr=0.1)
        fp16 = _dump(tmp_path, f"{level}_sgd_fp16", level, fp16=True, steps=3, optimizer=nn.SGD, lr=0.1)
        kinds[level] = [(f.step, f.kind) for f in first_divergence(fp16, base)]
    assert kinds["L0"] == kinds["mix"] == kinds["L1"] == [(0, "precision"), (1, "precision"), (2, "precision")], kinds


def test_agreeing_within_tolerance_while_differing_bitwise_is_said(runs, tmp_path):
    loose = tmp_path / "loose.yaml"
    loose.write_text("groups:\n  float32: {warning: 1.0, error: 2.0}\n")
    target, golden = runs[("mix", "changed")], runs[("mix", "base")]
    out = cli("first-diff", target, golden, "--thresholds", str(loose), check_code=0).stdout
    assert out.splitlines()[0] == ("the runs agree within tolerance but differ bitwise "
                                   "(--exact names where they first differ)"), out
    same = cli("first-diff", golden, golden, check_code=0).stdout
    assert same.splitlines()[0] == "the runs agree bitwise (every statistic recorded is equal)", same
