"""Worker for tests/test_graph_cells.py: GRAPH_MODE L0 on a network whose sub-Cells compile only
with ``self`` known (a name assigned in one branch of ``if self.flag:``), one of which has no Tensor
input (a slice of a constant table by an int, as mindformers' RoPE ``FreqsMgr``) and one of which is
never called. Trains 2 steps and prints ``{"losses": [...hex...], "grads": [...hex...]}`` as the last
line.

    python graph_cells_worker.py on|off DUMP_PATH
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from mindspore.ops import operations as P  # noqa: E402


class Branchy(nn.Cell):
    """``hidden`` is assigned in one branch only: compiles because ``self.concat`` is a constant."""

    def __init__(self):
        super().__init__()
        self.concat, self.fused = False, False
        self.dense = nn.Dense(4, 4)

    def construct(self, x):
        if self.concat:
            gate = x * 2
            if not self.fused:
                hidden = gate * 3
        else:
            hidden = self.dense(x)
        if self.fused:
            hidden = hidden * 2
        return hidden


class Table(nn.Cell):
    """Rows ``0..n`` of a constant table: nothing here depends on the data."""

    def __init__(self):
        super().__init__()
        self.table = Tensor(np.arange(32, dtype=np.float32).reshape(8, 4) / 32)
        self.slice = P.StridedSlice()

    def construct(self, n):
        return self.slice(self.table, (0, 0), (n, 4), (1, 1))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.table = Table()
        self.branchy = Branchy()
        self.unused = nn.Dense(4, 4)

    def construct(self, x):
        return (self.branchy(x) * self.table(x.shape[0])).sum()


def main():
    tool, dump_path = sys.argv[1], sys.argv[2]
    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net = Net()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    debugger = None
    if tool == "on":
        from msprobe.mindspore import PrecisionDebugger

        debugger = PrecisionDebugger(dump_path=dump_path, level="L0", task="statistics")
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    losses, grads_hex = [], []
    x = Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    for _ in range(2):
        if debugger is not None:
            debugger.start(net)
        loss, grads = grad_fn(x)
        opt(grads)
        losses.append(loss.asnumpy().tobytes().hex())
        grads_hex.append([g.asnumpy().tobytes().hex() for g in grads])
        if debugger is not None:
            debugger.stop()
            debugger.step()
    print(json.dumps({"losses": losses, "grads": grads_hex}))


if __name__ == "__main__":
    main()
