"""Small, real example networks and data for msprobe (MindSpore 2.10, CPU, PyNative).

Everything here runs without msprobe: tests and benchmarks import this module to get a tiny
CNN on real data (scikit-learn's bundled ``load_digits``) and a tiny decoder-only transformer on
real text (source files of the Python standard library, read with ``inspect.getsource``).

Importing this module has no side effects beyond importing MindSpore and NumPy: it does not
select a device or change any MindSpore context. Call :func:`configure_cpu` (or
``ms.set_device("CPU")`` yourself) before the first kernel runs.

Public API
----------
- ``configure_cpu(blocking=True)``
- ``set_seed(seed)``
- ``LeNet(num_classes=10)``                                    input [B,1,8,8] float32 -> logits [B,10]
- ``load_digits_dataset(batch_size=32, split="train", seed=0)`` -> list of (images, labels)
- ``evaluate(net, batches)``                                    -> accuracy in [0, 1]
- ``TinyLM(vocab_size, d_model=64, n_heads=4, n_layers=2, seq_len=32)``  tokens [B,T] int32 -> logits [B,T,V]
- ``LMCrossEntropy()``                                          loss Cell for [B,T,V] logits and [B,T] targets
- ``load_text_corpus(seq_len=32, batch_size=8, max_chars=200_000)`` -> (vocab, list of (inputs, targets))
- ``make_train_step(net, loss_fn, optimizer)``                  -> train_step(data, label) -> loss Tensor
- ``generate(net, prompt_ids, num_tokens)``                     -> list of token ids (greedy)
"""
from __future__ import annotations

import inspect
import random
from typing import Callable, List, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, nn, ops
from mindspore.common.initializer import HeNormal

__all__ = [
    "configure_cpu",
    "set_seed",
    "LeNet",
    "load_digits_dataset",
    "evaluate",
    "TinyLM",
    "LMCrossEntropy",
    "load_text_corpus",
    "make_train_step",
    "generate",
]

Batch = Tuple[np.ndarray, np.ndarray]

# Fixed permutation seed for the digits train/test split: the split never depends on the
# ``seed`` argument, so every caller evaluates on the same held-out images.
_SPLIT_SEED = 0
_TEXT_MODULES = ("textwrap", "json.decoder", "argparse")


# --------------------------------------------------------------------------------------------
# runtime helpers
# --------------------------------------------------------------------------------------------
def configure_cpu(blocking: bool = True) -> None:
    """Select the CPU device and (by default) synchronous kernel launch.

    This is a *user-script* setting, not something msprobe does. On a 2-core machine MindSpore's
    default asynchronous PyNative pipeline is ~30x slower than synchronous launch (a 100-layer toy
    step: 1370 ms vs 43 ms), because its dispatch threads compete for the two cores.

    Must be called before the first kernel runs. Calling it again is harmless.
    """
    ms.set_device("CPU")
    if blocking:
        ms.runtime.launch_blocking()


def set_seed(seed: int) -> None:
    """Seed MindSpore, NumPy and ``random`` so two processes build bit-identical models.

    Parameter initialisation of the models below draws from MindSpore's global seed, so call
    this *before* constructing a network.
    """
    ms.set_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


# --------------------------------------------------------------------------------------------
# LeNet on sklearn digits
# --------------------------------------------------------------------------------------------
def _he():
    return HeNormal(nonlinearity="relu")


