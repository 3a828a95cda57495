"""L1 (API-level) capture end to end: real MindSpore runs, values read back through msprobe.dump.load."""
from __future__ import annotations

import math
import os
import re
import zlib

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, nn, ops

import msprobe.dump
from msprobe.mindspore import PrecisionDebugger
from conftest import build_mlp, leaves, mlp_batch, only_step_dir, run_steps

API_NAME = re.compile(r"^(Tensor|Functional|Mint|MintFunctional|Jit)\.[A-Za-z_][\w.]*?\.\d+\.(forward|backward)$")
PRIM_NAME = re.compile(r"^Primitive\.\w+\.\w+\.\d+\.(forward|backward)$")


# ---------------------------------------------------------------------------------------------- helpers
def _lm_setup(seed=0):
    """TinyLM from examples/models.py on real text (small sizes), or skip if it is not importable."""
    models = pytest.importorskip("examples.models")
    vocab, batches = models.load_text_corpus(seq_len=16, batch_size=4, max_chars=20_000)
    ms.set_seed(seed)
    np.random.seed(seed)
    net = models.TinyLM(len(vocab), d_model=32, n_heads=2, n_layers=1, seq_len=16)
    x, y = batches[0]
    return net, (Tensor(x), Tensor(y)), models.LMCrossEntropy()


def _named_leaves(entry, body):
    """``(expected data_name, leaf)`` for every tensor leaf of an entry (naming.py grammar)."""
    categories = {"input_args": "input", "input_kwargs": "kwargs", "output": "output", "input": "input"}
    for key, value in body.items():
        cat = categories[key]
        yield from _walk(value, f"{entry}.{cat}")


def _walk(value, prefix):
    if isinstance(value, dict) and value.get("type") in ("mindspore.Tensor", "numpy.ndarray"):
        yield f"{prefix}.npy", value
    elif isinstance(value, dict) and "type" not in value:
        for k, v in value.items():
            yield from _walk(v, f"{prefix}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{prefix}.{i}")


def _crc(arr):
    return f"{zlib.crc32(np.ascontiguousarray(arr).tobytes()):08x}"


def _rel_close(a, b, rtol=1e-6):
    return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))


def _check_leaf_against(leaf, arr):
    """Statistics of a leaf against a (saved) array: Max/Min exact, Mean/Norm within 1e-6 (float64)."""
    assert list(arr.shape) == leaf["shape"]
    if arr.size == 0 or arr.dtype == np.bool_:
        return
    if arr.ndim == 0:
        assert leaf["Max"] == leaf["Min"] == arr.item()
        return
    assert leaf["Max"] == np.max(arr)
    assert leaf["Min"] == np.min(arr)
    a64 = arr.astype(np.float64)
    assert _rel_close(leaf["Mean"], float(np.mean(a64))), (leaf, np.mean(a64))
    assert _rel_close(leaf["Norm"], float(np.sqrt(np.sum(a64 * a64)))), (leaf, np.linalg.norm(a64))


# ----------------------------------------------------------------- a small LM: names, values, layout
@pytest.fixture(scope="module")
def lm_dumps(tmp_path_factory):
    """One seeded LM training step dumped twice (bit-identical reruns): tensor task with md5, and
    statistics task. Returns (tensor StepDump, statistics StepDump)."""
    from msprobe.mindspore import PrecisionDebugger

    base = tmp_path_factory.mktemp("lm")
    out = []
    for task, section in (("tensor", {"summary_mode": "md5"}), ("statistics", {})):
        net, batch, loss = _lm_setup()
        dump_path = str(base / task)
        cfg = base / f"{task}.json"
        cfg.write_text(__import__("json").dumps(
            {"task": task, "level": "L1", "dump_path": dump_path, task: section}))
        debugger = PrecisionDebugger(str(cfg))
        run_steps(net, debugger, 1, batch=batch, loss_fn=loss)
        out.append(msprobe.dump.load(only_step_dir(dump_path, 0)))
    return tuple(out)


def test_lm_l1_prefixes_forward_and_backward(lm_dumps):
    tensor_dump, _ = lm_dumps
    names = list(tensor_dump.data)
    for prefix in ("Tensor", "Functional", "Mint", "MintFunctional", "Primitive"):
        for direction in ("forward", "backward"):
            assert any(n.startswith(prefix + ".") and n.endswith("." + direction) for n in names), \
                (prefix, direction)
    for name in names:
        assert API_NAME.match(name) or PRIM_NAME.match(name), name
    assert tensor_dump.complete and tensor_dump.header["level"] == "L1"
    # body layout (seed: "dump.json文件说明"): forward input_args, input_kwargs, output
    for name, body in tensor_dump.data.items():
        if name.endswith(".forward"):
            assert list(body) == ["input_args", "input_kwargs", "output"], name
            assert isinstance(body["output"], list)
        else:
            assert set(body) <= {"input", "output"} and body, name


