"""GRAPH_MODE L0: ``start(model)`` after the network's graph was compiled. MindSpore reuses the graph
compiled without the probes, so the steps are dumped empty; a WARNING says which Cell was compiled
and what to do. A ``start(model)`` before the first step installs the probes even when the step
list leaves that step out, and then nothing is said. Subprocesses (GRAPH_MODE is process-wide), two at a time.

Under PyNative the same holds for a ``mindspore.jit`` Cell called before the first ``start(model)``:
the Cells inside it are not recorded, and a WARNING names the jit Cell (in this process)."""
from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from mindspore import Tensor

import msprobe.dump
from matrix_nets import JitNet
from msprobe.mindspore import PrecisionDebugger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, sys
import numpy as np
import mindspore as ms
from mindspore import nn, ops, Tensor
ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)
from msprobe.mindspore import PrecisionDebugger

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)
    def construct(self, x):
        return ops.relu(self.fc(x)).sum()

ms.set_seed(0)
net = Net()
opt = nn.SGD(net.trainable_params(), 0.1)
def forward_fn(x):
    return net(x)

if sys.argv[2].startswith("grad"):   # a value_and_grad loop: MindSpore compiles the jit function after_grad
    grad_fn = ms.value_and_grad(forward_fn if sys.argv[2].startswith("gradfn_") else net, None, opt.parameters)
    def train(x):
        loss, grads = grad_fn(x)
        opt(grads)
else:
    train = nn.TrainOneStepCell(net, opt)
x = Tensor(np.ones((2, 3), np.float32))
order = sys.argv[2].split("_", 1)[1] if sys.argv[2].startswith("grad") else sys.argv[2]
debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L0", step=json.loads(sys.argv[3]))
if order == "compiled_first":
    train(x)                      # a training step before the debugger is started: compiled now
for step in range(2):
    if order != "start_when_dumped" or step == 1:
        debugger.start(net)
    train(x)
    debugger.stop()
    debugger.step()
