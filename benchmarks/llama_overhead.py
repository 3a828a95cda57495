"""Per-step overhead of msprobe on third-party model code: mindformers' ``LlamaForCausalLM``.

    .venv/bin/python tests/thirdparty_venv.py          # once: creates or reuses .venv-mindformers
    .venv-mindformers/bin/python benchmarks/llama_overhead.py [--levels L0,L1,mix] [--pairs 5] [--steps 3]
    .venv-mindformers/bin/python benchmarks/llama_overhead.py --launch default --levels L1

The model, its configuration and the token batches are those of ``tests/scripts/thirdparty_worker.py``
(``llama``; the bit-identity test of the same model: 2 layers, hidden 64, 4 heads, seq 32, batch 2,
Momentum), trained with ``mindspore.value_and_grad`` + the optimizer. One process per level; inside it, runs of ``--steps``
steps alternate tool-off and tool-on (``start(net)``/step/``stop()``/``step()``) after warm-up of both,
and the ratio is the median of the per-pair ratios, as in ``overhead.py`` (wall, process CPU, and the
training thread's CPU time). The tool-off runs call nothing of the tool.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER_DIR = os.path.join(ROOT, "tests", "scripts")


def worker(level: str, pairs: int, steps: int, warmup: int, launch: str, out: str) -> dict:
    sys.path.insert(0, WORKER_DIR)
    os.chdir(out)  # importing mindformers writes ./output/log
    import mindspore as ms

    ms.set_device("CPU")
    if launch == "blocking":
        ms.runtime.launch_blocking()
    import thirdparty_worker  # noqa: E402  (puts its stand-in packages on sys.path)

    net, opt = thirdparty_worker.build("momentum", "llama")
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    batches = [ms.Tensor(t) for t in thirdparty_worker.token_batches(4)]
    from msprobe.mindspore import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task="statistics", level=level)
    state = {"i": 0}

    def one_step(on: bool):
        tokens = batches[state["i"] % len(batches)]
        state["i"] += 1
        if on:
            debugger.start(net)
        loss, grads = grad_fn(tokens)
        opt(grads)
        if on:
            debugger.stop()
            debugger.step()
        loss.asnumpy()

    for on in (False, True):
        for _ in range(warmup):
            one_step(on)
    runs = []
    for _ in range(pairs):
        for on in (False, True):
            w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
            for _ in range(steps):
                one_step(on)
            w1, c1, t1 = time.perf_counter(), time.process_time(), time.thread_time()
            runs.append({"on": on, "wall_ms": 1000 * (w1 - w0) / steps, "cpu_ms": 1000 * (c1 - c0) / steps,
                         "thread_ms": 1000 * (t1 - t0) / steps})
    debugger.service.close()
    return {"runs": runs}


def summarise(runs: list, key: str) -> tuple:
    off = [r[key] for r in runs if not r["on"]]
    on = [r[key] for r in runs if r["on"]]
    ratios = [b / a for a, b in zip(off, on)]
    return statistics.median(off), statistics.median(on), statistics.median(ratios), ratios


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="L0,L1,mix")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--launch", choices=("blocking", "default"), default="blocking")
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        out = tempfile.mkdtemp(prefix="msprobe_llama_bench_")
        print("RESULT " + json.dumps(worker(args.worker, args.pairs, args.steps, args.warmup, args.launch,
                                            out)), flush=True)
        return 0
    print(f"mindformers LlamaForCausalLM (tests/scripts/thirdparty_worker.py llama), launch {args.launch}; "
          f"{args.pairs} alternating off/on pairs x {args.steps} steps, warm-up {args.warmup}; "
          f"loadavg {os.getloadavg()[0]:.2f}")
    print(f"{'level':<6} {'off ms':>8} {'on ms':>8} {'ratio':>7} {'cpu':>7} {'thread':>7}  pair ratios")
    results = []
    for level in args.levels.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", level, "--pairs", str(args.pairs),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--launch", args.launch]
        env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="ignore")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"worker {level} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        runs = json.loads(lines[-1][len("RESULT "):])["runs"]
        off, on, ratio, ratios = summarise(runs, "wall_ms")
        cpu = summarise(runs, "cpu_ms")[2]
        thread = summarise(runs, "thread_ms")[2]
        results.append({"level": level, "off_ms": off, "on_ms": on, "ratio": ratio, "cpu_ratio": cpu,
                        "thread_ratio": thread, "pair_ratios": ratios, "runs": runs})
        print(f"{level:<6} {off:8.1f} {on:8.1f} {ratio:6.2f}x {cpu:6.2f}x {thread:6.2f}x  "
              + " ".join(f"{r:.2f}" for r in ratios), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"launch": args.launch, "pairs": args.pairs, "steps": args.steps, "results": results},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
