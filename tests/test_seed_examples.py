"""Every code example of the seed document (mindspore_data_dump_instruct.md), run as written there
on CPU (``tests/scripts/seed_example_worker.py`` lists the few changes), each in its own process
with ``./config.json`` in its working directory and MindSpore's default asynchronous launch. Each
test checks the complete set of entries of every step the example dumps, and that no step is
marked abnormal.

The network (``Network``): ``fc1`` (Dense) -> ``relu`` (ReLU Cell) -> ``ops.tanh`` -> ``fc2``
(Dense); two batches of 4.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "scripts", "seed_example_worker.py")
sys.path.insert(0, os.path.join(HERE, "scripts"))
import seed_example_worker  # noqa: E402

STEPS = seed_example_worker.STEPS

CELLS = {f"Cell.{c}.{d}.0" for c in ("fc1.Dense", "relu.ReLU", "fc2.Dense") for d in ("forward", "backward")}
PARAM_GRADS = {"Cell.fc1.Dense.parameters_grad.0", "Cell.fc2.Dense.parameters_grad.0"}
FUNCTIONAL = {"Functional.tanh.0.forward", "Functional.tanh.0.backward"}
PRIMITIVES = ({f"Primitive.{p}.{k}.{d}" for p in ("bias_add.BiasAdd", "matmul.MatMul") for k in (0, 1)
               for d in ("forward", "backward")}
              | {"Primitive.relu.ReLU.0.forward", "Primitive.relu.ReLU.0.backward",
                 "Primitive.shape_op.Shape.0.forward", "Primitive.shape_op.Shape.1.forward"})
OPTIMIZER_JIT = {"Jit.Momentum.0.forward"}  # nn.Momentum.construct is mindspore.jit: one entry at L1

#: example name -> (worker function, config level)
EXAMPLES = {
    "graph_l0_loop": ("graph_l0_loop", "L0"),
    "graph_l0_model": ("graph_l0_model", "L0"),
    "graph_l2": ("graph_l2", "L2"),
    "pynative_loop_L1": ("pynative_loop", "L1"),
    "pynative_loop_model_L0": ("pynative_loop_model", "L0"),
    "pynative_loop_model_L1": ("pynative_loop_model", "L1"),
    "pynative_loop_model_mix": ("pynative_loop_model", "mix"),
    "pynative_model_L1": ("pynative_model", "L1"),
    "pynative_model_with_model_L0": ("pynative_model_with_model", "L0"),
    "pynative_model_with_model_mix": ("pynative_model_with_model", "mix"),
    "pynative_code_block": ("pynative_code_block", "L1"),
    "pynative_l2_loop": ("pynative_l2_loop", "L2"),
    "pynative_l2_model": ("pynative_l2_model", "L2"),
    "token_range": ("token_range", "L0"),
    "debug_save": ("debug_save", "debug"),
    "interfaces": ("interfaces", "L1"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("seed_examples")

    def run(name):
        example, level = EXAMPLES[name]
        cwd = base / name
        cwd.mkdir()
        with open(cwd / "config.json", "w") as f:
            json.dump({"task": "statistics", "level": level, "dump_path": "./dump_path"}, f)
        env = {k: v for k, v in os.environ.items() if k not in ("MINDSPORE_DUMP_CONFIG", "RANK_ID", "RANK")}
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
        proc = subprocess.run([sys.executable, WORKER, example], cwd=str(cwd), env=env,
                              capture_output=True, text=True, timeout=400)
        return name, {"dump": str(cwd / "dump_path"), "rc": proc.returncode, "stdout": proc.stdout,
                      "stderr": proc.stderr}

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, EXAMPLES))


def _result(runs, name):
    result = runs[name]
    assert result["rc"] == 0 and "DONE" in result["stdout"], result["stderr"][-3000:]
    return result


def _steps(runs, name, file="dump.json") -> dict:
    """``{step directory name: (rank directory name, parsed file)}`` of an example's dump."""
    dump = _result(runs, name)["dump"]
    found = {}
    for path in sorted(glob.glob(os.path.join(dump, "step*", "*", file))):
        rank_dir = os.path.dirname(path)
        with open(path) as f:
            found[os.path.basename(os.path.dirname(rank_dir))] = (os.path.basename(rank_dir), json.load(f))
    return found