def test_lm_tensor_mode_leaves_match_saved_npy(lm_dumps):
    tensor_dump, _ = lm_dumps
    checked = 0
    for entry, body in tensor_dump.data.items():
        for expected_name, leaf in _named_leaves(entry, body):
            assert leaf["data_name"] == expected_name
            assert os.path.isfile(tensor_dump.tensor_path(leaf))
            arr = tensor_dump.load_tensor(leaf)
            assert leaf["dtype"] == {"float32": "Float32", "int32": "Int32", "int64": "Int64",
                                     "bool": "Bool"}[arr.dtype.name], leaf
            _check_leaf_against(leaf, arr)
            assert leaf["md5"] == _crc(arr)
            checked += 1
    assert checked > 100


def test_lm_statistics_mode_equals_tensor_mode(lm_dumps):
    tensor_dump, stats_dump = lm_dumps
    assert stats_dump.header["task"] == "statistics"
    assert list(stats_dump.data) == list(tensor_dump.data)
    for entry, body in stats_dump.data.items():
        t_leaves = list(leaves(tensor_dump.data[entry]))
        s_leaves = list(leaves(body))
        assert len(s_leaves) == len(t_leaves), entry
        for s_leaf, t_leaf in zip(s_leaves, t_leaves):
            assert "data_name" not in s_leaf and "md5" not in s_leaf
            assert (s_leaf["dtype"], s_leaf["shape"]) == (t_leaf["dtype"], t_leaf["shape"])
            _check_leaf_against(s_leaf, tensor_dump.load_tensor(t_leaf))
    assert not os.path.exists(os.path.join(stats_dump.directory, "dump_tensor_data"))


def test_mlp_no_primitive_without_model(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")
    run_steps(build_mlp(), debugger, 1, start_model=False)
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    assert not [n for n in data if n.startswith("Primitive.")]
    for name in ("Functional.relu.0", "Mint.mul.0", "Tensor.__mul__.0", "Functional.mse_loss.0"):
        assert f"{name}.forward" in data and f"{name}.backward" in data, name


# -------------------------------------------------------------------------------- training unchanged
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_training_bit_identical_with_tool(make_debugger, task):
    ref_losses, ref_grads = run_steps(build_mlp(), None, 3)
    losses, grads = run_steps(build_mlp(), make_debugger(task=task), 3)
    for a, b in zip(ref_losses, losses):
        assert a.dtype == b.dtype and np.array_equal(a, b) and (a == b).all()
    for ga, gb in zip(ref_grads, grads):
        for a, b in zip(ga, gb):
            assert a.dtype == b.dtype and (a == b).all()


def test_lm_training_bit_identical_with_tool(make_debugger):
    net, batch, loss = _lm_setup()
    ref_losses, ref_grads = run_steps(net, None, 2, batch=batch, loss_fn=loss)
    net, batch, loss = _lm_setup()
    losses, grads = run_steps(net, make_debugger(task="statistics"), 2, batch=batch, loss_fn=loss)
    assert all((a == b).all() for a, b in zip(ref_losses, losses))
    assert all((a == b).all() for ga, gb in zip(ref_grads, grads) for a, b in zip(ga, gb))


# ------------------------------------------------------------------------------------------ backward
def test_backward_semantics_mul_by_three(make_debugger, dump_dir):
    debugger = make_debugger(task="tensor")
    x = Tensor(np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    debugger.start()
    dx = ms.grad(lambda t: ops.mul(t, 3), grad_position=0)(x)   # dy = ones (default sens)
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))
    bwd = dump.data["Functional.mul.0.backward"]
    assert len(bwd["input"]) == 1                         # grad w.r.t. the one output
    grad_out = dump.load_tensor(bwd["input"][0])
    assert (grad_out == 1).all() and bwd["input"][0]["Max"] == bwd["input"][0]["Min"] == 1
    assert len(bwd["output"]) == 2 and bwd["output"][1] is None   # grad w.r.t. x; 3 is an int
    grad_in = dump.load_tensor(bwd["output"][0])
    assert (grad_in == 3).all() and bwd["output"][0]["Mean"] == 3
    assert (grad_in == dx.asnumpy()).all()
    assert bwd["output"][0]["data_name"] == "Functional.mul.0.backward.output.0.npy"
    assert bwd["input"][0]["data_name"] == "Functional.mul.0.backward.input.0.npy"
    assert [n for n in dump.data if ".backward" in n] == ["Functional.mul.0.backward"]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_batchnorm_backward_has_the_gradients_of_its_inputs(make_debugger, dump_dir, level):
    """The BatchNorm Primitive writes its moving statistics (``side_effect_mem``): its backward entry
    still has ``output``, the gradients w.r.t. x, gamma and beta (those MindSpore computes), null for
    the moving mean and variance."""
    debugger = make_debugger(task="tensor", level=level)
    ms.set_seed(1)
    bn = nn.BatchNorm1d(6)
    bn.set_train(True)
    x = Tensor(np.random.RandomState(0).randn(5, 6).astype(np.float32))
    weight = Tensor(np.random.RandomState(1).randn(5, 6).astype(np.float32))
    grad_fn = ms.grad(lambda t: (bn(t) * weight).sum(), grad_position=0, weights=bn.trainable_params())
    debugger.start(bn)
    dx, (dgamma, dbeta) = grad_fn(x)
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))
    bwd = dump.data["Primitive.bn_train.BatchNorm.0.backward"]
    assert len(bwd["output"]) == 5 and bwd["output"][3] is None and bwd["output"][4] is None
    for leaf, expected in zip(bwd["output"][:3], (dx, dgamma, dbeta)):
        assert (dump.load_tensor(leaf) == expected.asnumpy()).all()