class LeNet(nn.Cell):
    """A tiny LeNet for 1x8x8 images.

    conv1(1->6, 3x3, same) -> relu -> pool(2) -> conv2(6->16, 3x3, valid) -> relu -> flatten
    -> fc1(64->32) -> relu -> fc2(32->num_classes).

    The single ``relu`` Cell is called three times per forward (like MindSpore's own LeNet5), so
    a Cell-level dump sees ``relu`` with call counts 0, 1, 2.

    Input: float32 [B, 1, 8, 8]. Output: float32 logits [B, num_classes].
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        # Kaiming-normal weights: with MindSpore's default HeUniform(sqrt(5)) this tiny net sits on
        # a loss plateau for the first ~40 SGD steps; with He-normal it learns from step 0.
        self.conv1 = nn.Conv2d(1, 6, 3, pad_mode="same", has_bias=True, weight_init=_he())
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(6, 16, 3, pad_mode="valid", has_bias=True, weight_init=_he())
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(16 * 2 * 2, 32, weight_init=_he())
        self.fc2 = nn.Dense(32, num_classes, weight_init=_he())

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))  # [B, 6, 4, 4]
        x = self.relu(self.conv2(x))  # [B, 16, 2, 2]
        x = self.flatten(x)  # [B, 64]
        x = self.relu(self.fc1(x))
        return self.fc2(x)


def load_digits_dataset(batch_size: int = 32, split: str = "train", seed: int = 0) -> List[Batch]:
    """Real handwritten digits (scikit-learn's bundled ``load_digits``, 1797 8x8 images).

    The 80/20 train/test split uses a fixed permutation (independent of ``seed``): 1437 train
    and 360 test images. ``seed`` only shuffles the order of the *train* images.

    Returns a list of ``(images, labels)`` NumPy batches: images float32 [B, 1, 8, 8] scaled to
    [0, 1] (pixel / 16), labels int32 [B]. The train split drops the last incomplete batch (all
    train batches have the same shape); the test split keeps it.

    Raises ``ValueError`` for an unknown ``split`` or a non-positive ``batch_size``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} is invalid; expected one of ['train', 'test']")
    if batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} is invalid; expected a positive int")
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    labels = digits.target.astype(np.int32)
    perm = np.random.RandomState(_SPLIT_SEED).permutation(len(labels))
    n_train = int(0.8 * len(labels))
    idx = perm[:n_train] if split == "train" else perm[n_train:]
    if split == "train":
        idx = idx[np.random.RandomState(seed).permutation(len(idx))]
        n_batches = len(idx) // batch_size
    else:
        n_batches = (len(idx) + batch_size - 1) // batch_size
    batches = []
    for b in range(n_batches):
        sel = idx[b * batch_size:(b + 1) * batch_size]
        batches.append((np.ascontiguousarray(images[sel]), np.ascontiguousarray(labels[sel])))
    return batches


def evaluate(net: nn.Cell, batches: Sequence[Batch]) -> float:
    """Classification accuracy of ``net`` over ``(inputs, labels)`` batches (argmax of logits)."""
    correct = 0
    total = 0
    for x, y in batches:
        logits = net(Tensor(x)).asnumpy()
        correct += int((logits.argmax(axis=-1) == y).sum())
        total += len(y)
    return correct / max(total, 1)


