"""The compiled per-call path (msprobe/tensors/_hotpath.c) gives exactly what the Python code it stands
for gives: the same described records, leaves, journal lines, stack keys and dump files."""
from __future__ import annotations

import collections
import json
import math
import os
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, ops

from msprobe.engine import flush, stacks, writer
from msprobe.format import journal, naming
from msprobe.format.journal import encode_json
from msprobe.tensors import hotpath, records, stats
from conftest import build_mlp, mlp_batch, only_step_dir, run_steps

ext = hotpath.ext
pytestmark = pytest.mark.skipif(ext is None, reason="the compiled per-call path is not built")

Point = collections.namedtuple("Point", "x y")


def _python_describe(value):
    describer = records.Describer(lambda path: None, lambda t: ("snap", t) if isinstance(t, Parameter) else t)
    return describer.describe(value), describer.slots


def _c_describe(value):
    slots: list = []
    snapshot = lambda t: ("snap", t) if isinstance(t, Parameter) else t  # noqa: E731
    return ext.describe(value, snapshot, slots, records.describe_other), slots


def _plain(value):
    """A described structure with each slot as a tuple of its attributes (tensor by identity)."""
    if isinstance(value, (records.TensorSlot, records.PyTensorSlot)):
        t = value.tensor
        ident = ("snap", id(t[1])) if isinstance(t, tuple) else (type(t).__name__, id(t) if isinstance(t, Tensor) else None)
        return ("slot", ident, value.data_name, value.dtype, value.shape, value.type_name)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class MyInt(int):
    pass


def _values():
    f32 = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    deep: list = [f32]
    for _ in range(70):
        deep = [deep]
    return [
        f32, None, True, 3, 2.5, float("nan"), "text", MyInt(4), np.float32(1.5), np.int64(7),
        np.arange(3.0), slice(1, None, 2), Ellipsis, ms.float16, object(),
        (f32, [1, {"a": f32, 3: None}], ()), {"k": (f32,), "j": {}}, Point(f32, 2),
        [Tensor(np.ones(2, np.int8)), Tensor(np.zeros((), np.bool_)), Tensor(np.ones(3), ms.bfloat16)],
        Parameter(Tensor(np.ones(2, np.float32)), name="w"), collections.OrderedDict(a=f32), deep,
    ]


def test_describe_matches_python():
    for value in _values():
        py_desc, py_slots = _python_describe(value)
        c_desc, c_slots = _c_describe(value)
        assert _plain(c_desc) == _plain(py_desc), value
        assert [_plain(s) for s in c_slots] == [_plain(s) for s in py_slots]


def _python_named(value, entry, category, index=()):
    """:class:`records.Describer` naming each tensor as the runtime's general path names it."""
    describer = records.Describer(lambda path: naming.data_file_name(entry, category, index + path), lambda t: t)
    return describer.describe(value), describer.slots


LONG_ENTRY = "Cell." + "very_long_module_name." * 12 + "Dense.forward.0"  # past 255 bytes with its suffix


@pytest.mark.parametrize("entry", ["Functional.linear.0.forward", LONG_ENTRY, "Cell.été.0.forward"],
                         ids=["plain", "long", "non-ascii"])
def test_describe_names_files_as_python_names_them(entry):
    """describe() with an item name as prefix gives each tensor the .npy name of naming.data_file_name,
    in C (lists, tuples, dicts with any keys) and through the Python fallback (namedtuples, arrays)."""
    assert len(naming.data_file_name(LONG_ENTRY, "input", (0,)).encode()) <= naming.MAX_FILE_NAME_BYTES
    for value in _values():
        py_desc, py_slots = _python_named(value, entry, "input", (2,))
        slots: list = []
        c_desc = ext.describe(value, lambda t: t, slots, records.describe_other,
                              naming.file_prefix(entry, "input", (2,)))
        assert _plain(c_desc) == _plain(py_desc), value
        assert [_plain(s) for s in slots] == [_plain(s) for s in py_slots]
    named = [s.data_name for s in _python_named(_values(), entry, "output")[1]]
    assert len(named) > 10 and all(name and name.endswith(".npy") for name in named)
    if entry is LONG_ENTRY:
        assert all(len(name.encode()) <= naming.MAX_FILE_NAME_BYTES for name in named)
        assert named[0] != naming.item_name(entry, "output", 0) + ".npy"  # shortened


def test_item_lines_name_files_as_record_item_names_them():
    """item_lines(..., named=True): each gradient item's tensors are named as Runtime.record_item names
    them (data_file_name(entry, key, (index,) + path)); without ``named`` nothing is named."""
    f32 = Tensor(np.ones((2, 2), np.float32))
    entry = "Functional.linear.0.backward"
    items = [("input", 0, 3, f32), ("input", 2, 3, (f32, [f32])), ("output", 0, 1, Point(f32, None)),
             ("", 1, 2, f32)]
    for named in (True, False):
        slots: list = []
        lines = ext.item_lines(entry, items, lambda t: t, slots, records.describe_other, named)
        expected, expected_slots = [], []
        for key, index, size, value in items:
            describer = records.Describer(
                (lambda path, k=key, i=index: naming.data_file_name(entry, k, (i,) + path)) if named
                else (lambda path: None), lambda t: t)
            expected.append(journal.item_line(entry, key, index, size, describer.describe(value)))
            expected_slots += describer.slots
        assert _plain(lines) == _plain(expected)
        assert [_plain(s) for s in slots] == [_plain(s) for s in expected_slots]
        assert all(bool(s.data_name) == named for s in slots) and len(slots) == 5


