"""Tiny networks for the invisibility matrix (tests/test_invisible_matrix.py), built from MindSpore's own
``nn`` layers. Each :class:`NetSpec` builds a seeded network, its inputs and its loss; the worker
(tests/scripts/matrix_worker.py) trains it tool-off and tool-on and compares.

Every network covers one pattern whose capture could change what MindSpore computes: tensors with
several consumers, residuals, BatchNorm/Dropout in training mode, shared Cells, tuple/dict outputs,
in-place ops, recurrent layers, attention, recompute, jit Cells, list-input APIs, same-dtype casts,
constant tables, Cells whose output takes no gradient, 0-d losses, and user exceptions; more of
MindSpore's own layers (Conv1d, GroupNorm, PReLU, Conv2dTranspose, Embedding with ``padding_idx``, RNN,
TransformerEncoder) and mixed precision (``amp.auto_mixed_precision`` O1/O2). A spec's ``driver`` runs
its training step the ways MindSpore offers: ``value_and_grad`` (default), ``nn.TrainOneStepCell``,
dynamic loss scaling with ``nn.DynamicLossScaleUpdateCell``, ``amp.build_train_network``,
``ops.clip_by_global_norm``, gradient accumulation, the whole step under ``mindspore.jit``,
``mindspore.grad`` with ``has_aux``, ``nn.ForwardValueAndGrad``.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops import operations as P


# ---------------------------------------------------------------------------------------------- cells
class BranchBlock(nn.Cell):
    """``dense1(x) + dense2(batchnorm(x))``: ``x`` has two consumers."""

    def __init__(self, width=6):
        super().__init__()
        self.dense1 = nn.Dense(width, width)
        self.bn = nn.BatchNorm1d(width)
        self.dense2 = nn.Dense(width, width)

    def construct(self, x):
        return self.dense1(x) + self.dense2(self.bn(x))


class BranchNet(nn.Cell):
    """The first block's output feeds both the loss and the second block."""

    def __init__(self):
        super().__init__()
        self.block1 = BranchBlock()
        self.block2 = BranchBlock()

    def construct(self, x):
        h = self.block1(x)
        return h.sum() * 0.5 + self.block2(h).sum()


class ResidualBlock(nn.Cell):
    def __init__(self, width=6):
        super().__init__()
        self.norm = nn.LayerNorm((width,))
        self.fc = nn.Dense(width, width, activation="relu")

    def construct(self, x):
        return x + self.fc(self.norm(x))


class ResidualNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.SequentialCell([ResidualBlock(), ResidualBlock()])
        self.head = nn.Dense(6, 3)

    def construct(self, x):
        return self.head(self.layers(x))


class ConvBNNet(nn.Cell):
    """Conv2d -> BatchNorm2d (training mode) -> ReLU -> MaxPool -> Flatten -> Dense."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(3)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(12, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.pool(self.relu(self.bn(self.conv(x))))))


class DropoutNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 8)
        self.drop = nn.Dropout(p=0.5)
        self.fc2 = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc2(self.drop(ops.relu(self.fc1(x))))


class SharedNet(nn.Cell):
    """One Dense and one sub-block each called several times."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Dense(6, 6)
        self.block = ResidualBlock()
        self.head = nn.Dense(6, 2)

    def construct(self, x):
        h = self.shared(x)
        h = self.shared(ops.tanh(h))
        h = self.block(self.block(h))
        return self.head(self.shared(h))


