"""Every public name of a listed API is captured: ``mindspore.ops.functional`` (``F.cast``, as
mindformers and MindSpore's own layers call it) and the ``mindspore.ops.function.*`` modules hold the
same function objects as the ``mindspore.ops`` names in support_wrap_ops.yaml. Names that still
escape (a module whose attributes are not wrapped, a ``mint`` re-export of a function listed for
``ops`` only, a Primitive created at each call) are listed in coverage.json. Real MindSpore calls,
PyNative."""
from __future__ import annotations

import mindspore as ms
import mindspore.ops.auto_generate.gen_ops_def as gen_ops_def
import numpy as np
from mindspore import Tensor, mint, nn, ops
from mindspore.ops import functional as F
from mindspore.ops import operations as P
from mindspore.ops.function import array_func

import msprobe.dump
from conftest import only_step_dir
from msprobe.capture.api import alias_targets, load_api_list, resolve_targets
from msprobe.read.report import read_report


class ThroughAliases(nn.Cell):
    """Calls listed APIs only through names that are not the yaml's ``mindspore.ops.X``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)

    def construct(self, x):
        h = F.cast(self.fc(x), ms.float32)              # Functional.cast
        rows = F.shape(h)[0]                            # Functional.shape
        z = array_func.zeros_like(h)                    # Functional.zeros_like
        h = F.cast(h, ms.float32)                       # Functional.cast, second call
        return h + z + rows


class EscapingCalls(nn.Cell):
    """A listed function through a module whose attributes are not wrapped, a ``mint`` re-export of
    a function listed for ``ops`` only, and a Primitive made at each call: all are reported, none is
    recorded."""

    def construct(self, x):
        y = gen_ops_def.cast(x, ms.float32)
        y = mint.cumprod(y, 0)
        return P.Reshape()(y, (-1,))


def _run(make_debugger, net, x):
    debugger = make_debugger(task="statistics", level="L1", step=[0])  # its stop() ends the dump
    debugger.start(net)
    grad = ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())
    loss, grads = grad(x)
    debugger.stop()
    debugger.step()
    return loss, grads


def test_functional_and_function_module_names_are_recorded(make_debugger, dump_dir):
    ms.set_seed(0)
    net = ThroughAliases()
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    loss, _ = _run(make_debugger, net, x)
    d = only_step_dir(dump_dir, 0)
    data = msprobe.dump.load(d).data
    forward = sorted(k for k in data if k.endswith(".forward") and k.startswith("Functional."))
    assert forward == ["Functional.cast.0.forward", "Functional.cast.1.forward",
                       "Functional.shape.0.forward", "Functional.zeros_like.0.forward"]
    first = data["Functional.cast.0.forward"]
    assert first["input_args"][0]["shape"] == [2, 4] and first["output"][0]["dtype"] == "Float32"
    assert data["Functional.shape.0.forward"]["output"][0]["value"] == 2
    # nothing ThroughAliases calls escaped (this module's other Cell is reported, see below)
    reported = [i["name"] for i in read_report(d, "coverage.json")["not_captured"]]
    assert all(name.startswith(("gen_ops_def.", "mint.cumprod", "Reshape() in EscapingCalls"))
               for name in reported)
    # the wrappers are gone after stop(): every name is MindSpore's own object again
    assert F.cast is ops.cast and array_func.zeros_like is ops.zeros_like and F.shape is ops.shape
    assert not hasattr(F.cast, "__wrapped__")


def test_gradients_through_aliases_are_unchanged(make_debugger, dump_dir):
    x = Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    results = []
    for tool in (False, True):
        ms.set_seed(3)
        net = ThroughAliases()
        if tool:
            loss, grads = _run(make_debugger, net, x)
        else:
            loss, grads = ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())(x)
        results.append([loss.asnumpy().tobytes()] + [g.asnumpy().tobytes() for g in grads])
    assert results[0] == results[1]


def test_mindspore_internal_calls_through_module_globals_are_not_recorded(make_debugger, dump_dir):
    """``ops.function.math_func`` functions call each other through their module globals; with the
    globals wrapped, such a call inside an unlisted function must stay unrecorded."""
    x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start()
    expected = ops.cov(x).asnumpy()  # math_func.cov (not listed) calls math_func globals internally
    debugger.stop()
    debugger.step()
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    internal = [k for k in data if not k.startswith(("Tensor.", "Functional.cov."))]
    assert internal == [], internal
    np.testing.assert_array_equal(ops.cov(x).asnumpy(), expected)


def test_every_public_binding_of_a_listed_function_is_a_target():
    """Within a namespace family (Functional: ops, ops.functional, ops.function.*; Mint;
    MintFunctional) every name of a function listed for that family is wrapped."""
    targets = resolve_targets(load_api_list())
    wrapped = {(id(owner), attr) for owner, attr, _ in targets + alias_targets(targets)}
    listed = {}  # family prefix -> ids of the functions listed for it
    for owner, attr, api in targets:
        if not isinstance(owner, type):
            listed.setdefault(api.partition(".")[0], set()).add(id(getattr(owner, attr)))
    missing = []
    for module, family in ((F, "Functional"), (ops, "Functional"), (array_func, "Functional"),
                           (mint, "Mint"), (mint.nn.functional, "MintFunctional")):
        for attr, value in vars(module).items():
            if not attr.startswith("_") and id(value) in listed[family] and (id(module), attr) not in wrapped:
                missing.append(f"{module.__name__}.{attr}")
    assert missing == []
    aliases = {(owner.__name__, attr): api for owner, attr, api in alias_targets(targets)}
    assert aliases[("mindspore.ops.functional", "cast")] == "Functional.cast"
    assert aliases[("mindspore.ops.function.array_func", "zeros_like")] == "Functional.zeros_like"


def test_escaping_calls_are_listed_in_coverage(make_debugger, dump_dir):
    net = EscapingCalls()
    x = Tensor(np.ones((2, 3), np.float32))
    debugger = make_debugger(task="statistics", level="L1", step=[0])  # its stop() ends the dump
    debugger.start(net)
    net(x)
    debugger.stop()
    debugger.step()
    d = only_step_dir(dump_dir, 0)
    data = msprobe.dump.load(d).data
    assert not any(k.startswith(("Functional.cast", "Functional.cumprod", "Mint.", "Primitive."))
                   for k in data)  # the gaps are real
    items = {i["name"]: i for i in read_report(d, "coverage.json")["not_captured"]}
    cast = items["gen_ops_def.cast"]
    assert cast["api"] == "Functional.cast" and cast["call_as"] == "mindspore.ops.cast"
    assert cast["module"] == __name__ and "not wrapped" in cast["reason"]
    cumprod = items["mint.cumprod"]
    assert mint.cumprod is ops.cumprod and cumprod["call_as"] == "mindspore.ops.cumprod"
    assert "not in that namespace's list" in cumprod["reason"]
    (reshape,) = [i for name, i in items.items() if name.startswith("Reshape() in EscapingCalls.construct")]
    assert reshape["api"] == "Primitive.Reshape" and "__init__" in reshape["reason"]
    line = EscapingCalls.construct.__code__.co_firstlineno + 3
    assert f"test_api_aliases.py:{line})" in reshape["name"]
