"""The tool is invisible: every network of tests/matrix_nets.py x level (L0, L1, mix) x mode (PyNative,
GRAPH_MODE where MindSpore compiles the network) x optimizer (one per network, in rotation over the
mode's optimizers: ``matrix_nets.optimizers_of``; each one with ``MSPROBE_FULL_MATRIX=1``, ``make
test-full``), trained tool-off and tool-on, gives
bit-identical losses, parameter gradients and final parameters (raw bytes), the same exception (type
and message) or none, no dump_error_info.log, no forward hook left on a Cell after the last ``stop()``,
nothing left patched after ``close()`` (the listed APIs, ``Cell.__call__``, the compiled-call entry),
and a dump.json holding an entry for every Cell call
(L0) and API/Primitive call (L1) counted independently in a tool-off run (own hooks and wrappers,
tests/matrix_checks.py). A task-tensor mix run per network checks every statistic against a float64
recomputation from the saved ``.npy`` (0-d, 1-element, empty, integer, bool, float16 and bfloat16
values of both signs: network ``special_values``).

``set_context(mode=...)`` is process-global, so networks run in subprocesses of
tests/scripts/matrix_worker.py, two at a time; one worker runs all levels and optimizers of its
networks. Reproduce one case by hand with
``python tests/scripts/matrix_worker.py pynative /tmp/m NET --opts sgd --levels L0``.
"""
from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from matrix_nets import SPECS, optimizers_of  # noqa: E402

WORKER = os.path.join(HERE, "scripts", "matrix_worker.py")
LEVELS = ("L0", "L1", "mix")
OPTS = {"pynative": ("sgd", "momentum", "adam"), "graph": ("sgd", "momentum"),
        "pynative_async": ("sgd",)}
ASYNC_NETS = ("branch", "inplace", "shared", "dropout_ones", "jit_step", "bytecode_caught")
#: measured seconds per network in one worker (all levels and optimizers), to balance the workers
_COST = {"pynative": {"gru": 5, "transformer": 4, "mha": 4, "fp16": 4, "jit_cell": 5, "amp_o1": 12,
                      "encoder": 5, "jit_step": 7, "amp_train_network": 5, "grad_aux": 4,
                      "bytecode_jit_step": 22, "bytecode_jit_forward": 12, "bytecode_jit_bprop": 9,
                      "bytecode_jit_recompute": 12, "jit_bprop": 10, "jit_recompute": 15, "jit_o0_step": 15,
                      "jit_o1_forward": 7, "bprop": 10, "caught_error": 8, "hook_backward": 5},
         "graph": {"gru": 35, "transformer": 32, "mha": 30, "conv_bn": 20, "lstm": 17, "loss_scale": 14,
                   "train_one_step": 12, "amp_train_network": 10},
         "pynative_async": {"jit_step": 8}}
_DEFAULT_COST = {"pynative": 3, "graph": 10, "pynative_async": 4}
_CHUNK_SECONDS = 40

#: the module's fixture runs every worker (each allowed 1500 s): the first test waits for all of them
pytestmark = pytest.mark.timeout(1800)

MODES = {
    "pynative": [s.name for s in SPECS],
    "graph": [s.name for s in SPECS if s.graph],
    "pynative_async": list(ASYNC_NETS),
}


def _chunks() -> list:
    """``[(mode, [nets])]``: each mode's networks in chunks of about :data:`_CHUNK_SECONDS`
    (longest first onto the lightest chunk)."""
    out = []
    for mode, nets in MODES.items():
        cost = {n: _COST.get(mode, {}).get(n, _DEFAULT_COST[mode]) for n in nets}
        chunks = [[0, []] for _ in range(max(1, round(sum(cost.values()) / _CHUNK_SECONDS)))]
        for net in sorted(nets, key=lambda n: -cost[n]):
            target = min(chunks, key=lambda c: c[0])
            target[0] += cost[net]
            target[1].append(net)
        out += [(mode, c[1]) for c in chunks]
    return sorted(out, key=lambda c: -sum(_COST.get(c[0], {}).get(n, _DEFAULT_COST[c[0]]) for n in c[1]))


def _cases(mode: str, net: str) -> list:
    opts = optimizers_of(net, OPTS[mode])
    out = [f"{lvl}-{opt}" for opt in opts for lvl in LEVELS]
    if mode == "pynative":
        out.append(f"tensor-mix-{opts[0]}")
    return out


