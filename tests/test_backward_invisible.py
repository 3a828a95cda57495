"""Backward capture only observes: losses and every parameter gradient are bit-identical with the tool
on and off, on topologies where an inserted node would change MindSpore's summation order (a tensor
feeding several consumers, same-dtype casts that MindSpore treats as aliases), on Cells whose outputs
take no gradient, and the recorded gradients are the ones each call sends to its arguments."""
from __future__ import annotations

import glob
import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import operations as P

import msprobe.dump
from msprobe.capture import backward
from msprobe.mindspore import PrecisionDebugger
from tests.matrix_nets import BranchBlock  # dense1(x) + dense2(batchnorm(x)): x has three consumers


def _debugger(tmp_path, level, task="statistics", name="dump"):
    dump_path = os.path.join(str(tmp_path), name)
    cfg = {"task": task, "dump_path": dump_path, "level": level, "step": [], task: {"data_mode": ["all"]}}
    path = os.path.join(str(tmp_path), f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return PrecisionDebugger(config_path=path), dump_path


def _step_dir(dump_path, step):
    (d,) = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
    return d


# ---------------------------------------------------------------------------------------------- nets
class MultiConsumerNet(nn.Cell):
    """The first block's output feeds both the loss and a second block."""

    def __init__(self):
        super().__init__()
        self.b1 = BranchBlock(8)
        self.norm = nn.LayerNorm((8,))
        self.b2 = BranchBlock(8)

    def construct(self, x):
        h = self.b1(x)
        return self.b2(self.norm(h)).sum() + (h * h).mean()


class _RMSNorm(nn.Cell):
    """An RMSNorm written the way LLaMA implementations write it: casts to the dtype the tensor
    already has (MindSpore returns the argument itself) before and after the computation."""

    def __init__(self, width):
        super().__init__()
        self.weight = Parameter(Tensor(np.linspace(0.5, 1.5, width).astype(np.float32)), name="weight")
        self.cast = P.Cast()

    def construct(self, x):
        h = self.cast(x, ms.float32)
        norm = h * ops.rsqrt(ops.mean(h * h, -1, keep_dims=True) + 1e-6)
        return ops.cast(norm, ms.float32).astype(ms.float32) * self.weight


class _FreqTable(nn.Cell):
    """Returns slices of a constant table (outputs that take no gradient), like a RoPE table."""

    def __init__(self, seq, width):
        super().__init__()
        self.table = Tensor(np.random.RandomState(5).randn(2 * seq, width).astype(np.float32))
        self.seq = seq

    def construct(self):
        return self.table[: self.seq], ops.reshape(self.table[self.seq:], (self.seq, -1))


class CastAliasNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.norm = _RMSNorm(8)
        self.freqs = _FreqTable(4, 8)
        self.mask = nn.Dropout(p=0.5)
        self.out = nn.Dense(8, 1)

    def construct(self, x):
        cos, sin = self.freqs()
        keep = self.mask(ops.ones((4, 8), ms.float32))    # a Cell output that takes no gradient
        h = self.fc(x)
        h = h + self.norm(h) * cos + sin * keep           # h: residual plus the norm's input
        return self.out(self.norm(h)).sum()


NETS = {"multi_consumer": MultiConsumerNet, "cast_alias": CastAliasNet}


def _train(net, x, steps, debugger=None):
    params = net.trainable_params()
    opt = nn.Adam(params, learning_rate=0.01)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    out = []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(net)
        loss, grads = grad_fn(x)
        opt(grads)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        out.append((loss.asnumpy().tobytes(), [g.asnumpy().tobytes() for g in grads]))
    return out


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", sorted(NETS))
def test_losses_and_every_gradient_bit_identical(tmp_path, name, level):
    x = Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))
    ms.set_seed(11)
    reference = _train(NETS[name](), x, 2)
    ms.set_seed(11)
    debugger, dump_path = _debugger(tmp_path, level)
    net = NETS[name]()
    got = _train(net, x, 2, debugger)
    for step, ((ref_loss, ref_grads), (loss, grads)) in enumerate(zip(reference, got)):
        assert loss == ref_loss, (step, "loss")
        for i, (a, b) in enumerate(zip(ref_grads, grads)):
            assert a == b, (step, net.trainable_params()[i].name)
    for step in (0, 1):
        d = _step_dir(dump_path, step)
        assert not os.path.exists(os.path.join(d, "dump_error_info.log")), open(
            os.path.join(d, "dump_error_info.log")).read()
        data = msprobe.dump.load(d).data
        assert data
        if level != "L1":
            assert any(k.endswith("parameters_grad.0") for k in data)


