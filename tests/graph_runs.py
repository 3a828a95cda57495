"""Runs of ``tests/scripts/graph_worker.py`` for the compiled-graph tests: ``set_context(mode=...)``
is process-wide, so each run is a subprocess; runs go two at a time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "graph_worker.py")


def run_workers(base, runs: dict, extra: tuple = ()) -> dict:
    """Run the worker once per item of ``runs`` (``name -> (mode, tool, arguments)``), dumping into
    ``base/name``, each with ``extra`` arguments too.

    Returns:
        ``name -> dict``: the worker's JSON line (``losses``, ``grads``, ...) with ``dump`` (the dump
        path) and ``stderr``.

    Raises:
        AssertionError: a run failed (the end of its stderr is in the message).
    """
    def run(name):
        mode, tool, args = runs[name]
        dump = os.path.join(str(base), name)
        proc = subprocess.run([sys.executable, WORKER, mode, tool, dump, *extra, *args],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        return name, dict(out, dump=dump, stderr=proc.stderr)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, runs))
