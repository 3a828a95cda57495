"""Worker for tests/test_invisible_matrix.py: for each network of tests/matrix_nets.py, trains it
tool-off and tool-on (every level x optimizer) in one MindSpore mode and prints, as JSON on the last
line, the failures of every case.

    python matrix_worker.py pynative|graph OUT_DIR NET [NET ...] [--levels L0,L1,mix]
        [--opts sgd,momentum,adam] [--steps 2] [--tensor] [--async-launch]

A case is ``{level}-{optimizer}`` (``tensor-mix-{optimizer}``: task tensor with the statistics check).
Run it by hand to reproduce one failure, e.g. ``python tests/scripts/matrix_worker.py pynative /tmp/m branch``.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

ms.set_device("CPU")
if "--async-launch" not in sys.argv:
    ms.runtime.launch_blocking()
ms.device_context.cpu.op_tuning.threads_num(1)  # conv weight gradients vary in the last bit otherwise

import matrix_checks as checks  # noqa: E402
from matrix_nets import BY_NAME, optimizers_of  # noqa: E402
from msprobe.mindspore import PrecisionDebugger, seed_all  # noqa: E402

OPTIMIZERS = {
    "sgd": lambda p: nn.SGD(p, learning_rate=0.05),
    "momentum": lambda p: nn.Momentum(p, learning_rate=0.05, momentum=0.9),
    "adam": lambda p: nn.Adam(p, learning_rate=0.01),
}


def train(spec, opt_name, steps, debugger=None, counter_box=None):
    """``steps`` training steps of ``spec.driver``; returns ``{"losses", "grads", "params", "exc", "counts"}`` (bytes as
    hex-free tuples: raw ``tobytes()`` kept in memory)."""
    seed_all(1234)
    net = spec.cls()
    net.set_train(spec.train)
    data, label = spec.inputs(np.random.RandomState(0))
    opt = OPTIMIZERS[opt_name](net.trainable_params())

    step = spec.driver(net, spec.loss, opt)
    counter = checks.CallCounter(net) if counter_box is not None else None
    losses, grads, counts, exc = [], [], [], None
    for _ in range(steps):
        try:
            if debugger is not None:
                debugger.start(net)
            if counter is not None:
                counter.start()
            try:
                loss, g = step(data, label)
                losses.append(loss.asnumpy().tobytes())
                grads.append([t.asnumpy().tobytes() for t in g])
            finally:
                if counter is not None:
                    counter.stop()
                    counts.append(counter.snapshot())
                if debugger is not None:
                    debugger.stop()
                    debugger.step()
        except Exception as e:  # noqa: BLE001 - the user's exception is what is compared
            exc = (type(e).__name__, str(e))
            break
    params = [p.asnumpy().tobytes() for p in net.trainable_params()]
    # after the last stop(): no Cell of the model keeps a forward hook (the nets register none)
    hooked = sorted(name for name, cell in net.cells_and_names() if cell._forward_pre_hook or cell._forward_hook)
    if counter_box is not None:
        counter_box.extend(counts)
    return {"losses": losses, "grads": grads, "params": params, "exc": exc,
            "names": [p.name for p in opt.parameters], "hooked": hooked,
            "caught": list(getattr(net, "caught", []))}


def patchable() -> dict:
    """``{(owner, attribute): the object bound there}`` for every attribute the tool may patch: the
    listed APIs, ``Cell.__call__`` and MindSpore's compiled-call entry."""
    from mindspore.graph.api import _JitExecutor

    from msprobe.capture.api import load_api_list, resolve_targets

    where = [(owner, attr) for owner, attr, _ in resolve_targets(load_api_list())]
    where += [(nn.Cell, "__call__"), (_JitExecutor, "__call__")]
    return {(owner, attr): (vars(owner).get(attr) if isinstance(owner, type) else getattr(owner, attr, None))
            for owner, attr in where}


def compare(ref, on) -> list:
    fails = []
    if ref["exc"] != on["exc"]:
        fails.append(f"exception differs: tool-off {ref['exc']!r}, tool-on {on['exc']!r}")
    if ref["caught"] != on["caught"]:
        fails.append(f"exceptions the model caught differ: tool-off {ref['caught']!r}, tool-on {on['caught']!r}")
    if len(ref["losses"]) != len(on["losses"]):
        fails.append(f"steps completed: tool-off {len(ref['losses'])}, tool-on {len(on['losses'])}")
    for s, (a, b) in enumerate(zip(ref["losses"], on["losses"])):
        if a != b:
            fails.append(f"step {s}: loss differs ({np.frombuffer(a, np.float32)} vs "
                         f"{np.frombuffer(b, np.float32)})")
    for s, (ga, gb) in enumerate(zip(ref["grads"], on["grads"])):
        bad = [ref["names"][i] if i < len(ref["names"]) else f"step output {i}"
               for i, (a, b) in enumerate(zip(ga, gb)) if a != b]
        if bad:
            fails.append(f"step {s}: gradients differ for {bad}")
    if len(ref["losses"]) == len(on["losses"]):
        bad = [n for n, a, b in zip(ref["names"], ref["params"], on["params"]) if a != b]
        if bad:
            fails.append(f"parameters after training differ: {bad}")
    return fails