"""

WARNING = ("msprobe: GRAPH_MODE: TrainOneStepCell (it holds the model) was compiled before start(model) "
           "installed the L0 probes; MindSpore reuses a compiled graph without them, so its calls record "
           "nothing (empty dumps). Call debugger.start(model) before the first call of the network (before "
           "the first training step), or build the Cell that is called after start()")

EMPTY_REASON = ("no recorded call between start() and stop() in this step: TrainOneStepCell (it holds the model) "
                "was compiled before start(model) installed the L0 probes, and MindSpore runs the graph "
                "compiled without them (call start(model) before the first training step)")
GRAD_WARNING = ("msprobe: GRAPH_MODE: the jit function after_grad of Net (the model; made by "
                "mindspore.value_and_grad or mindspore.grad) was compiled before start(model) installed the "
                "L0 probes; MindSpore reuses a compiled graph without them, so its calls record nothing "
                "(empty dumps). Call debugger.start(model) before the first call of the network (before the "
                "first training step), or build the Cell or the gradient function that is called after start()")
GRAD_EMPTY_REASON = ("no recorded call between start() and stop() in this step: the jit function after_grad of "
                     "Net (the model; made by mindspore.value_and_grad or mindspore.grad) was compiled before "
                     "start(model) installed the L0 probes, and MindSpore runs the graph compiled without them "
                     "(call start(model) before the first training step)")


def _run(args):
    script, dump, order, steps = args
    proc = subprocess.run([sys.executable, script, dump, order, steps], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(dump, "step*", "*", "dump.json")))]
    return proc.stderr, docs


def test_start_after_the_graph_was_compiled_is_said(tmp_path):
    script = tmp_path / "train.py"     # a file: GRAPH_MODE compiles construct from its source
    script.write_text(SCRIPT)
    cases = [("late", "compiled_first", "[]"), ("ok", "start_first", "[]"),
             # start(model) in step 0, which the list leaves out: the probes are installed then
             ("listed", "start_first", "[1]"),
             # start(model) first called in the listed step, after step 0 compiled the graph
             ("late_listed", "start_when_dumped", "[1]"),
             ("grad_late", "grad_compiled_first", "[]"), ("grad_ok", "grad_start_first", "[]"),
             # value_and_grad of a Python function calling the model
             ("gradfn_late", "gradfn_compiled_first", "[]")]
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip([name for name, _, _ in cases], pool.map(
            _run, [(str(script), str(tmp_path / name), order, steps) for name, order, steps in cases])))
    (late_err, late), (ok_err, ok) = results["late"], results["ok"]
    assert len(late) == 2 and all(doc["data"] == {} for doc in late)
    assert all(doc["empty_reason"] == EMPTY_REASON for doc in late)
    assert late_err.splitlines().count(WARNING) == 1              # said once, at the first start()
    assert len(ok) == 2 and all("Cell.fc.Dense.forward.0" in doc["data"] for doc in ok)
    assert "was compiled before start(model)" not in ok_err
    listed_err, listed = results["listed"]
    assert len(listed) == 1 and listed[0]["data"] == ok[1]["data"]
    assert "was compiled before start(model)" not in listed_err
    late_listed_err, late_listed = results["late_listed"]
    assert len(late_listed) == 1 and late_listed[0]["data"] == {}
    assert late_listed_err.splitlines().count(WARNING) == 1
    grad_late_err, grad_late = results["grad_late"]
    assert len(grad_late) == 2 and all(doc["data"] == {} for doc in grad_late)
    assert grad_late_err.splitlines().count(GRAD_WARNING) == 1
    assert all(doc["empty_reason"] == GRAD_EMPTY_REASON for doc in grad_late)
    gradfn_late_err, gradfn_late = results["gradfn_late"]
    assert len(gradfn_late) == 2 and all(doc["data"] == {} for doc in gradfn_late)
    assert gradfn_late_err.splitlines().count(GRAD_WARNING) == 1
    grad_ok_err, grad_ok = results["grad_ok"]
    assert len(grad_ok) == 2 and all("Cell.fc.Dense.backward.0" in doc["data"] for doc in grad_ok)
    assert "was compiled before start(model)" not in grad_ok_err


JIT_WARNING = ("msprobe: the mindspore.jit Cell jit_block (JitBlock) was compiled before start(model) installed "
               "the L0 probes inside it; MindSpore reuses a compiled graph without them, so the Cells inside "
               "it are not recorded (the dump's graph/ tree holds none of them; the jit Cell itself is "
               "recorded as one call). Call debugger.start(model) before the first call of the network "
               "(before the first training step)")


def test_a_jit_cell_compiled_before_start_is_said_under_pynative(tmp_path, caplog):
    """PyNative, L0 and mix: a jit Cell called once before the first ``start(model)`` keeps the graph
    compiled without the probes (the Cells inside it are not recorded): one WARNING names it; called
    first after ``start(model)``, its Cells are recorded and nothing is said."""
    x = Tensor(np.ones((4, 6), np.float32))
    inside = {}
    for level in ("L0", "mix"):
        for order in ("compiled_first", "start_first"):
            net = JitNet()
            dump_path = str(tmp_path / f"{level}_{order}")
            debugger = PrecisionDebugger(dump_path=dump_path, level=level)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="msprobe"):
                if order == "compiled_first":
                    net(x)
                for _ in range(2):
                    debugger.start(net)
                    net(x)
                    debugger.stop()
                    debugger.step()
            debugger.close()
            said = [r.getMessage() for r in caplog.records if "compiled before start(model)" in r.getMessage()]
            assert said == ([JIT_WARNING] if order == "compiled_first" else []), (level, order, said)
            for step in (0, 1):
                (graph_dir,) = glob.glob(os.path.join(dump_path, "graph", f"step{step}", "*"))
                inside[level, order, step] = sorted(msprobe.dump.load(graph_dir).data)
    for level in ("L0", "mix"):
        assert all(inside[level, "compiled_first", step] == [] for step in (0, 1))
        assert all("Cell.jit_block.fc.Dense.forward.0" in inside[level, "start_first", step] for step in (0, 1))
