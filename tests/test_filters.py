"""Entry selection and data shaping of config.json: ``list``, ``scope``, ``data_mode``, ``tensor_list``,
``extra_info``, task ``structure``, ``async_dump``, ``precision`` (README "Configuration").

Real MindSpore (CPU, PyNative, blocking launch), no mocks. Every filter test asserts the exact set of
entries written, on a three-Dense network whose call order is known:

forward (L1, with start(model) so Primitives are hooked)::

    fc1: Primitive.shape_op.Shape.0, Primitive.matmul.MatMul.0, Primitive.bias_add.BiasAdd.0
    Functional.relu.0
    fc2: Primitive.shape_op.Shape.1, Primitive.matmul.MatMul.1, Primitive.bias_add.BiasAdd.1
    Mint.mul.0
    fc3: Primitive.shape_op.Shape.2, Primitive.matmul.MatMul.2, Primitive.bias_add.BiasAdd.2
    Tensor.sum.0

Shape has no backward entry (its output is not a float tensor).
"""
from __future__ import annotations

import json
import logging
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, nn, ops

ms.set_device("CPU")
ms.runtime.launch_blocking()

from msprobe.engine.config import ConfigError  # noqa: E402
from msprobe.dump import iter_step_dirs, load  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402


# ---------------------------------------------------------------------------------------------- network
class FilterNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 6)
        self.fc2 = nn.Dense(6, 5)
        self.fc3 = nn.Dense(5, 3)

    def construct(self, x):
        h = ops.relu(self.fc1(x))
        h = mint.mul(self.fc2(h), 2.0)
        return self.fc3(h).sum()


def _build():
    ms.set_seed(7)
    return FilterNet()


X = Tensor(np.random.RandomState(3).randn(2, 4).astype(np.float32))

PRIMS = {1: ("Primitive.shape_op.Shape.0", "Primitive.matmul.MatMul.0", "Primitive.bias_add.BiasAdd.0"),
         2: ("Primitive.shape_op.Shape.1", "Primitive.matmul.MatMul.1", "Primitive.bias_add.BiasAdd.1"),
         3: ("Primitive.shape_op.Shape.2", "Primitive.matmul.MatMul.2", "Primitive.bias_add.BiasAdd.2")}
L1_ORDER = [*PRIMS[1], "Functional.relu.0", *PRIMS[2], "Mint.mul.0", *PRIMS[3], "Tensor.sum.0"]


def _api(calls, backward=True):
    """Forward (and backward, except Shape) entry names of API calls."""
    out = set()
    for c in calls:
        out.add(f"{c}.forward")
        if backward and "Shape" not in c:
            out.add(f"{c}.backward")
    return out


def _cell(*names, param_grads=True):
    out = set()
    for n in names:
        prefix = f"Cell.{n}.Dense"
        out |= {f"{prefix}.forward.0", f"{prefix}.backward.0"}
        if param_grads:
            out.add(f"{prefix}.parameters_grad.0")
    return out


from conftest import write_config_with_dump as _write_config  # noqa: E402


def _dump(tmp_path, level="L1", section=None, task="statistics", train=True, **fields):
    """One training step (forward + backward w.r.t. parameters) under the dump; returns the StepDump."""
    cfg = _write_config(tmp_path, task=task, level=level, section=section or {}, **fields)
    debugger = PrecisionDebugger(cfg)
    net = _build()
    try:
        debugger.start(net)
        if train:
            ms.value_and_grad(net, None, net.trainable_params())(X)
        else:
            net(X)
    finally:
        debugger.stop()
    debugger.step()
    dirs = list(iter_step_dirs(os.path.join(str(tmp_path), "dump")))
    assert len(dirs) == 1, dirs
    return load(dirs[0][2])


def _body_keys(dump):
    return {name: set(body) for name, body in dump.data.items()}


# ---------------------------------------------------------------------------------------------- baseline
@pytest.fixture(scope="module")
def all_l1(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("all_l1"), "L1")


@pytest.fixture(scope="module")
def all_l0(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("all_l0"), "L0")


def test_unfiltered_baselines(all_l1, all_l0):
    assert set(all_l1.data) == _api(L1_ORDER)
    assert set(all_l0.data) == _cell("fc1", "fc2", "fc3")


