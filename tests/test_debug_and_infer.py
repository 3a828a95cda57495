"""Debug-level ``save()``, custom APIs, inference ``token_range``, ``rank_id`` and the editable
``support_wrap_ops.yaml`` (seed: save / register_custom_api / restore_custom_api /
推理模型采集指定token_range / 修改API支持列表).

Real MindSpore (CPU, PyNative, blocking launch), no mocks.
"""
from __future__ import annotations

import logging
import os
import types

import mindspore as ms
import numpy as np
import pytest
import yaml
from mindspore import Tensor, nn, ops

ms.set_device("CPU")
ms.runtime.launch_blocking()

import msprobe.capture.api as api_module  # noqa: E402
from msprobe.engine.config import ConfigError  # noqa: E402
from msprobe.dump import iter_step_dirs, load  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402


from conftest import write_config_with_dump as _write_config  # noqa: E402


def _debugger(tmp_path, **fields) -> PrecisionDebugger:
    return PrecisionDebugger(_write_config(tmp_path, **fields))


def _steps(tmp_path):
    return list(iter_step_dirs(os.path.join(str(tmp_path), "dump")))


def _only(tmp_path):
    dirs = _steps(tmp_path)
    assert len(dirs) == 1, dirs
    return load(dirs[0][2])


W = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
XV = np.array([0.5, 1.0, 2.0, -4.0], np.float32)


# ================================================================================ debug level save()
def _train_with_saves(debugger):
    """y = x * w is saved (plus scalars and a nested structure); loss = sum(y * 3), so dL/dy = 3."""
    w = Tensor(W)

    def loss_fn(x):
        y = x * w
        debugger.save(y, "y")
        debugger.save(7, "n")
        debugger.save(2.5, "f")
        debugger.save("hello", "s")
        debugger.save([y, (1, "a"), {"k": y, "z": 0.25}], "nest")
        debugger.save(y, "y")  # second call of the same name in the step
        return (y * 3).sum()

    return ms.grad(loss_fn)(Tensor(XV))


def test_debug_save_statistics(tmp_path):
    debugger = _debugger(tmp_path, level="debug")
    grad = _train_with_saves(debugger)
    np.testing.assert_allclose(grad.asnumpy(), 3 * W)
    debugger.step()
    (step, rank, path), = _steps(tmp_path)
    assert (step, rank) == (0, f"proc{os.getpid()}")
    assert os.path.isfile(os.path.join(path, "debug.json"))
    assert not os.path.exists(os.path.join(path, "dump.json"))
    assert not os.path.exists(os.path.join(path, "stack.json"))
    data = load(path).data
    assert set(data) == {"y.0.debug", "y.1.debug", "y_grad.0.debug", "y_grad.1.debug", "n.0.debug",
                         "f.0.debug", "s.0.debug", "nest.0.debug", "nest_grad.0.debug"}
    y = XV * W
    leaf = data["y.0.debug"]
    assert leaf["type"] == "mindspore.Tensor" and leaf["shape"] == [4] and leaf["dtype"] == "Float32"
    assert leaf["Max"] == pytest.approx(y.max()) and leaf["Min"] == pytest.approx(y.min())
    assert leaf["Mean"] == pytest.approx(y.astype(np.float64).mean())
    assert leaf["Norm"] == pytest.approx(np.linalg.norm(y.astype(np.float64)))
    assert "data_name" not in leaf
    assert data["n.0.debug"] == {"type": "int", "value": 7}
    assert data["f.0.debug"] == {"type": "float", "value": 2.5}
    assert data["s.0.debug"] == {"type": "str", "value": "hello"}
    nest = data["nest.0.debug"]
    assert nest[0]["Max"] == leaf["Max"] and nest[2]["k"]["Min"] == leaf["Min"]
    assert nest[1] == [{"type": "int", "value": 1}, {"type": "str", "value": "a"}]
    assert nest[2]["z"] == {"type": "float", "value": 0.25}
    for g in (data["y_grad.0.debug"], data["y_grad.1.debug"]):
        assert (g["Max"], g["Min"], g["Mean"]) == (3.0, 3.0, 3.0)
    ngrad = data["nest_grad.0.debug"]
    assert ngrad[1] == [None, None] and ngrad[2]["z"] is None
    assert ngrad[0]["Max"] == 3.0 and ngrad[2]["k"]["Min"] == 3.0