def _edges_net(x, w, t2):
    y = ops.mul(x, w)                      # Functional.mul.0
    a = ops.mul(y, w)                      # mul.1: y has two consumers (mul.1, mul.2)
    b = ops.mul(y, y)                      # mul.2: the same tensor on both edges
    c = ops.mul(a.transpose(1, 0), t2)     # mul.3: a non-contiguous view (edge via Contiguous)
    return c.sum() + 2 * b.sum()


def test_backward_per_call_gradients_from_node_hooks(make_debugger, dump_dir):
    """A call's gradients come from its autograd node's hook: each ``output`` gradient is what this
    call sends to that argument, not a tensor's total."""
    rng = np.random.RandomState(0)
    x, w = rng.randn(3, 4).astype(np.float32), rng.randn(3, 4).astype(np.float32)
    t2 = rng.randn(4, 3).astype(np.float32)
    debugger = make_debugger(task="tensor", level="L1")
    debugger.start()
    ms.grad(_edges_net, grad_position=(0, 1))(Tensor(x), Tensor(w), Tensor(t2))
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))

    def grads(n, side):
        return [None if leaf is None else dump.load_tensor(leaf)
                for leaf in dump.data[f"Functional.mul.{n}.backward"][side]]

    y = x * w
    a_grad = t2.T                                      # d loss / d a (through the transpose)
    gy = a_grad * w + 2 * (2 * y)                      # y's total gradient: mul.1 plus both edges of mul.2
    expected = {
        3: ([np.ones((4, 3), np.float32)], [t2, None]),   # t2 takes no gradient: MindSpore computes none
        2: ([np.full((3, 4), 2, np.float32)], [2 * y, 2 * y]),
        1: ([a_grad], [a_grad * w, a_grad * y]),
        0: ([gy], [gy * w, gy * x]),
    }
    for n, (grad_outputs, grad_inputs) in expected.items():
        got_in, got_out = grads(n, "input"), grads(n, "output")
        assert len(got_in) == 1 and len(got_out) == 2, n
        np.testing.assert_allclose(got_in[0], grad_outputs[0], rtol=1e-6, err_msg=f"mul.{n} input")
        for got, want in zip(got_out, grad_inputs):
            if want is None:
                assert got is None, n
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"mul.{n} output")
    for leaf in (leaf for e in dump.data.values() for side in ("input", "output") for leaf in e.get(side) or []
                 if isinstance(leaf, dict) and leaf.get("data_name")):
        _check_leaf_against(leaf, dump.load_tensor(leaf))