class TupleOut(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Dense(6, 4)
        self.b = nn.Dense(6, 4)

    def construct(self, x):
        return self.a(x), self.b(x), x.shape[0]


class DictOut(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)

    def construct(self, p, q):
        return {"sum": self.fc(p + q), "prod": p * q}


class TupleDictNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.pair = TupleOut()
        self.mix = DictOut()

    def construct(self, x):
        p, q, _ = self.pair(x)
        d = self.mix(p, q)
        return d["sum"].mean() + d["prod"].sum() * 0.1


class InplaceNet(nn.Cell):
    """In-place Tensor methods and item assignment on intermediate tensors."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 6)
        self.fc2 = nn.Dense(6, 3)

    def construct(self, x):
        h = self.fc1(x) * 1.0
        h.add_(1.0)
        h.mul_(0.5)
        h[:, 0] = 0.0
        return self.fc2(h)


class LSTMNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 5, num_layers=1, batch_first=True)
        self.fc = nn.Dense(5, 2)

    def construct(self, x):
        out, (h, c) = self.rnn(x)
        return self.fc(out[:, -1]) + c[0].sum() * 0.1


class GRUNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 5, num_layers=1, batch_first=True, bidirectional=True)
        self.fc = nn.Dense(10, 2)

    def construct(self, x):
        out, h = self.rnn(x)
        return self.fc(out.mean(1)) + h.sum() * 0.1


class MHANet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Dense(8, 2)

    def construct(self, x):
        out, weights = self.attn(x, x, x)
        return self.fc(out.mean(1)) + weights.sum() * 0.01


class TransformerNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.fc = nn.Dense(8, 2)

    def construct(self, x):
        return self.fc(self.layer(x).mean(1))


class RecomputeNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = ResidualBlock()
        self.block.recompute()
        self.head = nn.Dense(6, 3)

    def construct(self, x):
        return self.head(self.block(x))


class JitBlock(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6)
        self.relu = nn.ReLU()

    @ms.jit
    def construct(self, x):
        return self.relu(self.fc(x)) * 2.0


class JitNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.pre = nn.Dense(6, 6)
        self.jit_block = JitBlock()
        self.head = nn.Dense(6, 3)

    def construct(self, x):
        return self.head(self.jit_block(self.pre(x)))


class ListApiNet(nn.Cell):
    """``ops.concat``, ``ops.stack``, ``ops.addn`` on a list of Cell outputs."""

    def __init__(self):
        super().__init__()
        self.a = nn.Dense(6, 3)
        self.b = nn.Dense(6, 3)
        self.head = nn.Dense(6, 2)

    def construct(self, x):
        a, b = self.a(x), self.b(x)
        c = ops.concat([a, b], axis=1)
        s = ops.stack([a, b, a])
        n = ops.addn([a, b, a * 2.0])
        return self.head(c) + s.sum(0).mean() + n.mean()


class CastNet(nn.Cell):
    """Casts to the dtype the tensor already has (MindSpore may return the input itself)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 6)
        self.cast = P.Cast()
        self.fc2 = nn.Dense(6, 3)

    def construct(self, x):
        h = self.fc1(x)
        h = ops.cast(h, ms.float32)
        h = self.cast(h, ms.float32) + h
        h = h.astype(ms.float32)
        return self.fc2(h)


class Table(nn.Cell):
    """Returns a constant table (not a Parameter)."""

    def __init__(self):
        super().__init__()
        self.table = Tensor(np.linspace(-1.0, 1.0, 18).reshape(3, 6).astype(np.float32))

    def construct(self):
        return self.table


class ConstTableNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.table = Table()
        self.fc = nn.Dense(6, 3)

    def construct(self, x):
        t = self.table()
        return self.fc(x * t[0:1] + t[1]) + t[2, :3]


class DropoutOnes(nn.Cell):
    """``nn.Dropout`` on ``ops.ones(shape)``: a Cell whose output takes no gradient."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(p=0.25)

    def construct(self, shape):
        return self.drop(ops.ones(shape, ms.float32))


class DropoutOnesNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.mask = DropoutOnes()
        self.fc = nn.Dense(6, 3)

    def construct(self, x):
        return self.fc(x * self.mask(x.shape))


class ScalarNet(nn.Cell):
    """The network returns a 0-d tensor; the loss is computed on it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 1)

    def construct(self, x):
        return self.fc(x).sum()


class Half(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6).to_float(ms.float16)

    def construct(self, x):
        return ops.cast(self.fc(x), ms.float32)


class Fp16Net(nn.Cell):
    """A float16 sub-Cell (``Cell.to_float``) between float32 Cells."""

    def __init__(self):
        super().__init__()
        self.half = Half()
        self.head = nn.Dense(6, 3)

    def construct(self, x):
        return self.head(self.half(x))