@pytest.mark.parametrize("budget", [None, 1000], ids=["no budget", "tensor_budget_mb"])
def test_tensor_task_gradients_take_the_compiled_line_path(tmp_path, monkeypatch, make_debugger, budget):
    """An L1 tensor dump without a tensor budget queues each backward node's gradients in one C call
    (Runtime.record_item is not called, the files are there); with a budget, which counts every
    saved tensor, each item takes record_item."""
    from msprobe.engine import runtime

    calls = []
    original = runtime.Runtime.record_item
    monkeypatch.setattr(runtime.Runtime, "record_item", lambda self, *a: calls.append(a) or original(self, *a))
    section = {} if budget is None else {"tensor_budget_mb": budget}
    dump = str(tmp_path / "dump")
    run_steps(build_mlp(), make_debugger(dump_path=dump, level="L1", task="tensor", section=section),
              steps=1, batch=mlp_batch())
    step_dir = only_step_dir(dump, 0)
    with open(os.path.join(step_dir, "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    backward = [leaf for name, entry in data.items() if name.endswith(".backward")
                for leaf in entry.get("input", []) + entry.get("output", []) if isinstance(leaf, dict)]
    assert backward and all(os.path.isfile(os.path.join(step_dir, "dump_tensor_data", leaf["data_name"]))
                            for leaf in backward)
    assert (len(calls) == 0) == (budget is None), len(calls)


def test_describe_raises_what_python_raises():
    class Broken(Tensor):
        @property
        def dtype(self):
            raise RuntimeError("failed operation")

    bad = Broken(np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match="failed operation"):
        _python_describe([bad])
    with pytest.raises(RuntimeError, match="failed operation"):
        _c_describe([bad])


def _tensors():
    rng = np.random.default_rng(0)
    arrays = [
        rng.standard_normal(1000).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float16),
        rng.standard_normal(77), np.array([1.0, np.nan, 2.0], np.float32), np.array([np.inf, 1.0]),
        np.array([-np.inf, 1.0], np.float32), np.array([np.inf, -np.inf]), np.array([1e300, 1e300]),
        np.array([1e-200, -3e-200]), np.array([-0.0, 0.0], np.float32), np.zeros(4, np.float16),
        np.array([2 ** 63 - 1, -2 ** 63, 5], np.int64), np.arange(-100, 100, dtype=np.int8),
        np.array([2 ** 64 - 1, 3], np.uint64), np.arange(300, dtype=np.uint16), np.array([True, False]),
        np.array([True, True]), np.array(3.5, np.float32), np.zeros((0, 3), np.float32),
        rng.standard_normal(1 << 21).astype(np.float32),
    ]
    out = [Tensor(a) for a in arrays]
    out.append(Tensor(rng.standard_normal((4, 6)).astype(np.float32)).transpose())  # non-contiguous
    out.append(Tensor(np.ones(5), ms.bfloat16))
    return out


def _leaves(slots_of, monkeypatch, use_c: bool, md5: bool = False):
    monkeypatch.setattr(hotpath, "ext", ext if use_c else None)
    slots = slots_of()
    failure = flush.materialize(slots, md5=md5, tensor_dir=None, on_error=pytest.fail)
    assert failure is None
    return [json.dumps(s.leaf) for s in slots]  # NaN-aware, key order included


def test_fill_matches_python(monkeypatch):
    tensors = _tensors()

    def slots_of():
        slots: list = []
        ext.describe(tensors + tensors[:3], lambda t: t, slots, records.describe_other)
        return slots

    c_leaves = _leaves(slots_of, monkeypatch, True)
    assert c_leaves == _leaves(slots_of, monkeypatch, False)
    filled: list = []
    ext.describe(tensors, lambda t: t, filled, records.describe_other)
    assert flush.wait_for_device() is None
    ext.fill(filled)
    done = [s.leaf is not None for s in filled]
    assert done[0] and done[1] and done[11]  # plain float32, float16, int64: read in C
    assert done[-3] and done[-2]  # 2**21 elements (kernel threads), transposed (read through its strides): in C
    assert not any(done[-5:-3]) and not done[-1]  # 0-d, empty, bfloat16: left to Python