# ---------------------------------------------------------------------------------------------- list
def test_list_substring_l1(tmp_path):
    dump = _dump(tmp_path, "L1", {"list": ["relu"]})
    assert set(dump.data) == {"Functional.relu.0.forward", "Functional.relu.0.backward"}
    assert set(dump.data["Functional.relu.0.forward"]) == {"input_args", "input_kwargs", "output"}
    assert set(dump.data["Functional.relu.0.backward"]) == {"input", "output"}


def test_list_full_names_l1(tmp_path):
    dump = _dump(tmp_path, "L1", {"list": ["Mint.mul.0.forward", "Primitive.matmul.MatMul.2.backward"]})
    assert set(dump.data) == {"Mint.mul.0.forward", "Primitive.matmul.MatMul.2.backward"}


def test_list_l0(tmp_path):
    dump = _dump(tmp_path, "L0", {"list": ["Cell.fc1"]})
    assert set(dump.data) == _cell("fc1")
    assert set(dump.data["Cell.fc1.Dense.forward.0"]) == {"input_args", "input_kwargs", "output", "parameters"}
    assert set(dump.data["Cell.fc1.Dense.parameters_grad.0"]) == {"weight", "bias"}


def test_list_mix_expands_matching_cell(tmp_path):
    """In mix, a list item matching a Cell records the Cell and every API/Primitive run inside it."""
    dump = _dump(tmp_path, "mix", {"list": ["fc1"]})
    assert set(dump.data) == _cell("fc1") | _api(PRIMS[1])


class _Outer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = nn.SequentialCell([nn.Dense(4, 5), nn.ReLU()])
        self.fc = nn.Dense(5, 2)

    def construct(self, x):
        return self.fc(ops.sigmoid(self.block(x))).sum()


def _outer_dump(tmp_path, level: str, names: list):
    """One training step of ``_Outer`` with ``list: names``; returns the step's StepDump."""
    debugger = PrecisionDebugger(_write_config(tmp_path, level=level, section={"list": names}))
    ms.set_seed(1)
    net = _Outer()
    debugger.start(net)
    ms.value_and_grad(net, None, net.trainable_params())(X)
    debugger.stop()
    debugger.step()
    (_, _, path), = iter_step_dirs(os.path.join(str(tmp_path), "dump"))
    return load(path)


def test_list_mix_expands_nested_cells(tmp_path):
    """The expansion covers sub-Cells (with their parameter gradients) and their Primitives."""
    dump = _outer_dump(tmp_path, "mix", ["block"])
    fb = lambda p: {f"{p}.forward.0", f"{p}.backward.0"}  # noqa: E731
    assert set(dump.data) == (
        fb("Cell.block.SequentialCell") | fb("Cell.block.0.Dense") | fb("Cell.block.1.ReLU")
        | {"Cell.block.0.Dense.parameters_grad.0"}
        | _api(["Primitive.shape_op.Shape.0", "Primitive.matmul.MatMul.0", "Primitive.bias_add.BiasAdd.0",
                "Primitive.relu.ReLU.0"]))


def test_filtered_cell_keeps_its_ancestors_in_construct_json(tmp_path):
    """README "Configuration": construct.json has every Cell call, so the parent chain of a selected
    Cell is complete although its ancestors are not in dump.json; stack.json only has dumped entries."""
    dump = _outer_dump(tmp_path, "L0", ["Cell.block.0.Dense"])
    assert set(dump.data) == {"Cell.block.0.Dense.forward.0", "Cell.block.0.Dense.backward.0",
                              "Cell.block.0.Dense.parameters_grad.0"}
    assert dump.construct["Cell.block.0.Dense.forward.0"] == "Cell.block.SequentialCell.forward.0"
    assert dump.construct["Cell.block.SequentialCell.forward.0"] is None
    assert dump.construct["Cell.block.0.Dense.backward.0"] == "Cell.block.SequentialCell.backward.0"
    assert set(dump.stacks) == {"Cell.block.0.Dense.forward.0"}


def test_list_backward_name_l0(tmp_path):
    """A list naming only a Cell's backward entry records it and that Cell's parameter gradients."""
    dump = _dump(tmp_path, "L0", {"list": ["Cell.fc2.Dense.backward.0"]})
    assert set(dump.data) == {"Cell.fc2.Dense.backward.0", "Cell.fc2.Dense.parameters_grad.0"}


