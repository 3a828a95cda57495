"""Between two dumped steps the capture stays installed ("parked"): the API wrappers, jit capture,
Primitive hooks and in-place guard pass every call straight through while not recording; stop()
removes them when the next step is not dumped, and they also go at close(), when the debugger is
collected, when start() gets another model, or another debugger starts. The Cell hooks (L0/mix) are
removed at every stop(): a jit function calling the Cell would compile them into its graph. What
the user computes between the steps (new jit functions, bytecode jit, a jit function calling the
Cell, Cell forwards, gradients, errors) is exactly what it is without the tool. Real MindSpore, CPU."""
from __future__ import annotations

import gc
import json
import os
import weakref

import mindspore as ms
import pytest
from mindspore import mint, nn, ops

import msprobe.dump
from mindspore.ops import relu as early_relu  # bound before start(): listed in coverage.json
from conftest import build_mlp, hook_count, mlp_batch, only_step_dir

ORIGINAL_RELU = ops.relu


def _user_work(net, x, y):
    """What a user may run between two dumped steps, compiled afresh each call: an ast-jit
    function, a bytecode-jit function, a jit function calling the Cell, the Cell's PyNative forward,
    its loss and gradients. Returns the numpy results."""
    @ms.jit(capture_mode="ast")
    def ast_fn(a):
        return ops.relu(a) * 2 + ops.sin(a)

    @ms.jit(capture_mode="bytecode")
    def bytecode_fn(a):
        return mint.mul(ops.relu(a), 3.0) + ops.cos(a)

    @ms.jit
    def jit_forward(a):
        return net(a)

    grad_fn = ms.value_and_grad(lambda a, b: early_relu(ops.mse_loss(net(a), b)), None,
                                net.trainable_params())
    loss, grads = grad_fn(x, y)
    out = [ast_fn(x), bytecode_fn(x), jit_forward(x), net(x), x.exp().sum(), loss] + list(grads)
    return [t.asnumpy() for t in out]


def _user_errors(x):
    """``(type, message)`` of failing calls through a listed function, a Tensor method and a Mint
    function (shapes that do not fit)."""
    out = []
    for call in (lambda: ops.reshape(x, (7,)), lambda: x.reshape((5, 3)), lambda: mint.matmul(x, x)):
        try:
            call()
        except Exception as exc:  # the user's own error: compared with the tool-off one
            out.append((type(exc), str(exc).split("\n", 1)[0]))
        else:
            out.append(None)
    return out


@pytest.mark.parametrize("level", ["L1", "mix", "L0"])
def test_between_dumped_steps_results_and_errors_are_the_tool_off_ones(make_debugger, dump_dir, level):
    x, y = mlp_batch()
    reference = _user_work(build_mlp(), x, y)  # tool off: no debugger exists yet
    ref_errors = _user_errors(x)
    assert all(e is not None for e in ref_errors)
    net = build_mlp()
    base_hooks, prim_type = hook_count(net), type(net.fc1.matmul)
    debugger = make_debugger(task="statistics", level=level, step=[0, 1])
    debugger.start(net)
    net(x)
    debugger.stop()
    debugger.step()
    # parked: the capture is still installed (else this test could not fail), and passes through
    if level in ("L1", "mix"):
        assert ops.relu.__wrapped__ is ORIGINAL_RELU and type(net.fc1.matmul) is not prim_type
    assert hook_count(net) == base_hooks  # the Cell hooks are removed at every stop()
    got = _user_work(net, x, y)
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    assert _user_errors(x) == ref_errors
    debugger.start(net)
    net(x)
    debugger.stop()                   # step 1 is the last dumped step: everything is removed
    assert ops.relu is ORIGINAL_RELU and hook_count(net) == base_hooks
    debugger.step()
    first = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    second = msprobe.dump.load(only_step_dir(dump_dir, 1)).data
    assert list(first) == list(second) and first  # nothing of the work between the steps was recorded
    assert not any(name.startswith("Jit.") for name in second)


def test_parked_from_one_dumped_step_to_the_next_and_removed_after_the_last(make_debugger, dump_dir):
    net = build_mlp()
    x, _ = mlp_batch()
    prim_type = type(net.fc1.matmul)
    base_hooks = hook_count(net)
    gen0 = gc.get_threshold()
    debugger = make_debugger(task="statistics", level="mix", step=[0, 1, 3])
    seen = []
    for step in range(5):
        debugger.start(net)
        net(x)
        debugger.stop()
        assert gc.get_threshold() == gen0  # the GC window is closed at every stop()
        seen.append((ops.relu is not ORIGINAL_RELU, type(net.fc1.matmul) is not prim_type))
        assert hook_count(net) == base_hooks  # Cell hooks: removed at every stop()
        debugger.step()
    # parked after steps 0 (1 is dumped); removed after 1 (2 is not), 3 (the last); 2 and 4 idle
    assert seen == [(True, True)] + [(False, False)] * 4
    assert sorted(os.listdir(dump_dir)) == ["step0", "step1", "step3"]
    for step in (0, 1, 3):
        data = msprobe.dump.load(only_step_dir(dump_dir, step)).data
        assert "Functional.relu.0.forward" in data and "Cell.fc1.Dense.forward.0" in data


class EarlyBound(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 4)

    def construct(self, x):
        return early_relu(self.fc(x))  # the module-level name bound before start()


