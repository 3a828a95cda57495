"""msrun worker for tests/test_reliability.py: 2-process data-parallel training under the debugger.

Launched by ``msrun --worker_num=2 ...  dp_worker.py OUT_DIR``. One launch runs three phases (``init()``
costs ~10 s per worker, so they share it):

1. ``OUT/late``: ``debugger.start()`` *before* ``mindspore.communication.init()`` (late rank
   discovery), then ``init()`` inside the same step, then one more step.
2. ``OUT/main``: 2 training steps, L1, gradients averaged with ``mint.distributed.all_reduce`` (works
   on CPU; ``MintDistributed.all_reduce``) and the loss averaged with an ``ops.AllReduce`` held by the
   model (``Primitive.allreduce.AllReduce``). Inputs differ per rank (seeded by the rank).
3. ``OUT/rank1``: one step with ``"rank": [1]`` in config.json.
4. ``OUT/watch``: watch mode, 3 steps; rank 1 makes a NaN (``log`` of a negative value) at step 1, and
   rank 0 receives it only through the gradients' all-reduce.

Each worker writes ``OUT/result_rank{r}.json`` (losses, local gradients before the all-reduce, final
parameters) so the test can check the dump against the values the training saw.
"""
import json
import os
import sys

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()

import numpy as np  # noqa: E402
from mindspore import Tensor, mint, nn, ops  # noqa: E402
from mindspore import communication  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402

OUT = sys.argv[1]


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


class DataParallel(nn.Cell):
    """Holds the network and the Primitive used to average the loss across ranks."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.allreduce = ops.AllReduce()

    def construct(self, x):
        return self.net(x)


def phase_late():
    """start() before init(): the step directory must still end up as rank{N}."""
    debugger = PrecisionDebugger(dump_path=os.path.join(OUT, "late"), level="L1", step=[0, 1])
    x = Tensor(np.full((2, 3), -1.0 + int(os.environ.get("RANK_ID", "0")), np.float32))
    debugger.start()
    ops.relu(x)                      # recorded while the rank is still unknown
    communication.init()
    ops.relu(x + 1)
    debugger.stop()
    debugger.step()
    debugger.start()
    ops.relu(x)
    debugger.stop()
    debugger.step()


def train(dump_path, steps, config_path=None, record=None, poison=None):
    rank, size = communication.get_rank(), communication.get_group_size()
    ms.set_seed(0)
    dp = DataParallel(MLP())
    params = dp.trainable_params()
    opt = nn.SGD(params, learning_rate=0.1)
    rng = np.random.RandomState(100 + rank)          # rank-specific data
    x = Tensor(rng.randn(4, 8).astype(np.float32))
    y = Tensor(rng.randn(4, 4).astype(np.float32))
    shift = [0.0]  # poison: (rank, step) at which this rank's input goes through log(a - 100): NaN

    def prepare(a):
        return a if poison is None else ops.log(ops.abs(a) + 1.0 - shift[0])

    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(dp(prepare(a)), b), None, params)
    if config_path is not None:
        debugger = PrecisionDebugger(config_path)
    else:
        debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="statistics")
    for step in range(steps):
        shift[0] = 100.0 if poison == (rank, step) else 0.0
        debugger.start(dp)
        loss, grads = grad_fn(x, y)
        local = [g.asnumpy().copy() for g in grads]
        for g in grads:
            mint.distributed.all_reduce(g)            # in place, sum over ranks
        grads = tuple(g / size for g in grads)
        mean_loss = dp.allreduce(loss) / size
        opt(grads)
        debugger.stop()
        debugger.step()
        if record is not None:
            record["loss"].append(float(loss.asnumpy()))
            record["mean_loss"].append(float(mean_loss.asnumpy()))
            record["local_grad_max"].append([float(a.max()) for a in local])
            record["local_grad_min"].append([float(a.min()) for a in local])
            record["reduced_grad_max"].append([float((g * size).asnumpy().max()) for g in grads])
    if record is not None:
        record["params"] = [float(p.asnumpy().sum()) for p in params]


def main():
    phase_late()
    rank = communication.get_rank()
    record = {"rank": rank, "rank_id_env": int(os.environ.get("RANK_ID", "0")), "loss": [], "mean_loss": [], "local_grad_max": [], "local_grad_min": [],
              "reduced_grad_max": []}
    train(os.path.join(OUT, "main"), 2, record=record)
    cfg = os.path.join(OUT, f"rank1_config_{rank}.json")
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump({"task": "statistics", "level": "L1", "rank": [1],
                   "dump_path": os.path.join(OUT, "rank1"), "statistics": {}}, f)
    train(None, 1, config_path=cfg)
    cfg = os.path.join(OUT, f"watch_config_{rank}.json")   # watch mode: rank 1 makes a NaN at step 1
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump({"task": "statistics", "level": "mix", "dump_path": os.path.join(OUT, "watch"),
                   "watch": {"history": 256}}, f)
    train(None, 3, config_path=cfg, poison=(1, 1))
    with open(os.path.join(OUT, f"result_rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)
    print(f"WORKER DONE rank={rank}", flush=True)


if __name__ == "__main__":
    main()
