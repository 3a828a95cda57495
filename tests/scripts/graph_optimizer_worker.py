"""Worker for tests/test_graph_optimizers.py: GRAPH_MODE training of examples.models.LeNet with
each ``mindspore.nn`` optimizer in turn, tool on or off (the probes are compiled into the graphs,
so on/off need separate processes; several optimizers share one process, each with its own
network, optimizer and, tool on, its own ``PrecisionDebugger`` writing ``DUMP/{optimizer}``).

    python graph_optimizer_worker.py TOOL DUMP --optimizers Adam,SGD [--driver cell|model]
        [--level L0|mix] [--steps 2] [--grads FILE.npz]

DRIVER: ``cell`` (``nn.TrainOneStepCell`` called in a start/stop/step loop), ``model``
(``Model.train`` + ``MsprobeStep``). Prints one JSON line: ``{optimizer: {"losses": [...],
"state": [...]}}``, ``state`` = SHA-256 of every Parameter of the training network (model
parameters and optimizer state) after each step. ``--grads`` (tool off, cell driver): the gradient
of each model parameter at each step, computed by a separate ``value_and_grad`` before the step,
saved as ``{optimizer}/{step}/{parameter name}``.
"""
from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from examples.models import LeNet, configure_cpu, load_digits_dataset, set_seed  # noqa: E402

#: ``mindspore.nn`` optimizers that train on CPU without the tool (measured on MindSpore 2.10: LARS and
#: Lamb have no CPU kernel, OptTFTWrapper needs MindIO on Ascend), with the arguments used here
OPTIMIZERS = {
    "Adam": lambda p: nn.Adam(p, learning_rate=0.01),
    "AdamWeightDecay": lambda p: nn.AdamWeightDecay(p, learning_rate=0.01, weight_decay=0.01),
    "LazyAdam": lambda p: nn.LazyAdam(p, learning_rate=0.01),
    "AdamOffload": lambda p: nn.AdamOffload(p, learning_rate=0.01),
    "AdaMax": lambda p: nn.AdaMax(p, learning_rate=0.01),
    "AdaFactor": lambda p: nn.AdaFactor(p, learning_rate=0.01, scale_parameter=False,
                                        relative_step=False, warmup_init=False),
    "Adadelta": lambda p: nn.Adadelta(p, learning_rate=1.0),
    "Adagrad": lambda p: nn.Adagrad(p, learning_rate=0.01),
    "ProximalAdagrad": lambda p: nn.ProximalAdagrad(p, learning_rate=0.01),
    "ASGD": lambda p: nn.ASGD(p, learning_rate=0.01),
    "FTRL": lambda p: nn.FTRL(p, learning_rate=0.01),
    "Momentum": lambda p: nn.Momentum(p, learning_rate=0.01, momentum=0.9),
    "RMSProp": lambda p: nn.RMSProp(p, learning_rate=0.01),
    "Rprop": lambda p: nn.Rprop(p, learning_rate=0.01),
    "SGD": lambda p: nn.SGD(p, learning_rate=0.05),
    "WrappedSGD": lambda p: WrappedSGD(p),
}


class WrappedSGD(nn.Optimizer):
    """An optimizer holding another one (as ``nn.LARS`` holds its inner optimizer): both hold the
    model's parameters; the gradients are those the outer one receives."""

    def __init__(self, params):
        super().__init__(0.05, params)
        self.inner = nn.SGD(params, learning_rate=0.05)

    def construct(self, gradients):
        return self.inner(gradients)


def state_digest(cell) -> str:
    digest = hashlib.sha256()
    for p in cell.get_parameters():
        digest.update(p.name.encode())
        digest.update(np.ascontiguousarray(p.asnumpy()).tobytes())
    return digest.hexdigest()


def run_one(name, args, grads_out):
    set_seed(1234)
    net = LeNet()
    opt = OPTIMIZERS[name](net.trainable_params())
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    batches = load_digits_dataset(batch_size=32)[:args.steps]
    debugger = None
    if args.tool == "on":
        from msprobe.mindspore import PrecisionDebugger
        debugger = PrecisionDebugger(dump_path=os.path.join(args.dump_path, name), level=args.level)
    losses, states = [], []
    if args.driver == "model":
        from mindspore import dataset as ds
        from mindspore.train import Callback, Model
        from msprobe.mindspore import MsprobeStep

        class Observe(Callback):
            def on_train_step_end(self, run_context):
                cb = run_context.original_args()
                losses.append(repr(float(cb.net_outputs.asnumpy())))
                states.append(state_digest(cb.train_network))

        data = ds.NumpySlicesDataset({"x": [b[0] for b in batches], "y": [b[1] for b in batches]},
                                     shuffle=False)
        model = Model(net, loss_fn=loss_fn, optimizer=opt)
        callbacks = [Observe()]
        if debugger is not None:
            debugger.start(net)
            callbacks.insert(0, MsprobeStep(debugger))
        model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
        return {"losses": losses, "state": states}
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt)
    reference = None
    if grads_out is not None:
        def forward(x, y):
            return loss_fn(net(x), y)

        reference = ms.value_and_grad(forward, None, net.trainable_params())
    for step, (x, y) in enumerate(batches):
        if reference is not None:
            _, grads = reference(Tensor(x), Tensor(y))
            for p, g in zip(net.trainable_params(), grads):
                grads_out[f"{name}/{step}/{p.name}"] = g.asnumpy().copy()
        if debugger is not None:
            debugger.start(net)
        loss = train(Tensor(x), Tensor(y))
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(repr(float(loss.asnumpy())))
        states.append(state_digest(train))
    return {"losses": losses, "state": states}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tool", choices=["on", "off"])
    ap.add_argument("dump_path")
    ap.add_argument("--optimizers", required=True)
    ap.add_argument("--driver", default="cell", choices=["cell", "model"])
    ap.add_argument("--level", default="L0")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--grads")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(540, exit=True)  # a hang shows where, then ends the run
    os.makedirs(args.dump_path, exist_ok=True)
    configure_cpu()
    ms.set_context(mode=ms.GRAPH_MODE)
    grads = {} if args.grads else None
    out = {name: run_one(name, args, grads) for name in args.optimizers.split(",")}
    if grads is not None:
        np.savez(args.grads, **grads)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