def check_dump(dump, counts, level, graph_mode, steps_done, spec) -> list:
    """Failures of the dump: ``dump_error_info.log`` (but the lines ``spec.known_log`` matches), a
    dumped step without dump.json, and entries that differ from the calls counted (``counts``, one
    per step), or without the ``Jit.{spec.jit_entry}`` entry at L1/mix for a network whose calls run
    compiled (at L0: :func:`matrix_checks.check_unrecorded_jit`)."""
    fails = []
    logs = [os.path.relpath(os.path.join(r, f), dump) for r, _, fs in os.walk(dump) for f in fs
            if f == "dump_error_info.log"]
    for log in logs:
        with open(os.path.join(dump, log)) as f:
            lines = [line for line in f.read().splitlines()
                     if line.strip() and not (spec.known_log and re.search(spec.known_log, line))]
        if lines:
            fails.append(f"{log}: {chr(10).join(lines)[:600]}")
    dumped_steps = spec.dump_steps
    for step in range(steps_done):
        if dumped_steps and step not in dumped_steps:
            continue
        dumps = checks.step_dumps(dump, step)
        if not dumps:
            fails.append(f"step {step}: no dump.json")
            continue
        names = set()
        for content in dumps.values():
            names |= set(content["data"])
        if spec.jit_entry is None:
            fails += [f"step {step}: {m}" for m in checks.check_names(names, counts[step], level, graph_mode)]
        elif level == "L0":
            fails += [f"step {step}: {m}" for m in checks.check_unrecorded_jit(dumps, spec.jit_entry)]
        elif not any(n.startswith(f"Jit.{spec.jit_entry}.") for n in names):
            fails.append(f"step {step}: no Jit.{spec.jit_entry} entry")
    return fails


def run_net(name, mode, out_dir, levels, opts, steps, tensor) -> dict:
    spec = BY_NAME[name]
    steps = max(steps, max(spec.dump_steps, default=-1) + 1)
    graph_mode = mode == "graph"
    result = {"cases": {}, "times": {}}
    opts = optimizers_of(name, opts)
    for opt in opts:
        t0 = time.perf_counter()
        if graph_mode:  # the counters are Python hooks: count the same network in PyNative
            ms.set_context(mode=ms.PYNATIVE_MODE)
        counts = []
        if spec.jit_entry is None:  # (calls inside a compiled region are not the counter's to count)
            train(spec, opt, steps, counter_box=counts)
        if graph_mode:
            ms.set_context(mode=ms.GRAPH_MODE)
        try:
            ref = train(spec, opt, steps)
        except Exception as e:  # noqa: BLE001
            result["unsupported"] = f"tool-off run fails: {type(e).__name__}: {str(e)[:300]}"
            return result
        if graph_mode and ref["exc"] is not None:
            result["unsupported"] = f"tool-off run raises {ref['exc'][0]}: {ref['exc'][1][:300]}"
            return result
        if opt == opts[0] and not graph_mode:  # (GRAPH_MODE: one compile less; same kernels)
            again = train(spec, opt, steps)
            if compare(ref, again):
                result["nondeterministic"] = compare(ref, again)
        result["exc"] = ref["exc"]
        result["caught"] = ref["caught"]
        cases = [(lvl, "statistics") for lvl in levels] + ([("mix", "tensor")] if tensor and opt == opts[0] else [])
        for level, task in cases:
            key = f"{level}-{opt}" if task == "statistics" else f"tensor-{level}-{opt}"
            dump = os.path.join(out_dir, mode, name, key)
            os.makedirs(dump, exist_ok=True)
            cfg = {"task": task, "dump_path": dump, "level": level, task: {}}
            if spec.dump_steps:  # the other steps run between dumped steps
                cfg["step"] = list(spec.dump_steps)
            cfg_path = dump + ".json"
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            t1 = time.perf_counter()
            fails = []
            try:
                before = patchable()
                debugger = PrecisionDebugger(config_path=cfg_path)
                on = train(spec, opt, steps, debugger)
                debugger.close()
                fails += compare(ref, on)
                if on["hooked"]:
                    fails.append(f"Cells with forward hooks after stop(): {on['hooked']}")
                left = [f"{getattr(o, '__name__', o)}.{a}" for (o, a), v in patchable().items()
                        if v is not before[o, a]]
                if left:
                    fails.append(f"left patched after close(): {left[:10]} ({len(left)})")
                fails += check_dump(dump, counts, level, graph_mode, len(on["losses"]) + (on["exc"] is not None),
                                    spec)
                if task == "tensor":
                    sfails, checked, _ = checks.check_statistics(dump)
                    fails += sfails
                    if not checked:
                        fails.append("tensor task saved no .npy file")
            except Exception as e:  # noqa: BLE001 - a crash of the tool-on run is a failure
                import traceback

                fails.append(f"tool-on run crashed: {type(e).__name__}: {str(e)[:500]}\n"
                             f"{traceback.format_exc()[-1500:]}")
            result["cases"][key] = fails
            result["times"][key] = round(time.perf_counter() - t1, 2)
        result["times"][f"opt-{opt}"] = round(time.perf_counter() - t0, 2)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["pynative", "graph"])
    ap.add_argument("out_dir")
    ap.add_argument("nets", nargs="+")
    ap.add_argument("--levels", default="L0,L1,mix")
    ap.add_argument("--opts", default="sgd,momentum,adam")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tensor", action="store_true", help="also a task-tensor mix run (statistics check)")
    ap.add_argument("--async-launch", action="store_true", help="MindSpore's default asynchronous launch")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(1200, exit=True)  # a hang shows where, then ends the run
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    out = {}
    for name in args.nets:
        t0 = time.perf_counter()
        out[name] = run_net(name, args.mode, args.out_dir, args.levels.split(","), args.opts.split(","),
                            args.steps, args.tensor)
        out[name]["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"{name}: {out[name]['seconds']} s", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