def test_coverage_lists_the_same_gaps_at_every_parked_step(make_debugger, dump_dir):
    ms.set_seed(0)
    net = EarlyBound()
    x, _ = mlp_batch()
    debugger = make_debugger(task="statistics", level="L1", step=[0, 1, 2])
    for _ in range(3):
        debugger.start(net)
        net(x)
        debugger.stop()
        debugger.step()
    listed = []
    for step in range(3):
        with open(os.path.join(only_step_dir(dump_dir, step), "coverage.json"), encoding="utf-8") as f:
            listed.append(json.load(f)["not_captured"])
    assert listed[0] == listed[1] == listed[2]
    assert {i["name"] for i in listed[0] if i["module"] == __name__} == {"early_relu", "ORIGINAL_RELU"}


def test_the_coverage_scan_runs_when_the_capture_is_installed_not_at_each_parked_step(
        make_debugger, dump_dir, monkeypatch):
    """The names bound before ``start()`` are found by one scan when the capture is installed; the
    steps it stays parked for list the same names without scanning again, and a step that installs
    the capture again (after a step not dumped) scans again."""
    from msprobe.capture import coverage

    scans = []
    real_scan = coverage.stale_bindings

    def counting(*args, **kwargs):
        scans.append(1)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(coverage, "stale_bindings", counting)
    ms.set_seed(0)
    net = EarlyBound()
    x, _ = mlp_batch()
    debugger = make_debugger(task="statistics", level="L1", step=[0, 1, 2, 4])
    seen = []
    for step in range(5):
        debugger.start(net)
        net(x)
        debugger.stop()
        debugger.step()
        seen.append(len(scans))
    assert seen == [1, 1, 1, 1, 2]  # installed at steps 0 and 4; parked at 1 and 2; 3 not dumped
    listed = []
    for step in (0, 1, 2, 4):
        with open(os.path.join(only_step_dir(dump_dir, step), "coverage.json"), encoding="utf-8") as f:
            listed.append(f.read())
    assert listed[0] == listed[1] == listed[2] == listed[3]
    assert '"early_relu"' in listed[0]


def test_another_model_moves_the_hooks(make_debugger):
    a, b = build_mlp(0), build_mlp(1)
    prim_type = type(a.fc1.matmul)
    x, _ = mlp_batch()
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start(a)
    a(x)
    debugger.stop()
    debugger.step()
    assert type(a.fc1.matmul) is not prim_type
    debugger.start(b)
    assert type(a.fc1.matmul) is prim_type and type(b.fc1.matmul) is not prim_type
    b(x)
    debugger.stop()
    debugger.step()


def test_a_collected_or_closed_debugger_gives_everything_back(tmp_path):
    from msprobe.mindspore import PrecisionDebugger

    net = build_mlp()
    prim_type = type(net.fc1.matmul)
    x, _ = mlp_batch()

    def parked(path):
        debugger = PrecisionDebugger(dump_path=str(path), level="mix")
        debugger.start(net)
        net(x)
        debugger.stop()
        debugger.step()
        assert ops.relu is not ORIGINAL_RELU and type(net.fc1.matmul) is not prim_type
        return debugger

    ref = weakref.ref(parked(tmp_path / "a").service)
    gc.collect()
    assert ref() is None and ops.relu is ORIGINAL_RELU and type(net.fc1.matmul) is prim_type
    debugger = parked(tmp_path / "b")
    debugger.service.close()
    assert ops.relu is ORIGINAL_RELU and type(net.fc1.matmul) is prim_type


def test_a_second_debugger_wraps_mindspore_own_functions(tmp_path):
    from msprobe.mindspore import PrecisionDebugger

    x, _ = mlp_batch()
    first = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1")
    first.start()
    ops.relu(x)
    first.stop()
    first.step()
    assert ops.relu.__wrapped__ is ORIGINAL_RELU
    second = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1")
    second.start()                    # the first debugger's parked wrappers are removed first
    assert ops.relu.__wrapped__ is ORIGINAL_RELU
    ops.relu(x)
    second.stop()
    second.step()
    second.service.close()
    assert ops.relu is ORIGINAL_RELU
    first.service.close()
    assert ops.relu is ORIGINAL_RELU
    for name in ("a", "b"):
        assert list(msprobe.dump.load(only_step_dir(tmp_path / name, 0)).data) == ["Functional.relu.0.forward"]


def test_renumbering_to_a_step_not_dumped_removes_the_parked_capture(make_debugger):
    x, _ = mlp_batch()
    debugger = make_debugger(task="statistics", level="L1", step=[0, 1])
    debugger.start()
    ops.relu(x)
    debugger.stop()
    assert ops.relu is not ORIGINAL_RELU
    debugger.set_init_step(7)
    assert ops.relu is ORIGINAL_RELU


def test_a_dropped_model_takes_its_parked_primitive_hooks_with_it(make_debugger):
    """The model is dropped between two dumped steps: the parked Primitive hooks (which hold its
    Primitives) are removed, and its Primitives are collected."""
    net = build_mlp()
    x, _ = mlp_batch()
    debugger = make_debugger(task="statistics", level="L1", step=[0, 1])
    debugger.start(net)
    net(x)
    debugger.stop()
    debugger.step()
    prim = weakref.ref(net.fc1.matmul)
    assert type(prim()).__call__ is not type(prim()).__mro__[1].__call__  # hooked (parked)
    del net
    gc.collect()
    assert prim() is None and ops.relu is ORIGINAL_RELU
