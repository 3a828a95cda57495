"""GRAPH_MODE L0 and mix with every ``mindspore.nn`` optimizer that trains on CPU
(``tests/scripts/graph_optimizer_worker.py``): training with the tool is bit-identical to training
without it (loss, model parameters and optimizer state after each step), and every step's dump is
complete, with parameter gradients equal to the gradients computed separately (once per step, also
for ``WrappedSGD``, an optimizer holding another one as ``nn.LARS`` does).

Parameter gradients are probed on the ``construct`` of the optimizer; optimizers that keep state
by ``self.attr = value`` in their construct (``nn.Adam``, ``nn.LazyAdam``, ``nn.AdamOffload``,
``nn.AdaMax``: ``beta1_power``) need the wrapped construct to stay a method of the optimizer.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "scripts", "graph_optimizer_worker.py")
sys.path.insert(0, os.path.join(HERE, "scripts"))
from graph_optimizer_worker import OPTIMIZERS  # noqa: E402

NAMES = sorted(OPTIMIZERS)
STEPS = 2

#: LeNet at L0: 9 Cell calls (relu three times), forward and backward, and the 4 Cells with parameters
CELL_CALLS = ["conv1.Conv2d.{}.0", "relu.ReLU.{}.0", "pool.MaxPool2d.{}.0", "conv2.Conv2d.{}.0",
              "relu.ReLU.{}.1", "flatten.Flatten.{}.0", "fc1.Dense.{}.0", "relu.ReLU.{}.2",
              "fc2.Dense.{}.0"]
EXPECTED = sorted([f"Cell.{c.format(d)}" for c in CELL_CALLS for d in ("forward", "backward")]
                  + [f"Cell.{c}.parameters_grad.0" for c in ("conv1.Conv2d", "conv2.Conv2d",
                                                              "fc1.Dense", "fc2.Dense")])

RUNS = {
    "off_cell": ("off", ["--driver", "cell", "--grads"]),
    "off_model": ("off", ["--driver", "model"]),
    "L0_cell": ("on", ["--driver", "cell", "--level", "L0"]),
    "mix_model": ("on", ["--driver", "model", "--level", "mix"]),
}
#: no L0 ``Model.train`` run: ``Model.train`` wraps the network in the same ``nn.TrainOneStepCell`` as the
#: ``cell`` driver, so the optimizer's probes are those ``L0_cell`` checks; ``mix_model`` checks
#: ``Model.train`` + ``MsprobeStep`` with every optimizer, and tests/test_graph_mode.py L0 with it
#: (``graph_model``)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("graph_optimizers")

    def run(name):
        tool, extra = RUNS[name]
        dump = str(base / name)
        if extra[-1] == "--grads":
            extra = extra + [str(base / "grads.npz")]
        proc = subprocess.run([sys.executable, WORKER, tool, dump, "--optimizers", ",".join(NAMES),
                               "--steps", str(STEPS), *extra],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        return name, {"dump": dump, "out": json.loads(proc.stdout.strip().splitlines()[-1]),
                      "stderr": proc.stderr}

    with ThreadPoolExecutor(2) as pool:  # tool-on runs first (probes make their compile the longest):
        result = dict(pool.map(run, sorted(RUNS, key=lambda n: RUNS[n][0] == "off")))  # none runs alone
    result["grads"] = dict(np.load(str(base / "grads.npz")))
    return result


def _stats(a: np.ndarray) -> dict:
    a = a.astype(np.float64)
    return {"Max": a.max(), "Min": a.min(), "Mean": a.mean(), "Norm": np.sqrt((a * a).sum())}


@pytest.mark.parametrize("run", ["L0_cell", "mix_model"])
def test_training_is_unchanged_by_the_tool(runs, run):
    """Loss and every Parameter of the training network (model and optimizer state) after each step."""
    reference = runs["off_model" if run.endswith("model") else "off_cell"]["out"]
    for name in NAMES:
        assert runs[run]["out"][name] == reference[name], name


@pytest.mark.parametrize("run", ["L0_cell", "mix_model"])
def test_every_step_dump_is_complete(runs, run):
    grads = runs["grads"]
    for name in NAMES:
        for step in range(STEPS):
            (rank_dir,) = glob.glob(os.path.join(runs[run]["dump"], name, f"step{step}", "*"))
            with open(os.path.join(rank_dir, "dump.json")) as f:
                dump = json.load(f)
            where = f"{run} {name} step{step}"
            assert "abnormal" not in dump, where
            # mix: Model.train's own PyNative calls outside the graph (Tensor.from_numpy) as well
            assert sorted(e for e in dump["data"] if e.startswith("Cell.")) == EXPECTED, where
            if run.startswith("L0"):
                assert len(dump["data"]) == len(EXPECTED), where
            for entry, body in dump["data"].items():
                if ".parameters_grad." not in entry:
                    continue
                cell = entry.split(".")[1]
                assert sorted(body) == ["bias", "weight"], where
                for pname, (leaf,) in body.items():
                    expected = _stats(grads[f"{name}/{step}/{cell}.{pname}"])
                    assert leaf["Max"] == expected["Max"] and leaf["Min"] == expected["Min"], where
                    for key in ("Mean", "Norm"):  # float64 sums in another order
                        assert leaf[key] == pytest.approx(expected[key], rel=1e-12, abs=0), where

