"""Worker for tests/test_graph_mode.py: trains examples.models.LeNet on digits for a few steps in one
MindSpore mode (set_context mode is process-global) and prints the losses as JSON on the last line.

    python graph_worker.py MODE TOOL DUMP_PATH [--task statistics] [--data-mode all] [--driver loop|model|jit]

MODE: graph | pynative. TOOL: on | off. DRIVER: ``loop`` (value_and_grad + optimizer), ``model``
(``Model.train`` + ``MsprobeStep``), ``jit`` (PyNative network whose ``features`` Cell has a
``mindspore.jit`` construct), ``unread`` (the loop, reading the loss only after ``stop()`` and
``step()``). ``--async``: MindSpore's default asynchronous launch. ``--python-probes``: pyfunc graph probes
even when the compiled ones are built (``msprobe/capture/cells/graph_probes.py``); ``--direct-records``: the
probes' records made one by one through the runtime (``GraphCellCapture.batched``). ``--half-batches``: every
second step a batch of 16. ``--no-extra-info``: config ``extra_info`` false. ``--step-list``: the
config's ``step`` list (JSON), ``--scope`` its ``scope`` (JSON). The JSON also has the SHA-256 of each
step's gradients (``grads``, loop drivers) and of the trained parameters (``parameters``), and says how many drains made their records
from a recipe (``recipe_drains``).
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from examples.models import LeNet, configure_cpu, load_digits_dataset, set_seed  # noqa: E402
from worker_common import digest, training_parser  # noqa: E402


class JitFeatures(nn.Cell):
    """conv1 -> relu -> pool, compiled with mindspore.jit (children run inside the graph)."""

    def __init__(self, net):
        super().__init__()
        self.conv1, self.relu, self.pool = net.conv1, nn.ReLU(), net.pool

    @ms.jit
    def construct(self, x):
        return self.pool(self.relu(self.conv1(x)))


class JitLeNet(nn.Cell):
    def __init__(self):
        super().__init__()
        base = LeNet()
        self.features = JitFeatures(base)
        self.conv2, self.relu, self.flatten = base.conv2, base.relu, base.flatten
        self.fc1, self.fc2 = base.fc1, base.fc2

    def construct(self, x):
        x = self.relu(self.conv2(self.features(x)))
        x = self.relu(self.fc1(self.flatten(x)))
        return self.fc2(x)


def main():
    ap = training_parser()
    ap.add_argument("--task", default="statistics")
    ap.add_argument("--data-mode", default="all")
    ap.add_argument("--driver", default="loop", choices=["loop", "model", "jit", "unread"])
    ap.add_argument("--async", dest="async_launch", action="store_true",
                    help="MindSpore's default asynchronous launch instead of launch_blocking()")
    ap.add_argument("--python-probes", action="store_true", help="pyfunc graph probes, not the compiled ones")
    ap.add_argument("--direct-records", action="store_true",
                    help="the graph probes' records through the runtime's record methods one by one")
    ap.add_argument("--no-extra-info", action="store_true",
                    help="config extra_info false: dump.json only (no stack.json, construct.json)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--half-batches", action="store_true",
                    help="every second step a batch of 16 (another input shape: a graph compiled for it)")
    ap.add_argument("--step-list", default="[]",
                    help="the config's step list, as JSON (default: every step)")
    ap.add_argument("--scope", default="[]", help="the config's scope, as JSON (default: none)")
    ap.add_argument("--resume", type=int, default=0,
                    help="model driver: resume at this step number (MsprobeInitStep)")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where, then ends the run

    configure_cpu(blocking=not args.async_launch)
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    set_seed(1234)
    net = JitLeNet() if args.driver == "jit" else LeNet()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    batches = load_digits_dataset(batch_size=32)[:args.steps]
    if args.half_batches:
        batches = [(x[:16], y[:16]) if i % 2 else (x, y) for i, (x, y) in enumerate(batches)]

    debugger = None
    if args.direct_records:
        from msprobe.capture.cells.graph_cell import GraphCellCapture
        GraphCellCapture.batched = False
    if args.python_probes:
        from msprobe.capture.cells import graph_probes
        graph_probes._graph_probe = None
    if args.tool == "on":
        from msprobe.mindspore import PrecisionDebugger
        steps = json.loads(args.step_list)
        debugger = PrecisionDebugger(dump_path=args.dump_path, task=args.task, level=args.level, step=steps)
        if args.data_mode != "all" or args.no_extra_info or args.scope != "[]":
            cfg = {"task": args.task, "dump_path": args.dump_path, "level": args.level, "step": steps,
                   args.task: {"data_mode": args.data_mode.split(","), "scope": json.loads(args.scope)}}
            if args.no_extra_info:
                cfg["extra_info"] = False
            path = os.path.join(args.dump_path + ".json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            debugger = PrecisionDebugger(config_path=path)

    losses, times, cpu, grad_digests = [], [], [], []
    if args.driver == "model":
        from mindspore import dataset as ds
        from mindspore.train import Callback, Model
        from msprobe.mindspore import MsprobeStep

        class Losses(Callback):
            def on_train_step_end(self, run_context):
                losses.append(float(run_context.original_args().net_outputs.asnumpy()))

        data = ds.NumpySlicesDataset(
            {"x": [b[0] for b in batches], "y": [b[1] for b in batches]}, shuffle=False)
        model = Model(net, loss_fn=loss_fn, optimizer=opt)
        callbacks = [Losses()]
        if debugger is not None:
            debugger.start(net)
            callbacks.insert(0, MsprobeStep(debugger))
            if args.resume:
                from msprobe.mindspore import MsprobeInitStep

                class Resumed(Callback):  # what Model does when training resumes from a checkpoint
                    def on_train_begin(self, run_context):
                        run_context.original_args().cur_step_num = args.resume

                callbacks[:0] = [Resumed(), MsprobeInitStep()]
        model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    else:
        def forward(x, y):
            return loss_fn(net(x), y)

        grad_fn = ms.value_and_grad(forward, None, opt.parameters)
        for x, y in batches:
            t0, c0 = time.perf_counter(), time.process_time()
            if debugger is not None:
                debugger.start(net)
            loss, grads = grad_fn(Tensor(x), Tensor(y))
            opt(grads)
            grad_digests.append(digest(grads))
            if args.driver != "unread":  # unread: no result is read before stop() and step()
                losses.append(float(loss.asnumpy()))
            if debugger is not None:
                debugger.stop()
                debugger.step()
            if args.driver == "unread":
                losses.append(float(loss.asnumpy()))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    graph = debugger.service._graph if debugger is not None else None
    compiled = bool(graph) and graph._capture is not None and graph._capture._compiled is not None
    print(json.dumps({"losses": [repr(v) for v in losses], "times": times, "cpu": cpu,
                      "compiled_probes": compiled, "grads": grad_digests,
                      "parameters": digest(net.trainable_params()),
                      "recipe_drains": graph._capture.recipe_drains if compiled else 0}))


if __name__ == "__main__":
    main()