def _entries(runs, name, file="dump.json") -> dict:
    steps = _steps(runs, name, file)
    for step, (_, body) in steps.items():
        assert "abnormal" not in body, (name, step, body.get("abnormal"))
    return {step: set(body["data"]) for step, (_, body) in steps.items()}


def _every_step(expected: set) -> dict:
    return {f"step{n}": expected for n in range(STEPS)}


# ------------------------------------------------------------------------------ static graph (GRAPH_MODE)
def test_graph_l0_without_model_api(runs):
    """start(model) -> ms.grad(model)(data) -> step(), no stop(): every Cell's forward and backward,
    each step complete and not abnormal; the values are PyNative L0's."""
    assert _entries(runs, "graph_l0_loop") == _every_step(CELLS)
    _same_statistics(runs, "graph_l0_loop", "pynative_loop_model_L0")
    (_, step0), = [v for k, v in _steps(runs, "graph_l0_loop").items() if k == "step0"]
    data = seed_example_worker.batches()[0][0].astype(np.float64)
    leaf = step0["data"]["Cell.fc1.Dense.forward.0"]["input_args"][0]
    assert (leaf["Max"], leaf["Min"]) == (data.max(), data.min())
    assert leaf["Mean"] == pytest.approx(data.mean(), rel=1e-12)


def test_graph_l0_model_train(runs):
    """debugger.start(model) before Model(...).train(..., callbacks=[MsprobeStep(debugger)])."""
    assert _entries(runs, "graph_l0_model") == _every_step(CELLS | PARAM_GRADS)
    _same_statistics(runs, "graph_l0_model", "pynative_model_with_model_L0")


def test_graph_l2(runs):
    """start() before the network is built; train; stop(); step(): both training steps' kernels."""
    steps = _kernel_steps(runs, "graph_l2")
    assert sorted(steps) == ["step_0", "step_1"]
    for kernels in steps.values():
        assert kernels == {"MatMul", "BiasAdd", "ReLU", "Tanh", "SparseSoftmaxCrossEntropyWithLogits",
                           "TanhGrad", "ReluGrad", "BiasAddGrad", "SGD", "AssignAdd", "Parameter"}


# ------------------------------------------------------------------------------ PyNative
def test_pynative_l1_start_without_model(runs):
    """debugger.start(): non-Primitive APIs (the functional tanh), forward and backward."""
    assert _entries(runs, "pynative_loop_L1") == _every_step(FUNCTIONAL)


@pytest.mark.parametrize("level, expected", [("L0", CELLS), ("L1", FUNCTIONAL | PRIMITIVES),
                                             ("mix", CELLS | FUNCTIONAL | PRIMITIVES)])
def test_pynative_start_with_model(runs, level, expected):
    """debugger.start(model): Cells (L0), APIs with the Primitives inside nn.Dense/nn.ReLU (L1), both (mix)."""
    assert _entries(runs, f"pynative_loop_model_{level}") == _every_step(expected)


def test_pynative_model_train_l1(runs):
    """Model.train + MsprobeStep without start(model): APIs, the jit optimizer as one Jit entry."""
    assert _entries(runs, "pynative_model_L1") == _every_step(FUNCTIONAL | OPTIMIZER_JIT)


def test_pynative_model_train_with_model_l0(runs):
    assert _entries(runs, "pynative_model_with_model_L0") == _every_step(CELLS | PARAM_GRADS)


def test_pynative_model_train_with_model_mix(runs):
    """start(model) before Model(...) opens step 0 at once: Model.train's conversion of the first
    batch (two columns, before the first step begins) is recorded in step 0; later batches are
    converted between step() and the next start, so are not."""
    expected = CELLS | PARAM_GRADS | FUNCTIONAL | PRIMITIVES | OPTIMIZER_JIT
    first_batch = {"Tensor.from_numpy.0.forward", "Tensor.from_numpy.1.forward"}
    assert _entries(runs, "pynative_model_with_model_mix") == {"step0": expected | first_batch,
                                                               "step1": expected}


def test_pynative_code_block_forward_and_backward(runs):
    """start -> forward -> stop -> backward -> step: the block's forward AND backward, nothing of the
    loss computed after stop()."""
    assert _entries(runs, "pynative_code_block") == _every_step(FUNCTIONAL)


