"""GRAPH_MODE at L0/mix/L1 with the training step compiled by MindSpore (``ms.value_and_grad`` in
GRAPH_MODE runs as one ``mindspore.jit`` function, recorded as ``Jit.after_grad.0.forward``): the Cells
its graph runs are recorded inside that entry.

``set_context(mode=...)`` is process-global, so every run is a subprocess of
``tests/scripts/graph_region_worker.py``.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "scripts", "graph_region_worker.py")
REGION = "Jit.after_grad.0.forward"


def _run(dump: str, mode: str, level: str, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, WORKER, mode, level, dump, *extra],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"losses": json.loads(proc.stdout.strip().splitlines()[-1])["losses"], "stderr": proc.stderr}


def _read(dump: str, step: int, name: str):
    (path,) = glob.glob(os.path.join(dump, f"step{step}", "*", name))
    with open(path) as f:
        return json.load(f)


def test_watch_names_the_cell_inside_the_compiled_step(tmp_path):
    dump = str(tmp_path / "watch")
    out = _run(dump, "graph", "mix", "--watch", "--poison-step", "1")
    assert "first produced by Cell.attn.Attn.forward.0" in out["stderr"]
    found = _read(dump, 1, "anomalies.json")
    assert found["producer"] == found["first_producer"] == "Cell.attn.Attn.forward.0"
    assert found["first_non_finite"] == "Cell.attn.Attn.forward.0"
    assert found["cell"] == REGION
    assert "note" not in found  # the producer is a Cell: nothing to say about the region
    construct = _read(dump, 1, "construct.json")
    assert construct[REGION] is None
    for cell in ("Cell.fc.Dense", "Cell.attn.Attn", "Cell.head.Dense"):  # the Cells at its top
        assert construct[f"{cell}.forward.0"] == REGION
        assert construct[f"{cell}.backward.0"] == REGION  # the backward runs inside the compiled call
    assert construct["Cell.attn.q.Dense.forward.0"] == "Cell.attn.Attn.forward.0"
    assert construct["Cell.attn.q.Dense.backward.0"] == "Cell.attn.Attn.backward.0"
    (region,) = _read(dump, 1, "coverage.json")["compiled_regions"]
    assert region["entry"] == REGION and "not captured" not in region["note"]
    assert "Cells it called are recorded inside it" in region["note"]


def _leaf(value: float) -> dict:
    return {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [], "Max": value, "Min": value,
            "Mean": value, "Norm": abs(value)}


def test_region_named_when_the_nan_is_made_between_its_cells(tmp_path):
    """A NaN made inside the compiled call but outside its recorded Cells: the region is the producer,
    and the note says its Cells were recorded (no claim that nothing inside it was)."""
    from msprobe.read.report import step_reports

    data = {REGION: {"input_args": [_leaf(1.0)], "output": [_leaf(float("nan"))]},
            "Cell.fc.Dense.forward.0": {"input_args": [_leaf(1.0)], "output": [_leaf(2.0)]}}
    construct = {REGION: None, "Cell.fc.Dense.forward.0": REGION}
    directory = tmp_path / "step3" / "rank0"
    found = step_reports(str(directory), data, {}, {}, construct=construct)
    anomalies = found["anomalies.json"]
    assert anomalies["first_producer"] == REGION
    assert "calls inside it are not captured" not in anomalies["note"]
    assert "outside the Cells recorded in it" in anomalies["note"]
    alone = step_reports(str(directory), {REGION: data[REGION]}, {}, {}, construct={REGION: None})
    assert "calls inside it are not captured" in alone["anomalies.json"]["note"]
    assert alone["coverage.json"]["compiled_regions"][0]["note"].endswith("calls inside it are not captured")


def test_first_diff_graph_mode_against_pynative_agrees_with_a_note(tmp_path):
    """The same network, seed and data in GRAPH_MODE and under PyNative, at L0 and at mix: what only
    one mode records (backward output of Cells, the compiled step's Jit entry, APIs inside it) is
    never named as the first difference; the runs agree (exit 0) with one short note per step saying
    what is on one side only and why, only what holds at the level (no Jit entry at L0)."""
    from click.testing import CliRunner

    from msprobe.cli import main
    from msprobe.compare import first_divergence
    from msprobe.compare import comparisons
    from msprobe.compare.divergence import first_divergence as step_divergence

    for level in ("L0", "mix"):
        graph, pynative = str(tmp_path / f"graph_{level}"), str(tmp_path / f"pynative_{level}")
        assert _run(graph, "graph", level)["losses"] == _run(pynative, "pynative", level)["losses"]
        assert _read(graph, 0, "dump.json")["mode"] == "GRAPH_MODE"
        assert "mode" not in _read(pynative, 0, "dump.json")
        agreed = []
        assert first_divergence(graph, pynative, agreed=agreed) == []
        assert [a.step for a in agreed] == [0, 1, 2]
        for a in agreed:
            assert "target dump ran in GRAPH_MODE and the golden one under PyNative" in a.one_sided
            assert ("one Jit entry" in a.one_sided) == (level == "mix"), a.one_sided
        found = step_divergence(next(iter(comparisons(graph, pynative, step=[0]))))  # what the note counts
        assert found.kind == "one_sided" and "Cell.head.Dense.backward.0.output.0" in found.one_sided_records
        assert (REGION in found.one_sided) == (level == "mix"), found.one_sided
        if level == "mix":
            construct = _read(graph, 1, "construct.json")  # outside watch mode too
            assert construct["Cell.attn.Attn.forward.0"] == construct["Cell.attn.Attn.backward.0"] == REGION
        result = CliRunner().invoke(main, ["first-diff", pynative, graph, "--step", "0"])
        out = result.output
        assert result.exit_code == 0, out
        assert "golden dump ran in GRAPH_MODE" in out and "first difference (" not in out, out
        assert "note: " in out and "on one side only, not compared" in out, out
        assert "Cell.head.Dense.backward.0.output.0" not in out, out   # a note, not a list
        shown = CliRunner().invoke(main, ["show", graph, "Cell.head.Dense.forward.0", "--step", "0"]).output
        assert "stack: none: this step ran in GRAPH_MODE, and compiled graphs record no Python stack" in shown


def test_first_diff_says_a_record_of_one_mode_only_is_on_one_side(tmp_path):
    """GRAPH_MODE against PyNative at L0 with other labels (the gradients differ): the first difference
    is a Cell's backward whose output only the PyNative (golden) run records; that record is said to be
    only in golden, never to differ."""
    from click.testing import CliRunner

    from msprobe.cli import main

    graph, pynative = str(tmp_path / "graph"), str(tmp_path / "pynative")
    _run(graph, "graph", "L0", "--y-offset", "1")
    _run(pynative, "pynative", "L0")
    for extra in ((), ("--exact",)):
        out = CliRunner().invoke(main, ["first-diff", graph, pynative, "--step", "0", *extra]).output
        assert "first difference (step 0" in out and "backward): Cell.head.Dense.backward.0" in out, out
        (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("output.0")]
        assert "only in golden" in line and "differs" not in line and "unmatched" not in line, out
        assert "golden Max=" in line, out


def test_l1_in_graph_mode_says_what_its_jit_entry_holds(tmp_path):
    """Level L1 in GRAPH_MODE records the compiled training step as one entry: the console (once per
    run, at the end of the step) and dump.json's note (shown by msprobe summary) say so and name
    what records its inside; a PyNative L1 dump carries no note."""
    from msprobe.read.reader import summarize

    graph, pynative = str(tmp_path / "graph"), str(tmp_path / "pynative")
    out = _run(graph, "graph", "L1")
    assert out["stderr"].count("level L1 in GRAPH_MODE") == 1, out["stderr"]
    for step in range(3):
        dump = _read(graph, step, "dump.json")
        assert list(dump["data"]) == [REGION]
        note = dump["note"]
        assert "Jit.after_grad (the mindspore.jit function after_grad)" in note
        assert "use level L0 or mix" in note and "L2 for their kernels" in note
    assert summarize(graph).count("note: level L1 in GRAPH_MODE") == 1
    _run(pynative, "pynative", "L1")
    assert "note" not in _read(pynative, 0, "dump.json")
    assert "level L1 in GRAPH_MODE" not in summarize(pynative)


MODEL_TRAIN = r"""
import sys

import pytest
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Model
ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)
from msprobe.mindspore import MsprobeStep, PrecisionDebugger
debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1")
net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 3))
if sys.argv[2] == "net":
    debugger.start(net)
