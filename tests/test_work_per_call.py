"""How much of the tool's own Python runs in a training step: a deterministic guard of the hot path.

Overhead itself is measured by the scripts in ``benchmarks/`` (ratios against the tool-off run, with
CPU time beside wall time: README "Performance", ``docs/PERFORMANCE.md``), not by timed tests, which
follow the machine's load. What can be checked exactly is the work: ``sys.setprofile`` counts every
call of a Python function defined in the ``msprobe`` package (called from Python or from MindSpore's C++
through a hook) while a real training step runs.

- A step outside the ``step`` list runs none of the tool's code between ``start()`` and ``stop()``:
  nothing is installed while such a step computes.
- A recorded step stays on the compiled per-call path (``msprobe/tensors/_hotpath.c``): the Python
  calls per entry written to ``dump.json`` stay under a bound set at ~1.5x what the compiled path
  makes (measured on the test MLP: L1 11, L0 33, mix 18 per entry) and far under what the Python path
  alone makes (L1 128, L0 78, mix 140), so a change that falls back to Python for the common calls,
  or renders a known call stack again, fails here.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import sys

import mindspore as ms
import pytest
from mindspore import nn, ops

import msprobe
from msprobe.tensors import hotpath
from conftest import build_mlp, mlp_batch, only_step_dir

PACKAGE = os.path.dirname(os.path.abspath(msprobe.__file__)) + os.sep

#: most Python calls into the msprobe package per dump.json entry in a steady recorded step
BOUNDS = {"L1": 17, "L0": 50, "mix": 28}


class ToolCalls:
    """Counts calls of Python functions defined in the msprobe package while it is active."""

    def __init__(self):
        self.counts = collections.Counter()

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            code = frame.f_code
            self.counts[f"{os.path.relpath(code.co_filename, PACKAGE)}:{code.co_name}"] += 1

    def __enter__(self):
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _training_step():
    net = build_mlp()
    x, y = mlp_batch()
    params = net.trainable_params()
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
    opt = nn.SGD(params, 0.01)

    def train():
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    return net, train


def _steps_counting_the_last(debugger, net, train, steps: int) -> ToolCalls:
    """``steps`` dumped training steps (``start``/``train``/``stop``/``step``); the tool's Python calls
    counted during the last step's ``train()`` only, run from the same line as the others."""
    calls = ToolCalls()
    for step in range(steps):
        debugger.start(net)
        with calls if step == steps - 1 else contextlib.nullcontext():
            train()
        debugger.stop()
        debugger.step()
    return calls


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_step_outside_the_step_list_runs_no_tool_code(make_debugger, level):
    net, train = _training_step()
    debugger = make_debugger(level=level, task="statistics", step=[0])
    calls = _steps_counting_the_last(debugger, net, train, 3)
    assert calls.total == 0, calls.counts.most_common(10)


@pytest.mark.skipif(hotpath.ext is None, reason="the compiled per-call path is not built")
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_python_calls_per_recorded_entry_stay_bounded(make_debugger, dump_dir, level):
    net, train = _training_step()
    debugger = make_debugger(level=level, task="statistics")
    # step 3 is the steady state: its call stacks (the same lines as before), names and the parked
    # capture are already known
    calls = _steps_counting_the_last(debugger, net, train, 4)
    with open(os.path.join(only_step_dir(dump_dir, 3), "dump.json")) as f:
        entries = len(json.load(f)["data"])
    assert entries >= 8
    per_entry = calls.total / entries
    assert per_entry <= BOUNDS[level], (per_entry, calls.counts.most_common(15))