# ---------------------------------------------------------------------------------------------- scope
def test_scope_l1_inclusive_of_last_output_and_backward(tmp_path, all_l1):
    first, last = "Primitive.matmul.MatMul.0.forward", "Primitive.matmul.MatMul.1.forward"
    dump = _dump(tmp_path, "L1", {"scope": [first, last]})
    in_range = L1_ORDER[L1_ORDER.index("Primitive.matmul.MatMul.0"):L1_ORDER.index("Primitive.matmul.MatMul.1") + 1]
    assert set(dump.data) == _api(in_range)
    # the last API's forward output is kept (the reference tool drops it)
    assert set(dump.data[last]) == {"input_args", "input_kwargs", "output"}
    assert dump.data[last] == all_l1.data[last]
    assert set(dump.data["Primitive.matmul.MatMul.1.backward"]) == {"input", "output"}


def test_scope_l0_cells(tmp_path):
    dump = _dump(tmp_path, "L0", {"scope": ["Cell.fc2.Dense.forward.0", "Cell.fc3.Dense.forward.0"]})
    assert set(dump.data) == _cell("fc2", "fc3")
    dump = _dump(tmp_path / "b", "L0", {"scope": ["Cell.fc1.Dense.forward.0", "Cell.fc2.Dense.forward.0"]})
    assert set(dump.data) == _cell("fc1", "fc2")
    # the last Cell's own forward record is complete
    assert set(dump.data["Cell.fc2.Dense.forward.0"]) == {"input_args", "input_kwargs", "output", "parameters"}


def test_scope_mix_api_to_cell(tmp_path):
    dump = _dump(tmp_path, "mix", {"scope": ["Functional.relu.0.forward", "Cell.fc2.Dense.forward.0"]})
    assert set(dump.data) == _api(["Functional.relu.0", *PRIMS[2]]) | _cell("fc2")


def test_scope_mix_cell_to_api(tmp_path):
    dump = _dump(tmp_path, "mix", {"scope": ["Cell.fc2.Dense.forward.0", "Mint.mul.0.forward"]})
    assert set(dump.data) == _api([*PRIMS[2], "Mint.mul.0"]) | _cell("fc2")


def test_scope_and_list_combine(tmp_path):
    dump = _dump(tmp_path, "L1", {"scope": ["Primitive.matmul.MatMul.0.forward", "Mint.mul.0.forward"],
                                  "list": ["BiasAdd"]})
    assert set(dump.data) == _api(["Primitive.bias_add.BiasAdd.0", "Primitive.bias_add.BiasAdd.1"])


def test_scope_applies_in_every_step(tmp_path):
    cfg = _write_config(tmp_path, level="mix",
                        section={"scope": ["Functional.relu.0.forward", "Cell.fc2.Dense.forward.0"]})
    debugger = PrecisionDebugger(cfg)
    net = _build()
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    for _ in range(2):
        debugger.start(net)
        grad_fn(X)
        debugger.stop()
        debugger.step()
    dirs = list(iter_step_dirs(os.path.join(str(tmp_path), "dump")))
    assert [d[0] for d in dirs] == [0, 1]
    for _, _, path in dirs:
        assert set(load(path).data) == _api(["Functional.relu.0", *PRIMS[2]]) | _cell("fc2")


@pytest.mark.parametrize("level,scope,said", [
    ("L1", ["Functional.relu.9.forward", "Mint.mul.0.forward"], "scope start 'Functional.relu.9.forward'"),
    ("L0", ["Cell.fc1.Dense.forward.0", "Cell.fc9.Dense.forward.0"], "scope end 'Cell.fc9.Dense.forward.0'"),
    ("L1", ["Functional.relu.9.forward", "Functional.nope.0.forward"],
     "scope start 'Functional.relu.9.forward' and end 'Functional.nope.0.forward' matched no call"),
    ("L0", ["Cell.fc9.Dense.forward.0", "Cell.fc8.Dense.forward.0"],
     "scope start 'Cell.fc9.Dense.forward.0' and end 'Cell.fc8.Dense.forward.0' matched no call"),
    ("mix", ["Functional.relu.0.forward", "Cell.fc2.Dense.forward.0"], None),
    ("L0", ["Cell.fc2.Dense.forward.0", "Cell.fc3.Dense.forward.0"], None),
])
def test_scope_bound_matching_no_call_warns(tmp_path, caplog, level, scope, said):
    """A scope start or end (or both) that names no call of the step is said once at the step's end,
    naming each bound that matched nothing, like a list that names nothing; bounds that match say
    nothing."""
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _dump(tmp_path, level, {"scope": scope})
    warned = [r.getMessage() for r in caplog.records if "scope" in r.getMessage()]
    if said is None:
        assert warned == []
    else:
        assert len(warned) == 1 and said in warned[0] and "matched no call of this step" in warned[0]
        for i, which in enumerate(("start", "end")):  # each bound that matched nothing, and only those
            assert (f"{which} {scope[i]!r}" in warned[0]) == (scope[i] in said)


