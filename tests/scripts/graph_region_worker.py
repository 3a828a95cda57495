"""Worker for tests/test_graph_regions.py: a small network (Dense and LayerNorm Cells, an ``Attn`` Cell
holding two of them) trained with ``ms.value_and_grad`` + SGD for three steps, in one MindSpore mode
(set_context mode is process-global); prints the losses as JSON on the last line.

    python graph_region_worker.py MODE LEVEL DUMP_PATH [--watch] [--poison-step N] [--y-offset F]

MODE: graph | pynative. LEVEL: L0 | L1 | mix. ``--watch``: config ``"watch": {}``. ``--poison-step N``:
at step N the ``Attn`` Cell takes the logarithm of -1 (a NaN made inside that Cell, from finite inputs).
``--y-offset F``: F is added to the labels (the loss and every gradient differ, no Cell's forward).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402


class Attn(nn.Cell):
    def __init__(self):
        super().__init__()
        self.q = nn.Dense(8, 8)
        self.norm = nn.LayerNorm((8,))

    def construct(self, x, shift):
        return self.norm(self.q(x)) + ops.log(shift)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc, self.attn, self.head = nn.Dense(8, 8), Attn(), nn.Dense(8, 1)

    def construct(self, x, y, shift):
        return ((self.head(self.attn(self.fc(x), shift)) - y) ** 2).mean()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["graph", "pynative"])
    parser.add_argument("level", choices=["L0", "L1", "mix"])
    parser.add_argument("dump")
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--poison-step", type=int, default=-1)
    parser.add_argument("--y-offset", type=float, default=0.0)
    args = parser.parse_args()
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    from msprobe.mindspore import PrecisionDebugger, seed_all

    seed_all(1)
    config = {"task": "statistics", "dump_path": args.dump, "level": args.level}
    if args.watch:
        config["watch"] = {}
    config_path = args.dump.rstrip(os.sep) + ".config.json"
    with open(config_path, "w") as f:
        json.dump(config, f)
    net = Net()
    optimizer = nn.SGD(net.trainable_params(), 0.01)
    debugger = PrecisionDebugger(config_path=config_path)
    grad_fn = ms.value_and_grad(net, None, optimizer.parameters)
    rng = np.random.default_rng(0)
    losses = []
    for step in range(3):
        x = ms.Tensor(rng.standard_normal((4, 8)).astype(np.float32))
        y = ms.Tensor(rng.standard_normal((4, 1)).astype(np.float32) + np.float32(args.y_offset))
        shift = ms.Tensor(-1.0 if step == args.poison_step else 1.0, ms.float32)
        debugger.start(net)
        loss, grads = grad_fn(x, y, shift)
        optimizer(grads)
        debugger.stop()
        debugger.step()
        losses.append(float(loss.asnumpy()))
    print(json.dumps({"losses": losses}))


if __name__ == "__main__":
    main()
