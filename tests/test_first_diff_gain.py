"""first-diff in tolerance mode on a difference that stays below the thresholds for a while: a Dense ->
ReLU -> Dense net (conftest's TinyMLP) whose second weight has one element changed by a relative 1e-3 (real MindSpore,
CPU, PyNative, one training step). The weight, the MatMul that consumes it and the calls after it
all pass the float32 thresholds (or only warn) until the loss, whose inputs already differ by nearly
as much as its output: the loss carries the difference, the MatMul (L1) or the Dense Cell (mix) is
where it starts."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from mindspore import Tensor

from conftest import build_mlp, run_steps, write_config
from msprobe.compare import compare, first_divergence
from test_compare import cli


def _dump(root, name, level, changed, element=17):
    from msprobe.mindspore import PrecisionDebugger

    net = build_mlp(0)
    if changed:  # one element of fc2.weight, relative 1e-3
        w = net.fc2.weight.asnumpy().copy()
        w.flat[element] *= np.float32(1 + 1e-3)
        net.fc2.weight.set_data(Tensor(w))
    dump_path = os.path.join(str(root), name)
    debugger = PrecisionDebugger(write_config(str(root), level=level, dump_path=dump_path))
    rng = np.random.RandomState(7)
    run_steps(net, debugger, batch=(Tensor(rng.randn(4, 8).astype(np.float32)),
                                    Tensor(rng.rand(4, 4).astype(np.float32))))
    return dump_path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gain")
    return {(level, changed): _dump(root, f"{level}_{changed}", level, changed)
            for level in ("L1", "mix") for changed in (False, True)}


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_tolerance_mode_names_where_a_difference_below_the_thresholds_starts(runs, level):
    """Both levels name the MatMul that takes the changed weight (at mix, inside the Dense Cell whose
    weight it is: the deepest entry, the Cell in its Cell path)."""
    origin = "Primitive.matmul.MatMul.1.forward"
    target, golden = runs[(level, True)], runs[(level, False)]
    rows = {r["NPU Name"]: r for r in compare(target, golden)}
    loss = "Functional.mse_loss.0.forward"
    # the scenario: the loss's inputs pass, its output does not, with a gain far below entry.gain
    assert rows[f"{loss}.input.0"]["Result"] == "pass"
    assert rows[f"{loss}.output.0"]["Result"] != "pass"
    assert 0 < rows[f"{loss}.output.0"]["Error Gain"] < 10
    assert rows[f"{loss}.output.0"]["Gain Verdict"] == "carried"   # it carries, not produces
    (found,) = first_divergence(target, golden)
    # the weight already exceeds the warning threshold: the loss is not where the thresholds are
    # first exceeded, and no such claim is made
    assert (found.kind, found.entry, found.exceeds_at) == ("input", origin, None), found
    (bitwise,) = first_divergence(target, golden, exact=True)
    assert (bitwise.kind, bitwise.entry, bitwise.exceeds_at) == ("input", origin, None)
    out = cli("first-diff", target, golden, check_code=1).stdout
    assert "first difference (step 0 " in out and f"): {origin}" in out.splitlines()[0], out
    changed = "input.1" if level == "L1" else "input.1 = parameters.weight of Cell.fc2.Dense.forward.0"
    assert found.cell_path == ([] if level == "L1" else ["Cell.fc2.Dense.forward.0"]), found.cell_path
    assert re.search(re.escape(changed) + r": largest scaled statistic error [0-9.e+-]+\)", out), out
    assert "stays within tolerance" not in out, out


def test_exact_mode_names_the_differing_input_and_by_how_much(runs):
    out = cli("first-diff", runs[("L1", True)], runs[("L1", False)], "--exact", check_code=1).stdout
    first, why = out.splitlines()[:2]
    assert first.endswith("Primitive.matmul.MatMul.1.forward"), out
    # input.0 (the ReLU's output) is bitwise equal: only the weight is named
    match = re.search(r"its inputs already differ \(input\.1: largest scaled statistic error ([0-9.e+-]+)\)", why)
    assert match, why
    assert float(match.group(1)) == pytest.approx(2.3e-05, rel=0.05)
    assert "input.0" not in why


def test_the_call_consuming_the_change_is_named_when_it_exceeds_the_thresholds_itself(runs, tmp_path):
    """Another element: the MatMul's weight passes, its output fails with a gain far below
    entry.gain. It is named as the entry whose input already differs, and where it exceeds the
    thresholds, not as a call that produces a difference from agreeing inputs."""
    target = _dump(tmp_path, "L1_element2", "L1", True, element=2)
    (found,) = first_divergence(target, runs[("L1", False)])
    matmul = "Primitive.matmul.MatMul.1.forward"
    assert (found.kind, found.entry, found.exceeds_at) == ("input", matmul, matmul), found
    assert 0 < found.exceeds_gain < 10
    reason = found.reason()
    assert reason.startswith("its inputs already differ (input.1: largest scaled statistic error ")
    assert "within tolerance): the difference comes from outside the dump" in reason, reason
    assert reason.endswith(f"its outputs exceed the tolerance only by carrying that difference on "
                           f"(error gain {found.exceeds_gain:.3g})"), reason