@pytest.mark.parametrize("level,scope,field", [
    ("L1", ["Cell.fc1.Dense.forward.0", "Mint.mul.0.forward"], "scope[0]"),
    ("L1", ["Functional.relu.0.forward", "Cell.fc1.Dense.forward.0"], "scope[1]"),
    ("L0", ["Cell.fc1.Dense.forward.0", "Functional.relu.0.forward"], "scope[1]"),
    ("mix", ["relu", "Cell.fc1.Dense.forward.0"], "scope[0]"),
    ("L1", ["Functional.relu.0.forward"], "scope"),
    ("L1", ["Functional.relu.0.forward"] * 3, "scope"),
])
def test_invalid_scope_refused(tmp_path, level, scope, field):
    cfg = _write_config(tmp_path, level=level, section={"scope": scope})
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(cfg)
    assert info.value.field == f"statistics.{field}"
    assert f"'statistics.{field}'" in str(info.value)


# ---------------------------------------------------------------------------------------------- data_mode
FWD_KEYS = {"input_args", "input_kwargs", "output"}


def _project(all_dump, allowed_fwd, allowed_bwd, level):
    """The expected bodies' keys: the unfiltered run's keys restricted by data_mode."""
    expected = {}
    for name, keys in _body_keys(all_dump).items():
        if ".parameters_grad." in name:
            kept = keys if allowed_bwd else set()
        elif ".backward" in name:
            kept = keys & allowed_bwd
        else:
            kept = keys & allowed_fwd
            if level == "L0" and "output" not in kept:
                kept = kept - {"parameters"}
        if kept:
            expected[name] = kept
    return expected


@pytest.mark.parametrize("modes,fwd,bwd", [
    (["forward"], {"input_args", "input_kwargs", "output", "parameters"}, set()),
    (["backward"], set(), {"input", "output"}),
    (["input"], {"input_args", "input_kwargs"}, {"input"}),
    (["output"], {"output", "parameters"}, {"output"}),
    (["forward", "input"], {"input_args", "input_kwargs"}, set()),
    (["forward", "output"], {"output", "parameters"}, set()),   # a Cell's parameters ride on its output
])
@pytest.mark.parametrize("level", ["L1", "L0"])
def test_data_mode(tmp_path, all_l1, all_l0, level, modes, fwd, bwd):
    dump = _dump(tmp_path, level, {"data_mode": modes})
    expected = _project(all_l1 if level == "L1" else all_l0, fwd, bwd, level)
    assert _body_keys(dump) == expected
    if modes == ["forward"]:
        assert not any(".backward" in n or "parameters_grad" in n for n in dump.data)
    if modes == ["backward"]:
        assert not any(".forward" in n for n in dump.data)
        if level == "L0":
            assert {n for n in dump.data if "parameters_grad" in n} == {
                f"Cell.{c}.Dense.parameters_grad.0" for c in ("fc1", "fc2", "fc3")}
    # the data that is kept is identical to the unfiltered run's
    base = all_l1 if level == "L1" else all_l0
    for name, body in dump.data.items():
        for key, value in body.items():
            assert value == base.data[name][key], (name, key)


