"""The compiled GRAPH_MODE probes (``ops.Custom`` aot kernels of ``msprobe/capture/cells/_graph_probe.c``)
write the files the pyfunc probes write, byte for byte (the run id aside), with the same losses; a 0-d
tensor keeps its dtype (a pyfunc receives a Python number for it); the records of the probes' reports
queued at once are the ones made one by one.

Every run is a subprocess (``set_context(mode=...)`` is process-global): ``tests/scripts/graph_worker.py``
with and without ``--python-probes``, and with ``--direct-records``."""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from msprobe.capture.cells import graph_probes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "scripts", "graph_worker.py")

pytestmark = pytest.mark.skipif(graph_probes.compiled() is None, reason="compiled graph probes not built")

CONFIGS = {
    "statistics": [],
    "tensor": ["--task", "tensor"],
    "async_unread": ["--driver", "unread", "--async"],
}
#: configs also run with the probes' records made one by one (``--direct-records``)
DIRECT = ("statistics", "async_unread")


def _run(dump: str, extra: list) -> list:
    proc = subprocess.run([sys.executable, WORKER, "graph", "on", dump, "--steps", "3", *extra],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compiled_probes"] == ("--python-probes" not in extra)
    return out["losses"]


def _files(dump: str) -> dict:
    """Every file of the dump by relative path, with what names the writing process (its run id, the
    ``proc{pid}`` rank directory, the dump path) replaced by constants."""
    files = {}
    for path in sorted(glob.glob(os.path.join(dump, "**", "*"), recursive=True)):
        if not os.path.isdir(path):
            with open(path, "rb") as f:
                files[re.sub(r"proc\d+", "rank", os.path.relpath(path, dump))] = f.read()
    (run_id,) = {json.loads(data)["run_id"] for name, data in files.items() if name.endswith("dump.json")}
    return {name: re.sub(rb"proc\d+", b"rank", data.replace(run_id.encode(), b"RUN").replace(dump.encode(), b"DUMP"))
            for name, data in files.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("graph_probes")
    jobs = [(name, probes) for name in CONFIGS for probes in ("compiled", "python")]
    jobs += [(name, "direct") for name in DIRECT]

    def run(job):
        name, probes = job
        dump = str(base / f"{name}_{probes}")
        extra = CONFIGS[name] + {"python": ["--python-probes"], "direct": ["--direct-records"]}.get(probes, [])
        return job, (_run(dump, extra), _files(dump))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, jobs))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_compiled_probes_write_the_files_of_the_pyfunc_probes(runs, name):
    (losses, files), (py_losses, py_files) = runs[(name, "compiled")], runs[(name, "python")]
    assert losses == py_losses
    assert any(n.endswith("dump.json") for n in files) and len(files) == len(py_files)
    if name == "tensor":
        assert sum(n.endswith(".npy") for n in files) > 50
    for file in sorted(py_files):
        assert files.get(file) == py_files[file], file


@pytest.mark.parametrize("name", DIRECT)
def test_records_queued_at_once_write_the_files_of_records_made_one_by_one(runs, name):
    """The records of a drain of the probes' reports queued together (one lock, one batch-size
    check) are the records the runtime's record methods make one by one: same files, byte for byte."""
    (losses, files), (direct_losses, direct_files) = runs[(name, "compiled")], runs[(name, "direct")]
    assert losses == direct_losses
    assert any(n.endswith("construct.json") for n in files) and sorted(files) == sorted(direct_files)
    for file in sorted(direct_files):
        assert files[file] == direct_files[file], file


