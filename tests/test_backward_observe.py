"""The pieces backward capture reads the autograd graph with (msprobe.capture.backward), on real
MindSpore graphs built under ``ms.grad``: which tensors take a gradient, which edge of a one-node call
leads to which argument, which edges of a several-node call lead into its arguments."""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops

from msprobe.capture import backward

ms.set_device("CPU")

FLOATS = {ms.float16, ms.float32, ms.float64, ms.bfloat16}


def _definition(t) -> bool:
    """A floating-point tensor that is part of the graph being differentiated."""
    return isinstance(t, Tensor) and t.dtype in FLOATS and t._grad_node is not None and t._requires_grad


def _under_grad(body):
    """Run ``body(x, w)`` inside ``ms.grad`` (w.r.t. ``x`` and the Parameter ``w``); returns what
    ``body`` put in its result dict."""
    w = Parameter(Tensor(np.full((2, 3), 0.5, np.float32)), name="w")
    found = {}

    def f(x):
        found.update(body(x, w))
        return (x * w).sum()

    ms.grad(f, grad_position=0, weights=[w])(Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)))
    return found


def test_node_of_is_the_node_of_exactly_the_tensors_that_take_a_gradient():
    frozen = Parameter(Tensor(np.ones((2, 3), np.float32)), name="frozen", requires_grad=False)
    constant = Tensor(np.ones((2, 3), np.float32))

    def body(x, w):
        values = {
            "argument": x, "parameter": w, "frozen parameter": frozen, "constant": constant,
            "output": ops.sin(x), "float16 output": ops.cast(x, ms.float16) * 2,
            "float64 output": ops.cast(x, ms.float64) * 2, "bfloat16 output": ops.cast(x, ms.bfloat16) * 2,
            "int64 argmax (has a node)": ops.argmax(x * w), "int32 cast (has a node)": (x * w).astype(ms.int32),
            "constant times 2": constant * 2, "stop_gradient": ops.stop_gradient(x * w),
            "not a tensor": 3.0, "none": None,
        }
        return {name: (backward._node_of(v), _definition(v)) for name, v in values.items()}

    found = _under_grad(body)
    for name, (node, expected) in found.items():
        assert (node is not None) == expected, name
    assert found["int64 argmax (has a node)"][0] is None  # a node, but not a float gradient
    assert found["output"][0] is not None and found["parameter"][0].is_leaf()


def test_one_node_call_maps_each_edge_to_its_argument():
    def body(x, w):
        square = x * x  # one node, two edges into the same tensor: one per position
        product = ops.mul(x, w)
        alias = ops.cast(x, ms.float32)  # same dtype: MindSpore returns the argument itself
        result = {}
        for name, args, out in (("square", (x, x), square), ("product", (x, w), product),
                                ("alias", (x, ms.float32), alias)):
            targets = backward._targets(args)
            result[name] = backward._single_mapping([backward._node_of(out)], targets)
            result[name + " targets"] = [(i, k) for i, k, *_ in targets]
        return result

    found = _under_grad(body)
    assert found["square"] == [(0, (0, None)), (1, (1, None))]
    assert found["square targets"] == [(0, None), (1, None)]
    assert sorted(slot for _, slot in found["product"]) == [(0, None), (1, None)]
    assert found["alias"] is None  # the output is the argument: not a node of the call


def test_walk_finds_every_edge_of_the_call_into_its_argument():
    def body(x, w):
        before = x * 3  # made before the mark: not part of the call
        mark = backward.watermark(x)
        out = ops.sin(x) + ops.cos(x) * before  # the call: two of its nodes use x
        node = backward._node_of(out)
        x_key = backward._targets((x,))[0][4]
        found = backward.consumer_edges([node], {x_key[0]}, mark)
        return {"mark": mark, "edges": found, "x": x_key, "before": backward._node_of(before)._sequence_nr()}

    found = _under_grad(body)
    assert found["before"] < found["mark"]
    assert list(found["edges"]) == [found["x"]]
    edges = found["edges"][found["x"]]
    assert sorted(node.name() for node, _ in edges) == sorted(["Sin", "Cos"])


def test_first_grad_input_skips_arguments_without_a_gradient():
    constant = Tensor(np.ones((2, 3), np.float32))

    def body(x, w):
        return {"first": backward.first_grad_input((constant, 2, x, w)) is x,
                "none": backward.first_grad_input((constant, None))}

    found = _under_grad(body)
    assert found == {"first": True, "none": None}