class RaiseAtSecondCall(nn.Cell):
    """Raises a user ValueError from inside a sub-Cell on its second call."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 3)
        self.calls = 0

    def construct(self, x):
        self.calls += 1
        if self.calls == 2:
            raise ValueError("user error in step 1")
        return self.fc(x)


class RaiseNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inner = RaiseAtSecondCall()

    def construct(self, x):
        return self.inner(x)


class ShapeErrorNet(nn.Cell):
    """A MindSpore op raising on a shape mismatch (every step)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 3)

    def construct(self, x):
        return ops.matmul(self.fc(x), x)


class HalfGrad(nn.Cell):
    """``tanh`` with a custom ``bprop`` (half its true gradient): MindSpore ignores forward hooks on
    such a Cell and runs ``bprop`` for its backward."""

    def construct(self, x):
        return ops.tanh(x)

    def bprop(self, x, out, dout):
        return (dout * (1.0 - out * out) * 0.5,)


class BpropNet(nn.Cell):
    """A Cell with a custom ``bprop`` between two Dense layers."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 6)
        self.half_grad = HalfGrad()
        self.fc2 = nn.Dense(6, 3)

    def construct(self, x):
        return self.fc2(self.half_grad(self.fc1(x)))


def _half(grads):
    """A ``HookBackward`` hook: the gradients (a tuple) halved."""
    return tuple(g * 0.5 for g in grads)


def _cube(x):
    return x * x * x


def _cube_bprop(x, out, dout):
    return (dout * 3.0 * x * x,)


class CustomOpNet(nn.Cell):
    """An ``ops.Custom`` op of ``func_type="pyfunc"`` (a Python function MindSpore runs on the host
    arrays, the flavour that runs on CPU) with a ``bprop``, between two Dense layers."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 6)
        self.cube = ops.Custom(_cube, out_shape=lambda shape: shape, out_dtype=lambda dtype: dtype,
                               func_type="pyfunc", bprop=_cube_bprop)
        self.fc2 = nn.Dense(6, 3)

    def construct(self, x):
        return self.fc2(self.cube(self.fc1(x)))


class HookBackwardNet(nn.Cell):
    """``ops.HookBackward`` between two Dense layers, its hook halving the gradient that passes."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 6)
        self.hook = ops.HookBackward(_half)
        self.fc2 = nn.Dense(6, 3)

    def construct(self, x):
        return self.fc2(self.hook(ops.tanh(self.fc1(x))))


class CaughtErrorNet(nn.Cell):
    """An ``ops.matmul`` with mismatched shapes inside the model, raising every call; the model catches
    the error (kept in :attr:`caught` as ``(type, message)``) and goes on without it."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 6)
        self.fc2 = nn.Dense(6, 3)
        self.caught = []

    def construct(self, x):
        h = self.fc1(x)
        try:
            h = ops.matmul(h, x[:, :4])
        except (RuntimeError, ValueError, TypeError) as e:
            self.caught.append((type(e).__name__, str(e)))
        return self.fc2(ops.relu(h))