# --------------------------------------------------------------------------------------------
# TinyLM: a decoder-only transformer written with nn layers, Tensor methods, ops and mint
# --------------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Cell):
    """Multi-head causal self-attention.

    Uses Tensor methods (reshape, transpose, ``*``, ``+``, slicing), ``ops.matmul`` (Functional),
    ``mint.matmul`` (Mint) and ``mint.nn.functional.softmax`` (MintFunctional), so an API-level
    dump sees several prefixes. (``ops.matmul is mint.matmul``: the same function object under two
    namespaces.)
    Input/output: float32 [B, T, d_model], T <= seq_len.
    """

    def __init__(self, d_model: int, n_heads: int, seq_len: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.scale = float(self.head_dim) ** -0.5
        self.q = nn.Dense(d_model, d_model)
        self.k = nn.Dense(d_model, d_model)
        self.v = nn.Dense(d_model, d_model)
        self.o = nn.Dense(d_model, d_model)
        # Additive causal mask: 0 on and below the diagonal, a large negative above it.
        mask = np.triu(np.full((seq_len, seq_len), -1e9, dtype=np.float32), k=1)
        self.mask = Tensor(mask[None, None])  # [1, 1, S, S], a constant, not a Parameter

    def _split_heads(self, x, b, t):
        return x.reshape(b, t, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)

    def construct(self, x):
        b, t, d = x.shape
        q = self._split_heads(self.q(x), b, t)  # [B, H, T, Dh]
        k = self._split_heads(self.k(x), b, t)
        v = self._split_heads(self.v(x), b, t)
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale  # [B, H, T, T]
        scores = scores + self.mask[:, :, :t, :t]
        attn = mint.nn.functional.softmax(scores, dim=-1)
        out = mint.matmul(attn, v)  # [B, H, T, Dh]
        out = out.transpose(0, 2, 1, 3).reshape(b, t, d)
        return self.o(out)


class MLP(nn.Cell):
    """Dense(d, 4d) -> GELU (``ops.gelu``, tanh approximation) -> Dense(4d, d).

    ``mint.nn.functional.gelu`` would be the mint spelling, but its kernel (GeluExt) is not
    registered on CPU in MindSpore 2.10, so the Functional ``ops.gelu`` is used.
    """

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Dense(d_model, hidden)
        self.fc2 = nn.Dense(hidden, d_model)

    def construct(self, x):
        return self.fc2(ops.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Cell):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, d_model: int, n_heads: int, seq_len: int):
        super().__init__()
        self.ln1 = nn.LayerNorm((d_model,), epsilon=1e-5)
        self.attn = CausalSelfAttention(d_model, n_heads, seq_len)
        self.ln2 = nn.LayerNorm((d_model,), epsilon=1e-5)
        self.mlp = MLP(d_model, 4 * d_model)

    def construct(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class TinyLM(nn.Cell):
    """A small decoder-only (GPT-style) character language model.

    Cells: ``embed`` (token nn.Embedding), ``pos_embed`` (learned positions, nn.Embedding),
    ``blocks`` (nn.CellList of :class:`Block`: ``blocks.<i>.ln1/attn/ln2/mlp``), ``ln_f``, ``head``.

    ``construct(tokens)``: tokens int32 [B, T] with 1 <= T <= seq_len -> logits float32 [B, T, V].
    Position ids are a constant [1, seq_len] int32 Tensor sliced to T.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                 seq_len: int = 32):
        super().__init__()
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.embed = nn.Embedding(vocab_size, d_model, embedding_table="normal")
        self.pos_embed = nn.Embedding(seq_len, d_model, embedding_table="normal")
        self.blocks = nn.CellList([Block(d_model, n_heads, seq_len) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm((d_model,), epsilon=1e-5)
        self.head = nn.Dense(d_model, vocab_size)
        self.pos_ids = Tensor(np.arange(seq_len, dtype=np.int32)[None])  # constant, not a Parameter

    def construct(self, tokens):
        t = tokens.shape[1]
        pos = self.pos_ids[:, :t]  # [1, T]  (mint.arange has no CPU kernel in 2.10)
        x = self.embed(tokens) + self.pos_embed(pos)  # [B, T, d]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class LMCrossEntropy(nn.Cell):
    """Mean softmax cross-entropy of logits [B, T, V] against int32 targets [B, T]."""

    def __init__(self):
        super().__init__()
        self.ce = nn.CrossEntropyLoss()

    def construct(self, logits, targets):
        v = logits.shape[-1]
        return self.ce(logits.reshape(-1, v), targets.reshape(-1))


def load_text_corpus(seq_len: int = 32, batch_size: int = 8, max_chars: int = 200_000,
                     modules: Sequence[str] = _TEXT_MODULES) -> Tuple[List[str], List[Batch]]:
    """Character-level LM batches from real text shipped with Python.

    The text is the source code of a few standard-library modules (``textwrap``, ``json.decoder``,
    ``argparse`` by default), concatenated in that order and cut to ``max_chars`` characters.
    The vocabulary is the sorted list of distinct characters (index = token id).

    The text is cut into non-overlapping windows of ``seq_len + 1`` characters; windows are
    shuffled with a fixed permutation and grouped into ``batch_size`` (incomplete batch dropped).
    Each batch is ``(input_ids, target_ids)``, both int32 [B, seq_len], targets shifted by one.
    Deterministic for a given Python installation.
    """
    import importlib

    text = "".join(inspect.getsource(importlib.import_module(m)) for m in modules)[:max_chars]
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    ids = np.fromiter((stoi[c] for c in text), dtype=np.int32, count=len(text))
    win = seq_len + 1
    n_win = len(ids) // win
    windows = ids[:n_win * win].reshape(n_win, win)
    windows = windows[np.random.RandomState(0).permutation(n_win)]
    batches = []
    for b in range(n_win // batch_size):
        w = windows[b * batch_size:(b + 1) * batch_size]
        batches.append((np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])))
    return vocab, batches


# --------------------------------------------------------------------------------------------
# training and inference
# --------------------------------------------------------------------------------------------
def make_train_step(net: nn.Cell, loss_fn: Callable, optimizer: nn.Optimizer) -> Callable:
    """The standard MindSpore 2.x PyNative training step.

    ``forward_fn(data, label) = loss_fn(net(data), label)``; gradients w.r.t.
    ``optimizer.parameters`` via ``ms.value_and_grad``; then ``optimizer(grads)``.

    Returns ``train_step(data, label) -> loss Tensor`` (scalar). ``data``/``label`` may be NumPy
    arrays or Tensors. Note that the forward runs once per step (``value_and_grad`` does not run
    it a second time), and Cell hooks fire during it.
    """

    def forward_fn(data, label):
        logits = net(data)
        return loss_fn(logits, label)

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

    def train_step(data, label):
        if not isinstance(data, Tensor):
            data = Tensor(data)
        if not isinstance(label, Tensor):
            label = Tensor(label)
        loss, grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    return train_step


def generate(net: nn.Cell, prompt_ids: Sequence[int], num_tokens: int) -> List[int]:
    """Greedy decoding: one full forward of ``net`` per new token (no KV cache).

    The context is cropped to the last ``net.seq_len`` tokens (if ``net`` has that attribute).
    The argmax is taken in NumPy, so the only MindSpore calls per token are the forward itself.
    Exactly ``num_tokens`` forwards run. Returns prompt + generated ids as a list of ints.
    Raises ``ValueError`` for an empty prompt.
    """
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("prompt_ids must contain at least one token")
    seq_len = getattr(net, "seq_len", None)
    for _ in range(num_tokens):
        ctx = ids[-seq_len:] if seq_len else ids
        logits = net(Tensor(np.asarray([ctx], dtype=np.int32)))
        ids.append(int(logits.asnumpy()[0, -1].argmax()))
    return ids


def dumped_step(net, train_step, batch, debugger=None):
    """One training step, between ``debugger.start(net)`` and ``stop()``/``step()`` when a debugger
    is given (the seed's three lines). Returns the loss Tensor (not synchronised)."""
    if debugger is not None:
        debugger.start(net)
    loss = train_step(*batch)
    if debugger is not None:
        debugger.stop()
        debugger.step()
    return loss


def run_training(net, train_step, batches, steps: int, debugger=None, log_every: int = 0) -> list:
    """The training loop of the examples, with the seed's three debugger lines around each step.

    Args:
        net (nn.Cell): the model (passed to ``debugger.start``).
        train_step: ``callable(data, label) -> loss Tensor`` (see :func:`make_train_step`).
        batches: sequence of ``(data, label)`` numpy batches, cycled through.
        steps (int): number of training steps.
        debugger (PrecisionDebugger | None): when given, every step runs between
            ``start(net)`` and ``stop()``/``step()``; its config decides which steps are dumped.
        log_every (int): print the loss every this many steps (0: never).

    Returns:
        list[float]: the loss of every step (compare tool-on and tool-off runs bit for bit).
    """
    net.set_train(True)
    losses = []
    for step in range(steps):
        loss = dumped_step(net, train_step, batches[step % len(batches)], debugger)
        losses.append(float(loss.asnumpy()))
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    net.set_train(False)
    return losses
