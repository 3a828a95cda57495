"""Cost per Cell call of MindSpore's Cell hook path, by registration kind, and of msprobe's L0 hooks.

    .venv/bin/python benchmarks/cell_hook_cost.py                 # 60 rounds
    .venv/bin/python benchmarks/cell_hook_cost.py --rounds 100 --cells 50 --json out.json

Workload: a chain of ``--cells`` ``nn.Dense(8, 8)`` Cells (tiny tensors, so the per-call cost is large
next to the computation), one ``mindspore.value_and_grad`` forward and backward per step,
``ms.set_device("CPU"); ms.runtime.launch_blocking()``. Variants run in turn (the order reversed every
other round, so slow drift of the machine's load hits them alike); reported: the median training-thread
CPU time per step (``time.thread_time``) and its excess over ``off`` per Cell call.

MindSpore rows (no-op hook functions, registered on every Cell before the step and removed after it,
as msprobe does at every dumped step):

* ``pre``, ``pre kw``: ``register_forward_pre_hook`` without / with ``with_kwargs``;
* ``post``, ``post kw``, ``post kw always``: ``register_forward_hook`` without / with ``with_kwargs``,
  with ``always_call``;
* ``msprobe's pair``: the pre-hook with ``with_kwargs`` and the forward hook with ``with_kwargs`` and
  ``always_call`` (what msprobe registers);
* ``parameter hooks``: ``Parameter.register_hook`` on every trainable parameter (2 per Dense);
* ``construct wrapper``: the same two no-op calls made by an instance-level ``construct`` wrapper
  instead of hooks (a comparison only: msprobe uses MindSpore's hooks).

msprobe rows (L0 statistics, ``start(net)``/step/``stop()``/``step()``): ``L0 hooks only`` (a ``list``
that selects nothing: the hooks run, nothing is recorded), ``L0 forward`` (``data_mode`` forward),
``L0 all``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # noqa: E402
from breakdown import _debugger  # noqa: E402  (an L0/L1/mix statistics debugger)


def _noop_pre(cell, args):
    return None


def _noop_pre_kw(cell, args, kwargs):
    return None


def _noop_post(cell, args, output):
    return None


def _noop_post_kw(cell, args, kwargs, output):
    return None


def _noop_grad(grad):
    return None


#: MindSpore variant -> [(register_forward_pre_hook "pre" or register_forward_hook "post", hook, keywords)]
HOOK_KINDS = {
    "pre": [("pre", _noop_pre, {})],
    "pre kw": [("pre", _noop_pre_kw, {"with_kwargs": True})],
    "post": [("post", _noop_post, {})],
    "post kw": [("post", _noop_post_kw, {"with_kwargs": True})],
    "post kw always": [("post", _noop_post_kw, {"with_kwargs": True, "always_call": True})],
    "msprobe's pair": [("pre", _noop_pre_kw, {"with_kwargs": True}),
                       ("post", _noop_post_kw, {"with_kwargs": True, "always_call": True})],
}


def _install_kind(name: str, cells: list, params: list):
    """Install MindSpore variant ``name``; returns the function that removes it."""
    if name == "parameter hooks":
        handles = [p.register_hook(_noop_grad) for p in params]
        return lambda: [h.remove() for h in handles]
    if name == "construct wrapper":
        for cell in cells:
            object.__setattr__(cell, "construct", _wrapper(cell, cell.construct))
        return lambda: [vars(cell).pop("construct") for cell in cells]
    handles = []
    for cell in cells:
        for kind, hook, keywords in HOOK_KINDS[name]:
            register = cell.register_forward_pre_hook if kind == "pre" else cell.register_forward_hook
            handles.append(register(hook, **keywords))
    return lambda: [h.remove() for h in handles]


def _wrapper(cell, original):
    def construct(*args, **kwargs):
        _noop_pre_kw(cell, args, kwargs)
        try:
            out = original(*args, **kwargs)
        except BaseException:
            _noop_post_kw(cell, args, kwargs, None)
            raise
        _noop_post_kw(cell, args, kwargs, out)
        return out
    return construct


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--cells", type=int, default=50)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)

    import logging

    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    ms.set_device("CPU")
    ms.runtime.launch_blocking()

    class Chain(nn.Cell):
        def __init__(self, n: int):
            super().__init__()
            self.layers = nn.CellList([nn.Dense(8, 8) for _ in range(n)])

        def construct(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    net = Chain(args.cells)
    x = Tensor(np.ones((4, 8), np.float32))
    grad_fn = ms.value_and_grad(lambda data: net(data).sum(), None, net.trainable_params())
    cells, params = list(net.layers), net.trainable_params()
    tool = {"L0 hooks only": _debugger("L0", ["all"], ["Cell.selects.nothing"]),
            "L0 forward": _debugger("L0", ["forward"], []), "L0 all": _debugger("L0", ["all"], [])}
    logging.getLogger("msprobe").setLevel(logging.WARNING)
    variants = ["off"] + list(HOOK_KINDS) + ["parameter hooks", "construct wrapper"] + list(tool)

    def step(name: str) -> float:
        t = time.thread_time()
        debugger = tool.get(name)
        undo = None
        if debugger is not None:
            debugger.start(net)
        elif name != "off":
            undo = _install_kind(name, cells, params)
        loss, _ = grad_fn(x)
        loss.asnumpy()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        if undo is not None:
            undo()
        return time.thread_time() - t

    for _ in range(3):  # warm-up: kernels compiled, plans built
        for name in variants:
            step(name)
    cpu = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in (variants if r % 2 else variants[::-1]):
            cpu[name].append(1e3 * step(name))
    off = statistics.median(cpu["off"])
    print(overhead.HEADER)
    print(f"chain of {args.cells} Dense(8, 8), forward + backward; training-thread CPU ms per step, median of "
          f"{args.rounds} rounds; loadavg {os.getloadavg()[0]:.2f}")
    print(f"{'variant':18s} {'cpu ms':>8s} {'us/Cell':>8s} {'quartiles':>14s}")
    rows = {}
    for name in variants:
        med = statistics.median(cpu[name])
        q1, _, q3 = statistics.quantiles(cpu[name], n=4)
        per_cell = 1e3 * (med - off) / args.cells
        rows[name] = {"cpu_ms": med, "excess_us_per_cell": per_cell, "q1_ms": q1, "q3_ms": q3}
        print(f"{name:18s} {med:8.2f} {per_cell:+8.1f} {q1:6.1f}-{q3:<6.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": overhead.HEADER, "cells": args.cells, "rounds": args.rounds,
                       "loadavg": os.getloadavg()[0], "results": rows}, f, indent=2)
    for debugger in tool.values():
        debugger.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