class ConvFamilyNet(nn.Cell):
    """Conv1d -> GroupNorm -> PReLU -> Conv2dTranspose: the convolution and normalisation layers
    ConvBNNet does not have."""

    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(2, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.gn = nn.GroupNorm(2, 4)
        self.prelu = nn.PReLU(4)
        self.deconv = nn.Conv2dTranspose(4, 2, 2, stride=2, has_bias=True)
        self.fc = nn.Dense(2, 3)

    def construct(self, x):
        h = self.conv1d(x)  # (N, 4, 8)
        h = self.prelu(self.gn(h.reshape(h.shape[0], 4, 2, 4)))
        return self.fc(self.deconv(h).mean((2, 3)))


class EmbedRNNNet(nn.Cell):
    """``nn.Embedding`` with ``padding_idx`` (its row takes no gradient) -> ``nn.RNN`` (tanh)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6, padding_idx=0)
        self.rnn = nn.RNN(6, 5, num_layers=1, batch_first=True)
        self.fc = nn.Dense(5, 3)

    def construct(self, ids):
        out, h = self.rnn(self.embed(ids))
        return self.fc(out[:, -1]) + h.sum() * 0.1


class EncoderNet(nn.Cell):
    """``nn.TransformerEncoder``: two copies of one layer and a final LayerNorm, with a key padding mask."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm((8,)))
        self.mask = Tensor(np.array([[False, False, True], [False, False, False]]))
        self.fc = nn.Dense(8, 2)

    def construct(self, x):
        return self.fc(self.encoder(x, src_key_padding_mask=self.mask).mean(1))


class AmpNet(nn.Cell):
    """``amp.auto_mixed_precision`` applied to a sub-network (float16 compute, float32 BatchNorm)."""

    def __init__(self, level="O2"):
        super().__init__()
        self.body = ms.amp.auto_mixed_precision(ConvBNNet(), level)

    def construct(self, x):
        return ops.cast(self.body(x), ms.float32)


class AmpO1Net(AmpNet):
    def __init__(self):
        super().__init__("O1")


# ---------------------------------------------------------------------------------------------- drivers
class LossOf(nn.Cell):
    """A loss function as a Cell (``loss(output, label)``), for ``nn.WithLossCell``."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def construct(self, out, label):
        return self.loss(out, label)


def _grad_of(net, loss, opt, scale=None):
    """``mindspore.value_and_grad`` of ``loss(net(x), y)`` (times ``scale`` when given) for the
    optimizer's Parameters (a ``def``: GRAPH_MODE cannot parse a lambda passed in a call)."""
    def forward(x, y):
        if scale is None:
            return loss(net(x), y)
        return loss(net(x), y) * scale

    return ms.value_and_grad(forward, None, opt.parameters)


def value_and_grad_step(net, loss, opt):
    """The default training step: ``mindspore.value_and_grad`` of ``loss(net(x), y)``, then ``opt``;
    returns ``(loss, gradients)``."""
    grad_fn = _grad_of(net, loss, opt)

    def step(x, y):
        value, grads = grad_fn(x, y)
        opt(grads)
        return value, grads

    return step


def _updated(opt):
    """What a step that hides its gradients exposes: the parameters after the update."""
    return tuple(p.value() * 1 for p in opt.parameters)


def train_one_step(net, loss, opt):
    """``nn.TrainOneStepCell(nn.WithLossCell(...))``; returns ``(loss, parameters after the step)``."""
    train = nn.TrainOneStepCell(nn.WithLossCell(net, LossOf(loss)), opt)

    def step(x, y):
        return train(x, y), _updated(opt)

    return step


def loss_scale_step(net, loss, opt):
    """Dynamic loss scaling in the step: the loss scaled by a Parameter, gradients unscaled, an
    ``ops.isfinite`` overflow check, ``nn.DynamicLossScaleUpdateCell`` updating the scale and the
    update skipped on overflow. The first scale overflows the float16 gradients: step 0 skips its
    update and divides the scale by 4, step 1 updates and multiplies it by 4.
    (``nn.TrainOneStepWithLossScaleCell`` cannot run on CPU: its overflow check is the Ascend-only
    ``NPUGetFloatStatusV2``. ``amp.all_finite`` runs a ``mindspore.jit`` function that reaches
    ``ops.isfinite``, which the tool-off counter of tests/matrix_checks.py, a Python wrapper with
    ``try``, cannot be compiled through.) Returns ``(loss, gradients + (finite, scale))``."""
    scale = ms.Parameter(Tensor(2.0 ** 20, ms.float32), name="loss_scale", requires_grad=False)
    update = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0 ** 20, scale_factor=4, scale_window=1)
    grad_fn = _grad_of(net, loss, opt, scale)

    def step(x, y):
        value, grads = grad_fn(x, y)
        grads = tuple(g / scale for g in grads)
        finite = ops.stack([ops.isfinite(g).all() for g in grads]).all()
        update(scale, ops.logical_not(finite))
        if finite:
            opt(grads)
        return value / scale, grads + (ops.cast(finite, ms.float32), scale.value() * 1)

    return step


def amp_train_network(net, loss, opt):
    """``amp.build_train_network(level="O2")`` with a fixed loss scale; returns ``(loss, parameters
    after the step)``."""
    train = ms.amp.build_train_network(net, opt, LossOf(loss), level="O2",
                                       loss_scale_manager=ms.amp.FixedLossScaleManager(
                                           128.0, drop_overflow_update=False))

    def step(x, y):
        return train(x, y), _updated(opt)

    return step