data = ds.NumpySlicesDataset({"x": np.ones((4, 4), np.float32), "y": np.zeros((4,), np.int32)},
                             shuffle=False).batch(2)
model = Model(net, loss_fn=nn.CrossEntropyLoss(), optimizer=nn.SGD(net.trainable_params(), 0.1))
model.train(1, data, callbacks=[MsprobeStep(debugger)], dataset_sink_mode=False)
"""


@pytest.mark.parametrize("start", ["net", "none"])
def test_l1_in_graph_mode_with_model_train_says_the_network_ran_compiled(tmp_path, start):
    """Level L1 in GRAPH_MODE with ``Model.train`` (the training Cell compiled, no ``Jit`` entry),
    with and without ``start(net)``: no API or Primitive of the network is recorded, and each step's
    note (or an empty step's ``empty_reason``) and one WARNING say that Cells run as compiled graphs
    and what records their inside (not that ``start()`` was given no model)."""
    from msprobe.engine.runtime import GRAPH_L1_NOTE

    script, dump = tmp_path / "train.py", str(tmp_path / "dump")
    script.write_text(MODEL_TRAIN)
    proc = subprocess.run([sys.executable, str(script), dump, start], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for step in range(2):
        doc = _read(dump, step, "dump.json")  # at most the dataset's Tensor.from_numpy
        assert all(name.startswith("Tensor.from_numpy.") for name in doc["data"]), list(doc["data"])
        assert doc["note"] == GRAPH_L1_NOTE
        if not doc["data"]:
            assert "at level L1 in GRAPH_MODE the calls inside compiled graphs are not" in doc["empty_reason"]
    assert proc.stderr.count(GRAPH_L1_NOTE) == 1, proc.stderr
    assert "start() was given no model" not in proc.stderr
