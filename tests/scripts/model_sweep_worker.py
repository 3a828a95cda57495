"""Model-sweep worker for tests/test_runtime_guarantees.py: one debugger, a new model per step.

``model_sweep_worker.py DUMP_PATH MODELS LEVEL [off]``: builds ``MODELS`` models one after the other
(4 x Dense(256, 256), ~1 MB of Parameters each), runs a forward and backward pass of each under
start(model)/stop()/step() and drops it. Prints ``RSS [...]``: the process RSS in bytes after each
model (psutil). With ``off`` no debugger is used (baseline).
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


def one_model(debugger, x):
    net = nn.SequentialCell(*[nn.Dense(256, 256) for _ in range(4)])
    params = net.trainable_params()
    grad_fn = ms.grad(lambda a: ops.sum(net(a) ** 2), None, params)
    if debugger:
        debugger.start(net)
    grad_fn(x)
    if debugger:
        debugger.stop()
        debugger.step()


def main(dump_path, models, level, tool_on):
    x = Tensor(np.random.RandomState(0).randn(8, 256).astype(np.float32))
    debugger = PrecisionDebugger(dump_path=dump_path, level=level) if tool_on else None
    proc = psutil.Process()
    rss = []
    for _ in range(models):
        one_model(debugger, x)
        gc.collect()
        rss.append(proc.memory_info().rss)
    print("RSS " + json.dumps(rss), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], len(sys.argv) < 5 or sys.argv[4] != "off")
