"""Watch mode with ``on_anomaly: "raise"``: the training loop catches the exception and the process
ends without another ``stop()``/``step()`` (argv: dump_path). The test reads the heartbeat the tool
writes as the interpreter exits."""
import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

ms.set_device("CPU")
ms.runtime.launch_blocking()
from msprobe.engine.watch import WatchAnomaly  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402

dump_path = sys.argv[1]
config = os.path.join(os.path.dirname(dump_path), "config.json")
with open(config, "w") as f:
    json.dump({"task": "statistics", "dump_path": dump_path, "level": "L1",
               "watch": {"on_anomaly": "raise"}}, f)
debugger = PrecisionDebugger(config_path=config)
ms.set_seed(0)
net = nn.Dense(4, 1)
opt = nn.SGD(net.trainable_params(), 0.01)
grad_fn = ms.value_and_grad(lambda x, shift: net(ops.log(x - shift)).sum(), None, opt.parameters)
for step in range(5):
    try:
        debugger.start(net)
        _, grads = grad_fn(Tensor(np.ones((2, 4), np.float32)), 100.0 if step == 2 else 0.0)
        opt(grads)
        debugger.stop()
        debugger.step()
    except WatchAnomaly:
        print("CAUGHT", step, flush=True)
        break