def clip_global_norm_step(net, loss, opt):
    """``ops.clip_by_global_norm`` on the gradients before the update; returns the clipped ones."""
    grad_fn = _grad_of(net, loss, opt)

    def step(x, y):
        value, grads = grad_fn(x, y)
        grads = ops.clip_by_global_norm(grads, 0.1)
        opt(grads)
        return value, grads

    return step


def accumulate_step(net, loss, opt):
    """Gradient accumulation: the batch's two halves as micro-batches, gradients summed, one update;
    returns ``(sum of the two losses, summed gradients)``."""
    grad_fn = _grad_of(net, loss, opt)

    def step(x, y):
        half = x.shape[0] // 2
        total, acc = None, None
        for part in (slice(0, half), slice(half, None)):
            value, grads = grad_fn(x[part], y[part])
            total = value if total is None else total + value
            acc = grads if acc is None else tuple(a + g for a, g in zip(acc, grads))
        opt(acc)
        return total, acc

    return step



def _compiled_step(compile_, doc: str):
    """A driver whose whole training step (gradients and update), a function named ``step``, is
    compiled by ``compile_`` (a ``mindspore.jit`` decorator)."""
    def driver(net, loss, opt):
        grad_fn = _grad_of(net, loss, opt)

        def step(x, y):
            value, grads = grad_fn(x, y)
            opt(grads)
            return value, grads

        return compile_(step)

    driver.__doc__ = doc
    return driver


def _compiled_forward(compile_, doc: str):
    """A driver taking ``mindspore.value_and_grad`` of a function named ``forward`` that calls the
    model, compiled by ``compile_`` (a ``mindspore.jit`` decorator), then ``opt``."""
    def driver(net, loss, opt):
        def forward(x, y):
            return loss(net(x), y)

        grad_fn = ms.value_and_grad(compile_(forward), None, opt.parameters)

        def step(x, y):
            value, grads = grad_fn(x, y)
            opt(grads)
            return value, grads

        return step

    driver.__doc__ = doc
    return driver


jit_step = _compiled_step(ms.jit, "The whole training step as one ``mindspore.jit`` function.")
bytecode_jit_step = _compiled_step(ms.jit(capture_mode="bytecode"),
                                   'The whole training step as a ``mindspore.jit(capture_mode="bytecode")`` function.')
jit_o0_step = _compiled_step(ms.jit(jit_level="O0"),
                             'The whole training step as one ``mindspore.jit(jit_level="O0")`` function.')
bytecode_jit_forward = _compiled_forward(ms.jit(capture_mode="bytecode"),
                                         '``mindspore.value_and_grad`` of a ``capture_mode="bytecode"`` jit function.')
jit_o1_forward = _compiled_forward(ms.jit(jit_level="O1"),
                                   '``mindspore.value_and_grad`` of a ``jit_level="O1"`` jit function.')


def bytecode_caught_step(net, loss, opt):
    """The ``capture_mode="bytecode"`` training step (:data:`bytecode_jit_step`), after an ``ops.gather``
    whose indices are out of range: its kernel fails, the step catches the error (kept in
    ``net.caught`` as ``(where, type, message)``, ``where`` = ``"call"`` or, when MindSpore reported
    the failure late, ``"read"``) and trains on. Under asynchronous launch the failure is reported at
    the next synchronisation, the ``asnumpy()`` inside the ``try``."""
    compiled = bytecode_jit_step(net, loss, opt)
    net.caught = []
    out_of_range = Tensor(np.array([0, 9], np.int32))

    def step(x, y):
        where = "call"
        try:
            picked = ops.gather(x, out_of_range, 0)
            where = "read"
            picked.asnumpy()
        except (RuntimeError, ValueError) as e:
            net.caught.append((where, type(e).__name__, str(e)))
        return compiled(x, y)

    return step


def grad_aux_step(net, loss, opt):
    """``mindspore.grad`` with ``has_aux=True`` (the network output returned beside the loss) and
    ``return_ids``; returns ``(loss, gradients)``."""
    def forward(x, y):
        out = net(x)
        return loss(out, y), out

    grad_fn = ms.grad(forward, None, opt.parameters, has_aux=True)

    def step(x, y):
        grads, (out,) = grad_fn(x, y)
        opt(grads)
        return loss(out, y), grads

    return step


