"""msprobe compare reads dumps written by the reference tool (mindstudio-probe 26.2.0 on MindSpore
2.10 CPU). The files under tests/data/reference were written by tests/scripts/reference_dump.py
(see its docstring) from the net in tests/scripts/ref_net.py; in the reference's dumps a Cell's
entry follows the calls inside it, in ours it precedes them."""
from __future__ import annotations

import os
import sys

from msprobe.compare import compare, first_divergence

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "data", "reference")
sys.path.insert(0, os.path.join(HERE, "scripts"))

from ref_net import dumped_step  # noqa: E402


def test_reference_dumps_compare_and_first_divergence():
    base, factor = os.path.join(REFERENCE, "base"), os.path.join(REFERENCE, "factor")
    rows = compare(factor, base)
    assert len(rows) > 60 and {r["Match"] for r in rows} == {"name"}
    named = {r["NPU Name"]: r for r in rows}
    assert named["Cell.fc1.Dense.forward.0.output.0"]["Result"] == "pass"
    assert named["Mint.mul.0.forward.input.1"]["Err_message"] == "value differs (2.5 vs 2.0)"
    (found,) = first_divergence(factor, base)
    assert (found.kind, found.entry, found.cell_path) == (
        "divergence", "Mint.mul.0.forward", ["Cell.scale.Scale.forward.0"])
    assert any("ref_net.py" in frame for frame in found.target_stack)


def test_our_dump_against_the_reference_dump(make_debugger, dump_dir):
    dumped_step(make_debugger(level="mix"), 2.0)
    rows = compare(dump_dir, os.path.join(REFERENCE, "base"))
    matched = [r for r in rows if r["Match"] != "unmatched"]
    assert len(matched) > 60
    assert {r["Match"] for r in matched} == {"name"}
    # same net, same data: every forward record and every Cell's backward record agrees within
    # float32 tolerance (the reference computes statistics in float32, msprobe in float64), whatever
    # the entry order of the two files
    entry = {id(r): (r["NPU Name"] or r["Bench Name"]).split(".forward")[0].split(".backward")[0]
             for r in rows}
    forward = [r for r in rows if ".forward." in (r["NPU Name"] or r["Bench Name"])]
    assert len(forward) > 30 and {r["Result"] for r in forward} == {"pass"}
    cells = [r for r in rows if (r["NPU Name"] or "").startswith("Cell.")]
    assert {r["Result"] for r in cells} == {"pass"}
    # what differs is the reference's order of a Primitive's input gradients (BiasAdd: bias first)
    # and its gradient for mse_loss's label, which msprobe does not record (no gradient flows there)
    others = {entry[id(r)] for r in rows if r["Result"] != "pass"}
    assert others <= {"Primitive.bias_add.BiasAdd.0", "Primitive.bias_add.BiasAdd.1",
                      "Primitive.matmul.MatMul.0", "Primitive.matmul.MatMul.1", "Functional.mse_loss.0"}