def test_every_tensor_hook_the_tool_registers_is_removed(make_debugger):
    """MindSpore keeps an entry for each ``Tensor.register_hook`` until the handle is removed, even
    once the tensor is gone: the hooks the tool puts on the outputs of recorded calls (at mix: Cells
    whose outputs come from several nodes) are removed when the step ends; those on the Parameters
    are registered once and stay while the capture is parked for the next dumped step, and
    ``close()`` removes them."""
    import pytest

    from conftest import build_mlp, run_steps
    from mindspore.common.hook_handle import _TensorHookHandle

    registered, removed = [], []
    register, remove = Tensor.register_hook, _TensorHookHandle.remove

    def spy_register(self, hook):
        handle = register(self, hook)
        registered.append((handle.id, isinstance(self, Parameter)))
        return handle

    def spy_remove(self):
        removed.append(self.id)
        return remove(self)

    net = build_mlp()
    params = len(net.trainable_params())
    debugger = make_debugger(task="statistics", level="mix")   # every step dumped: parked between steps
    with pytest.MonkeyPatch.context() as mp:  # counts calls; MindSpore's functions still do the work
        mp.setattr(Tensor, "register_hook", spy_register)
        mp.setattr(_TensorHookHandle, "remove", spy_remove)
        run_steps(net, debugger, steps=2)
        on_outputs = [i for i, on_parameter in registered if not on_parameter]
        on_parameters = [i for i, on_parameter in registered if on_parameter]
        assert on_outputs and set(on_outputs) <= set(removed)
        assert len(on_parameters) == params and not set(on_parameters) & set(removed)
        debugger.close()
    assert registered and sorted(removed) == sorted(i for i, _ in registered)


class _Affine(ms.nn.Cell):
    """``x @ w + b``: two autograd nodes, so its backward is observed by walking them."""

    def __init__(self, seed: int):
        super().__init__()
        rng = np.random.RandomState(seed)
        self.w = Parameter(Tensor(rng.randn(4, 4).astype(np.float32)), name="w")
        self.b = Parameter(Tensor(rng.randn(4).astype(np.float32)), name="b")

    def construct(self, x):
        return ops.matmul(x, self.w) + self.b


class _Wrapper(ms.nn.Cell):
    """Passes its input straight to an inner Cell: the inner Cell's node that consumes ``x`` feeds
    the arguments of both calls, and both hook it."""

    def __init__(self):
        super().__init__()
        self.inner = _Affine(1)

    def construct(self, x):
        return ops.tanh(self.inner(x)) * 2


class _Nested(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = _Wrapper()
        self.head = _Affine(2)

    def construct(self, x):
        return self.head(self.block(x))


def _dump_nested_step(make_debugger, dump_path) -> tuple:
    """One L0 step of :class:`_Nested` dumped into ``dump_path``: ``(dump.json, node hooks)``, the
    node hooks being the runtime's per-node lists as the step's ``stop()`` left them."""
    import json
    import os

    from conftest import only_step_dir

    net = _Nested()
    debugger = make_debugger(task="statistics", level="L0", dump_path=dump_path)
    x = Tensor(np.random.RandomState(0).randn(3, 4).astype(np.float32))
    grad_fn = ms.value_and_grad(lambda a: net(a).sum(), None, net.trainable_params())
    debugger.start(net)
    grad_fn(x)
    debugger.stop()
    node_hooks = {key: list(hooks) for key, hooks in debugger.service.runtime.node_hooks.items()}
    debugger.step()
    with open(os.path.join(only_step_dir(dump_path, 0), "dump.json"), encoding="utf-8") as f:
        return json.load(f), node_hooks


def test_calls_hooking_the_same_node_share_one_mindspore_hook(make_debugger, tmp_path, monkeypatch):
    """A Cell handing its input to an inner Cell: the inner Cell's node consuming that input is
    hooked for both calls' backward ``output``, through one MindSpore hook on the node calling both
    in turn (MindSpore converts the node's gradients to Python once); the records are those of one
    MindSpore hook per call, in the same order."""
    shared, node_hooks = _dump_nested_step(make_debugger, str(tmp_path / "shared"))
    assert max(len(hooks) for hooks in node_hooks.values()) >= 2, node_hooks
    backward_entries = [name for name in shared["data"] if ".backward." in name]
    assert "Cell.block.inner._Affine.backward.0" in backward_entries
    assert "Cell.block._Wrapper.backward.0" in backward_entries

    monkeypatch.setattr(backward, "register_node_hook", lambda registry, node, hook: node.register_hook(hook))
    separate, node_hooks = _dump_nested_step(make_debugger, str(tmp_path / "separate"))
    assert not node_hooks  # every hook registered on its own
    assert list(shared["data"]) == list(separate["data"])
    assert shared["data"] == separate["data"]