def test_input_gradients_exact_when_a_calls_node_structure_changes(make_debugger, dump_dir):
    """The same API with the same argument types runs as one autograd node in one call and as two in
    another: each call's input gradients are what that call sends to its argument, and nothing is
    reported lost (the capture reads each call's own graph, it does not learn from the first)."""
    import types

    mod = types.ModuleType("user_ops")

    def scale(x, twice):
        return x * 3.0 if not twice else (x * 3.0) * x   # one node, or two

    mod.scale = scale
    debugger = make_debugger(task="statistics", level="L1")
    debugger.register_custom_api(mod, "scale", "UserOps")
    x = Tensor(np.arange(1, 7, dtype=np.float32).reshape(2, 3))

    def f(t):
        return mod.scale(t, False).sum() + mod.scale(t, False).sum() + mod.scale(t, True).sum() \
            + mod.scale(t, True).sum()

    try:
        debugger.start()
        ms.grad(f)(x)
        debugger.stop()
        debugger.step()
    finally:
        debugger.restore_custom_api(mod, "scale")
    step_dir = only_step_dir(dump_dir, 0)
    data = msprobe.dump.load(step_dir).data
    xs = x.asnumpy().astype(np.float64)
    for n in range(4):
        bwd = data[f"UserOps.scale.{n}.backward"]
        assert bwd["input"][0]["Max"] == 1.0, n          # gradient w.r.t. the output
    assert data["UserOps.scale.0.backward"]["output"][0]["Max"] == 3.0    # one node
    assert data["UserOps.scale.1.backward"]["output"][0]["Max"] == 3.0
    for n in (2, 3):                                                      # two nodes: d/dx 3x^2 = 6x
        assert data[f"UserOps.scale.{n}.backward"]["output"][0]["Max"] == pytest.approx((6 * xs).max())
        assert data[f"UserOps.scale.{n}.backward"]["output"][0]["Min"] == pytest.approx((6 * xs).min())
    assert not os.path.exists(os.path.join(step_dir, "dump_error_info.log"))


def test_backward_data_independent_of_learning_call_and_level(make_debugger, tmp_path):
    """The first call of a signature (identity node) and later ones (node hook) record the same
    thing, so step 1 is the same whether step 0 was dumped; API entries are the same at L1 and mix;
    the data batch, which takes no gradient, has ``null`` everywhere."""
    def dump(level, steps_dumped, name):
        path = str(tmp_path / name)
        run_steps(build_mlp(), make_debugger(task="statistics", level=level, step=steps_dumped,
                                             dump_path=path), steps=2)
        return msprobe.dump.load(only_step_dir(path, 1)).data

    both, only_second = dump("L1", [0, 1], "a"), dump("L1", [1], "b")
    assert both == only_second
    mix = dump("mix", [0, 1], "c")
    assert {k: v for k, v in mix.items() if not k.startswith("Cell.")} == both
    first = both["Primitive.matmul.MatMul.0.backward"]["output"]
    assert first[0] is None and first[1]["shape"] == [16, 8]   # data batch: none; weight: its gradient


@pytest.mark.parametrize("prep", [False, True])
def test_backward_data_batch_gradient_null_in_every_step_and_level(make_debugger, tmp_path, prep):
    """Review finding: the data batch (or a value computed from it only, ``x / 2``) takes no gradient;
    its backward ``output`` is null in the first dumped step too (where calls go through the
    identity node), at L1 and at mix (where the enclosing Cell's identity node sits in between)."""
    def dump(level, name):
        path = str(tmp_path / f"{name}_{prep}")
        net = build_mlp()
        params = net.trainable_params()
        opt = nn.SGD(params, 0.1)
        x, y = mlp_batch()
        grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a / 2 if prep else a), b), None, params)
        debugger = make_debugger(task="statistics", level=level, dump_path=path)
        for _ in range(2):
            debugger.start(net)
            _, g = grad_fn(x, y)
            opt(g)
            debugger.stop()
            debugger.step()
        return [msprobe.dump.load(only_step_dir(path, s)).data for s in (0, 1)]

    l1, mix = dump("L1", "l1"), dump("mix", "mix")
    for step in (0, 1):
        assert l1[step]["Primitive.matmul.MatMul.0.backward"]["output"][0] is None, step
        assert l1[step]["Primitive.matmul.MatMul.0.backward"]["output"][1]["shape"] == [16, 8]
        assert {k: v for k, v in mix[step].items() if not k.startswith("Cell.")} == l1[step], step
    assert "output" not in mix[0]["Cell.fc1.Dense.backward.0"]     # the Cell's input: the batch


