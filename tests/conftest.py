"""Shared fixtures for the end-to-end capture tests (real MindSpore, CPU, PyNative; no mocks).

MindSpore's asynchronous PyNative pipeline is ~30x slower than synchronous launch on a 2-core
machine, so the CPU device and blocking launch are selected once, here, before any kernel runs.
"""
from __future__ import annotations

import glob
import json
import os
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, nn, ops

ms.set_device("CPU")
ms.runtime.launch_blocking()

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

TENSOR_TYPES = ("mindspore.Tensor", "numpy.ndarray")


# ---------------------------------------------------------------------------------------------- models
class TinyMLP(nn.Cell):
    """Dense(8,16) -> ReLU -> Dense(16,4), plus a Functional, a Mint and a Tensor-method call."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        h = self.relu(self.fc1(x))
        h = ops.relu(h)          # Functional.relu
        h = mint.mul(h, 2.0)     # Mint.mul
        h = h * 0.5              # Tensor.__mul__
        return self.fc2(h)


def build_mlp(seed: int = 0) -> TinyMLP:
    ms.set_seed(seed)
    np.random.seed(seed)
    return TinyMLP()


def mlp_batch(seed: int = 0):
    rng = np.random.RandomState(seed)
    return (Tensor(rng.randn(4, 8).astype(np.float32)),
            Tensor(rng.randn(4, 4).astype(np.float32)))


def _mse(pred, target):
    return ops.mse_loss(pred, target)


# ---------------------------------------------------------------------------------------------- helpers
def run_steps(net, debugger, steps: int = 1, *, batch=None, loss_fn=_mse, lr: float = 0.1,
              start_model: bool = True, optimizer=nn.SGD):
    """``steps`` training steps of ``net`` (``optimizer``: an ``nn.Optimizer`` class, SGD by default);
    with ``debugger`` each step is start/stop/step.

    Returns ``(losses, grads)``: lists (one item per step) of numpy arrays (grads: one list of arrays
    per step, in ``net.trainable_params()`` order).
    """
    params = net.trainable_params()
    opt = optimizer(params, learning_rate=lr)
    x, y = batch if batch is not None else mlp_batch()

    def forward(data, label):
        return loss_fn(net(data), label)

    grad_fn = ms.value_and_grad(forward, None, params)
    losses, grads = [], []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(net) if start_model else debugger.start()
        loss, g = grad_fn(x, y)
        opt(g)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(loss.asnumpy().copy())
        grads.append([t.asnumpy().copy() for t in g])
    return losses, grads


def hook_count(net) -> int:
    """Hooks registered on the Cells of ``net`` (every ``*hook*`` dict of every Cell)."""
    n = 0
    for _, cell in net.cells_and_names():
        for key, value in vars(cell).items():
            if "hook" in key and isinstance(value, dict):
                n += len(value)
    return n


def leaves(body):
    """Yield every tensor leaf (dict with a tensor/ndarray ``type``) of an entry body, depth first."""
    if isinstance(body, dict):
        if body.get("type") in TENSOR_TYPES:
            yield body
            return
        for v in body.values():
            yield from leaves(v)
    elif isinstance(body, list):
        for v in body:
            yield from leaves(v)


def write_config_with_dump(directory, **fields) -> str:
    """:func:`write_config` into ``directory`` (created), with ``dump_path`` defaulting to
    ``directory/dump``."""
    os.makedirs(str(directory), exist_ok=True)
    fields.setdefault("dump_path", os.path.join(str(directory), "dump"))
    return write_config(directory, **fields)


def write_config(directory, **fields) -> str:
    """Write ``config.json`` into ``directory``; ``fields`` are top-level keys, plus ``section={...}``
    for the task section."""
    section = fields.pop("section", {})
    cfg = {"task": "statistics", "level": "L1"}
    cfg.update(fields)
    cfg[cfg["task"]] = section
    path = os.path.join(str(directory), "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return path


def step_dirs(dump_path, step: int) -> list:
    return sorted(glob.glob(os.path.join(str(dump_path), f"step{step}", "*")))


def only_step_dir(dump_path, step: int) -> str:
    found = [d for d in step_dirs(dump_path, step) if os.path.isdir(d)]
    assert len(found) == 1, found
    return found[0]


def load_step(dump_path, step: int = 0):
    """``(directory, msprobe.dump.load(directory))`` of the one rank directory of ``step``."""
    import msprobe.dump

    directory = only_step_dir(dump_path, step)
    return directory, msprobe.dump.load(directory)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def tiny_mlp():
    """Factory: ``tiny_mlp(seed=0)`` builds a seeded :class:`TinyMLP`."""
    return build_mlp


@pytest.fixture
def dump_dir(tmp_path):
    """A fresh, not yet existing dump directory."""
    return str(tmp_path / "dump")


@pytest.fixture
def make_debugger(tmp_path, dump_dir):
    """Factory: ``make_debugger(task=..., level=..., section={...}, dump_path=...)``."""
    from msprobe.mindspore import PrecisionDebugger

    created = []

    def make(**fields):
        fields.setdefault("dump_path", dump_dir)
        cfg_dir = tmp_path / f"cfg{len(created)}"
        cfg_dir.mkdir()
        debugger = PrecisionDebugger(write_config(cfg_dir, **fields))
        created.append(debugger)
        return debugger

    yield make
    # a failing test must not leave wrappers installed for the next one; close(), not stop(): a
    # stop() before another dumped step keeps the capture installed (parked) for that step
    for debugger in created:
        debugger.service.close()


#: directories under pytest's base temporary directory already checked (or opted out) per test
_FORMAT_SEEN: set = set()


def _format_opted_out(node) -> bool:
    return node.get_closest_marker("no_format_check") is not None


@pytest.fixture(autouse=True)
def _format_check(request):
    """At teardown, every dump file the test wrote into its ``tmp_path`` must match the format's
    schemas (``msprobe.format``); a test that writes broken or foreign dumps on purpose opts out with
    ``@pytest.mark.no_format_check``."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is None:
        return
    _FORMAT_SEEN.add(os.path.basename(str(tmp)))
    if not _format_opted_out(request.node):
        from msprobe.format import validate_dump_tree

        validate_dump_tree(str(tmp))


@pytest.fixture(scope="module", autouse=True)
def _format_check_module_dumps(request, tmp_path_factory):
    """The same check for dumps made by module-scoped fixtures (``tmp_path_factory.mktemp``), at the
    end of the module."""
    base = tmp_path_factory.getbasetemp()
    before = set(os.listdir(base))
    yield
    if _format_opted_out(request.node):
        return
    from msprobe.format import validate_dump_tree

    for name in sorted(set(os.listdir(base)) - before - _FORMAT_SEEN):
        path = os.path.join(str(base), name)
        if not os.path.islink(path):  # pytest's "{name}current" links to numbered directories
            validate_dump_tree(path)


@pytest.fixture(autouse=True)
def _no_leftover_patches():
    before = ops.gelu, ops.relu, Tensor.__mul__, Tensor.add_
    yield
    if (ops.gelu, ops.relu, Tensor.__mul__, Tensor.add_) != before:
        # a debugger the test dropped gives its capture back when collected (one kept alive by a
        # reference cycle, e.g. through a caught exception's traceback, only by the collector)
        import gc

        gc.collect()
    assert (ops.gelu, ops.relu, Tensor.__mul__, Tensor.add_) == before, "a test left patches installed"