def forward_value_and_grad_step(net, loss, opt):
    """``nn.ForwardValueAndGrad(nn.WithLossCell(...), get_by_list=True)``, then the optimizer."""
    train = nn.ForwardValueAndGrad(nn.WithLossCell(net, LossOf(loss)), opt.parameters, get_by_list=True)

    def step(x, y):
        value, grads = train(x, y)
        opt(grads)
        return value, grads

    return step


# ---------------------------------------------------------------------------------------------- specs
def _mean_square(out, label):
    return ((out - label) ** 2).mean()


def _ce(out, label):
    return ops.cross_entropy(out, label)


def _scalar(out, label):
    return ops.square(out - label)


def _plain(out, label):
    return out


@dataclasses.dataclass
class NetSpec:
    """A network of the matrix.

    Attributes:
        name: matrix key.
        cls: the network class (built after seeding).
        inputs: ``rng -> (data, label)``.
        loss: ``(network output, label) -> 0-d loss``.
        graph: whether the network is tried in GRAPH_MODE too.
        train: ``set_train(True)`` (BatchNorm batch statistics, active Dropout).
        driver: ``(net, loss, optimizer) -> step``, ``step(data, label) -> (loss, tensors)``: how one
            training step runs; the tensors (gradients, or the parameters after the update where the
            step hides its gradients) are compared bit for bit.
        dump_steps: ``()`` (every step dumped), or the steps the config's ``step`` list dumps: the
            network then trains ``max(dump_steps) + 1`` steps, the others run between dumped steps.
        jit_entry: ``None``, or the name of the ``mindspore.jit`` function the driver calls the model in:
            its calls run compiled, so the dump is checked for its ``Jit.{jit_entry}`` entry (L1, mix)
            instead of an entry per counted call.
        known_log: ``None``, or a regular expression matching the ``dump_error_info.log`` lines the
            tool writes for this network by design (what it could not capture, said).
        opts: the optimizers it trains with (``()``: each of the mode's); one for the networks
            whose compile dominates their time.
    """

    name: str
    cls: Callable
    inputs: Callable
    loss: Callable = _mean_square
    graph: bool = True
    train: bool = True
    driver: Callable = value_and_grad_step
    dump_steps: tuple = ()
    jit_entry: str | None = None
    known_log: str | None = None
    opts: tuple = ()


def _x(*shape):
    return lambda r: (Tensor(r.randn(*shape).astype(np.float32)),
                      Tensor(r.randn(*shape[:-1], 3).astype(np.float32)))


def _xs(shape, label_shape):
    return lambda r: (Tensor(r.randn(*shape).astype(np.float32)),
                      Tensor(r.randn(*label_shape).astype(np.float32)))


def _cls_inputs(shape, classes):
    return lambda r: (Tensor(r.randn(*shape).astype(np.float32)),
                      Tensor(r.randint(0, classes, shape[0]).astype(np.int32)))


#: networks that passed in GRAPH_MODE when they were added (every level and optimizer) but whose
#: GRAPH_MODE run the suite leaves out for its time budget (30-110 s each on 2 shared cores), since
#: GRAPH_MODE adds little for them that another network's GRAPH_MODE run lacks (the same layers: GRU/LSTM,
#: TransformerEncoderLayer, ConvBNNet, a float16 sub-Cell; Python around the same compiled
#: value_and_grad). The training steps MindSpore compiles whole (TrainOneStepCell,
#: amp.build_train_network) and the loss scale update run in GRAPH_MODE in the suite.
#: ``python tests/scripts/matrix_worker.py graph OUT NET`` runs one.
_GRAPH_ONCE = False

#: what the tool writes when the autograd node of a compiled region hands its backward hook fewer
#: gradients than it has inputs (the inputs of ``value_and_grad`` take none): the region's gradients
#: w.r.t. its inputs are not recorded, and said
#: one optimizer: the networks whose time is MindSpore's compile of the jit function
_ONE = ("sgd",)
_UNEVEN = r"Jit\.\w+\.\d+\.backward: gradients w\.r\.t\. the inputs not captured \(MindSpore handed a backward hook"