def test_nested_api_calls_record_only_outer(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")
    a = Tensor(np.ones((2, 3), np.float32))
    b = Tensor(np.zeros((2, 3), np.float32))
    debugger.start()
    loss = ops.mse_loss(a, b)   # implemented with `input - target` (Tensor.__sub__, also wrapped)
    diff = a - b                # a direct Tensor.__sub__ call: recorded
    debugger.stop()
    debugger.step()
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    assert list(data) == ["Functional.mse_loss.0.forward", "Tensor.__sub__.0.forward"]
    assert data["Functional.mse_loss.0.forward"]["output"][0]["Max"] == float(loss.asnumpy()) == 1.0
    assert data["Tensor.__sub__.0.forward"]["output"][0]["Mean"] == float(diff.asnumpy().mean())


# -------------------------------------------------------------------- arguments that are not tensors
def test_non_tensor_arguments(make_debugger, dump_dir):
    debugger = make_debugger(task="statistics")
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    debugger.start()
    mint.sum(x, dim=1, keepdim=True, dtype=ms.float64)      # int, bool, dtype kwargs
    mint.sum(x, None)                                        # None positional
    mint.mul(x, 2.5)                                         # float
    ops.gelu(x, approximate="tanh")                          # str kwarg
    ops.reshape(x, (3, 2))                                   # tuple of ints
    ops.cast(x, ms.float16)                                  # dtype positional
    recorder = debugger.service.recorder                     # Tensor.__getitem__ is not wrapped:
    recorder.call("Custom.index", lambda t, s, cfg, nested, step=None: t[s],   # drive the recorder directly
                  (x, slice(0, 2), {"k": [1, None, True], "e": Ellipsis, "n": np.int64(7)},
                   [x, (1.5, "s")]), {"step": slice(None, 3, 2)})
    # values JSON carries only as NaN/Infinity tokens, or beyond 64 bits (the json module writes them)
    recorder.call("Custom.odd", lambda *a: a[0], (x, float("nan"), float("-inf"), 2 ** 70), {})
    debugger.stop()
    debugger.step()
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data

    s0 = data["Mint.sum.0.forward"]
    assert s0["input_args"][0]["type"] == "mindspore.Tensor"
    assert s0["input_kwargs"] == {"dim": {"type": "int", "value": 1},
                                  "keepdim": {"type": "bool", "value": True},
                                  "dtype": {"type": "mindspore.dtype", "value": "Float64"}}
    assert s0["output"][0]["dtype"] == "Float64" and s0["output"][0]["shape"] == [2, 1]
    assert s0["output"][0]["Max"] == 12.0 and s0["output"][0]["Min"] == 3.0
    assert data["Mint.sum.1.forward"]["input_args"][1] is None
    assert data["Mint.sum.1.forward"]["output"][0]["shape"] == []
    assert data["Mint.sum.1.forward"]["output"][0]["Max"] == 15.0
    assert data["Mint.mul.0.forward"]["input_args"][1] == {"type": "float", "value": 2.5}
    assert data["Functional.gelu.0.forward"]["input_kwargs"] == {
        "approximate": {"type": "str", "value": "tanh"}}
    assert data["Functional.reshape.0.forward"]["input_args"][1] == [
        {"type": "int", "value": 3}, {"type": "int", "value": 2}]
    cast = data["Functional.cast.0.forward"]
    assert cast["input_args"][1] == {"type": "mindspore.dtype", "value": "Float16"}
    assert cast["output"][0]["dtype"] == "Float16" and cast["output"][0]["Max"] == 5.0

    custom = data["Custom.index.0.forward"]
    args = custom["input_args"]
    assert args[1] == {"type": "slice", "value": [0, 2, None]}
    assert args[2] == {"k": [{"type": "int", "value": 1}, None, {"type": "bool", "value": True}],
                       "e": {"type": "ellipsis", "value": "..."},
                       "n": {"type": "int64", "value": 7}}
    assert args[3][0]["type"] == "mindspore.Tensor" and args[3][0]["Max"] == 5.0
    assert args[3][1] == [{"type": "float", "value": 1.5}, {"type": "str", "value": "s"}]
    assert custom["input_kwargs"] == {"step": {"type": "slice", "value": [None, 3, 2]}}
    assert custom["output"][0]["shape"] == [2, 3]
    odd = data["Custom.odd.0.forward"]["input_args"]
    assert math.isnan(odd[1]["value"]) and odd[2] == {"type": "float", "value": -math.inf}
    assert odd[3] == {"type": "int", "value": 2 ** 70}


# ------------------------------------------------------------------------------- in-place operations
# On MindSpore 2.10 CPU, Tensor.add_/sub_/mul_/div_ and ``+=`` fall back to out-of-place kernels (the
# tensor is NOT changed; a new one is returned), fill_/masked_fill_/zero_ have no CPU kernel. Real
# in-place writes on CPU: Tensor.copy_, Tensor.__setitem__ and ops.assign; the tests below use them.
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_inplace_api_input_recorded_before_mutation(make_debugger, dump_dir, task):
    debugger = make_debugger(task=task)
    x = ops.ones(4, ms.float32)
    p = ms.Parameter(Tensor(np.ones(4, np.float32)), name="p")
    debugger.start()
    y = x.mul_(2)                       # a Tensor in-place method (out of place on CPU)
    ops.assign(p, p * 2)                # a real in-place write of a Parameter
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))
    body = dump.data["Tensor.mul_.0.forward"]
    inp, out = body["input_args"][0], body["output"][0]
    assert inp["Max"] == inp["Min"] == inp["Mean"] == 1.0 and inp["Norm"] == 2.0
    assert out["Max"] == out["Min"] == out["Mean"] == 2.0 and (y.asnumpy() == 2).all()
    body = dump.data["Functional.assign.0.forward"]
    p_in, value, p_out = body["input_args"][0], body["input_args"][1], body["output"][0]
    assert p_in["Max"] == p_in["Min"] == p_in["Mean"] == 1.0
    assert value["Max"] == p_out["Max"] == p_out["Min"] == 2.0
    assert (p.asnumpy() == 2).all()
    if task == "tensor":
        assert (dump.load_tensor(inp) == 1).all() and (dump.load_tensor(out) == 2).all()
        assert (dump.load_tensor(p_in) == 1).all() and (dump.load_tensor(p_out) == 2).all()


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_output_mutated_after_hook_keeps_hook_time_value(make_debugger, dump_dir, task):
    debugger = make_debugger(task=task)
    x = Tensor(np.array(1.5, np.float32))
    debugger.start()
    t = ops.relu(x)                     # 0-d output, recorded (deferred)
    t.copy_(Tensor(np.array(2.5, np.float32)))   # not wrapped: the mutation guard flushes first
    u = ops.relu(Tensor(np.ones(3, np.float32)))
    u[1] = 6.0                          # __setitem__, in place
    t.add_(1)                           # wrapped in-place API (out of place on CPU)
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))
    out = dump.data["Functional.relu.0.forward"]["output"][0]
    assert out["Max"] == out["Min"] == out["Mean"] == 1.5 and float(t.asnumpy()) == 2.5
    out1 = dump.data["Functional.relu.1.forward"]["output"][0]
    assert out1["Max"] == out1["Min"] == 1.0 and u.asnumpy().tolist() == [1.0, 6.0, 1.0]
    add = dump.data["Tensor.add_.0.forward"]
    assert add["input_args"][0]["Max"] == 2.5 and add["output"][0]["Max"] == 3.5
    if task == "tensor":
        assert dump.load_tensor(out).item() == 1.5
        assert (dump.load_tensor(out1) == 1).all()