@pytest.mark.parametrize("md5", [False, True], ids=["statistics", "md5"])
def test_fill_of_views_and_host_snapshots_matches_python(monkeypatch, md5):
    """Tensor objects over the same memory (views), a slice of it, the same bytes as another dtype, and
    Parameters' host snapshots (numpy arrays, as the runtime makes them) give Python's leaves."""
    base = Tensor(np.random.default_rng(1).standard_normal(12).astype(np.float32))
    weight = Parameter(Tensor(np.linspace(-1, 2, 8, dtype=np.float32).reshape(2, 4)), name="w")
    snapshot = stats.host_copy(weight)
    values = [base, base.view(3, 4), base.reshape(4, 3), base[2:6], base.view(ms.int32), weight,
              np.arange(5, dtype=np.int64), base.view(3, 4).transpose(), base.view(2, 2, 3).transpose(2, 0, 1),
              base.view(3, 4)[:, 1:3]]

    def slots_of():
        slots: list = []
        ext.describe(values, lambda t: snapshot if t is weight else t, slots, records.describe_other)
        return slots

    c_leaves = _leaves(slots_of, monkeypatch, True, md5)
    assert c_leaves == _leaves(slots_of, monkeypatch, False, md5)
    assert all(("md5" in json.loads(leaf)) == md5 for leaf in c_leaves)
    assert not any(v.is_contiguous() for v in values[-3:])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8])
def test_fill_of_views_with_contiguous_rows_matches_python(monkeypatch, dtype):
    """Views whose last index is contiguous but whose rows are not (outer axes permuted, as attention
    heads are, or columns sliced) are read in C through their strides: Python's leaves (the statistics
    of the C-order copy)."""
    rng = np.random.default_rng(7)
    base = Tensor((rng.standard_normal((4, 32, 3, 16)) * 50).astype(dtype))
    values = [base.permute(0, 2, 1, 3), base.permute(2, 1, 0, 3), base[:, 3:29, :, 2:15],
              base.permute(0, 2, 1, 3)[1:, :, ::2]]
    assert not any(v.is_contiguous() for v in values)

    def slots_of():
        slots: list = []
        ext.describe(values, lambda t: t, slots, records.describe_other)
        return slots

    assert _leaves(slots_of, monkeypatch, True) == _leaves(slots_of, monkeypatch, False)
    filled = slots_of()
    assert flush.wait_for_device() is None
    ext.fill(filled)
    assert all(s.leaf is not None for s in filled)  # all read in C


def test_fill_reads_each_memory_once(monkeypatch):
    """fill() reduces memory that several tensor objects show (same address, elements and dtype) once,
    and every other memory on its own; the host snapshot of a Parameter is read in C too."""
    calls: list = []
    real_scan = hotpath._scan._stats_kernel.scan

    def counting_scan(view, code, *rest):
        calls.append((len(view), code))
        return real_scan(view, code, *rest)

    base = Tensor(np.arange(1, 13, dtype=np.float32))
    snapshot = np.arange(4, dtype=np.float32)
    values = [base, base.view(3, 4), base.flatten(), base, base[2:6], base.view(ms.int32)]
    monkeypatch.setattr(hotpath._scan._stats_kernel, "scan", counting_scan)
    try:
        hotpath.configure()
        slots: list = []
        ext.describe(values, lambda t: t, slots, records.describe_other)
        slots.append(records.TensorSlot(snapshot, None, "Float32", [4], "mindspore.Tensor"))
        assert flush.wait_for_device() is None
        ext.fill(slots, True)
    finally:
        monkeypatch.undo()
        hotpath.configure()
    assert all(s.leaf is not None for s in slots)
    assert sorted(calls) == sorted([(48, "f4"), (16, "f4"), (48, "i4"), (16, "f4")])
    assert slots[0].leaf["shape"] == [12] and slots[1].leaf["shape"] == [3, 4]
    assert slots[0].leaf["md5"] == slots[1].leaf["md5"] == stats.crc32_hex(base.asnumpy())
    assert slots[-1].leaf["md5"] == stats.crc32_hex(snapshot)


def test_fill_leaves_slots_with_a_file_to_python():
    t = Tensor(np.arange(4, dtype=np.float32))
    plain = records.TensorSlot(t, None, "Float32", [4], "mindspore.Tensor")
    named = records.TensorSlot(t, "x.npy", "Float32", [4], "mindspore.Tensor")
    assert flush.wait_for_device() is None
    ext.fill([plain, named])  # the same tensor: read once, but only the slot without a file is filled
    assert plain.leaf is not None and named.leaf is None


