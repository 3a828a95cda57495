"""Memory worker for tests/test_reliability.py: ``gc.disable()`` in the user script, ``step: [0]``.

``gc_memory_worker.py DUMP_PATH STEPS [off]``: trains ``STEPS`` steps of a small MLP calling
start/stop/step every step (only step 0 is dumped, L1). Prints ``RSS [...]``: the process RSS in bytes
after each step (psutil). With ``off`` no debugger is used (baseline).
"""
import gc
import json
import sys

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402


def main(dump_path, steps, tool_on):
    gc.disable()
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 64), nn.ReLU(), nn.Dense(64, 8))
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=0.01)
    rng = np.random.RandomState(0)
    x = Tensor(rng.randn(16, 32).astype(np.float32))
    y = Tensor(rng.randn(16, 8).astype(np.float32))
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", step=[0]) if tool_on else None
    proc = psutil.Process()
    rss = []
    for _ in range(steps):
        if debugger:
            debugger.start(net)
        loss, grads = grad_fn(x, y)
        opt(grads)
        if debugger:
            debugger.stop()
            debugger.step()
        loss.asnumpy()
        rss.append(proc.memory_info().rss)
    print("RSS " + json.dumps(rss), flush=True)
    print("GC_ENABLED", gc.isenabled(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), len(sys.argv) < 4 or sys.argv[3] != "off")