def test_outputs_without_gradient_have_no_backward_entry(tmp_path):
    """Sub-Cells whose outputs take no gradient (constant-table slices, a dropout mask of ones) get a
    forward entry and no backward entry, and nothing is reported as a failure."""
    debugger, dump_path = _debugger(tmp_path, "L0")
    ms.set_seed(3)
    _train(CastAliasNet(), Tensor(np.ones((4, 8), np.float32)), 1, debugger)
    data = msprobe.dump.load(_step_dir(dump_path, 0)).data
    assert "Cell.freqs._FreqTable.forward.0" in data and "Cell.mask.Dropout.forward.0" in data
    assert "Cell.freqs._FreqTable.backward.0" not in data and "Cell.mask.Dropout.backward.0" not in data
    assert "Cell.norm._RMSNorm.backward.1" in data


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_alias_hook_writes_the_files_of_two_hooks(tmp_path, monkeypatch, level):
    """A call that returns its argument (same-dtype casts in an RMSNorm): the one tensor hook of
    ``BackwardProbe._hook_alias`` writes the files (and leaves the gradients) that the general path's
    two hooks on that tensor (output gradient, alias) write."""
    x = Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))
    real, used, outputs = backward.BackwardProbe._hook_alias, [], {}

    def spy(self, *args):
        took = real(self, *args)
        used.append(took)
        return took

    for name in ("one_hook", "two_hooks"):
        monkeypatch.setattr(backward.BackwardProbe, "_hook_alias",
                            spy if name == "one_hook" else (lambda self, *args: False))
        ms.set_seed(11)
        debugger, dump_path = _debugger(tmp_path, level, name=name)
        numbers = _train(CastAliasNet(), x, 2, debugger)
        files = {}
        for file in ("dump.json", "stack.json", "construct.json"):
            with open(os.path.join(_step_dir(dump_path, 1), file), "rb") as f:
                files[file] = f.read()
        outputs[name] = numbers, files
    assert outputs["one_hook"] == outputs["two_hooks"]
    assert sum(used) >= 2  # both steps' casts took the one hook
    data = json.loads(outputs["one_hook"][1]["dump.json"])["data"]
    casts = [entry for name, entry in data.items() if "cast" in name.lower() and name.endswith("backward")]
    assert casts and all(entry["input"][0] and entry["output"][0] for entry in casts)


def test_same_dtype_cast_records_the_one_gradient(tmp_path):
    """``ops.cast`` to the dtype a tensor already has returns the tensor itself: its backward entry
    has the tensor's gradient on both sides."""
    debugger, dump_path = _debugger(tmp_path, "L1", task="tensor")
    w = Parameter(Tensor(np.arange(1, 5, dtype=np.float32)), name="w")

    def f(x):
        h = x * w
        return (ops.cast(h, ms.float32) * 3.0).sum()

    debugger.start()
    ms.grad(f, None, [w])(Tensor(np.ones(4, np.float32)))
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(_step_dir(dump_path, 0))
    bwd = dump.data["Functional.cast.0.backward"]
    for side in ("input", "output"):
        np.testing.assert_array_equal(dump.load_tensor(bwd[side][0]), np.full(4, 3.0, np.float32))