def test_l0_cell_output_mutated_after_cell(make_debugger, dump_dir):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(8, 4)

        def construct(self, x):
            return self.dense(x)

    ms.set_seed(1)
    net = Net()
    x = Tensor(np.random.RandomState(1).randn(2, 8).astype(np.float32))
    expected = net(x).asnumpy().copy()
    debugger = make_debugger(task="tensor", level="L0")
    debugger.start(net)
    y = net(x)
    y.add_(1)                           # out of place on CPU
    y.copy_(y + 1)                      # in place: the guard keeps the Cell output pre-mutation
    y[0] = 0.0
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))
    leaf = dump.data["Cell.dense.Dense.forward.0"]["output"][0]
    assert leaf["Max"] == expected.max() and leaf["Min"] == expected.min()
    assert (dump.load_tensor(leaf) == expected).all()
    assert (y.asnumpy()[1] == expected[1] + 1).all() and (y.asnumpy()[0] == 0).all()


# ------------------------------------------------------------------------------------------- patches
def test_patches_only_inside_start_stop(make_debugger):
    act, relu, tmul, tadd = ops.gelu, ops.relu, Tensor.__mul__, Tensor.add_
    mint_mul = mint.mul
    net = build_mlp()
    prim_class = type(net.fc1.matmul)
    # step 0 is the only dumped step: its stop() removes everything (before another dumped step
    # the patches stay installed, passing calls through: tests/test_parked_install.py)
    debugger = make_debugger(task="statistics", step=[0])
    debugger.start(net)
    try:
        assert type(net.fc1.matmul) is not prim_class and isinstance(net.fc1.matmul, prim_class)
        assert ops.gelu is not act
        assert ops.gelu.__wrapped__ is act
        for wrapped, orig in ((ops.gelu, act), (Tensor.__mul__, tmul), (mint.mul, mint_mul)):
            assert wrapped.__name__ == orig.__name__
            assert wrapped.__qualname__ == orig.__qualname__
            assert wrapped.__doc__ == orig.__doc__
            assert wrapped.__wrapped__ is orig
        assert Tensor.add_.__wrapped__ is tadd
    finally:
        debugger.stop()
    assert ops.gelu is act and ops.relu is relu and mint.mul is mint_mul
    assert Tensor.__mul__ is tmul and Tensor.add_ is tadd
    assert "add_" not in vars(Tensor) or vars(Tensor)["add_"] is tadd
    assert type(net.fc1.matmul) is prim_class and "_msprobe_probe" not in vars(net.fc1.matmul)
    debugger.step()
    assert ops.gelu is act and Tensor.__mul__ is tmul