def test_resolve_and_lines_match_python():
    slot = records.TensorSlot(None, None, "Float32", [2], "mindspore.Tensor")
    slot.leaf = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [2], "Max": math.inf, "Min": 0.0,
                 "Mean": math.inf, "Norm": math.inf}
    fine = records.PyTensorSlot(None, None, "Int8", [1], "mindspore.Tensor")
    fine.leaf = {"type": "mindspore.Tensor", "dtype": "Int8", "shape": [1], "Max": 1, "Min": 1, "Mean": 1.0,
                 "Norm": 1.0}
    pending = records.TensorSlot(None, None, "Float32", [2], "mindspore.Tensor")
    recs = [{"e": "a", "k": "input_args", "v": [fine, {"x": [fine, 2 ** 70]}]},
            {"e": "b", "k": "output", "v": [slot]}, {"e": "c", "k": "input_kwargs", "v": {"t": float("nan")}},
            {"e": "d", "stack": 0}, {"c": "d", "p": None}, {"e": "e", "k": "output", "v": [(1, 2)]}]
    unfilled = {"e": "f", "k": "output", "v": [pending]}  # resolved as itself (never encoded)
    assert ext.resolve(unfilled) == ({k: writer.resolve_slots(v, [False]) for k, v in unfilled.items()}, False)
    py_lines, py_resolved, py_any = b"", [], False
    for r in recs:
        flags = [False]
        rec = {k: writer.resolve_slots(v, flags) for k, v in r.items()}
        c_rec, c_flag = ext.resolve(r)
        assert c_rec == rec and c_flag == flags[0]
        py_resolved.append(rec)
        py_lines += encode_json(rec, flags[0], line=True)
        py_any |= flags[0]
    text, resolved, non_finite = ext.encode_lines(recs, encode_json)
    assert (bytes(text), resolved, non_finite) == (py_lines, py_resolved, py_any)


def _replay_cases():
    """Journal lines of every kind, in orders that exercise each handler's branches."""
    leaf = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [2], "Max": 1.0, "Min": 0.0}
    return [
        journal.header("statistics", "mix", "mindspore", None),
        journal.construct_edge("Cell.a.A.forward.0", None),
        journal.stack_frames(0, ["File x.py, line 1, in f, \n f()"]),
        journal.stack_ref("Functional.relu.0.forward", 0, {"input_args": [leaf], "input_kwargs": {},
                                                           "output": [leaf]}),
        journal.stack_ref("Functional.relu.0.forward", 0),  # a second use of the same entry
        journal.stack_ref("Functional.add.0.forward", 0, None),
        journal.key_line("Functional.relu.0.forward", "output", [leaf, None]),  # overwrites a key
        journal.key_line("Functional.relu.0.backward", "input", [leaf]),
        journal.item_line("Functional.relu.0.backward", "output", 1, 3, leaf),  # grows a missing list
        journal.item_line("Functional.relu.0.backward", "output", 0, 3, leaf),  # fills it in place
        journal.item_line("Functional.relu.0.backward", "output", 2, 2, leaf),  # the longer list stays
        journal.item_line("Functional.relu.0.backward", "input", 2, 4, leaf),  # grows an existing list
        journal.item_line("Functional.mul.0.backward", "output", 0, 1, leaf),  # a new entry
        journal.value_line("debug.x", [leaf]),
        journal.path_line("debug.x", [0], leaf),
        journal.key_line("Functional.add.0.forward", "output", None),
        journal.construct_edge("Cell.a.A.backward.0", "Cell.a.A.forward.0"),
        journal.stack_frames(1, []),
        journal.stack_ref("Functional.mul.0.backward", 1, {"input": [leaf]}),
        journal.item_line("Functional.relu.0.backward", "output", -1, 3, "negative index: Python decides"),
        {"x": 1},  # no kind: ignored
    ]


def _replayed(apply, lines):
    state = journal.Replay()
    apply(state, lines)
    return json.dumps(state.result()), list(state.data), sorted(state._valued)


def test_replay_lines_matches_python():
    lines = _replay_cases()
    assert _replayed(ext.replay_lines, lines) == _replayed(journal.Replay.apply_all, lines)
    assert _replayed(flush.replay_batch, lines) == _replayed(journal.Replay.apply_all, lines)


@pytest.mark.parametrize("line", [{"e": "a", "k": "output"}, {"e": "a", "k": "x", "i": 5, "n": 2, "v": 1},
                                  {"e": "a", "k": "x", "i": "0", "n": 1, "v": 1}, {"c": "a"}, {"s": 0}])
def test_replay_lines_raises_what_python_raises(line):
    """A malformed line raises in C what Replay.apply raises (it is applied by Replay.apply)."""
    with pytest.raises(Exception) as py_error:
        journal.Replay().apply(line)
    with pytest.raises(type(py_error.value)):
        ext.replay_lines(journal.Replay(), [line])


def test_stack_key_matches_python():
    def inner():
        return ext.stack_key(0, stacks.MAX_WALK), stacks.stack_key(sys._getframe(0))

    c_key, py_key = inner()
    # the same frames; the innermost differs only in where each call sits on its line
    assert c_key[0] == py_key[0] == id(inner.__code__) and c_key[2:] == py_key[2:]
    short, full = ext.stack_key(0, 3), ext.stack_key(0, stacks.MAX_WALK)
    assert len(short) == 6 and short[2:] == full[2:6] and len(full) > 6


@pytest.mark.parametrize("fields", [{"level": "L1"}, {"level": "mix"},
                                    {"level": "L1", "section": {"tensor_list": ["relu"]}},
                                    {"level": "L0", "task": "tensor"}, {"level": "L1", "task": "tensor"}],
                         ids=["L1", "mix", "list", "tensor", "L1 tensor"])