@pytest.mark.parametrize("config", [[], ["--no-extra-info"]], ids=["extra_info", "no_extra_info"])
def test_later_steps_of_a_graph_reuse_the_first_drain_s_records_and_write_the_same_files(tmp_path, config):
    """From the second step that reads parameters at start() on, a graph run again reports the same
    calls, so a drain's journal lines come from a recipe made at the first such drain (one compiled
    function per recipe, ``graph_lines.Lines``); with another input shape every second step (another
    compiled graph, the same calls) the files are those of the records made one by one, byte for
    byte, with ``extra_info`` (edges and stack uses journaled) and without."""
    outs, files = {}, {}
    for mode, extra in (("recipe", []), ("direct", ["--direct-records"])):
        dump = str(tmp_path / mode)
        proc = subprocess.run([sys.executable, WORKER, "graph", "on", dump, "--steps", "6", "--half-batches",
                               *config, *extra], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        files[mode] = _files(dump)
    assert outs["recipe"]["compiled_probes"] and outs["recipe"]["recipe_drains"] >= 4
    assert outs["direct"]["recipe_drains"] == 0
    assert outs["recipe"]["losses"] == outs["direct"]["losses"]
    assert sum(n.endswith("dump.json") for n in files["recipe"]) == 6
    assert sorted(files["recipe"]) == sorted(files["direct"])
    for name in sorted(files["direct"]):
        assert files["recipe"][name] == files["direct"][name], name
    shapes = {json.loads(files["recipe"][f"step{i}/rank/dump.json"])["data"]["Cell.conv1.Conv2d.forward.0"]
              ["input_args"][0]["shape"][0] for i in range(6)}
    assert shapes == {16, 32}


MIXED_SCRIPT = r"""
import sys
import numpy as np
import mindspore as ms
from mindspore import nn, ops, Tensor
ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)
dump, probes, extras = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
if probes == "python":
    from msprobe.capture.cells import graph_probes
    graph_probes._graph_probe = None
from msprobe.mindspore import PrecisionDebugger

class Cast(nn.Cell):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype
    def construct(self, x):
        return x.astype(self.dtype) * 3

class Flags(nn.Cell):
    def construct(self, x):
        return x > 0, (x * 10).astype(ms.int32)

class Total(nn.Cell):
    def construct(self, x):
        return x.sum()

class Empty(nn.Cell):
    def construct(self, x):
        return ops.zeros((x.shape[0], 0), ms.float32)

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.half, self.wide = Cast(ms.float16), Cast(ms.float64)
        self.brain = Cast(ms.bfloat16) if "bf16" in extras else None
        self.empty = Empty() if "empty" in extras else None
        self.flags, self.total = Flags(), Total()
    def construct(self, x):
        h = self.fc(x)
        positive, scaled = self.flags(h)
        y = self.half(h).astype(ms.float32) + self.wide(h).astype(ms.float32)
        if self.brain is not None:
            y = y + self.brain(h).astype(ms.float32)
        loss = self.total(y * positive.astype(ms.float32)) + scaled.astype(ms.float32).sum() * 0
        if self.empty is not None:  # not summed: MindSpore's CPU ReduceSum of an empty tensor is garbage
            self.empty(h)
        return loss

ms.set_seed(0)
net = Net()
opt = nn.SGD(net.trainable_params(), 0.01)
grad_fn = ms.value_and_grad(net, None, opt.parameters)
debugger = PrecisionDebugger(dump_path=dump, level="L0") if probes != "off" else None
x = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
for _ in range(2):
    if debugger is not None:
        debugger.start(net)
    loss, grads = grad_fn(x)
    opt(grads)
    if debugger is not None:
        debugger.stop()
        debugger.step()
    print(repr(float(loss.asnumpy())), [g.asnumpy().tobytes().hex() for g in grads])
"""


def _mixed(tmp_path, probes: str, extras: str) -> tuple:
    """``(stdout: losses and gradients, files)`` of :data:`MIXED_SCRIPT` run with ``probes``
    (``compiled``, ``python`` or ``off``: no tool) and ``extras`` (``bf16``, ``empty``)."""
    script = tmp_path / "mixed.py"
    script.write_text(MIXED_SCRIPT)
    dump = str(tmp_path / f"{probes}_{extras}")
    proc = subprocess.run([sys.executable, str(script), dump, probes, extras], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": os.path.dirname(HERE)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [line for line in proc.stdout.splitlines() if not line.startswith("dump.json is at")]
    return printed, _files(dump) if probes != "off" else {}


def _outputs(files: dict, step: int = 0) -> dict:
    (doc,) = [json.loads(data) for name, data in files.items() if name.startswith(f"step{step}")
              and name.endswith("dump.json")]
    return doc["data"]


def test_every_dtype_is_recorded_as_the_pyfunc_probes_record_it(tmp_path):
    """float16, float64, bool and int32 tensors and a 0-d float32 one through probed Cells, forward
    and backward: the compiled probes write the files the pyfunc probes write, except that a 0-d
    tensor keeps its dtype (a pyfunc receives a Python number, recorded as Float64); losses and
    gradients are the tool-off ones."""
    off, _ = _mixed(tmp_path, "off", "")
    (out, files), (py_out, py_files) = _mixed(tmp_path, "compiled", ""), _mixed(tmp_path, "python", "")
    assert out == py_out == off
    assert sorted(files) == sorted(py_files)
    for file in sorted(py_files):
        assert files[file] == py_files[file].replace(b'"dtype":"Float64","shape":[]', b'"dtype":"Float32","shape":[]'), file
    data = _outputs(files)
    dtypes = {leaf["dtype"] for entry in data.values() for leaf in entry.get("output", [])}
    assert {"Float16", "Float64", "Bool", "Int32"} <= dtypes
    (total,), (grad,) = data["Cell.total.Total.forward.0"]["output"], data["Cell.total.Total.backward.0"]["input"]
    assert (total["dtype"], total["shape"], grad["dtype"], grad["shape"], grad["Max"]) == ("Float32", [], "Float32", [], 1.0)


def test_bfloat16_and_empty_tensors(tmp_path):
    """A Cell returning bfloat16 (its gradient too) and one returning an empty tensor are recorded and
    training is unchanged (a pyfunc probe makes MindSpore fail on both: a numpy bfloat16 gradient
    "cannot include dtype 'E' in a buffer", an empty tensor "memcpy failed")."""
    off, _ = _mixed(tmp_path, "off", "bf16,empty")
    out, files = _mixed(tmp_path, "compiled", "bf16,empty")
    assert out == off
    data = _outputs(files, 1)
    (brain,), (brain_grad,) = data["Cell.brain.Cast.forward.0"]["output"], data["Cell.brain.Cast.backward.0"]["input"]
    assert (brain["dtype"], brain_grad["dtype"], brain["shape"]) == ("BFloat16", "BFloat16", [3, 4])
    (empty,) = data["Cell.empty.Empty.forward.0"]["output"]
    assert (empty["dtype"], empty["shape"]) == ("Float32", [3, 0])