# ------------------------------------------------------------------------------------ host transfers
def test_hooks_make_no_host_transfers(make_debugger, dump_dir, monkeypatch):
    """Counted on one MLP training step, statistics mode, start(model): every Tensor.asnumpy /
    Tensor.item / data_ptr call the tool makes happens inside Runtime.flush (one zero-copy read per
    recorded tensor: 50 on this MLP step when written), except the few smallest Parameters start()
    reads at a step's first window (msprobe.mindspore.step_windows: to tell a forgotten step());
    hooks themselves make none."""
    from msprobe.engine.runtime import Runtime
    from msprobe.mindspore import step_windows

    state = {"in_flush": 0, "inside": 0, "outside": 0, "at_start": 0}
    orig_asnumpy, orig_item, orig_flush = Tensor.asnumpy, Tensor.item, Runtime._flush_batch
    orig_window = step_windows.StepWindows.window_starts
    orig_data_ptr = Tensor.data_ptr  # the zero-copy host view of a CPU tensor starts from it

    def counted(orig):
        def f(self, *a, **k):
            state["at_start" if state.get("window") else "inside" if state["in_flush"] else "outside"] += 1
            return orig(self, *a, **k)
        return f

    def window_starts(self, *args):
        state["window"] = True
        try:
            return orig_window(self, *args)
        finally:
            state["window"] = False

    def flush(self):
        state["in_flush"] += 1
        try:
            return orig_flush(self)
        finally:
            state["in_flush"] -= 1

    net = build_mlp()
    x, y = mlp_batch()
    params = net.trainable_params()
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, params)
    opt = nn.SGD(params, 0.1)
    debugger = make_debugger(task="statistics")
    # the guarantee is for asynchronous launch, where a read would wait for the device queue; under
    # launch_blocking on CPU a Parameter's snapshot is a host copy (nothing to wait for): off here
    monkeypatch.setattr(msprobe.tensors.stats, "synchronous_cpu", lambda: False)
    monkeypatch.setattr(Tensor, "asnumpy", counted(orig_asnumpy))
    monkeypatch.setattr(Tensor, "item", counted(orig_item))
    monkeypatch.setattr(Tensor, "data_ptr", counted(orig_data_ptr))
    monkeypatch.setattr(Runtime, "_flush_batch", flush)  # every flush reads its batch here
    monkeypatch.setattr(step_windows.StepWindows, "window_starts", window_starts)
    debugger.start(net)
    _, g = grad_fn(x, y)
    opt(g)
    debugger.stop()
    debugger.step()
    monkeypatch.undo()
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    n_leaves = sum(1 for body in data.values() for _ in leaves(body))
    assert state["outside"] == 0 and state["at_start"] <= step_windows._WATCHED, state
    # one read per distinct tensor object in a flush batch: a tensor recorded twice (output of one API,
    # input of the next) is read once, so reads <= leaves
    assert 0 < state["inside"] <= n_leaves, (state, n_leaves)
    assert n_leaves >= 40 and len(data) >= 20, (n_leaves, len(data))


# ------------------------------------------------------------------------------------- low precision
def test_low_precision_tensors(make_debugger, dump_dir):
    debugger = make_debugger(task="tensor")
    x_bf = ops.cast(Tensor(np.linspace(-2, 2, 768).astype(np.float32)), ms.bfloat16)
    debugger.start()
    back = ops.cast(x_bf, ms.float32)                             # bf16 input
    ones_bf = ops.cast(Tensor(np.ones(768, np.float32)), ms.bfloat16)   # bf16 output
    ones_h = ops.cast(Tensor(np.ones(70000, np.float32)), ms.float16)
    full_h = ops.cast(Tensor(np.full(1000, 300, np.float32)), ms.float16)
    debugger.stop()
    debugger.step()
    dump = msprobe.dump.load(only_step_dir(dump_dir, 0))

    bf_in = dump.data["Functional.cast.0.forward"]["input_args"][0]
    assert bf_in["dtype"] == "BFloat16" and bf_in["stored_as"] == "bfloat16->float32"
    arr = dump.load_tensor(bf_in)
    assert arr.dtype == np.float32 and (arr == back.asnumpy()).all()
    _check_leaf_against(bf_in, arr)

    bf_out = dump.data["Functional.cast.1.forward"]["output"][0]
    assert bf_out["dtype"] == "BFloat16" and "stored_as" in bf_out
    assert bf_out["Mean"] == 1.0 and bf_out["Norm"] == math.sqrt(768)
    assert dump.load_tensor(bf_out).dtype == np.float32

    h1 = dump.data["Functional.cast.2.forward"]["output"][0]
    assert h1["dtype"] == "Float16" and "stored_as" not in h1
    assert dump.load_tensor(h1).dtype == np.float16
    assert h1["Mean"] == 1.0 and h1["Norm"] == math.sqrt(70000)
    h2 = dump.data["Functional.cast.3.forward"]["output"][0]
    assert h2["Max"] == h2["Min"] == h2["Mean"] == 300.0
    assert h2["Norm"] == pytest.approx(300 * math.sqrt(1000), rel=1e-15)
    assert ones_bf.dtype == ms.bfloat16 and ones_h.dtype == ms.float16 and full_h.dtype == ms.float16