# ---------------------------------------------------------------------------------------------- tensor_list
def test_tensor_list_saves_only_matching_entries(tmp_path):
    dump = _dump(tmp_path, "L1", {"tensor_list": ["relu"]})
    assert set(dump.data) == _api(L1_ORDER)
    files = set(os.listdir(os.path.join(dump.directory, "dump_tensor_data")))
    named = set()
    for name, body in dump.data.items():
        for leaf in _leaves(body):
            if "relu" in name:
                assert "data_name" in leaf, (name, leaf)
                named.add(leaf["data_name"])
                arr = dump.load_tensor(leaf)
                assert float(arr.max()) == pytest.approx(leaf["Max"])
            else:
                assert "data_name" not in leaf, (name, leaf)
    assert files == named and files
    assert all(f.startswith("Functional.relu.0.") for f in files)
    # the relu output file is exactly relu(fc1(x))
    net = _build()
    out_leaf = dump.data["Functional.relu.0.forward"]["output"][0]
    np.testing.assert_array_equal(dump.load_tensor(out_leaf), ops.relu(net.fc1(X)).asnumpy())


from conftest import leaves as _leaves  # noqa: E402


# ---------------------------------------------------------------------------------------------- extra_info, structure
def test_extra_info_false_writes_no_stack_or_construct(tmp_path):
    dump = _dump(tmp_path, "mix", extra_info=False)
    files = set(os.listdir(dump.directory))
    assert "dump.json" in files
    assert "stack.json" not in files and "construct.json" not in files
    assert dump.data


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_structure_task(tmp_path, level):
    dump = _dump(tmp_path, level, task="structure")
    assert dump.data == {}
    files = set(os.listdir(dump.directory))
    assert {"dump.json", "stack.json", "construct.json"} <= files
    assert "dump_tensor_data" not in files
    assert "Cell.fc2.Dense.forward.0" in dump.stacks
    assert dump.construct.get("Cell.fc2.Dense.forward.0", "missing") is None
    if level == "mix":
        assert dump.construct["Primitive.matmul.MatMul.1.forward"] == "Cell.fc2.Dense.forward.0"
        assert "Functional.relu.0.forward" in dump.stacks


# ---------------------------------------------------------------------------------------------- async_dump, precision
def test_async_dump_statistics(tmp_path, all_l1):
    dump = _dump(tmp_path, "L1", async_dump=True)
    assert dump.complete
    assert dump.data == all_l1.data


def test_async_dump_reads_nothing_before_stop(tmp_path, all_l0):
    """With async_dump the statistics are computed when the step is written (stop/step), not during
    the forward/backward pass: until stop() the journal holds only its header line."""
    cfg = _write_config(tmp_path, level="L0", async_dump=True)
    debugger = PrecisionDebugger(cfg)
    net = _build()
    debugger.start(net)
    ms.value_and_grad(net, None, net.trainable_params())(X)
    (_, _, path), = iter_step_dirs(os.path.join(str(tmp_path), "dump"))
    with open(os.path.join(path, "dump.journal"), encoding="utf-8") as f:
        assert len(f.readlines()) == 1
    debugger.stop()
    assert load(path).data == all_l0.data
    debugger.step()
    assert load(path).complete and load(path).data == all_l0.data


def test_async_dump_tensor_with_list(tmp_path):
    dump = _dump(tmp_path, "L1", {"list": ["relu"]}, task="tensor", async_dump=True)
    assert set(dump.data) == {"Functional.relu.0.forward", "Functional.relu.0.backward"}
    net = _build()
    leaf = dump.data["Functional.relu.0.forward"]["output"][0]
    np.testing.assert_array_equal(dump.load_tensor(leaf), ops.relu(net.fc1(X)).asnumpy())


def test_async_dump_refusals(tmp_path):
    cfg = _write_config(tmp_path, task="tensor", async_dump=True, section={"list": []})
    with pytest.raises(ConfigError, match="async_dump") as info:
        PrecisionDebugger(cfg)
    assert "list" in str(info.value)
    cfg = _write_config(tmp_path, async_dump=True, section={"summary_mode": "md5"})
    with pytest.raises(ConfigError, match="md5"):
        PrecisionDebugger(cfg)
    cfg = _write_config(tmp_path, async_dump=True, section={"summary_mode": ["max", "md5"]})
    with pytest.raises(ConfigError, match="md5"):
        PrecisionDebugger(cfg)


def test_precision_low_and_high_identical(tmp_path, all_l1):
    """``precision`` ("low" by default, or "high") is accepted for compatibility with the reference
    tool, but this tool always accumulates statistics (mean, L2 norm) in float64 on the host, so both
    values give bit-identical statistics; a third value is refused."""
    low = _dump(tmp_path / "low", "L1", precision="low")
    high = _dump(tmp_path / "high", "L1", precision="high")
    assert low.data == high.data == all_l1.data
    cfg = _write_config(tmp_path, precision="medium")
    with pytest.raises(ConfigError, match="precision"):
        PrecisionDebugger(cfg)