@pytest.mark.parametrize("api", ["concat", "stack", "addn"])
def test_list_argument_gradients_per_element(tmp_path, api):
    """APIs taking a list of tensors record one gradient per list element in backward ``output``."""
    debugger, dump_path = _debugger(tmp_path, "L1", task="tensor")
    w = Parameter(Tensor(np.arange(1, 5, dtype=np.float32)), name="w")
    call = {"concat": lambda xs: ops.concat(xs), "stack": lambda xs: ops.stack(xs),
            "addn": lambda xs: ops.addn(xs)}[api]
    weights = Tensor(np.arange(1, 9 if api == "concat" else 5, dtype=np.float32))

    def f(x):
        a = x * w
        b = a * 2.0
        y = call([a, b])
        return (y.reshape(-1)[: weights.shape[0]] * weights).sum() if api != "stack" else (y * weights).sum()

    debugger.start()
    ms.grad(f, None, [w])(Tensor(np.ones(4, np.float32)))
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(_step_dir(dump_path, 0))
    out = dump.data[f"Functional.{api}.0.backward"]["output"]
    assert len(out) == 1 and isinstance(out[0], list) and len(out[0]) == 2
    ga, gb = (dump.load_tensor(leaf) for leaf in out[0])
    wn = weights.asnumpy()
    if api == "concat":
        want = (wn[:4], wn[4:])
    else:
        want = (wn, wn)
    np.testing.assert_array_equal(ga, want[0])
    np.testing.assert_array_equal(gb, want[1])


def test_parameter_gradients_when_backward_runs_after_stop(tmp_path):
    """Seed pattern for one code block: start -> forward -> stop -> backward -> step. Cell backward
    entries and parameter gradients of the block are both recorded."""
    debugger, dump_path = _debugger(tmp_path, "L0")
    ms.set_seed(2)
    net = MultiConsumerNet()
    x = Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))
    params = net.trainable_params()
    reference = ms.grad(net, None, params)(x)
    debugger.start(net)
    loss, vjp = ms.vjp(net, x, weights=params)      # forward only
    debugger.stop()
    _, grads = vjp(ops.ones_like(loss))             # the backward, after stop()
    debugger.step()
    for a, b in zip(reference, grads):
        assert a.asnumpy().tobytes() == b.asnumpy().tobytes()
    data = msprobe.dump.load(_step_dir(dump_path, 0)).data
    assert "Cell.b1.BranchBlock.backward.0" in data
    assert "Cell.b1.dense1.Dense.parameters_grad.0" in data


class _Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.act = nn.ReLU()

    def construct(self, x):
        return self.act(self.fc(x)) * 2


class _RecomputeNet(nn.Cell):
    def __init__(self, recompute):
        super().__init__()
        self.b = _Block()
        if recompute:
            self.b.recompute()
        self.head = nn.Dense(4, 1)

    def construct(self, x):
        return self.head(self.b(x)).sum()


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_recompute_records_each_call_once_and_pairs_backward(tmp_path, level):
    """Under ``Cell.recompute()`` MindSpore runs the block's forward again during the backward: the
    dump is the same as without recompute (same entries, same numbers), and gradients are
    bit-identical to the tool-off run."""
    x = Tensor(np.random.RandomState(0).randn(2, 4).astype(np.float32))
    dumps = {}
    for recompute in (False, True):
        ms.set_seed(1)
        net = _RecomputeNet(recompute)
        grad_fn = ms.value_and_grad(net, None, net.trainable_params())
        _, reference = grad_fn(x)
        debugger, dump_path = _debugger(tmp_path, level, name=f"rc{recompute}")
        debugger.start(net)
        _, grads = grad_fn(x)
        debugger.stop()
        debugger.step()
        for a, b in zip(reference, grads):
            assert a.asnumpy().tobytes() == b.asnumpy().tobytes()
        dump = msprobe.dump.load(_step_dir(dump_path, 0))
        dumps[recompute] = dump
    plain, recomputed = dumps[False], dumps[True]
    assert set(recomputed.data) == set(plain.data)
    assert not any(k.startswith("Cell.b.fc.") and k.endswith(".1") for k in recomputed.data)
    assert "Cell.b.fc.Dense.backward.0" in recomputed.data
    for name, body in plain.data.items():
        for side in ("input", "output"):
            for a, b in zip(body.get(side) or [], recomputed.data[name].get(side) or []):
                if isinstance(a, dict) and "Max" in a:
                    assert (a["Max"], a["Min"]) == (b["Max"], b["Min"]), (name, side)
    assert recomputed.construct == plain.construct