def _expand(modes, nets, cases) -> list:
    return [f"{m}/{n}/{c}" for m in modes for n in nets for c in cases]


_PY = ("pynative", "pynative_async")
_L1_CASES = ("L1-*", "mix-*", "tensor-mix-*")
#: (patterns "mode/net/case" (fnmatch), reason): cases known to fail, reported with minimal repros;
#: strict, so a fixed case shows up as XPASS and its entry must go
KNOWN_FAILURES = [
]


def _param(mode, net, case):
    key = f"{mode}/{net}/{case}"
    reasons = [reason for patterns, reason in KNOWN_FAILURES if any(fnmatch.fnmatch(key, p) for p in patterns)]
    if reasons:
        return pytest.param(mode, net, case, marks=pytest.mark.xfail(strict=True, reason="; ".join(reasons)))
    return pytest.param(mode, net, case)


PARAMS = [_param(mode, net, case) for mode, nets in MODES.items() for net in nets for case in _cases(mode, net)]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    base = tmp_path_factory.mktemp("matrix")

    def run(numbered):
        i, (mode, nets) = numbered
        cwd = base / f"cwd{i}"  # MindSpore writes rank_0/om/analyze_fail.ir into the cwd
        cwd.mkdir()
        args = [sys.executable, WORKER, "graph" if mode == "graph" else "pynative", str(base / mode), *nets,
                "--opts", ",".join(OPTS[mode])]
        if mode == "pynative":
            args.append("--tensor")
        if mode == "pynative_async":
            args.append("--async-launch")
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1500,
                              cwd=str(cwd))
        if proc.returncode != 0:  # every case of the chunk fails with the worker's error
            crash = f"worker {' '.join(args[2:])} exited with {proc.returncode}: {proc.stderr[-3000:]}"
            return {(mode, net): {"crash": crash} for net in nets}
        return {(mode, net): r for net, r in json.loads(proc.stdout.strip().splitlines()[-1]).items()}

    results = {}
    with ThreadPoolExecutor(2) as pool:
        for part in pool.map(run, enumerate(_chunks())):
            results.update(part)
    with open(base / "results.json", "w") as f:  # the whole matrix, for reports
        json.dump({f"{mode}:{net}": r for (mode, net), r in results.items()}, f, indent=1)
    return results


@pytest.mark.parametrize("mode,net", [(m, n) for m, nets in MODES.items() for n in nets])
def test_tool_off_runs_are_reproducible(matrix, mode, net):
    """The comparison means something: two tool-off runs of the same seeded network are identical."""
    result = matrix[(mode, net)]
    assert "crash" not in result, result.get("crash")
    if "unsupported" in result:
        pytest.skip(result["unsupported"])
    assert not result.get("nondeterministic"), result.get("nondeterministic")


@pytest.mark.parametrize("mode,net,case", PARAMS)
def test_invisible(matrix, mode, net, case):
    result = matrix[(mode, net)]
    assert "crash" not in result, result.get("crash")
    if "unsupported" in result:
        pytest.skip(f"MindSpore {mode}: {result['unsupported']}")
    fails = result["cases"][case]
    assert not fails, "\n".join(fails)


def test_exception_networks_raise_without_the_tool(matrix):
    """The exception cases compare something: tool-off, the user's ValueError ends step 1 and the
    shape error step 0 (``test_invisible`` then requires the same with the tool on)."""
    assert matrix[("pynative", "raise_user")]["exc"] == ["ValueError", "user error in step 1"]
    exc_type, message = matrix[("pynative", "raise_shape")]["exc"]
    assert exc_type == "RuntimeError" and "MatMul" in message


def test_a_failed_kernel_is_caught_late_under_asynchronous_launch(matrix):
    """The caught-exception case compares something: tool-off, the out-of-range ``gather`` before the
    bytecode-jit step fails in each step; asynchronous launch reports it at the ``asnumpy()``, not at the
    call (``test_invisible`` then requires the same catches with the tool on)."""
    for mode, where in (("pynative", "call"), ("pynative_async", "read")):
        caught = matrix[(mode, "bytecode_caught")]["caught"]
        assert [c[:2] for c in caught] == [[where, "RuntimeError"]] * 2, (mode, caught)
        assert all("Gather" in c[2] for c in caught), caught
