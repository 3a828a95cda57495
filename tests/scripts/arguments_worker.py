"""Worker for tests/test_graph_arguments.py: trains a small network whose Cells take a tuple, ``None``
and Python scalars as positional arguments (an ``nn.LSTM`` given an initial state ``(h, c)``, one
without (its inner Cell then gets the zero state it makes), an attention Cell called with
``mask=None`` and a scale, a Cell whose only argument is a float) for two steps in one MindSpore mode
(``set_context`` mode is process-global) and prints the losses, the SHA-256 of each step's gradients
and how many drains were made from a recipe as JSON on the last line.

    python arguments_worker.py MODE TOOL DUMP_PATH [--level L0|mix] [--shift] [--jit]

MODE: graph | pynative. TOOL: on | off. ``--shift``: the attention Cell's query projection starts from
weights shifted by 1e-2 (a real difference, in its forward output). ``--jit`` (PyNative): the network
is the child ``body`` of the model and its ``construct`` a ``mindspore.jit`` function, so its Cells run
compiled (entries ``Cell.body.lstm...`` in the dump's ``graph`` tree).
"""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402
from worker_common import digest, training_parser  # noqa: E402


class Attention(nn.Cell):
    """Self-attention over the sequence, with an optional additive ``mask`` and a ``scale``."""

    def __init__(self, width):
        super().__init__()
        self.q, self.k, self.v = nn.Dense(width, width), nn.Dense(width, width), nn.Dense(width, width)

    def construct(self, x, mask, scale):
        scores = ops.matmul(self.q(x), self.k(x).swapaxes(-1, -2)) * scale
        if mask is not None:
            scores = scores + mask
        return ops.matmul(ops.softmax(scores, -1), self.v(x))


class Gain(nn.Cell):
    """A learned gain times ``scale``: a Cell whose only argument is a Python float."""

    def __init__(self):
        super().__init__()
        self.gain = ms.Parameter(Tensor(np.full((2,), 1.5, np.float32)), name="gain")

    def construct(self, scale):
        return self.gain * scale


class Net(nn.Cell):
    def __init__(self, width=8):
        super().__init__()
        self.lstm = nn.LSTM(width, width, batch_first=True)
        self.lstm2 = nn.LSTM(width, width, batch_first=True)
        self.att = Attention(width)
        self.head = nn.Dense(width, 2)
        self.gain = Gain()

    def construct(self, x, h0, c0):
        y, _ = self.lstm(x, (h0, c0))
        z, _ = self.lstm2(y)
        w = self.att(z, None, 0.25)
        return self.head(w[:, -1]) * self.gain(0.5)


class JitNet(Net):
    construct = ms.jit(Net.construct)


class Outer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = JitNet()

    def construct(self, x, h0, c0):
        return self.body(x, h0, c0)


def main():
    ap = training_parser()
    ap.add_argument("--shift", action="store_true")
    ap.add_argument("--jit", action="store_true")
    args = ap.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    ms.set_seed(5)
    np.random.seed(5)
    net = Outer() if args.jit else Net()
    body = net.body if args.jit else net
    if args.shift:
        body.att.q.weight.set_data(body.att.q.weight + 1e-2)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    rng = np.random.RandomState(7)
    x = Tensor(rng.randn(3, 5, 8).astype(np.float32))
    h0 = Tensor(rng.randn(1, 3, 8).astype(np.float32))
    c0 = Tensor(rng.randn(1, 3, 8).astype(np.float32))
    label = Tensor(rng.randn(3, 2).astype(np.float32))

    def forward(data, h, c, y):
        return ((net(data, h, c) - y) ** 2).mean()

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    debugger = None
    if args.tool == "on":
        from msprobe.mindspore import PrecisionDebugger
        os.makedirs(args.dump_path, exist_ok=True)
        config = os.path.join(args.dump_path, "config.json")
        with open(config, "w") as f:
            json.dump({"task": "statistics", "dump_path": args.dump_path, "level": args.level, "statistics": {}}, f)
        debugger = PrecisionDebugger(config)
    losses, grads = [], []
    for _ in range(2):
        if debugger is not None:
            debugger.start(net)
        loss, g = grad_fn(x, h0, c0, label)
        opt(g)
        losses.append(float(loss.asnumpy()))
        grads.append(digest(g))
        if debugger is not None:
            debugger.stop()
            debugger.step()
    recipe_drains = 0
    if debugger is not None and args.mode == "graph":  # drains made from a recipe (compiled probes)
        recipe_drains = debugger.service._graph._capture.recipe_drains
    print(json.dumps({"losses": losses, "grads": grads, "recipe_drains": recipe_drains}))


if __name__ == "__main__":
    main()
