"""Compiled graphs with a ``step`` list that leaves out the first steps: ``start(model)`` of a step
that is not dumped installs the graph probes (they record nothing then), so the graph MindSpore
compiles at step 0 and reuses afterwards holds them, and every listed step is dumped as in a dump of
every step. GRAPH_MODE (plain loop and ``Model.train`` + ``MsprobeStep``, L0 and mix) and PyNative
with a ``mindspore.jit`` Cell; the losses, gradients and trained parameters are those of the tool-off
run. Runs of ``tests/scripts/graph_worker.py`` (:mod:`graph_runs`)."""
from __future__ import annotations

import glob
import json
import os

import pytest

from graph_runs import run_workers

STEPS = 3

#: name -> (mode, tool, worker arguments)
RUNS = {
    "loop_L0_every": ("graph", "on", []),
    "loop_L0_listed": ("graph", "on", ["--step-list", "[1, 2]"]),
    "loop_mix_every": ("graph", "on", ["--level", "mix"]),
    "loop_mix_listed": ("graph", "on", ["--level", "mix", "--step-list", "[1, 2]"]),
    "loop_off": ("graph", "off", []),
    "model_L0_every": ("graph", "on", ["--driver", "model"]),
    "model_L0_listed": ("graph", "on", ["--driver", "model", "--step-list", "[2]"]),
    "jit_L0_every": ("pynative", "on", ["--driver", "jit"]),
    "jit_L0_listed": ("pynative", "on", ["--driver", "jit", "--step-list", "[1, 2]"]),
    "jit_off": ("pynative", "off", ["--driver", "jit"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_workers(tmp_path_factory.mktemp("graph_step_list"), RUNS, ("--steps", str(STEPS)))


def _files(dump: str, step: int) -> dict:
    """``{file name: document}`` of one step's directory (``run_id`` removed: one per run)."""
    (path,) = glob.glob(os.path.join(dump, f"step{step}", "*"))
    docs = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name)) as f:
            docs[name] = json.load(f)
    docs["dump.json"].pop("run_id")
    return docs


def _steps(dump: str) -> list:
    return sorted(int(os.path.basename(p)[4:]) for p in glob.glob(os.path.join(dump, "step*")))


@pytest.mark.parametrize("every, listed, tree, steps", [
    ("loop_L0_every", "loop_L0_listed", "", [1, 2]),
    ("loop_mix_every", "loop_mix_listed", "", [1, 2]),
    ("model_L0_every", "model_L0_listed", "", [2]),
    ("jit_L0_every", "jit_L0_listed", "graph", [1, 2]),
    ("jit_L0_every", "jit_L0_listed", "pynative", [1, 2]),
])
def test_listed_steps_are_dumped_as_in_a_dump_of_every_step(runs, every, listed, tree, steps):
    full, part = (os.path.join(runs[name]["dump"], tree) for name in (every, listed))
    assert _steps(full) == list(range(STEPS)) and _steps(part) == steps
    for step in steps:
        a, b = _files(full, step), _files(part, step)
        assert a == b, step
        cells = [k for k in b["dump.json"]["data"] if k.startswith("Cell.")]
        assert any(".forward." in k for k in cells) and any(".backward." in k for k in cells)
        if tree != "pynative":  # the compiled graph's parameter gradients (optimizer, or hooks in jit)
            assert any(".parameters_grad." in k for k in cells)
    assert "was compiled before start(model)" not in runs[listed]["stderr"]


@pytest.mark.parametrize("name, off", [
    ("loop_L0_listed", "loop_off"), ("loop_mix_listed", "loop_off"), ("model_L0_listed", "loop_off"),
    ("jit_L0_listed", "jit_off"),
])
def test_losses_gradients_and_parameters_bit_identical_to_tool_off(runs, name, off):
    """The probes installed in steps that are not dumped change nothing the network computes."""
    assert runs[name]["losses"] == runs[off]["losses"]
    assert runs[name]["grads"] == runs[off]["grads"] or not runs[name]["grads"]  # the model driver has none
    assert runs[name]["parameters"] == runs[off]["parameters"]