def test_numpy_scalars_without_a_json_value_are_recorded_as_text(make_debugger, dump_dir):
    """A numpy scalar JSON cannot hold (complex, datetime64) is recorded with its text; the batch it is
    in is written and nothing reaches the user."""
    import types

    mod = types.ModuleType("user_ops")
    mod.scale = lambda x, c: x * 2.0
    debugger = make_debugger(task="statistics", level="L1")
    debugger.register_custom_api(mod, "scale", "UserOps")
    try:
        debugger.start()
        mod.scale(Tensor(np.ones(3, np.float32)), np.complex64(1 + 2j))
        mod.scale(Tensor(np.ones(3, np.float32)), np.datetime64("2026-12-01"))
        debugger.stop()
        debugger.step()
    finally:
        debugger.restore_custom_api(mod, "scale")
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    assert data["UserOps.scale.0.forward"]["input_args"][1] == {"type": "complex64", "value": "(1+2j)"}
    assert data["UserOps.scale.1.forward"]["input_args"][1]["value"] == "2026-12-01"
    assert data["UserOps.scale.0.forward"]["output"][0]["Max"] == 2.0


class _Matmul(nn.Cell):
    """``ops.matmul(fc(x), w)`` inside a ``try``: with ``w`` of 5 rows the shapes do not match and the
    model keeps the error (``caught``: ``(type, message)``) and goes on with ``fc(x)``."""

    def __init__(self, rows):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.w = Tensor(np.ones((rows, 3), np.float32))
        self.caught = []

    def construct(self, x):
        h = self.fc(x)
        try:
            h = ops.matmul(h, self.w)
        except (RuntimeError, ValueError, TypeError) as exc:
            self.caught.append((type(exc).__name__, str(exc)))
        return ops.relu(h).sum()


@pytest.mark.parametrize("level,task", [("L1", "statistics"), ("mix", "statistics"), ("L1", "tensor")])
def test_an_api_call_that_raised_says_so(tmp_path, level, task):
    """An API call that raised inside the model, which caught it and went on: the exception the model
    caught is the one it catches without the tool (type and message), the step is written, the call's
    entry has its inputs and ``"error": "the call raised {type}: ..."`` and no ``output``, and
    ``first-diff`` against a run whose call did not raise names that call and says it raised."""
    from test_compare import cli

    x = Tensor(np.ones((2, 4), np.float32))
    runs = {}
    for name, rows, tool in (("off", 5, False), ("bad", 5, True), ("good", 4, True)):
        ms.set_seed(3)
        net = _Matmul(rows)
        debugger = None
        if tool:
            debugger = PrecisionDebugger(dump_path=str(tmp_path / name), task=task, level=level)
            debugger.start(net)
        loss = net(x)
        if debugger is not None:
            debugger.stop()
            debugger.step()
            debugger.close()
        runs[name] = (loss.asnumpy().tobytes(), net.caught)
    assert runs["off"][1] and runs["off"] == runs["bad"]  # loss and the exception caught
    assert not runs["good"][1]
    data = msprobe.dump.load(only_step_dir(str(tmp_path / "bad"), 0)).data
    raised = data["Functional.matmul.0.forward"]
    exc_type, message = runs["off"][1][0]
    assert raised["error"] == f"the call raised {exc_type}: {message.splitlines()[0]}"
    assert "output" not in raised and [a["shape"] for a in raised["input_args"]] == [[2, 4], [5, 3]]
    assert data["Functional.relu.0.forward"]["output"]  # recording went on after it
    out = cli("first-diff", only_step_dir(str(tmp_path / "bad"), 0),
              only_step_dir(str(tmp_path / "good"), 0)).stdout.splitlines()
    assert "Functional.matmul.0.forward" in out[0], out
    assert f"the target run's call raised {exc_type}" in out[1], out