def test_debug_save_tensor_files_and_per_step_counters(tmp_path):
    debugger = _debugger(tmp_path, level="debug", task="tensor")
    for _ in range(2):
        _train_with_saves(debugger)
        debugger.step()
    dirs = _steps(tmp_path)
    assert [d[0] for d in dirs] == [0, 1]
    for _, _, path in dirs:
        dump = load(path)
        # counters restart at 0 in every step
        assert {"y.0.debug", "y.1.debug", "nest.0.debug"} <= set(dump.data)
        assert "y.2.debug" not in dump.data
        files = set(os.listdir(os.path.join(path, "dump_tensor_data")))
        assert files == {"y.0.debug.npy", "y.1.debug.npy", "y_grad.0.debug.npy", "y_grad.1.debug.npy",
                         "nest.0.debug.0.npy", "nest.0.debug.2.k.npy",
                         "nest_grad.0.debug.0.npy", "nest_grad.0.debug.2.k.npy"}
        assert dump.data["nest.0.debug"][2]["k"]["data_name"] == "nest.0.debug.2.k.npy"
        np.testing.assert_array_equal(dump.load_tensor(dump.data["y.1.debug"]), XV * W)
        np.testing.assert_array_equal(dump.load_tensor(dump.data["nest.0.debug"][2]["k"]), XV * W)
        np.testing.assert_array_equal(dump.load_tensor(dump.data["y_grad.0.debug"]), np.full(4, 3, np.float32))
        np.testing.assert_array_equal(dump.load_tensor(dump.data["nest_grad.0.debug"][0]),
                                      np.full(4, 3, np.float32))


def test_debug_save_backward_false(tmp_path):
    debugger = _debugger(tmp_path, level="debug")
    w = Tensor(W)

    def loss_fn(x):
        y = x * w
        debugger.save(y, "y", save_backward=False)
        return y.sum()

    ms.grad(loss_fn)(Tensor(XV))
    debugger.step()
    assert set(_only(tmp_path).data) == {"y.0.debug"}


def test_debug_save_only_on_configured_steps(tmp_path):
    debugger = _debugger(tmp_path, level="debug", step=[1])
    for step in range(3):
        debugger.save(Tensor(XV) * step, "x")
        debugger.step()
    (step, _, path), = _steps(tmp_path)
    assert step == 1
    assert load(path).data["x.0.debug"]["Max"] == pytest.approx(XV.max())


@pytest.mark.parametrize("args,problem", [
    ((Tensor(XV), 3), "name"),
    ((object(), "v"), "object"),
    ((None, "v"), "NoneType"),
    (([Tensor(XV), object()], "v"), "object"),
    (({1: Tensor(XV)}, "v"), "key"),
    ((Tensor(XV), "v", "yes"), "save_backward"),
])
def test_debug_save_bad_arguments_warn_and_skip(tmp_path, caplog, args, problem):
    debugger = _debugger(tmp_path, level="debug")
    w = Tensor(W)

    def loss_fn(x):
        y = x * w
        debugger.save(*args)
        return y.sum()

    with caplog.at_level(logging.WARNING, logger="msprobe"):
        grad = ms.grad(loss_fn)(Tensor(XV))  # training continues
    np.testing.assert_allclose(grad.asnumpy(), W)
    debugger.step()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "save" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert problem in warnings[0].getMessage()
    for _, _, path in _steps(tmp_path):
        assert load(path).data == {}


