"""Watch mode, then SIGTERM while a step runs (tests/test_watch.py): the flight recorder writes the
history of the open step before the process ends. Prints READY once the step has recorded calls."""
import json
import os
import sys
import time

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()

import numpy as np  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402

dump_path = sys.argv[1]
cfg = os.path.join(dump_path + ".json")
with open(cfg, "w") as f:
    json.dump({"task": "statistics", "level": "L1", "dump_path": dump_path, "watch": {}}, f)
debugger = PrecisionDebugger(config_path=cfg)
net = nn.Dense(4, 4)
x = Tensor(np.ones((2, 4), np.float32))
for _ in range(2):
    debugger.start(net)
    ops.relu(net(x))
    debugger.stop()
    debugger.step()
debugger.start(net)
ops.tanh(ops.relu(net(x)))
print("READY", flush=True)
time.sleep(60)   # the test sends SIGTERM now