def test_pynative_l2_loop(runs):
    """L2 in PyNative dumps the kernels of mindspore.jit code (forward graph, then backward graph)."""
    steps = _kernel_steps(runs, "pynative_l2_loop")
    assert set().union(*steps.values()) >= {"MatMul", "BiasAdd", "ReLU", "Tanh", "ReluGrad", "TanhGrad"}


def test_pynative_l2_model_train(runs):
    """Model.train in PyNative at L2: the jit-compiled optimizer's kernels, at each step."""
    steps = _kernel_steps(runs, "pynative_l2_model")
    assert sorted(steps) == ["step_0", "step_1"]
    for kernels in steps.values():
        assert {"ApplyMomentum", "AssignAdd"} <= kernels


# ------------------------------------------------------------------------------ interfaces
def test_token_range_forward_passes_1_to_3(runs):
    """seed_all(); start(model=model, token_range=[1, 3]); generate; stop(); step(): every sub-Cell
    of the model, forward only, in passes 1..3 (calls 0..2)."""
    from examples.models import TinyLM
    from mindspore import nn

    model = TinyLM(vocab_size=12, d_model=16, n_heads=2, n_layers=1, seq_len=16)
    prefixes = {f"Cell.{name}.{type(cell).__name__}" for name, cell in model.cells_and_names()
                if name and not isinstance(cell, nn.CellList)}  # a CellList is indexed, never called
    expected = {f"{p}.forward.{k}" for p in prefixes for k in range(3)}
    assert _entries(runs, "token_range") == {"step0": expected}


def test_debug_save(runs):
    """save(variable, name, save_backward=True/False) at level debug, in each step."""
    assert _entries(runs, "debug_save", "debug.json") == _every_step(
        {"logits.0.debug", "logits_grad.0.debug", "loss_info.0.debug"})


def test_set_init_step_custom_api_and_rank_id(runs):
    """set_init_step(5); register_custom_api(mindspore.ops, "matmul", "MyOps") for the first step,
    restore_custom_api afterwards; start(rank_id=3)."""
    steps = _steps(runs, "interfaces")
    assert {step: rank for step, (rank, _) in steps.items()} == {"step5": "rank3", "step6": "rank3"}
    found = _entries(runs, "interfaces")
    tensor_sum = {"Tensor.sum.0.forward", "Tensor.sum.0.backward"}
    assert found == {"step5": {"MyOps.matmul.0.forward", "MyOps.matmul.0.backward"} | tensor_sum,
                     "step6": {"Functional.matmul.0.forward", "Functional.matmul.0.backward"} | tensor_sum}


# ------------------------------------------------------------------------------ helpers
def _kernel_steps(runs, name) -> dict:
    """``{step_N: set of kernel op types}`` of an L2 dump."""
    dump = _result(runs, name)["dump"]
    found = {}
    for path in glob.glob(os.path.join(dump, "rank_0", "*", "step_*", "statistic.csv")):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))[1:]
        found[os.path.basename(os.path.dirname(path))] = {row[0] for row in rows}
    return found


def _same_statistics(runs, graph: str, pynative: str) -> None:
    """The GRAPH_MODE dump has PyNative's entries, leaf layout and statistics (float32 rounding),
    except backward ``output`` (gradients w.r.t. a Cell's inputs), which compiled graphs do not record."""
    g, p = _steps(runs, graph), _steps(runs, pynative)
    assert sorted(g) == sorted(p)
    for step in g:
        gd, pd = g[step][1]["data"], p[step][1]["data"]
        assert sorted(gd) == sorted(pd)
        for entry in gd:
            if ".backward." in entry:
                assert "output" not in gd[entry], entry
                pd[entry] = {k: v for k, v in pd[entry].items() if k != "output"}
            assert _stat_leaves(gd[entry]) == pytest.approx(_stat_leaves(pd[entry]), rel=1e-6, abs=1e-9), entry


def _stat_leaves(value) -> list:
    if isinstance(value, dict) and "Max" in value:
        return [value["Max"], value["Min"], value["Mean"], value["Norm"]] + list(value["shape"])
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _stat_leaves(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _stat_leaves(v)] + [len(value)]
    return [0.0 if value is None else 1.0]
