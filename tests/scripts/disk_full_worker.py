"""Disk-full worker for tests/test_reliability.py (run under RLIMIT_FSIZE with SIGXFSZ ignored).

``disk_full_worker.py DUMP_PATH``: 6 training steps of a small MLP with a tensor-task L1 dump. Step 2
first flushes what it recorded (the background flush deadline passes in a pause), then calls ``ops.relu`` on a
256 KB tensor whose ``.npy`` exceeds the file-size limit (EFBIG). The tool must log one error, switch
itself off, and the training must finish: the script prints ``LOSSES [...]`` and ``DONE``.
"""
import json
import sys
import time

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()

import numpy as np  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402


def main(dump_path):
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=0.1)
    rng = np.random.RandomState(0)
    x = Tensor(rng.randn(4, 8).astype(np.float32))
    y = Tensor(rng.randn(4, 4).astype(np.float32))
    small = Tensor(np.arange(6, dtype=np.float32) - 3)
    big = Tensor(np.ones((64, 1024), np.float32))          # 256 KB .npy
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor")
    losses = []
    for step in range(6):
        debugger.start(net)
        loss, grads = grad_fn(x, y)
        opt(grads)
        if step == 2:
            ops.relu(small)
            time.sleep(1.5)        # the flush deadline (0.75 s) passes: the step so far is journaled
            ops.relu(big)          # its .npy files exceed RLIMIT_FSIZE: EFBIG at the next flush
        debugger.stop()
        debugger.step()
        losses.append(float(loss.asnumpy()))
    print("LOSSES " + json.dumps(losses), flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