def test_debug_save_refusal_names_the_name_once_and_only_in_dumped_steps(tmp_path, caplog):
    """A refused save() names its ``name`` and is said once, not at every call, nor in steps that are
    not dumped."""
    debugger = _debugger(tmp_path, level="debug", step=[1, 2])
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for _ in range(3):
            debugger.save([Tensor(XV), object()], "act")
            debugger.save([Tensor(XV), object()], "act")
            debugger.step()
    said = [r.getMessage() for r in caplog.records if "save" in r.getMessage()]
    assert said == ["msprobe: PrecisionDebugger.save(..., 'act') refused: variable has an element of type "
                    "object; allowed: mindspore.Tensor, int, float, str, or list/tuple/dict of them (said "
                    "once for this name; nothing is recorded for it while the problem lasts)"]


def test_save_ignored_outside_debug_level(tmp_path, caplog):
    debugger = _debugger(tmp_path, level="L1")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        debugger.save(Tensor(XV), "x")
    assert _steps(tmp_path) == []


# ================================================================================ custom APIs
def _matmul_loss(x, w):
    return ops.matmul(x, w).sum()


def test_register_custom_api_mindspore_ops(tmp_path):
    original = ops.matmul
    debugger = _debugger(tmp_path, level="L1")
    debugger.register_custom_api(ops, "matmul", "MyPrefix")
    assert ops.matmul is not original and ops.matmul.__wrapped__ is original
    x = np.random.RandomState(0).randn(2, 3).astype(np.float32)
    w = np.random.RandomState(1).randn(3, 4).astype(np.float32)
    try:
        debugger.start()
        gx, gw = ms.grad(_matmul_loss, grad_position=(0, 1))(Tensor(x), Tensor(w))
        debugger.stop()
        debugger.step()
    finally:
        debugger.restore_custom_api(ops, "matmul")
    assert ops.matmul is original
    data = _only(tmp_path).data
    assert {n for n in data if "matmul" in n} == {"MyPrefix.matmul.0.forward", "MyPrefix.matmul.0.backward"}
    fwd, bwd = data["MyPrefix.matmul.0.forward"], data["MyPrefix.matmul.0.backward"]
    y = x @ w
    assert fwd["output"][0]["Max"] == pytest.approx(y.max(), rel=1e-6)
    assert fwd["output"][0]["shape"] == [2, 4]
    assert [a["shape"] for a in fwd["input_args"]] == [[2, 3], [3, 4]]
    assert bwd["input"][0]["Max"] == bwd["input"][0]["Min"] == 1.0  # d(sum)/dy
    assert bwd["output"][0]["Max"] == pytest.approx(gx.asnumpy().max(), rel=1e-6)
    assert bwd["output"][1]["Norm"] == pytest.approx(np.linalg.norm(gw.asnumpy().astype(np.float64)), rel=1e-6)
    # after restore, nothing is recorded under the custom prefix
    debugger.start()
    _matmul_loss(Tensor(x), Tensor(w))
    debugger.stop()
    debugger.step()
    step1 = load([d for d in _steps(tmp_path) if d[0] == 1][0][2]).data
    assert not any(n.startswith("MyPrefix.") for n in step1)
    assert "Functional.matmul.0.forward" in step1


def test_register_custom_api_user_module(tmp_path):
    mod = types.ModuleType("user_ops")

    def scale_shift(x, k, b=0.0):
        return x * k + b

    mod.scale_shift = scale_shift
    debugger = _debugger(tmp_path, level="L1")
    debugger.register_custom_api(mod, "scale_shift", "User")
    x = Tensor(XV)
    try:
        debugger.start()
        grad = ms.grad(lambda t: mod.scale_shift(t, 3.0, b=1.0).sum())(x)
        debugger.stop()
        debugger.step()
    finally:
        debugger.restore_custom_api(mod, "scale_shift")
    assert mod.scale_shift is scale_shift
    np.testing.assert_allclose(grad.asnumpy(), np.full(4, 3.0))
    data = _only(tmp_path).data
    # the Tensor ops inside the custom API are not recorded separately
    assert set(data) == {"User.scale_shift.0.forward", "User.scale_shift.0.backward",
                         "Tensor.sum.0.forward", "Tensor.sum.0.backward"}
    fwd = data["User.scale_shift.0.forward"]
    assert fwd["input_args"][1] == {"type": "float", "value": 3.0}
    assert fwd["input_kwargs"] == {"b": {"type": "float", "value": 1.0}}
    assert fwd["output"][0]["Max"] == pytest.approx((XV * 3 + 1).max())
    bwd = data["User.scale_shift.0.backward"]
    assert bwd["output"][0]["Max"] == bwd["output"][0]["Min"] == 3.0