SPECS = [
    NetSpec("branch", BranchNet, _x(4, 6), _plain),
    NetSpec("residual", ResidualNet, _x(4, 6)),
    NetSpec("conv_bn", ConvBNNet, _cls_inputs((4, 2, 4, 4), 3), _ce),
    NetSpec("dropout", DropoutNet, _x(4, 6)),
    NetSpec("shared", SharedNet, _xs((4, 6), (4, 2))),
    NetSpec("tuple_dict", TupleDictNet, _x(4, 6), _plain),
    NetSpec("inplace", InplaceNet, _x(4, 6)),
    NetSpec("lstm", LSTMNet, _xs((3, 5, 4), (3, 2))),
    NetSpec("gru", GRUNet, _xs((3, 5, 4), (3, 2))),
    NetSpec("mha", MHANet, _xs((2, 3, 8), (2, 2))),
    NetSpec("transformer", TransformerNet, _xs((2, 3, 8), (2, 2))),
    NetSpec("recompute", RecomputeNet, _x(4, 6)),
    NetSpec("jit_cell", JitNet, _x(4, 6), graph=False),
    NetSpec("list_apis", ListApiNet, _xs((4, 6), (4, 2))),
    NetSpec("casts", CastNet, _x(4, 6)),
    NetSpec("const_table", ConstTableNet, _x(4, 6)),
    NetSpec("dropout_ones", DropoutOnesNet, _x(4, 6)),
    NetSpec("scalar_loss", ScalarNet, lambda r: (Tensor(r.randn(4, 6).astype(np.float32)),
                                                 Tensor(np.float32(0.5))), _scalar),
    NetSpec("fp16", Fp16Net, _x(4, 6)),
    NetSpec("conv_family", ConvFamilyNet, _xs((4, 2, 8), (4, 3)), graph=_GRAPH_ONCE),
    NetSpec("embed_rnn", EmbedRNNNet, lambda r: (Tensor(r.randint(0, 10, (3, 5)).astype(np.int32)),
                                                 Tensor(r.randn(3, 3).astype(np.float32))), graph=_GRAPH_ONCE),
    NetSpec("encoder", EncoderNet, _xs((2, 3, 8), (2, 2)), graph=_GRAPH_ONCE),
    NetSpec("amp_o1", AmpO1Net, _cls_inputs((4, 2, 4, 4), 3), _ce, graph=_GRAPH_ONCE),
    NetSpec("amp_o2", AmpNet, _cls_inputs((4, 2, 4, 4), 3), _ce, graph=_GRAPH_ONCE),
    NetSpec("train_one_step", ResidualNet, _x(4, 6), driver=train_one_step),
    NetSpec("loss_scale", Fp16Net, _x(4, 6), driver=loss_scale_step),
    NetSpec("amp_train_network", ResidualNet, _x(4, 6), driver=amp_train_network),
    NetSpec("clip_global_norm", BranchNet, _x(4, 6), _plain, driver=clip_global_norm_step, graph=_GRAPH_ONCE),
    NetSpec("accumulate", ConvBNNet, _cls_inputs((4, 2, 4, 4), 3), _ce, driver=accumulate_step,
            graph=_GRAPH_ONCE),
    NetSpec("jit_step", ResidualNet, _x(4, 6), driver=jit_step, graph=False),
    NetSpec("grad_aux", SharedNet, _xs((4, 6), (4, 2)), driver=grad_aux_step, graph=_GRAPH_ONCE),
    NetSpec("forward_value_and_grad", DropoutNet, _x(4, 6), driver=forward_value_and_grad_step,
            graph=_GRAPH_ONCE),
    NetSpec("bprop", BpropNet, _x(4, 6)),
    NetSpec("caught_error", CaughtErrorNet, _x(4, 6), graph=False),
    NetSpec("hook_backward", HookBackwardNet, _x(4, 6), graph=False),
    NetSpec("custom_pyfunc", CustomOpNet, _x(4, 6)),
    NetSpec("bytecode_jit_step", ResidualNet, _x(4, 6), driver=bytecode_jit_step, graph=False,
            dump_steps=(0, 2), jit_entry="step", known_log=_UNEVEN, opts=_ONE),
    NetSpec("bytecode_jit_forward", SharedNet, _xs((4, 6), (4, 2)), driver=bytecode_jit_forward, graph=False,
            dump_steps=(1,), jit_entry="forward", known_log=_UNEVEN, opts=_ONE),
    NetSpec("bytecode_jit_bprop", BpropNet, _x(4, 6), driver=bytecode_jit_step, graph=False, jit_entry="step",
            known_log=_UNEVEN, opts=_ONE),
    NetSpec("bytecode_jit_recompute", RecomputeNet, _x(4, 6), driver=bytecode_jit_forward, graph=False,
            jit_entry="forward", known_log=_UNEVEN, opts=_ONE),
    NetSpec("jit_bprop", BpropNet, _x(4, 6), driver=jit_step, graph=False, jit_entry="step", opts=_ONE),
    NetSpec("jit_recompute", RecomputeNet, _x(4, 6), driver=jit_step, graph=False, jit_entry="step", opts=_ONE),
    NetSpec("jit_o0_step", ResidualNet, _x(4, 6), driver=jit_o0_step, graph=False, jit_entry="step", opts=_ONE),
    NetSpec("jit_o1_forward", SharedNet, _xs((4, 6), (4, 2)), driver=jit_o1_forward, graph=False,
            jit_entry="forward", known_log=_UNEVEN, opts=_ONE),
    NetSpec("bytecode_caught", ResidualNet, _x(4, 6), driver=bytecode_caught_step, graph=False, jit_entry="step",
            known_log=_UNEVEN, opts=_ONE),
    NetSpec("raise_user", RaiseNet, _x(4, 6), graph=False),
    NetSpec("raise_shape", ShapeErrorNet, _x(4, 6), graph=False),
]


