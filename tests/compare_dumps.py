"""Real MindSpore dumps for the compare and report tests: small nets trained one step with msprobe
(CPU, PyNative), one variant per scenario. Imported by tests/test_compare*.py and test_report*.py."""
from __future__ import annotations

import os

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops

from conftest import write_config


class CompareNet(nn.Cell):
    """Dense(8,16) -> ReLU Cell -> ops.relu -> Scale Cell -> gelu -> Dense(16,4) -> ops.relu.

    Variants: ``extra_relu`` calls ``ops.relu`` once more right after the first (same values: relu is
    idempotent; ``inner_relu``: inside the ``Scale`` Cell, on its result), ``approximate`` is gelu's argument and ``factor`` the ``mint.mul`` factor inside the
    ``Scale`` Cell (changed-op cases), ``mint_relu`` calls ``mint.nn.functional.relu`` instead of
    the last ``ops.relu`` (a name mapping case), ``cast_out`` ends with ``ops.cast`` to float32 (the
    float32 loss of a mixed-precision run), ``nan`` takes ``ops.sqrt``
    of a tensor holding negative values (NaN produced at ``Functional.sqrt.0.forward``, after one extra ``Tensor.__sub__``)."""

    def __init__(self, extra_relu=False, approximate="none", nan=False, factor=2.0,
                 mint_relu=False, cast_out=False, inner_relu=False):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.relu = nn.ReLU()
        self.scale = Scale(factor, inner_relu)
        self.fc2 = nn.Dense(16, 4)
        self.extra_relu, self.approximate, self.nan = extra_relu, approximate, nan
        self.mint_relu = mint_relu
        self.cast_out = cast_out

    def construct(self, x):
        h = self.relu(self.fc1(x))
        h = ops.relu(h)
        if self.extra_relu:
            h = ops.relu(h)
        h = self.scale(h)
        h = ops.gelu(h, approximate=self.approximate)
        if self.nan:
            h = ops.sqrt(h - 0.3)
        if self.mint_relu:  # looked up at call time: msprobe wraps the module attribute
            return mint.nn.functional.relu(self.fc2(h))
        out = ops.relu(self.fc2(h))
        if self.cast_out:  # a loss computed in float32 (mixed precision)
            out = ops.cast(out, ms.float32)
        return out


class Scale(nn.Cell):
    def __init__(self, factor, inner_relu=False):
        super().__init__()
        self.factor, self.inner_relu = factor, inner_relu

    def construct(self, h):
        h = mint.mul(h, self.factor) * 0.5
        return ops.relu(h) if self.inner_relu else h


def build(seed=0, dtype=ms.float32, **variant):
    ms.set_seed(seed)
    np.random.seed(seed)
    net = CompareNet(**variant)
    if dtype != ms.float32:
        for p in net.get_parameters():
            p.set_dtype(dtype)
    return net


def batch(dtype=ms.float32):
    rng = np.random.RandomState(7)
    x = Tensor(rng.randn(4, 8).astype(np.float32)).astype(dtype)
    y = Tensor(rng.rand(4, 4).astype(np.float32)).astype(dtype)
    return x, y


def make_dump(root, name, *, level="mix", task="statistics", steps=1, seed=0, dtype=ms.float32,
              section=None, lr=0.1, **variant) -> str:
    """Train ``steps`` SGD steps (learning rate ``lr``) of a :class:`CompareNet` variant with msprobe
    on; returns the dump_path ``root/name``."""
    from msprobe.mindspore import PrecisionDebugger

    dump_path = os.path.join(str(root), name)
    cfg_dir = os.path.join(str(root), name + "_cfg")
    os.makedirs(cfg_dir, exist_ok=True)
    debugger = PrecisionDebugger(write_config(cfg_dir, task=task, level=level, dump_path=dump_path,
                                              section=section or {}))
    net = build(seed, dtype, **variant)
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=lr)
    x, y = batch(dtype)
    if variant.get("cast_out"):
        y = ops.cast(y, ms.float32)
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
    try:
        for _ in range(steps):
            debugger.start(net)
            _, grads = grad_fn(x, y)
            opt(grads)
            debugger.stop()
            debugger.step()
    finally:
        debugger.stop()
    return dump_path
