"""first-diff and compare at a step after an optimizer update (real MindSpore, CPU, PyNative, three
steps with Adam). The model is ``WithNet(Net)``: ``Net`` holds no Parameter of its own, only Cells
(Dense ``inp``, two blocks of Dense + LayerNorm + GELU, Dense ``head``). One run changes one element
of ``b2.fc.weight`` by a relative 1e-3. After the first update the Parameters of every Cell inside
``Net`` differ (within tolerance) while ``Net``'s input agrees: those Parameters are inputs of
``Net``'s computation, so ``Net`` does not make its output difference with an infinite error gain,
and tolerance mode names what the bitwise rule names, the first Cell whose Parameters differ."""
from __future__ import annotations

import os

import numpy as np
import pytest

from mindspore import Tensor, nn

from conftest import mlp_batch, run_steps, write_config
from msprobe.compare import compare, first_divergence
from test_compare import cli

STEP = 2          # the third step: two updates made every Parameter differ
FIRST = "Cell.net.inp.Dense.forward.0"
OUTER = "Cell.net.Net.forward.0"


class Block(nn.Cell):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Dense(width, width)
        self.ln = nn.LayerNorm((width,))
        self.act = nn.GELU()

    def construct(self, x):
        return self.act(self.ln(self.fc(x)))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inp = nn.Dense(8, 16)
        self.b1 = Block(16)
        self.b2 = Block(16)
        self.head = nn.Dense(16, 4)

    def construct(self, x):
        return self.head(self.b2(self.b1(self.inp(x))))


class WithNet(nn.Cell):
    """The model given to the debugger (not dumped itself: the Cells inside it are)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x):
        return self.net(x)


def _dump(root, level, changed):
    from msprobe.mindspore import PrecisionDebugger, seed_all

    seed_all(1234)
    net = Net()
    if changed:
        w = net.b2.fc.weight.asnumpy().copy()
        w[3, 5] *= np.float32(1 + 1e-3)
        net.b2.fc.weight.set_data(Tensor(w))
    name = f"{level}_{'changed' if changed else 'base'}"
    cfg_dir, dump_path = os.path.join(str(root), name + "_cfg"), os.path.join(str(root), name)
    os.makedirs(cfg_dir, exist_ok=True)
    debugger = PrecisionDebugger(write_config(cfg_dir, level=level, dump_path=dump_path))
    run_steps(WithNet(net), debugger, STEP + 1, batch=mlp_batch(0), lr=1e-2, optimizer=nn.Adam)
    return dump_path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("update")
    return {(level, changed): _dump(root, level, changed)
            for level in ("L0", "mix") for changed in (False, True)}


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_after_an_update_tolerance_mode_names_what_the_bitwise_rule_names(runs, level):
    """L0 names the first Cell whose Parameters differ; mix the call inside it that takes them (its
    MatMul, the deepest entry), with that Cell in its Cell path."""
    target, golden = runs[(level, True)], runs[(level, False)]
    (bitwise,) = first_divergence(target, golden, exact=True, step=[STEP])
    (found,) = first_divergence(target, golden, step=[STEP])
    named = FIRST if level == "L0" else "Primitive.matmul.MatMul.0.forward"
    assert (bitwise.kind, bitwise.entry) == ("input", named), bitwise
    assert (found.kind, found.entry) == ("input", named), (found.kind, found.entry, found.exceeds_at)
    if level == "L0":
        assert found.differing_parameters() == ["parameters.weight", "parameters.bias"]
    else:
        assert found.differing_parameters() == [f"input.1 = parameters.weight of {FIRST}"]
        assert found.cell_path[-1] == FIRST, found.cell_path
    # the carrying entry is a call inside Net whose own inputs already differ, not Net
    assert found.exceeds_at not in (None, OUTER), found.exceeds_at
    out = cli("first-diff", target, golden, "--step", str(STEP), check_code=1).stdout
    assert out.splitlines()[0].endswith(named), out
    assert "its parameters already differ (" + found.differing_parameters()[0] in out, out
    assert "inputs agree, outputs do not" not in out, out


def test_the_outer_cell_is_not_a_source_with_infinite_gain(runs):
    rows = {r["NPU Name"]: r for r in compare(runs[("L0", True)], runs[("L0", False)], step=[STEP])}
    out = rows[f"{OUTER}.output.0"]
    # the scenario: the Parameters inside Net differ within tolerance, its input is equal, its output fails
    params = [r for name, r in rows.items() if ".forward.0.parameters." in name]
    assert params and all(r["Result"] == "pass" for r in params)
    assert any(r["Mean diff"] or r["L2norm diff"] for r in params)
    diffs = ("Max diff", "Min diff", "Mean diff", "L2norm diff")
    assert [rows[f"{OUTER}.input.0"][k] for k in diffs] == [0] * 4
    assert out["Result"] != "pass"
    # its input is bitwise equal; what it carries is the difference of the Parameters inside it
    assert out["Error Gain"] is not None and np.isfinite(out["Error Gain"]), out
    assert out["Gain Verdict"] == "carried", out