def test_register_custom_api_while_started_restores_originals(tmp_path):
    """Registering inside a start/stop window (over the yaml wrapper of ops.matmul) still unwinds to
    MindSpore's own function after stop + restore, in either order."""
    original = ops.matmul
    for restore_first in (False, True):
        # step 0 is the last dumped step: its stop() removes the yaml wrappers
        debugger = _debugger(tmp_path / str(restore_first), level="L1", step=[0])
        debugger.start()
        debugger.register_custom_api(ops, "matmul", "Late")
        ops.matmul(Tensor(np.ones((2, 2), np.float32)), Tensor(np.ones((2, 2), np.float32)))
        if restore_first:
            debugger.restore_custom_api(ops, "matmul")
            # while started, the support_wrap_ops.yaml wrapper is back in place
            ops.matmul(Tensor(np.ones((2, 2), np.float32)), Tensor(np.ones((2, 2), np.float32)))
            debugger.stop()
        else:
            debugger.stop()
            debugger.restore_custom_api(ops, "matmul")
        debugger.step()
        assert ops.matmul is original
        data = _only(tmp_path / str(restore_first)).data
        expected = {"Late.matmul.0.forward"} | ({"Functional.matmul.0.forward"} if restore_first else set())
        assert set(data) == expected


def test_register_custom_api_default_prefix_is_module_name(tmp_path):
    mod = types.ModuleType("user_ops")
    mod.double = lambda x: x + x
    debugger = _debugger(tmp_path, level="L1")
    debugger.register_custom_api(mod, "double")
    try:
        debugger.start()
        mod.double(Tensor(XV))
        debugger.stop()
        debugger.step()
    finally:
        debugger.restore_custom_api(mod, "double")
    assert set(_only(tmp_path).data) == {"user_ops.double.0.forward"}


def test_register_custom_api_errors(tmp_path):
    debugger = _debugger(tmp_path, level="L1")
    mod = types.ModuleType("empty_mod")
    with pytest.raises(ConfigError, match="missing_fn"):
        debugger.register_custom_api(mod, "missing_fn", "User")
    with pytest.raises(ConfigError, match="api_prefix"):
        debugger.register_custom_api(ops, "matmul", 5)
    assert not hasattr(mod, "missing_fn")
    debugger.restore_custom_api(mod, "missing_fn")  # nothing registered: does nothing


# ================================================================================ token_range
def _tiny_lm():
    models = pytest.importorskip("examples.models")
    models.set_seed(0)
    return models, models.TinyLM(vocab_size=12, d_model=16, n_heads=2, n_layers=1, seq_len=16)


def test_token_range_dumps_forward_passes_1_to_3(tmp_path):
    models, net = _tiny_lm()
    prompt = [1, 2, 3]
    # reference: the inputs of `head` in each of the 6 forward passes, without the tool
    seen = []
    handle = net.head.register_forward_pre_hook(lambda cell, args: seen.append(args[0].asnumpy().copy()))
    ids_ref = models.generate(net, prompt, 6)
    handle.remove()
    assert len(seen) == 6

    debugger = _debugger(tmp_path, level="L0", task="tensor")
    debugger.start(model=net, token_range=[1, 3])
    ids = models.generate(net, prompt, 6)
    debugger.stop()
    debugger.step()
    assert ids == ids_ref
    dump = _only(tmp_path)
    heads = sorted(n for n in dump.data if n.startswith("Cell.head.Dense.forward."))
    assert heads == ["Cell.head.Dense.forward.0", "Cell.head.Dense.forward.1", "Cell.head.Dense.forward.2"]
    # every sub-Cell runs once per pass: only call indices 0..2 anywhere
    assert {n.rsplit(".", 1)[-1] for n in dump.data} == {"0", "1", "2"}
    assert not any(".backward." in n for n in dump.data)
    for k in range(3):
        arr = dump.load_tensor(dump.data[f"Cell.head.Dense.forward.{k}"]["input_args"][0])
        np.testing.assert_array_equal(arr, seen[k + 1])  # pass k+1, context length 3 + k + 1
        assert arr.shape[1] == len(prompt) + k + 1


