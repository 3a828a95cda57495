"""Train a tiny decoder-only transformer on real text and dump it with msprobe.

    python examples/tiny_lm.py --dump-path ./lm_dump                   # 5 dumped training steps
    python examples/tiny_lm.py --dump-path ./lm_dump --generate 6      # + dumped greedy decoding
    python examples/tiny_lm.py --no-dump --steps 20                    # no tool

Data: the source code of a few Python standard-library modules (character level).
Training steps use the guide's pattern ``start(net)`` / step / ``stop()`` / ``step()``.
With ``--generate N`` the script then decodes N tokens greedily inside
``debugger.start(model=net, token_range=[1, 3])`` ... ``stop()`` / ``step()``: only the forwards
for tokens 1..3 (inclusive, counted from 0) should be dumped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)  # for `import models` and `import lenet_digits`
sys.path.append(os.path.dirname(_HERE))  # msprobe from this checkout if it is not installed

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

import models  # noqa: E402
from lenet_digits import print_dump_summary, write_default_config  # noqa: E402

SEQ_LEN = 32
LEARNING_RATE = 3e-3
TOKEN_RANGE = [1, 3]


def build(seed: int = 0):
    """Seed, load the corpus and build the model: returns (vocab, batches, net)."""
    models.set_seed(seed)
    vocab, batches = models.load_text_corpus(seq_len=SEQ_LEN, batch_size=8)
    net = models.TinyLM(len(vocab), seq_len=SEQ_LEN)
    return vocab, batches, net


def train(net: nn.Cell, batches: Sequence, steps: int, debugger=None,
          log_every: int = 1) -> List[float]:
    """Train ``net`` with Adam for ``steps`` steps; returns the losses as floats.

    With ``debugger``, each step is wrapped in ``start(net)`` / ``stop()`` / ``step()``.
    """
    optimizer = nn.Adam(net.trainable_params(), learning_rate=LEARNING_RATE)
    train_step = models.make_train_step(net, models.LMCrossEntropy(), optimizer)
    return models.run_training(net, train_step, batches, steps, debugger, log_every)


def run_generate(net: nn.Cell, vocab: Sequence[str], prompt: str, num_tokens: int,
                 debugger=None) -> str:
    """Greedy-decode ``num_tokens`` characters after ``prompt``; dump tokens 1..3 if a debugger."""
    stoi = {c: i for i, c in enumerate(vocab)}
    prompt_ids = [stoi[c] for c in prompt if c in stoi] or [0]
    if debugger is not None:
        debugger.start(model=net, token_range=TOKEN_RANGE)
    ids = models.generate(net, prompt_ids, num_tokens)
    if debugger is not None:
        debugger.stop()
        debugger.step()
    return "".join(vocab[i] for i in ids)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-path", default="./lm_dump", help="where msprobe writes its dump")
    parser.add_argument("--steps", type=int, default=5, help="training steps (all dumped)")
    parser.add_argument("--level", default="L1", help="msprobe level: L0, L1, mix, ...")
    parser.add_argument("--task", default="statistics", help="msprobe task: statistics, tensor, ...")
    parser.add_argument("--generate", type=int, default=0, metavar="N",
                        help="after training, greedily generate N tokens (dumping tokens 1..3)")
    parser.add_argument("--prompt", default="def ")
    parser.add_argument("--no-dump", action="store_true", help="run without msprobe")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    ms.set_device("CPU")
    # User-script setting, not the tool's: on a 2-core machine the default asynchronous PyNative
    # pipeline is ~30x slower than synchronous launch (its dispatch threads fight for the cores).
    ms.runtime.launch_blocking()

    vocab, batches, net = build(args.seed)
    print(f"corpus: {len(batches)} batches of 8x{SEQ_LEN}, vocabulary {len(vocab)} characters")

    debugger = None
    if not args.no_dump:
        # step list empty = every step (training steps, then the generation "step")
        config_path = write_default_config(args.dump_path, [], task=args.task, level=args.level)
        print(f"msprobe config: {config_path}")
        from msprobe.mindspore import PrecisionDebugger
        debugger = PrecisionDebugger(config_path=config_path)

    t0 = time.perf_counter()
    losses = train(net, batches, args.steps, debugger=debugger)
    elapsed = time.perf_counter() - t0
    print(f"trained {args.steps} steps in {elapsed:.2f} s "
          f"({1000 * elapsed / max(args.steps, 1):.0f} ms/step); losses {losses[0]:.4f} -> {losses[-1]:.4f}")

    if args.generate:
        text = run_generate(net, vocab, args.prompt, args.generate, debugger=debugger)
        print(f"generated: {text!r}")

    if debugger is not None:
        print_dump_summary(os.path.abspath(args.dump_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
