"""L0 inside compiled graphs on CPU: GRAPH_MODE networks and mindspore.jit
Cells in PyNative, through ops.Custom pyfunc probes (msprobe/capture/cells/graph_cell.py).

``set_context(mode=...)`` is process-global, so every run is a subprocess of
``tests/scripts/graph_worker.py`` (seeded LeNet on digits, 2 steps); runs go two at a time.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import msprobe.dump
from graph_runs import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "scripts", "graph_worker.py")

SCOPE = ["Cell.conv2.Conv2d.forward.0", "Cell.fc1.Dense.forward.0"]
RUNS = {
    "graph": ("graph", "on", []),
    "graph_off": ("graph", "off", []),
    "pynative": ("pynative", "on", []),
    "graph_model": ("graph", "on", ["--driver", "model"]),
    "graph_unread_async": ("graph", "on", ["--driver", "unread", "--async"]),
    "graph_tensor_fwd": ("graph", "on", ["--task", "tensor", "--data-mode", "forward"]),
    "graph_bwd": ("graph", "on", ["--data-mode", "backward"]),
    "graph_scope": ("graph", "on", ["--level", "mix", "--scope", json.dumps(SCOPE)]),
    "pynative_scope": ("pynative", "on", ["--level", "mix", "--scope", json.dumps(SCOPE)]),
    "jit_L0": ("pynative", "on", ["--driver", "jit"]),
    "jit_mix": ("pynative", "on", ["--driver", "jit", "--level", "mix"]),
    "jit_off": ("pynative", "off", ["--driver", "jit"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_workers(tmp_path_factory.mktemp("graph_mode"), RUNS)


def _step(dump, step, tree=""):
    (path,) = glob.glob(os.path.join(dump, tree, f"step{step}", "*"))
    with open(os.path.join(path, "dump.json")) as f:
        data = json.load(f)
    with open(os.path.join(path, "construct.json")) as f:
        construct = json.load(f)
    return path, data, construct


def _leaves(value, path=""):
    if isinstance(value, dict) and "Max" in value:
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")


def _max_rel_diff(a: dict, b: dict) -> float:
    """Largest relative difference of Max/Min/Mean/Norm between two dump.json data dicts (same
    leaf paths required, with the same type, dtype and shape)."""
    worst = 0.0
    for entry in a:
        la, lb = dict(_leaves(a[entry])), dict(_leaves(b[entry]))
        assert la.keys() == lb.keys(), entry
        for path in la:
            x, y = la[path], lb[path]
            assert (x["type"], x["dtype"], x["shape"]) == (y["type"], y["dtype"], y["shape"]), entry + path
            for key in ("Max", "Min", "Mean", "Norm"):
                worst = max(worst, abs(x[key] - y[key]) / max(abs(y[key]), 1e-30))
    return worst


def _without_input_grads(data: dict) -> dict:
    """A PyNative dump's data without backward ``output`` (the gradients w.r.t. a Cell's inputs,
    which compiled graphs do not record: see :func:`_assert_no_input_grads`)."""
    return {name: {k: v for k, v in entry.items() if not (".backward." in name and k == "output")}
            for name, entry in data.items()}


def _assert_no_input_grads(data: dict) -> None:
    backward = [name for name in data if ".backward." in name]
    assert backward and all(set(data[name]) == {"input"} for name in backward)


def test_graph_mode_l0_matches_pynative_l0(runs):
    """Same entry names, leaf layout, construct.json and statistics as PyNative L0, except backward
    ``output`` (not recorded in graphs); losses unchanged."""
    assert runs["graph"]["losses"] == runs["graph_off"]["losses"] == runs["pynative"]["losses"]
    for step in (0, 1):
        _, g, gc = _step(runs["graph"]["dump"], step)
        _, p, pc = _step(runs["pynative"]["dump"], step)
        assert g["level"] == "L0" and g["task"] == "statistics"
        assert sorted(g["data"]) == sorted(p["data"])
        assert "Cell.relu.ReLU.backward.2" in g["data"] and "Cell.fc1.Dense.parameters_grad.0" in g["data"]
        assert gc == pc
        _assert_no_input_grads(g["data"])
        # measured: 0.0 (bit-identical statistics); allow float32 rounding in case kernels differ
        assert _max_rel_diff(g["data"], _without_input_grads(p["data"])) <= 1e-6


def test_graph_mode_result_not_read_before_stop(runs):
    """A graph call returns before the graph runs: with no result read before stop() and step()
    (and asynchronous launch), every step's dump is still complete and equal to the loop's."""
    assert runs["graph_unread_async"]["losses"] == runs["graph_off"]["losses"]
    for step in (0, 1):
        _, u, uc = _step(runs["graph_unread_async"]["dump"], step)
        _, g, gc = _step(runs["graph"]["dump"], step)
        assert "abnormal" not in u
        assert sorted(u["data"]) == sorted(g["data"]) and uc == gc
        assert _max_rel_diff(u["data"], g["data"]) == 0.0


def test_graph_mode_model_train_with_msprobe_step(runs):
    assert runs["graph_model"]["losses"] == runs["graph_off"]["losses"]
    for step in (0, 1):
        _, g, _ = _step(runs["graph_model"]["dump"], step)
        _, p, _ = _step(runs["pynative"]["dump"], step)
        assert sorted(g["data"]) == sorted(p["data"])
        assert _max_rel_diff(g["data"], _without_input_grads(p["data"])) <= 1e-6


def test_graph_mode_tensor_task_forward_only(runs):
    path, d, _ = _step(runs["graph_tensor_fwd"]["dump"], 1)
    names = sorted(d["data"])
    assert names and all(".forward." in n for n in names)
    entry = d["data"]["Cell.conv2.Conv2d.forward.0"]
    leaf = entry["output"][0]
    arr = np.load(os.path.join(path, "dump_tensor_data", leaf["data_name"]))
    assert leaf["type"] == "mindspore.Tensor" and leaf["dtype"] == "Float32"
    assert list(arr.shape) == leaf["shape"] and arr.max() == leaf["Max"] and arr.min() == leaf["Min"]
    assert set(entry["parameters"]) == {"weight", "bias"}
    assert runs["graph_tensor_fwd"]["losses"] == runs["graph_off"]["losses"]


def test_graph_mode_backward_only(runs):
    _, d, _ = _step(runs["graph_bwd"]["dump"], 0)
    names = set(d["data"])
    assert names and not any(".forward." in n for n in names)
    assert "Cell.relu.ReLU.backward.0" in names and "Cell.conv1.Conv2d.parameters_grad.0" in names
    _, p, _ = _step(runs["pynative"]["dump"], 0)
    assert names == {n for n in p["data"] if ".forward." not in n}


def test_graph_mode_scope_keeps_the_last_cells_backward(runs):
    """A ``scope`` from one Cell to another selects the last Cell's backward and parameter gradients
    in GRAPH_MODE as under PyNative (the range includes the last Cell's forward and backward)."""
    for step in (0, 1):
        _, g, _ = _step(runs["graph_scope"]["dump"], step)
        _, p, _ = _step(runs["pynative_scope"]["dump"], step)
        cells = {name for name in p["data"] if name.startswith("Cell.")}
        assert {"Cell.fc1.Dense.backward.0", "Cell.fc1.Dense.parameters_grad.0"} <= cells
        assert "Cell.fc2.Dense.forward.0" not in cells
        assert {name for name in g["data"] if name.startswith("Cell.")} == cells


@pytest.mark.parametrize("name", ["jit_L0", "jit_mix"])
def test_jit_cell_children_in_graph_subtree(runs, name):
    """PyNative with a jit Cell: its children under graph/, everything else under pynative/; the jit
    Cell itself once, in pynative/."""
    assert runs[name]["losses"] == runs["jit_off"]["losses"]
    dump = runs[name]["dump"]
    assert sorted(os.listdir(dump)) == ["graph", "pynative"]
    for step in (0, 1):
        _, g, gc = _step(dump, step, "graph")
        _, p, _ = _step(dump, step, "pynative")
        assert sorted(g["data"]) == [
            "Cell.features.conv1.Conv2d.backward.0", "Cell.features.conv1.Conv2d.forward.0",
            "Cell.features.conv1.Conv2d.parameters_grad.0",
            "Cell.features.pool.MaxPool2d.backward.0", "Cell.features.pool.MaxPool2d.forward.0",
            "Cell.features.relu.ReLU.backward.0", "Cell.features.relu.ReLU.forward.0"]
        assert "Cell.features.JitFeatures.forward.0" in p["data"]
        assert not any(k.startswith("Cell.features.") and "JitFeatures" not in k for k in p["data"])
        assert not any(k.startswith("Cell.") and "JitFeatures" in k for k in g["data"])
        assert gc["Cell.features.relu.ReLU.forward.0"] is None  # parent (the jit Cell) is in pynative/
    text = msprobe.dump.summarize(dump)          # the reader finds both subtrees
    for step in (0, 1):
        assert f"pynative/step{step}/" in text and f"graph/step{step}/" in text
    assert "no dump found" not in text


def test_graph_mode_resume_with_msprobe_init_step(tmp_path):
    """GRAPH_MODE Model.train resumed at step 5 with MsprobeInitStep dumps step5, step6."""
    dump = str(tmp_path / "dump")
    out = subprocess.run([sys.executable, WORKER, "graph", "on", dump, "--driver", "model", "--resume", "5"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = sorted(n for n in os.listdir(dump) if n.startswith("step"))
    assert steps == ["step5", "step6"], steps
    for name in steps:
        rank_dir = os.path.join(dump, name, os.listdir(os.path.join(dump, name))[0])
        assert any(k.startswith("Cell.") for k in msprobe.dump.load(rank_dir).data)


MANY_SCRIPT = r"""
import json, sys
import numpy as np
import mindspore as ms
from mindspore import nn, Tensor
ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)
from msprobe.mindspore import PrecisionDebugger

class Many(nn.Cell):
    def construct(self, *xs):
        out = ()
        for x in xs:
            out = out + (x * 2,)
        return out

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.many = Many()
    def construct(self, x):
        h = self.fc(x)
        xs = ()
        for i in range(17):
            xs = xs + (h + i,)
        total = 0
        for y in self.many(*xs):
            total = total + y.sum()
        return total

ms.set_seed(0)
net = Net()
debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L0")
debugger.start(net)
grad = ms.grad(net)(Tensor(np.ones((2, 3), np.float32)))
debugger.step()
print(json.dumps(grad.asnumpy().tolist()))
"""


def test_boundary_with_more_than_16_tensors(tmp_path):
    """A Cell with 17 Tensor inputs and outputs in a graph: a WARNING names it when the graph
    compiles, the first 16 of each side are recorded, forward and backward, the rest of the dump too."""
    script = tmp_path / "many.py"
    script.write_text(MANY_SCRIPT)
    dump = str(tmp_path / "dump")
    proc = subprocess.run([sys.executable, str(script), dump], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(HERE)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for side in ("input", "output"):  # once each, although two graphs are compiled (forward, grad)
        assert proc.stderr.count(f"Cell.many.Many has 17 Tensor {side}s in a compiled graph; a graph "
                                 "probe takes 16, so only the first 16 are recorded") == 1
    _, d, _ = _step(dump, 0)
    assert "abnormal" not in d
    assert sorted(d["data"]) == ["Cell.fc.Dense.backward.0", "Cell.fc.Dense.forward.0",
                                 "Cell.many.Many.backward.0", "Cell.many.Many.forward.0"]
    fwd, bwd = d["data"]["Cell.many.Many.forward.0"], d["data"]["Cell.many.Many.backward.0"]
    assert len(fwd["input_args"]) == len(fwd["output"]) == len(bwd["input"]) == 16 and "output" not in bwd
    assert [leaf["Max"] for leaf in bwd["input"]] == [1.0] * 16
    assert proc.stderr.count("the gradients w.r.t. a Cell's inputs (backward 'output') are not recorded") == 1
    assert fwd["output"][15]["Max"] == 2 * fwd["input_args"][15]["Max"]


KEYWORD_GRADIENTS_SCRIPT = r"""
import sys
import numpy as np
import mindspore as ms
from mindspore import nn, ops, Tensor
ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)
from msprobe.mindspore import PrecisionDebugger

class Step(nn.Cell):
    def __init__(self, net, opt):
        super().__init__()
        self.net, self.opt = net, opt
        self.grad = ops.GradOperation(get_by_list=True)
        self.weights = opt.parameters
    def construct(self, x):
        loss = self.net(x).sum()
        grads = self.grad(self.net, self.weights)(x)
        return ops.depend(loss, self.opt(gradients=grads))

ms.set_seed(0)
net = nn.SequentialCell(nn.Dense(3, 4), nn.ReLU())
step = Step(net, nn.SGD(net.trainable_params(), 0.1))
debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L0")
for _ in range(2):
    debugger.start(net)
    print(float(step(Tensor(np.ones((2, 3), np.float32))).asnumpy()))
    debugger.step()
"""


def test_optimizer_called_with_keyword_gradients_warns(tmp_path):
    """optimizer(gradients=grads) cannot be probed: one WARNING saying so; the Cells are dumped."""
    script = tmp_path / "kw.py"
    script.write_text(KEYWORD_GRADIENTS_SCRIPT)
    dump = str(tmp_path / "dump")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(HERE)}
    proc = subprocess.run([sys.executable, str(script), dump], capture_output=True, text=True, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("SGD is called in a compiled graph without a tuple of its 2 gradients as first "
                             "positional argument: the gradients it receives there are not recorded") == 1
    for step in (0, 1):
        _, d, _ = _step(dump, step)
        assert sorted(d["data"]) == ["Cell.0.Dense.backward.0", "Cell.0.Dense.forward.0",
                                     "Cell.1.ReLU.backward.0", "Cell.1.ReLU.forward.0"]
