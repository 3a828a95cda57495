"""Train a tiny LeNet on real handwritten digits and dump precision data with msprobe.

    python examples/lenet_digits.py --dump-path ./demo_dump            # what `make demo` runs
    python examples/lenet_digits.py --no-dump                          # the same training, no tool
    python examples/lenet_digits.py --config my_config.json            # your own msprobe config
    python examples/lenet_digits.py --dtype float16 --dump-path ./demo_dump_fp16   # same net in fp16

Data: scikit-learn's bundled ``load_digits`` (1797 real 8x8 images), 80/20 split.
Without ``--config`` the script writes a config.json (task "statistics", level "L1", the dump
path and the ``--dump-steps`` list) into a temporary directory and passes it to msprobe.

The training loop uses msprobe exactly as its guide shows::

    debugger.start(net)
    loss = train_step(x, y)
    debugger.stop()
    debugger.step()
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)  # for `import models`
sys.path.append(os.path.dirname(_HERE))  # msprobe from this checkout if it is not installed

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

import models  # noqa: E402

DEFAULT_STEPS = 150  # ~3.3 epochs of 32 images; ~2-3 s on 2 CPU cores; > 90 % test accuracy
LEARNING_RATE = 0.05
MOMENTUM = 0.9


def train(net: nn.Cell, batches: Sequence, steps: int, debugger=None,
          log_every: int = 0, nan_at: Optional[int] = None) -> List[float]:
    """Train ``net`` for ``steps`` steps (cycling through ``batches``) with Momentum SGD.

    When ``debugger`` is given, every step is wrapped in ``start(net)`` / ``stop()`` / ``step()``;
    which steps are actually dumped is decided by the debugger's config (``step`` list).
    Returns the per-step losses as Python floats (so tool-on and tool-off runs can be compared).
    """
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=LEARNING_RATE, momentum=MOMENTUM)
    train_step = models.make_train_step(net, nn.CrossEntropyLoss(), optimizer)
    if nan_at is not None:
        train_step = _nan_at(train_step, nan_at)
    return models.run_training(net, train_step, batches, steps, debugger, log_every)


def _nan_at(train_step, step: int):
    """``train_step`` whose call number ``step`` (from 0) feeds the images through ``log(x - 100)``:
    a NaN made by one known operation (``Functional.log`` at L1), for the watch-mode demo."""
    calls = [0]

    def poisoned(data, label):
        calls[0] += 1
        if calls[0] - 1 == step:
            data = ops.log(ms.Tensor(data) - 100.0)
        return train_step(data, label)

    return poisoned


def write_default_config(dump_path: str, steps: Sequence[int], task: str = "statistics",
                         level: str = "L1", watch: bool = False) -> str:
    """Write a minimal msprobe config.json into a fresh temporary directory; return its path
    (``watch``: with a ``"watch"`` section, README "Watch mode")."""
    config = {
        "task": task,
        "dump_path": os.path.abspath(dump_path),
        "rank": [],
        "step": list(steps),
        "level": level,
        task: {"scope": [], "list": [], "data_mode": ["all"]},
    }
    if task == "statistics":
        config[task]["summary_mode"] = "statistics"
    if watch:
        config["watch"] = {"history": 64}
    path = os.path.join(tempfile.mkdtemp(prefix="msprobe_example_"), "config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path


def print_dump_summary(dump_path: str) -> None:
    """Print msprobe's summary of the dump directory, if this version of msprobe provides one."""
    try:
        import msprobe.dump as dump_api
    except ImportError as exc:
        print(f"(no dump summary: msprobe.dump is not importable: {exc})")
        return
    summary = getattr(dump_api, "summary", None) or getattr(dump_api, "summarize", None)
    if summary is None:
        print("(no dump summary: msprobe.dump has no summary() yet)")
        return
    print(summary(dump_path))


def parse_steps(text: str) -> List[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--dump-steps={text!r}: expected comma-separated ints, e.g. 0,1,2")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-path", default="./demo_dump", help="where msprobe writes its dump")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps")
    parser.add_argument("--dump-steps", type=parse_steps, default=[0, 1, 2],
                        help="comma-separated steps to dump (default 0,1,2)")
    parser.add_argument("--config", default=None, help="msprobe config.json (else one is written)")
    parser.add_argument("--no-dump", action="store_true", help="train without msprobe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                        help="parameters and images in this dtype (float16: compare with a float32 run)")
    parser.add_argument("--watch", action="store_true",
                        help="watch mode: every step kept in memory, written only when a NaN/Inf appears")
    parser.add_argument("--nan-at", type=int, default=None, metavar="STEP",
                        help="make a NaN at this step (log of a negative value), to show watch mode")
    args = parser.parse_args(argv)

    ms.set_device("CPU")
    # User-script setting, not the tool's: on a 2-core machine the default asynchronous PyNative
    # pipeline is ~30x slower than synchronous launch (its dispatch threads fight for the cores).
    ms.runtime.launch_blocking()

    models.set_seed(args.seed)
    net = models.LeNet()
    train_batches = models.load_digits_dataset(batch_size=32, split="train", seed=args.seed)
    test_batches = models.load_digits_dataset(batch_size=32, split="test")
    if args.dtype == "float16":
        for p in net.get_parameters():
            p.set_dtype(ms.float16)
        train_batches = [(x.astype("float16"), y) for x, y in train_batches]
        test_batches = [(x.astype("float16"), y) for x, y in test_batches]

    debugger = None
    dump_path = os.path.abspath(args.dump_path)
    if not args.no_dump:
        config_path = args.config or write_default_config(dump_path, [] if args.watch else args.dump_steps,
                                                          watch=args.watch)
        if args.config:  # the user's config decides where the dump goes
            with open(args.config) as f:
                dump_path = json.load(f).get("dump_path", dump_path)
        print(f"msprobe config: {config_path}")
        from msprobe.mindspore import PrecisionDebugger
        debugger = PrecisionDebugger(config_path=config_path)

    t0 = time.perf_counter()
    losses = train(net, train_batches, args.steps, debugger=debugger, log_every=10, nan_at=args.nan_at)
    elapsed = time.perf_counter() - t0
    accuracy = models.evaluate(net, test_batches)
    print(f"trained {args.steps} steps in {elapsed:.2f} s; final loss {losses[-1]:.4f}; "
          f"test accuracy {accuracy:.2%}")

    if debugger is not None:
        print_dump_summary(dump_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
