"""GRAPH_MODE (and ``mindspore.jit`` Cells under PyNative) record a Cell's positional arguments at the
positions PyNative records them: a tuple argument as a nested array, ``None`` as ``null``, a Python
scalar known when the graph compiles as its value, so ``input.3`` names the same argument in both
modes. Real MindSpore, CPU: ``tests/scripts/arguments_worker.py`` trains a network with an
``nn.LSTM`` given ``(h, c)``, one given no state, and an attention Cell called with ``mask=None`` and a
scale, in each mode; the tests read the dumps and compare them with ``msprobe first-diff`` and
``msprobe compare``."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_compare import cli

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "arguments_worker.py")
#: run name -> worker arguments (mode, tool, options)
RUNS = {
    "graph": ("graph", "on"),
    "pynative": ("pynative", "on"),
    "graph_off": ("graph", "off"),
    "graph_mix": ("graph", "on", "--level", "mix"),
    "pynative_mix": ("pynative", "on", "--level", "mix"),
    "graph_shifted": ("graph", "on", "--shift"),
    "jit": ("pynative", "on", "--jit"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (dump path, the worker's JSON line); the runs go two at a time."""
    from concurrent.futures import ThreadPoolExecutor

    base = tmp_path_factory.mktemp("arguments")

    def run(name):
        mode, tool, *options = RUNS[name]
        dump = str(base / name)
        proc = subprocess.run([sys.executable, WORKER, mode, tool, dump, *options], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        return name, (dump, json.loads(proc.stdout.strip().splitlines()[-1]))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, RUNS))


def _data(dump: str, step: int, tree: str = "") -> dict:
    (path,) = glob.glob(os.path.join(dump, tree, f"step{step}", "*", "dump.json"))
    with open(path, encoding="utf-8") as f:
        return json.load(f)["data"]


def _layout(value):
    """A recorded value with each tensor leaf replaced by its shape."""
    if isinstance(value, list):
        return [_layout(v) for v in value]
    if isinstance(value, dict) and "shape" in value:
        return tuple(value["shape"])
    return value


def _cell_inputs(data: dict, prefix: str = "Cell.") -> dict:
    """Forward Cell entry (without ``prefix``) -> layout of its ``input_args``."""
    return {name[len(prefix):]: _layout(body["input_args"]) for name, body in data.items()
            if name.startswith(prefix) and ".forward." in name and "input_args" in body}


def test_graph_mode_records_each_argument_at_its_pynative_position(runs):
    """Every Cell's input_args has the PyNative structure, at both steps (the second one's records
    are made from the first one's recipe)."""
    for step in (0, 1):
        graph, pynative = (_cell_inputs(_data(runs[name][0], step)) for name in ("graph", "pynative"))
        assert graph == pynative
        assert graph["lstm.rnn._DynamicLSTMCPUGPU.forward.0"] == [
            (5, 3, 8), [(3, 8), (3, 8)], None, (32, 8), (32, 8), (32,), (32,)]
        assert graph["lstm.LSTM.forward.0"] == [(3, 5, 8), [(1, 3, 8), (1, 3, 8)]]
        assert graph["lstm2.LSTM.forward.0"] == [(3, 5, 8)]
        assert graph["att.Attention.forward.0"] == [(3, 5, 8), None, {"type": "float", "value": 0.25}]
        assert graph["gain.Gain.forward.0"] == [{"type": "float", "value": 0.5}]
    assert runs["graph"][1]["recipe_drains"] >= 1  # also with a Cell whose one argument is a scalar


def test_the_tensors_of_a_tuple_argument_are_the_values_given(runs):
    """input.1.0 and input.1.1 of the LSTM are the initial state (h0, c0) the worker made: their
    statistics equal a float64 recomputation."""
    rng = np.random.RandomState(7)
    rng.randn(3, 5, 8)
    state = [rng.randn(1, 3, 8).astype(np.float32) for _ in range(2)]
    recorded = _data(runs["graph"][0], 0)["Cell.lstm.LSTM.forward.0"]["input_args"][1]
    for leaf, array in zip(recorded, state):
        exact = array.astype(np.float64)
        assert (leaf["Max"], leaf["Min"]) == (exact.max(), exact.min())
        assert leaf["Mean"] == exact.mean() and leaf["Norm"] == np.sqrt((exact * exact).sum())


def test_the_probes_leave_the_training_unchanged(runs):
    """Losses and every step's gradients bit-identical with the tool on and off."""
    on, off = runs["graph"][1], runs["graph_off"][1]
    assert (on["losses"], on["grads"]) == (off["losses"], off["grads"])


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_graph_mode_and_pynative_dumps_of_the_same_training_agree(runs, level, tmp_path):
    """first-diff and compare pair the same arguments: no difference, exit 0, the mode note."""
    suffix = "" if level == "L0" else "_mix"
    target, golden = runs["graph" + suffix][0], runs["pynative" + suffix][0]
    out = cli("first-diff", target, golden, "--step", "0,1", check_code=0).stdout
    assert "first difference" not in out and "note: " in out and "GRAPH_MODE" in out, out
    out = cli("compare", "-tp", target, "-gp", golden, "--step", "0,1", "-o", str(tmp_path), check_code=0).stdout
    assert out.count("first difference (as msprobe first-diff): none: the runs agree") == 2, out
    (summary,) = glob.glob(str(tmp_path / "compare_summary_*.json"))
    with open(summary, encoding="utf-8") as f:
        results = json.load(f)["results"]
    assert len(results) == 2 and all(r["first_difference"] is None and "GRAPH_MODE" in r["one_sided"]
                                      for r in results), results


def test_a_real_difference_is_still_named(runs):
    out = cli("first-diff", runs["graph_shifted"][0], runs["pynative"][0], "--step", "0", check_code=1).stdout
    assert out.startswith("first difference (step 0") and "Cell.att.q.Dense.forward.0" in out.splitlines()[0], out
    assert "its parameters already differ (parameters.weight" in out, out


def test_cells_of_a_jit_cell_keep_the_positions_too(runs):
    """Under PyNative, the Cells inside a ``mindspore.jit`` construct (the ``graph`` tree) have the
    structure PyNative records for the same Cells run eagerly."""
    jit = _cell_inputs(_data(runs["jit"][0], 0, "graph"), "Cell.body.")
    pynative = _cell_inputs(_data(runs["pynative"][0], 0))
    assert jit and jit == {name: pynative[name] for name in jit}
    assert jit["lstm.rnn._DynamicLSTMCPUGPU.forward.0"][1:3] == [[(3, 8), (3, 8)], None]