def test_dump_files_identical_with_and_without_extension(tmp_path, monkeypatch, make_debugger, fields):
    """The same training steps dumped with the compiled path and with the Python path only."""
    outputs = _dumps_with_and_without_extension(tmp_path, monkeypatch, make_debugger, fields)
    assert outputs[0] == outputs[1]
    assert outputs[0][0]["dump.json"]["data"]
    assert bool(outputs[0][0]["npy"]) == (fields.get("task") == "tensor" or "section" in fields)


def test_md5_dump_files_identical_with_and_without_extension(tmp_path, monkeypatch, make_debugger):
    """summary_mode md5: CRC-32 computed in C beside the statistics gives Python's dump.json."""
    outputs = _dumps_with_and_without_extension(tmp_path, monkeypatch, make_debugger,
                                                {"level": "L1", "section": {"summary_mode": "md5"}})
    assert outputs[0] == outputs[1]
    data = outputs[0][0]["dump.json"]["data"]
    assert any(name.endswith(".backward") for name in data)
    leaves = [leaf for entry in data.values() for leaf in entry.get("input_args", []) if isinstance(leaf, dict)]
    assert leaves and all(len(leaf["md5"]) == 8 for leaf in leaves if leaf.get("type") == "mindspore.Tensor")


def _dumps_with_and_without_extension(tmp_path, monkeypatch, make_debugger, fields, ways=("c", "python"),
                                      build=build_mlp):
    """Step 1's files, losses and gradients of two steps of ``build()`` dumped each of the ``ways``: ``c``
    (the compiled path), ``probe objects`` (the compiled recorder observing every call through a
    ``BackwardProbe`` it makes), ``python`` (no extension)."""
    outputs = []
    for way in ways:
        monkeypatch.setattr(hotpath, "ext", None if way == "python" else ext)
        dump = str(tmp_path / f"dump_{way}")
        debugger = make_debugger(dump_path=dump, **fields)
        if way == "probe objects":
            debugger.service.recorder.fast_record.observe_here = False
        losses, grads = run_steps(build(), debugger, steps=2, batch=mlp_batch())
        step_dir = only_step_dir(dump, 1)
        files = {}
        for name in ("dump.json", "stack.json", "construct.json"):
            with open(os.path.join(step_dir, name), encoding="utf-8") as f:
                files[name] = json.load(f)
        files["dump.json"]["dump_data_dir"] = None
        tensor_dir = os.path.join(step_dir, "dump_tensor_data")
        files["npy"] = sorted(os.listdir(tensor_dir)) if os.path.isdir(tensor_dir) else []
        outputs.append((files, [l.tobytes() for l in losses], [[g.tobytes() for g in s] for s in grads]))
    monkeypatch.setattr(hotpath, "ext", ext)
    return outputs


