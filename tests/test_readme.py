"""The README's complete scripts, run as written in a fresh directory (a new user copies them): the
quick start, the watch-mode example and the GRAPH_MODE loop; each must write the files the README says.
(The "`with` blocks" script is run by tests/test_runtime_guarantees.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import msprobe.dump
from tests.conftest import only_step_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(after: str) -> str:
    """The first ```python block of README.md after the text ``after``."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index(after):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("\n```\n", start)]


def _run(script: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(cwd), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_quick_start_script_runs_as_written(tmp_path):
    proc = _run(_script("## Quick start"), tmp_path)
    dump = str(tmp_path / "dump")
    dirs = [only_step_dir(dump, step) for step in range(3)]
    assert [line for line in proc.stdout.splitlines() if line.startswith("dump.json is at")] == \
        [f"dump.json is at {d}" for d in dirs]
    for d in dirs:
        loaded = msprobe.dump.load(d)
        assert loaded.complete and "Functional.mse_loss.0.forward" in loaded.data
        assert {"dump.json", "stack.json", "construct.json"} <= set(os.listdir(d))
    assert f"dump at {dump}" in proc.stdout and "first producer of a non-finite value" in proc.stdout


@pytest.mark.slow
def test_watch_mode_script_runs_as_written(tmp_path):
    proc = _run(_script("A run writes into `dump_path` only"), tmp_path)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (found["first_producer"], found["step"], found["kind"]) == ("Functional.log.0.forward", 3, "nan")
    assert [line for line in proc.stdout.splitlines() if line.startswith("dump.json is at")] == \
        [f"dump.json is at {only_step_dir(tmp_path / 'watch_dump', 3)}"]
    assert "written now under" in proc.stderr and "step 3, the anomaly's step" in proc.stderr


@pytest.mark.slow
def test_graph_mode_loop_runs_as_written(tmp_path):
    _run(_script("### L0 in GRAPH_MODE"), tmp_path)
    for step in range(2):
        data = msprobe.dump.load(only_step_dir(tmp_path / "dump_path", step)).data
        assert {"Cell.0.Dense.forward.0", "Cell.0.Dense.backward.0", "Cell.2.Dense.forward.0"} <= set(data)