# ------------------------------------------------------------------ pruning by `list` at L1
def test_l1_list_wraps_only_apis_that_could_be_recorded(tmp_path):
    """With an L1 `list`, an API none of whose entries can contain a list item is not wrapped (so a
    one-API list costs almost nothing); APIs named by a scope bound are kept (their calls are counted)."""
    import mindspore
    from msprobe.engine.config import load_config
    from msprobe.engine.filters import Selector

    def selector(**section):
        cfg = tmp_path / f"c{len(section)}.json"
        cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"),
                                   "statistics": section}))
        return Selector(load_config(str(cfg)))

    sel = selector(list=["Functional.softmax"])
    assert sel.may_record_api("Functional.softmax") and not sel.may_record_api("Tensor.__add__")
    sel = selector(list=["relu.12.back"])
    assert sel.may_record_api("Functional.relu") and sel.may_record_api("Mint.relu")
    assert not sel.may_record_api("Functional.gelu")
    sel = selector(list=["add"], scope=["Functional.relu.0.forward", "Tensor.__add__.3.forward"])
    assert sel.may_record_api("Functional.relu") and sel.may_record_api("Tensor.__add__")
    assert selector().may_record_api("Tensor.__add__")             # no list: everything

    debugger = PrecisionDebugger(config_path=_write_config(tmp_path / "run", section={"list": ["Functional.relu"]}))
    original_add = mindspore.Tensor.__add__
    debugger.start()
    try:
        assert mindspore.Tensor.__add__ is original_add            # never recorded: not wrapped
        assert mindspore.ops.relu.__wrapped__ is not None          # wrapped
    finally:
        debugger.stop()
        debugger.step()


def test_construct_json_has_no_backward_entry_without_gradient(tmp_path):
    """A call whose outputs carry no gradient (Primitive Shape) has no backward entry in dump.json,
    and none in construct.json either; its forward entry is in both."""
    dump = _dump(tmp_path, level="mix")
    assert "Primitive.shape_op.Shape.0.forward" in dump.data
    assert "Primitive.shape_op.Shape.0.forward" in dump.construct
    assert not any(".backward" in name and name not in dump.data and
                   not any(parent == name for parent in dump.construct.values())
                   for name in dump.construct)
    assert "Primitive.shape_op.Shape.0.backward" not in dump.construct


@pytest.mark.parametrize("level,items,missed,scope", [
    ("L0", ["softmax"], ["softmax"], None),                  # a typo: nothing of the step matches
    ("L1", ["relu", "Functional.reluu"], ["Functional.reluu"], None),
    ("mix", ["Cell.fc1", "Cell.fc9", "softmax"], ["Cell.fc9", "softmax"], None),
    ("mix", ["Cell.fc2", "matmul"], [], None),               # matmul also runs inside the expanded fc2
    ("L0", ["parameters_grad"], [], None),                   # met by the parameter gradients only
    ("L1", ["Tensor.sum"], [], ["Functional.relu.0.forward", "Mint.mul.0.forward"]),  # met outside the scope
])
def test_list_item_matching_nothing_warns_once(tmp_path, caplog, level, items, missed, scope):
    """A ``list`` item that no entry name of a dumped step contains is named in one WARNING at the
    step's end, once per run; items that matched something (also outside the ``scope``) are not named."""
    section = {"list": items} if scope is None else {"list": items, "scope": scope}
    cfg = _write_config(tmp_path, level=level, section=section)
    debugger = PrecisionDebugger(cfg)
    net = _build()
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for _ in range(2):
            debugger.start(net)
            ms.value_and_grad(net, None, net.trainable_params())(X)
            debugger.stop()
            debugger.step()
    debugger.close()
    warned = [r.getMessage() for r in caplog.records if "config's list" in r.getMessage()]
    if not missed:
        assert warned == []
        return
    assert len(warned) == 1, warned
    assert "matched nothing in step 0" in warned[0]
    for item in items:
        assert (repr(item) in warned[0]) == (item in missed), (item, warned[0])