class _ShapesAndSplits(ms.nn.Cell):
    """Calls whose output is not one Tensor: a Primitive and a function returning a tuple of ints, a
    function returning an int, one returning a tuple of Tensors, and a tuple argument (``concat``)."""

    def __init__(self):
        super().__init__()
        ms.set_seed(0)
        self.dense = ms.nn.Dense(8, 4)
        self.shape = ops.Shape()

    def construct(self, x):
        h = self.dense(x)
        rows, cols = self.shape(h)
        left, right = ops.split(h, cols // 2, axis=1)
        scale = ops.numel(x) / (rows * 8.0)
        return ops.concat((left * right, right), axis=1).reshape(ops.shape(h)) * scale


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_calls_of_other_outputs_give_the_python_paths_files(tmp_path, monkeypatch, make_debugger, level):
    """Outputs of plain scalars, tuples of them and tuples of Tensors are recorded by the compiled
    recorder, and the gradients of its calls hooked without a BackwardProbe object: the files, losses
    and gradients of the Python path, and of the compiled recorder making a probe for every call."""
    ways = ("c", "probe objects", "python")
    outputs = _dumps_with_and_without_extension(tmp_path, monkeypatch, make_debugger, {"level": level}, ways,
                                                _ShapesAndSplits)
    assert outputs[0] == outputs[1] == outputs[2]
    data = outputs[0][0]["dump.json"]["data"]
    assert data["Primitive.shape.Shape.0.forward"]["output"] == [{"type": "int", "value": 4}] * 2
    assert data["Functional.numel.0.forward"]["output"] == [{"type": "int", "value": 32}]
    assert len(data["Functional.split.0.forward"]["output"]) == 2
    assert "Functional.split.0.backward" in data and "Functional.concat.0.backward" in data


def test_dtype_objects_described_as_python_describes_them():
    """MindSpore dtype objects (``ops.cast``'s argument) are described in C: the Python describer's leaf."""
    dtypes = [ms.float16, ms.float32, ms.float64, ms.bfloat16, ms.int8, ms.int32, ms.int64, ms.uint8,
              ms.bool_, ms.complex64, ms.string, ms.tensor_type]
    for value in dtypes + [dtypes, {"dtype": ms.float32, "n": 2}]:
        py_desc, _ = _python_describe(value)
        c_desc, _ = _c_describe(value)
        assert c_desc == py_desc, value
    assert _c_describe(ms.float32)[0] == {"type": "mindspore.dtype", "value": "Float32"}


def _grad_values():
    """Tensors inside and outside a gradient: floating and integer, constants, a Parameter, lists."""
    from msprobe.capture import backward

    w = Parameter(Tensor(np.ones((3, 3), np.float32)), name="w_grad_values")
    seen = {}

    def forward(x, w):
        h = ops.matmul(x, w)
        pair = ops.split(h, 1, axis=1)
        seen["args"] = [
            (h,), (x, w), (pair,), (list(pair) + [3, None],), (h, ops.cast(h, ms.int32), Tensor(np.ones(2))),
            (ops.cast(h, ms.float16), ops.cast(h, ms.float64), ops.cast(h, ms.bfloat16)),
            ((h, ops.stop_gradient(h)), "text", [w]), (), (Point(h, 1),),
        ]
        constant = Tensor(np.ones(3, np.float32))
        seen["nodes"] = [(v, ext.grad_node(v), backward._node_of(v)) for v in (h, x, w, pair[0], constant, 3, None)]
        seen["targets"] = [(ext.grad_targets(a), _python_targets(a)) for a in seen["args"]]
        return h.sum()

    ms.grad(forward, grad_position=(0, 1))(Tensor(np.ones((2, 3), np.float32)), w)
    return seen


def _python_targets(args):
    from msprobe.capture import backward

    saved = hotpath.ext
    hotpath.ext = None
    try:
        return backward._targets(args)
    finally:
        hotpath.ext = saved


def _plain_targets(found):
    return [(i, k, id(t), node._unique_id(), key) for i, k, t, node, key in found]


def test_grad_node_and_targets_match_python():
    """``grad_node``/``grad_targets`` in C find the nodes and argument slots the Python code finds."""
    seen = _grad_values()
    for value, c_node, py_node in seen["nodes"]:
        assert (c_node is None) == (py_node is None), value
        if c_node is not None:
            assert c_node._unique_id() == py_node._unique_id()
    assert [node is not None for _, node, _ in seen["nodes"]] == [True, True, True, True, False, False, False]
    found_any = False
    for c_found, py_found in seen["targets"]:
        assert _plain_targets(c_found) == _plain_targets(py_found)
        found_any = found_any or bool(c_found)
    assert found_any
    assert [(i, k) for i, k, *_ in seen["targets"][3][0]] == [(0, 0), (0, 1), (0, 2)]  # split into 3, then 3, None


def test_single_mapping_matches_python():
    """``single_mapping`` in C maps the edges of a call's one autograd node to its arguments as the Python
    ``_single_mapping`` does: plain and repeated arguments, list elements, a view read through an automatic
    ``Contiguous``, a Parameter the call uses without it being an argument, and the refusals (an alias, outputs
    of several nodes, an edge into a value that is no argument)."""
    from msprobe.capture import backward

    w = Parameter(Tensor(np.ones((3, 3), np.float32)), name="w_single_mapping")
    cases = []

    def case(args, out, targets_of=None):
        outs = [out] if isinstance(out, Tensor) else list(out)
        nodes = [backward._node_of(t) for t in outs]
        targets = _python_targets(targets_of if targets_of is not None else args)
        cases.append((nodes, targets))

    def forward(x, w):
        h = ops.matmul(x, w)
        case((x, w), h)
        case((h, h), ops.mul(h, h))
        case(([h, x],), ops.concat([h, x]))
        view = ops.transpose(h, (1, 0))
        case((view, x), ops.matmul(view, x))
        case((h,), ops.split(h, 1, axis=1))
        case((h,), ops.matmul(h, w))  # w is used, not given: a leaf edge, skipped
        case((h, w), ops.matmul(h, w), targets_of=(w,))  # h's producer is no argument: refused
        same = ops.cast(h, ms.float32)
        case((h,), same)  # the argument returned itself (or a new node): both decide alike
        case((h, x), (ops.relu(h), ops.relu(x)))  # two nodes: refused
        return h.sum()

    ms.grad(forward, grad_position=(0, 1))(Tensor(np.ones((3, 3), np.float32)), w)
    results = []
    for nodes, targets in cases:
        if None in nodes:
            continue
        c_map, py_map = ext.single_mapping(nodes, targets), backward._single_mapping(nodes, targets)
        assert c_map == py_map, (nodes, targets)
        results.append(c_map)
    assert len(results) >= 8
    assert results[0] == [(0, (0, None)), (1, (1, None))] and results[1] == [(0, (0, None)), (1, (1, None))]
    assert [i for i, _ in results[2]] == [0, 1] and [slot for _, slot in results[2]] == [(0, 0), (0, 1)]
    assert None in results and any(r not in (None, []) for r in results[3:])


def _python_consumer_edges(nodes, targets, mark, limit=None):
    from msprobe.capture import backward

    saved, saved_limit = hotpath.ext, backward.MAX_WALK
    hotpath.ext = None
    backward.MAX_WALK = saved_limit if limit is None else limit
    try:
        return backward.consumer_edges(nodes, targets, mark)
    finally:
        hotpath.ext, backward.MAX_WALK = saved, saved_limit


def _plain_edges(found):
    if found is None:
        return None
    return {key: [(node._unique_id(), j) for node, j in edges] for key, edges in found.items()}


def test_consumer_edges_match_python():
    """``consumer_edges`` in C walks back from a call's output nodes through the nodes made after the mark
    and finds the edges into the arguments' nodes the Python walk finds, in the same order: an argument used
    by several nodes, one used twice by one node, a node made before the mark (not walked), a Parameter
    (a leaf, not walked), a view read through an automatic ``Contiguous``, a target reached through nothing;
    and both give up alike past the walk limit."""
    from msprobe.capture import backward

    w = Parameter(Tensor(np.ones((3, 3), np.float32)), name="w_consumer_edges")
    cases = []

    def case(outs, args, mark, limit=None):
        nodes = [backward._node_of(t) for t in outs]
        uids = {key[0] for *_, key in _python_targets(args)}
        c_found = ext.consumer_edges(nodes, uids, mark, backward.MAX_WALK if limit is None else limit)
        cases.append((_plain_edges(c_found), _plain_edges(_python_consumer_edges(nodes, uids, mark, limit))))

    def forward(x, w):
        before = x * 3
        mark = backward.watermark(x)
        out = ops.sin(x) + ops.cos(x) * before + ops.matmul(x, w) + x * x
        case([out], (x,), mark)
        case([out], (x, before), mark)
        case([out], (x, before), -1)
        view = ops.transpose(out, (1, 0))
        mark2 = backward.watermark(view)
        tail = ops.matmul(view, w) + ops.exp(view)
        case([tail, ops.relu(tail)], (view,), mark2)
        case([tail], (x,), mark2)  # x is not reached after mark2
        case([out], (x,), mark, limit=2)
        return out.sum()

    ms.grad(forward, grad_position=(0, 1))(Tensor(np.ones((3, 3), np.float32)), w)
    for c_found, py_found in cases:
        assert c_found == py_found
    assert len(cases[0][0]) == 1 and len(next(iter(cases[0][0].values()))) == 5  # sin, cos, matmul, mul twice
    assert len(cases[1][0]) == 2 and cases[4][0] == {} and cases[5][0] is None


def test_grad_node_raises_what_python_raises():
    """A tensor whose dtype cannot be read (a failed operation's output) raises the same from both."""
    from msprobe.capture import backward

    class Broken(Tensor):
        _grad_node = property(lambda self: "a node")

        @property
        def dtype(self):
            raise RuntimeError("failed operation")

    class Constant(Tensor):
        _grad_node = property(lambda self: "a node")
        _requires_grad = property(lambda self: False)

    bad = Broken(np.ones(2, np.float32))
    for find in (backward._node_of, ext.grad_node, lambda t: ext.grad_targets((1, [t]))):
        with pytest.raises(RuntimeError, match="failed operation"):
            find(bad)
    constant = Constant(np.ones(2, np.float32))
    assert backward._node_of(constant) is None and ext.grad_node(constant) is None
    assert ext.grad_targets((constant, [constant])) == []


def test_slots_nbytes_matches_python_sum():
    f32 = Tensor(np.ones((2, 3), np.float32))
    _, slots = _c_describe([f32, Tensor(np.ones(5, np.int8)), Tensor(np.ones((), np.float32))])
    py_slot = records.PyTensorSlot(None, None, "Float32", [4, 4], "mindspore.Tensor")
    mixed = slots + [py_slot]
    assert ext.slots_nbytes(mixed) == sum(s.nbytes() for s in mixed) == (6 + 5 + 1 + 16) * 4
    assert ext.slots_nbytes([]) == 0


def test_tensor_checks_follow_isinstance():
    """The compiled path's ``isinstance(v, Tensor)`` (kept per type) answers as Python's does: for
    subclasses, for types MindSpore's ``Tensor.__subclasshook__`` accepts (a ``stub_sync``
    attribute), and for objects that claim another ``__class__``, each asked repeatedly."""
    from msprobe.capture import backward

    class Node:
        dtype = ms.float32
        _requires_grad = True

    class Stub(Node):
        stub_sync = None
        _grad_node = "stub node"

    claimed = [Tensor]

    class Claims(Node):
        _grad_node = "claims node"

        @property
        def __class__(self):
            return claimed[0]

    class Plain(Node):
        _grad_node = "plain node"

    def ident(node):  # a BackwardNode object is made at each read
        return node if node is None or isinstance(node, str) else node._unique_id()

    claims = Claims()
    for value in (Stub(), claims, Plain(), Parameter(Tensor(np.ones(2, np.float32)), name="p_checks")):
        for _ in range(3):
            assert ident(ext.grad_node(value)) == ident(backward._node_of(value)), value
    assert isinstance(claims, Tensor) and ext.grad_node(claims) == "claims node"
    claimed[0] = Plain  # what it claims may change: not kept per type
    assert not isinstance(claims, Tensor) and ext.grad_node(claims) is None is backward._node_of(claims)
    assert ext.grad_node(Plain()) is None and ext.grad_node(Stub()) == "stub node"


@pytest.mark.parametrize("md5", [False, True], ids=["statistics", "md5"])
def test_host_slots_give_the_leaves_of_their_host_tensors(md5):
    """Arrays described by host_slots (the graph probes' copies) get, through the flush, the leaves of
    Tensor.from_numpy of the same arrays (every dtype the kernel reads, values whose float64 sums
    overflow); an array of another dtype, 0-d, empty or not C-contiguous gets none (the caller then
    describes its Tensor)."""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((2, 3, 4)).astype(dt) for dt in (np.float16, np.float32, np.float64)]
    arrays += [rng.integers(-9, 9, 7).astype(dt) for dt in (np.int8, np.int16, np.int32, np.int64)]
    arrays += [rng.integers(0, 9, 5).astype(dt) for dt in (np.uint8, np.uint16, np.uint32, np.uint64)]
    arrays += [rng.standard_normal(6) > 0, np.array([1e308, 1e308, -np.inf, np.nan]),
               np.array([3.0e38, 3.0e38], np.float32)]

    def leaves(values, slots):
        flush.materialize(slots, md5=md5, tensor_dir=None, on_error=pytest.fail)
        return [json.dumps(v.leaf) for v in values]

    slots = hotpath.host_slots(arrays)
    tensor_slots: list = []
    described = ext.describe([Tensor.from_numpy(a) for a in arrays], lambda t: t, tensor_slots,
                             records.describe_other)
    assert [s.leaf is None for s in slots] == [True] * len(arrays)
    assert leaves(slots, list(slots)) == leaves(described, tensor_slots)
    for odd in (np.float32(1.0) * np.ones(()), np.zeros((3, 0), np.float32), np.ones((4, 4), np.float32)[:, ::2],
                np.array(["a"]), np.ones(2, np.complex64)):
        assert hotpath.host_slots([np.ones(2, np.float32), odd]) is None


