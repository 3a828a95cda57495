"""GRAPH_MODE L0 on Cells as third-party model code writes them (mindformers' LLaMA): a construct
that compiles only because conditions on Cell attributes are constants, a Cell without Tensor inputs
(a constant table sliced by an int), and a Cell that is never called, which is listed in coverage.json
instead of silently missing. Subprocesses (GRAPH_MODE is process-wide)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import msprobe.dump
from msprobe.read.report import read_report

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "graph_cells_worker.py")


def _run(tool: str, dump: str) -> dict:
    proc = subprocess.run([sys.executable, WORKER, tool, dump], capture_output=True, text=True,
                          timeout=240, cwd=os.path.dirname(dump))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_graph_mode_cells_compile_train_identically_and_constant_cells_are_listed(tmp_path):
    off, on = _run("off", str(tmp_path / "off")), _run("on", str(tmp_path / "dump"))
    assert on == off  # losses and every gradient, bit for bit
    for step in (0, 1):
        (d,) = glob.glob(str(tmp_path / "dump" / f"step{step}" / "*"))
        data = msprobe.dump.load(d).data
        assert "Cell.branchy.Branchy.forward.0" in data and "Cell.branchy.dense.Dense.backward.0" in data
        table = data["Cell.table.Table.forward.0"]  # no Tensor input: opened by its output probe
        # its int argument, known when the graph compiles, as PyNative records it
        assert table["input_args"] == [{"type": "int", "value": 2}] and table["output"][0]["shape"] == [2, 4]
        assert table["output"][0]["Max"] == 7 / 32
        (item,) = read_report(d, "coverage.json")["not_recorded_in_graph"]
        assert item["cell"] == "Cell.unused.Dense" and "not called" in item["note"]