def test_token_range_l1(tmp_path):
    models, net = _tiny_lm()
    debugger = _debugger(tmp_path, level="L1")
    debugger.start(model=net, token_range=[2, 2])
    models.generate(net, [1, 2], 4)
    debugger.stop()
    debugger.step()
    data = _only(tmp_path).data
    # exactly one forward pass (pass 2, context 2 + 2 = 4 tokens): two embedding lookups, three
    # LayerNorms (ln1, ln2, ln_f), seven Dense MatMuls (q, k, v, proj, mlp x2, head)
    assert {n for n in data if ".gather." in n} == {"Primitive.gather.Gather.0.forward",
                                                    "Primitive.gather.Gather.1.forward"}
    assert {n for n in data if "LayerNorm" in n} == {f"Primitive.layer_norm.LayerNorm.{k}.forward"
                                                     for k in range(3)}
    assert {n for n in data if ".MatMul." in n} == {f"Primitive.matmul.MatMul.{k}.forward" for k in range(7)}
    assert data["Primitive.gather.Gather.0.forward"]["input_args"][1]["shape"] == [4]
    assert data["Primitive.matmul.MatMul.6.forward"]["output"][0]["shape"] == [4, 12]


@pytest.mark.parametrize("token_range", [[3, 1], [-1, 2], [1], [1, 2, 3], "1-3", [1.0, 2], [True, 2], 5])
def test_token_range_bad_values(tmp_path, token_range):
    debugger = _debugger(tmp_path, level="L0")
    net = nn.Dense(2, 2)
    with pytest.raises(ConfigError, match="token_range"):
        debugger.start(model=net, token_range=token_range)
    debugger.stop()


def test_token_range_needs_model(tmp_path):
    debugger = _debugger(tmp_path, level="L1")
    with pytest.raises(ConfigError, match="token_range"):
        debugger.start(token_range=[0, 1])
    debugger.stop()
    assert _steps(tmp_path) == []


# ================================================================================ rank_id
def test_rank_id_names_the_directory(tmp_path):
    debugger = _debugger(tmp_path, level="L1")
    debugger.start(rank_id=3)
    ops.relu(Tensor(XV))
    debugger.stop()
    debugger.step()
    (step, rank, path), = _steps(tmp_path)
    assert (step, rank) == (0, "rank3")
    assert set(load(path).data) == {"Functional.relu.0.forward"}


@pytest.mark.parametrize("rank_id", [-1, "a", True, 1.0])
def test_rank_id_invalid(tmp_path, rank_id):
    debugger = _debugger(tmp_path, level="L1")
    with pytest.raises(ConfigError, match="rank_id"):
        debugger.start(rank_id=rank_id)
    debugger.stop()
    assert _steps(tmp_path) == []


# ================================================================================ support_wrap_ops.yaml
def test_support_wrap_ops_edit_takes_effect(tmp_path, monkeypatch):
    with open(api_module.SUPPORT_WRAP_OPS, encoding="utf-8") as f:
        lists = yaml.safe_load(f)
    lists["ops"] = [name for name in lists["ops"] if name != "relu"]
    edited = tmp_path / "support_wrap_ops.yaml"
    edited.write_text(yaml.safe_dump(lists), encoding="utf-8")
    monkeypatch.setattr(api_module, "SUPPORT_WRAP_OPS", str(edited))

    debugger = _debugger(tmp_path, level="L1")
    debugger.start()
    y = ops.relu(Tensor(XV))
    ops.sigmoid(y)
    debugger.stop()
    debugger.step()
    assert set(_only(tmp_path).data) == {"Functional.sigmoid.0.forward"}

