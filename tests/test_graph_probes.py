"""The compiled GRAPH_MODE probes (``ops.Custom`` aot kernels of ``msprobe/capture/cells/_graph_probe.c``)
write the files the pyfunc probes write, byte for byte (the run id aside), with the same losses; a 0-d
tensor keeps its dtype (a pyfunc receives a Python number for it).

Every run is a subprocess (``set_context(mode=...)`` is process-global): ``tests/scripts/graph_worker.py``
with and without ``--python-probes``."""
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

    def run(job):
        name, probes = job
        dump = str(base / f"{name}_{probes}")
        extra = CONFIGS[name] + (["--python-probes"] if probes == "python" else [])
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


SCALAR_SCRIPT = r"""
import sys
import numpy as np
import mindspore as ms
from mindspore import nn, Tensor
ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)
from msprobe.mindspore import PrecisionDebugger

class Total(nn.Cell):
    def construct(self, x):
        return x.sum()

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.total = Total()
    def construct(self, x):
        return self.total(self.fc(x)) * 2

ms.set_seed(0)
net = Net()
debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L0")
debugger.start(net)
ms.grad(net)(Tensor(np.ones((2, 3), np.float16).astype(np.float32)))
debugger.step()
"""


def test_a_zero_dimensional_tensor_keeps_its_dtype(tmp_path):
    """A Cell returning a 0-d float32 tensor: its forward output and its backward input are Float32
    with shape [] (as PyNative records them)."""
    script = tmp_path / "scalar.py"
    script.write_text(SCALAR_SCRIPT)
    dump = str(tmp_path / "dump")
    proc = subprocess.run([sys.executable, str(script), dump], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(HERE)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = glob.glob(os.path.join(dump, "step0", "*", "dump.json"))
    with open(path) as f:
        data = json.load(f)["data"]
    (out,) = data["Cell.total.Total.forward.0"]["output"]
    (grad,) = data["Cell.total.Total.backward.0"]["input"]
    assert (out["dtype"], out["shape"], grad["dtype"], grad["shape"], grad["Max"]) == ("Float32", [], "Float32", [], 2.0)
