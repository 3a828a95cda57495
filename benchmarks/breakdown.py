"""Where the overhead of one level goes: hooks alone, forward data, backward data (TinyLM, statistics).

    .venv/bin/python benchmarks/breakdown.py --level L1          # 15 rounds
    .venv/bin/python benchmarks/breakdown.py --level L0 --rounds 25 --json out.json

One process, ``ms.set_device("CPU"); ms.runtime.launch_blocking()`` (as ``overhead.py``). Variants run
in turn, two training steps each, for ``--rounds`` rounds (so slow drift of the machine's load hits
them alike); reported: median wall and process-CPU ms per step and the excess over ``off``:

* ``off``: the bare training step;
* ``hooks only``: the level installed with a ``list`` that selects nothing (``start(net)``, all
  hooks in place and running, nothing recorded; at L1 a list that matches no API also leaves the API
  wrappers out, so this row is the Cell and Primitive part);
* ``forward``: ``data_mode: ["forward"]``;
* ``backward``: ``data_mode: ["backward"]`` (gradients, and at L0 parameter gradients);
* ``all``: the default.

``forward + backward - all`` is the part both share (hooks, stacks, start/stop, flush batches).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # noqa: E402

VARIANTS = {  # name -> (data_mode, list)
    "hooks only": (["all"], ["Cell.selects.nothing"]),
    "forward": (["forward"], []),
    "backward": (["backward"], []),
    "all": (["all"], []),
}


def _debugger(level: str, data_mode: list, names: list):
    from msprobe.mindspore import PrecisionDebugger

    directory = tempfile.mkdtemp(prefix="msprobe_breakdown_")
    config = {"task": "statistics", "dump_path": os.path.join(directory, "dump"), "level": level,
              "statistics": {"scope": [], "list": names, "data_mode": data_mode,
                             "summary_mode": "statistics"}}
    path = os.path.join(directory, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return PrecisionDebugger(config_path=path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L1", choices=("L0", "L1", "mix"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)

    net, batches, train_step = overhead._setup()
    debuggers = {"off": None}
    debuggers.update({name: _debugger(args.level, dm, names) for name, (dm, names) in VARIANTS.items()})

    from models import dumped_step  # examples/, on sys.path after overhead._setup()

    def step(debugger, i: int) -> None:
        dumped_step(net, train_step, batches[i % len(batches)], debugger).asnumpy()

    wall = {k: [] for k in debuggers}
    cpu = {k: [] for k in debuggers}
    for i in range(2):  # warm-up: kernels compiled, plans built
        for debugger in debuggers.values():
            step(debugger, i)
    for _ in range(args.rounds):
        for name, debugger in debuggers.items():
            t, c = time.perf_counter(), time.process_time()
            for i in range(2):
                step(debugger, i)
            wall[name].append((time.perf_counter() - t) / 2)
            cpu[name].append((time.process_time() - c) / 2)

    print(overhead.HEADER)
    print(f"level {args.level}, TinyLM, statistics; median of {args.rounds} rounds x 2 steps per variant")
    print(f"{'variant':12s} {'wall ms':>8s} {'excess':>7s} {'cpu ms':>8s} {'excess':>7s}")
    off_w, off_c = statistics.median(wall["off"]), statistics.median(cpu["off"])
    rows = {}
    for name in debuggers:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        rows[name] = {"wall_ms": 1e3 * w, "wall_excess_ms": 1e3 * (w - off_w),
                      "cpu_ms": 1e3 * c, "cpu_excess_ms": 1e3 * (c - off_c)}
        print(f"{name:12s} {1e3 * w:8.1f} {1e3 * (w - off_w):+7.1f} {1e3 * c:8.1f} {1e3 * (c - off_c):+7.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": overhead.HEADER, "level": args.level, "rounds": args.rounds,
                       "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