class Special(nn.Cell):
    """Outputs of every kind the statistics must handle: 0-d and 1-element (negative), empty,
    integer (both signs), bool, float16 (large values: their squares overflow float16) and bfloat16."""

    def construct(self, x):
        zero_d = x.sum() * 0.0 - 3.5
        one = x[0:1, 0:1] - 10.0
        empty = ops.relu(x[0:0])
        ints = ops.cast(x * 10.0, ms.int32)
        neg_int = ops.neg(ops.abs(ints))
        flags = ops.logical_not(x > 0)
        half = ops.cast(x * 300.0, ms.float16) * -1.0
        bf = ops.cast(x, ms.bfloat16) * -2.0
        return zero_d, one, empty, neg_int, ops.cast(zero_d, ms.int64), flags, half, bf


class SpecialNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6)
        self.special = Special()

    def construct(self, x):
        zero_d, one, _, _, _, flags, half, bf = self.special(self.fc(x))
        floats = ops.cast(half, ms.float32).mean() * 1e-3 + ops.cast(bf, ms.float32).mean()
        return zero_d + one.sum() + floats + ops.cast(flags, ms.float32).mean()


SPECS.append(NetSpec("special_values", SpecialNet, _x(4, 6), _plain, graph=False))
BY_NAME = {s.name: s for s in SPECS}

#: environment variable: set to 1 to train every network with each of its mode's optimizers (the full
#: product, ~2x the matrix's time); otherwise each network trains with one, in rotation
FULL_MATRIX = "MSPROBE_FULL_MATRIX"


def optimizers_of(name: str, opts) -> list:
    """The optimizers network ``name`` trains with, of the mode's ``opts`` (in order): the ones its
    spec allows; of those, with :data:`FULL_MATRIX` unset, only one, chosen by the network's place in
    :data:`SPECS` so that each optimizer is used by every ``len(opts)``-th network. Every level of a
    network runs with its optimizers; the suite keeps under its time budget this way, and
    ``MSPROBE_FULL_MATRIX=1`` (``make test-full``) runs the whole product."""
    spec = BY_NAME[name]
    allowed = [o for o in opts if not spec.opts or o in spec.opts]
    if os.environ.get(FULL_MATRIX) == "1" or len(allowed) <= 1:
        return allowed
    return [allowed[SPECS.index(spec) % len(allowed)]]