class _CastsItsWeight(ms.nn.Cell):
    """``Cast`` of a Parameter to its own dtype returns the Parameter itself; then a ``MatMul`` with it."""

    def __init__(self):
        super().__init__()
        self.weight = Parameter(Tensor(np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(8, 4)), name="weight")
        self.cast = ops.Cast()
        self.matmul = ops.MatMul()

    def construct(self, x):
        return self.matmul(x, self.cast(self.weight, ms.float32))


def test_parameters_of_a_call_read_at_once_give_the_python_paths_files(tmp_path, monkeypatch, make_debugger):
    """With synchronous CPU launch the compiled recorder takes a call's Parameter statistics when it
    describes them (no host copy): the files of the Python path, whose copy the flush reads, and the
    value the call saw, not the optimizer's update after it."""
    weights = []
    outputs = []
    for use_c in (True, False):
        monkeypatch.setattr(hotpath, "ext", ext if use_c else None)
        dump = str(tmp_path / f"dump_{use_c}")
        net = _CastsItsWeight()
        weights.append([net.weight.asnumpy().copy()])
        debugger = make_debugger(dump_path=dump, level="L1")
        losses, grads = run_steps(net, debugger, steps=2, batch=mlp_batch())
        files = {}
        for step in (0, 1):
            step_dir = only_step_dir(dump, step)
            for name in ("dump.json", "stack.json", "construct.json"):
                with open(os.path.join(step_dir, name), encoding="utf-8") as f:
                    files[(step, name)] = json.load(f)
            files[(step, "dump.json")]["dump_data_dir"] = None
        outputs.append((files, [l.tobytes() for l in losses], [[g.tobytes() for g in s] for s in grads]))
    monkeypatch.setattr(hotpath, "ext", ext)
    assert outputs[0] == outputs[1]
    data = outputs[0][0][(0, "dump.json")]["data"]
    cast = data["Primitive.cast.Cast.0.forward"]
    start = weights[0][0].astype(np.float64)
    for leaf in (cast["input_args"][0], cast["output"][0]):
        assert (leaf["Max"], leaf["Min"]) == (start.max(), start.min())
        assert leaf["Norm"] == float(np.sqrt((start * start).sum()))
    assert data["Primitive.matmul.MatMul.0.forward"]["input_args"][1] == cast["output"][0]
    second = outputs[0][0][(1, "dump.json")]["data"]["Primitive.cast.Cast.0.forward"]["input_args"][0]
    assert second != cast["input_args"][0]  # the optimizer changed the weight between the steps


def test_dtype_names_kept_per_dtype_object_match_python():
    """The dump.json dtype name of a tensor of each dtype, described again and again (the compiled path
    keeps each dtype object's name after the first time), is the Python describer's every time."""
    tensors = [Tensor(np.ones((2, 3)), dtype) for dtype in
               (ms.float16, ms.float32, ms.float64, ms.bfloat16, ms.int8, ms.int16, ms.int32, ms.int64,
                ms.uint8, ms.bool_)]
    expected = [_plain(_python_describe(t)[0]) for t in tensors]
    for _ in range(3):
        assert [_plain(_c_describe(t)[0]) for t in tensors] == expected
    assert len({leaf[3] for leaf in expected}) == len(tensors)
