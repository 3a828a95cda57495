"""The common case of a recorded API call (``CallRecorder.fast_call``: one body, one journal line per
call) writes byte for byte the files the general path writes, with the compiled per-call path and
with the Python one (``MSPROBE_PURE_PYTHON=1``); the journal it leaves replays to the same records."""
from __future__ import annotations

import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, nn, ops

import msprobe.dump
from msprobe.engine.runtime import Runtime
from msprobe.format import journal
from msprobe.tensors import hotpath
from conftest import mlp_batch, only_step_dir, run_steps

FILES = ("dump.json", "stack.json", "construct.json")


class Net(nn.Cell):
    """Calls with keyword arguments, tuple and list arguments and outputs, a scalar argument, an
    in-place Tensor method (the general path) between the others, and one outside the gradient."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        h = ops.relu(self.fc1(x))
        a, b = ops.split(h, 8, axis=1)
        h = ops.concat((b, a), axis=1)
        h = mint.mul(h, 2.0)
        h = ops.softmax(h, axis=-1) * 0.5
        h.add_(1.0)
        return self.fc2(ops.clamp(h, min=0.0, max=2.0))


def _net():
    ms.set_seed(3)
    np.random.seed(3)
    return Net()


def _run(tmp_path, monkeypatch, make_debugger, name: str, whole: bool, use_c: bool, fields: dict,
         make_net=None):
    monkeypatch.setattr(hotpath, "ext", hotpath.ext if use_c else None)
    if not whole:
        monkeypatch.setattr(Runtime, "takes_whole_calls", lambda self: False)
    dump = str(tmp_path / name)
    debugger = make_debugger(dump_path=dump, **fields)
    recorder = debugger.service.recorder
    assert recorder.has_fast_path("Functional.relu", False) == whole
    net = (make_net or _net)()
    losses, grads = run_steps(net, debugger, steps=2, batch=mlp_batch(1))
    # a third step left open after stop(): its journal is what msprobe.dump reads
    debugger.start(net)
    ops.relu(mlp_batch(1)[0])
    debugger.stop()
    step_dir = only_step_dir(dump, 1)
    files = {}
    for file in FILES:
        if os.path.exists(os.path.join(step_dir, file)):  # no stack.json without extra_info
            with open(os.path.join(step_dir, file), "rb") as f:
                files[file] = f.read()
    open_dir = only_step_dir(dump, 2)
    with open(os.path.join(open_dir, journal.JOURNAL), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    replayed = msprobe.dump.load(open_dir)
    pieces = {}
    for piece in msprobe.dump.iter_entries(open_dir):
        pieces.setdefault(piece.entry, {})[piece.key] = piece.value
    debugger.step()
    monkeypatch.undo()
    numbers = ([l.tobytes() for l in losses], [[g.tobytes() for g in s] for s in grads])
    return files, numbers, lines, (replayed.data, replayed.stacks, replayed.construct, pieces)


@pytest.mark.parametrize("fields", [{"level": "L1"}, {"level": "mix"}, {"level": "L1", "extra_info": False},
                                    {"level": "L1", "section": {"data_mode": ["forward"]}}],
                         ids=["L1", "mix", "no_extra_info", "forward_only"])
def test_whole_calls_write_the_files_of_the_general_path(tmp_path, monkeypatch, make_debugger, fields):
    runs = {}
    variants = [("general", False, True), ("whole", True, True), ("whole_python", True, False)]
    if hotpath.ext is None:  # not built: the Python path only
        variants = [("general_python", False, False)] + [v for v in variants if not v[2]]  # reference first
    for name, whole, use_c in variants:
        runs[name] = _run(tmp_path, monkeypatch, make_debugger, name, whole, use_c, fields)
    reference = next(iter(runs.values()))
    assert json.loads(reference[0]["dump.json"])["data"]
    for name, run in runs.items():
        assert run[0] == reference[0], name  # dump.json, stack.json, construct.json byte for byte
        assert run[1] == reference[1], name  # losses and gradients
        assert run[3] == reference[3], name  # the open step read back from its journal
    calls = [line for line in runs["whole" if "whole" in runs else "whole_python"][2] if "v" in line and "stack" in line]
    general = [line for line in reference[2] if "v" in line and "stack" in line]
    assert not general
    if fields.get("extra_info", True):
        # one line per call: the step's relu call holds its stack, inputs and output
        assert [sorted(line["v"]) for line in calls] == [["input_args", "input_kwargs", "output"]]
        assert len(runs["whole" if "whole" in runs else "whole_python"][2]) < len(reference[2])
    else:
        assert not calls


def test_user_exception_and_inputs_of_a_failing_call(tmp_path, make_debugger):
    """An exception raised by the original API reaches the user unchanged; the call's inputs are
    recorded (as by the general path) with the entry's ``error``, no output."""
    dump = str(tmp_path / "dump")
    debugger = make_debugger(dump_path=dump)
    assert debugger.service.recorder.has_fast_path("Functional.matmul", False)
    x = Tensor(np.ones((2, 3), np.float32))
    debugger.start()
    with pytest.raises(Exception) as info:
        ops.matmul(x, x)  # (2, 3) @ (2, 3): MindSpore refuses the shapes
    direct = None
    try:
        ops.matmul.__wrapped__(x, x)
    except Exception as exc:
        direct = exc
    debugger.stop()
    debugger.step()
    assert type(info.value) is type(direct) and str(info.value) == str(direct)
    with open(os.path.join(only_step_dir(dump, 0), "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    body = data["Functional.matmul.0.forward"]
    assert sorted(body) == ["error", "input_args", "input_kwargs"]
    assert body["error"] == f"the call raised {type(direct).__name__}: {str(direct).splitlines()[0]}"
    assert [leaf["shape"] for leaf in body["input_args"]] == [[2, 3], [2, 3]]


def test_journal_stack_use_with_a_body_means_its_lines():
    """A stack use with a body replays like the stack use and the key lines it stands for; old
    journals (separate lines) stay readable."""
    leaf = {"type": "int", "value": 1}
    body = {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]}
    entry = "Functional.relu.0.forward"
    frames = journal.stack_frames(0, ["File a.py, line 1, in f, \n x"])
    combined = [frames, journal.stack_ref(entry, 0, body)]
    separate = [frames, journal.stack_ref(entry, 0)] + [journal.key_line(entry, k, v) for k, v in body.items()]
    assert journal.replay(combined) == journal.replay(separate)
    assert journal.line_kind(combined[1]) == "stack_ref"
    assert journal.decode(combined[1]) == ("stack_ref", (entry, 0, body))
    assert list(journal.pieces(combined)) == list(journal.pieces(separate))
    assert journal.piece_of(combined[1]) == journal.Piece(entry, "input_args", [leaf])
    from msprobe.format import validate_document

    validate_document(combined[1], "journal")


class BrokenDtype(Tensor):
    """A Tensor whose ``dtype`` cannot be read: describing it is a failure of the tool's, not of the
    user's computation."""

    @property
    def dtype(self):
        raise RuntimeError("no dtype here")


def test_tool_failure_is_reported_and_the_call_goes_on(tmp_path, monkeypatch, make_debugger):
    """An argument the tool cannot describe: the same records and the same dump_error_info.log
    message on both paths; the call's result reaches the user, and later calls are recorded."""
    got = {}
    for whole in (True, False):
        with monkeypatch.context() as patch:
            if not whole:
                patch.setattr(Runtime, "takes_whole_calls", lambda self: False)
            dump = str(tmp_path / f"dump_{whole}")
            debugger = make_debugger(dump_path=dump)
            assert debugger.service.recorder.has_fast_path("Functional.relu", False) == whole
            x = Tensor(np.array([-1.0, 2.0], np.float32))
            broken = BrokenDtype(np.array([-1.0, 2.0], np.float32))
            debugger.start()
            first = ops.relu(broken)
            second = ops.sigmoid(x)
            debugger.stop()
            debugger.step()
            step = only_step_dir(dump, 0)
            with open(os.path.join(step, "dump.json"), "rb") as f:
                data = f.read()
            log = os.path.join(step, "dump_error_info.log")
            messages = [line.split(" ", 2)[2] for line in open(log, encoding="utf-8")] if os.path.exists(log) else []
            got[whole] = data, messages, first.asnumpy().tolist(), second.asnumpy().tolist()
    assert got[True] == got[False]
    assert got[True][1] == ["failed to record Functional.relu: RuntimeError('no dtype here')\n"]
    assert got[True][2] == [0.0, 2.0]
    data = json.loads(got[True][0])["data"]
    assert "Functional.relu.0.forward" not in data and "Functional.sigmoid.0.forward" in data


@pytest.mark.parametrize("fields", [{"level": "L1"}, {"level": "mix"},
                                    {"level": "L1", "section": {"summary_mode": "md5"}}],
                         ids=["L1", "mix", "md5"])
def test_node_hook_items_write_the_files_of_one_by_one_items(tmp_path, monkeypatch, make_debugger, fields):
    """Gradients a node hook receives, queued together (``Runtime.record_items``), write the files
    that recording them one by one (``Runtime.record_item`` per item) writes; most items of the step
    take the grouped path."""
    runs, singles = {}, {}
    real_item = Runtime.record_item

    def one_by_one(self, entry, items, token):
        for key, index, size, value in items:
            self.record_item(entry, key, index, size, value, key, token)

    for name in ("items", "one_by_one"):
        calls = []

        def counting_item(self, *args, _calls=calls):
            _calls.append(args[0])
            return real_item(self, *args)

        monkeypatch.setattr(Runtime, "record_item", counting_item)
        if name == "one_by_one":
            monkeypatch.setattr(Runtime, "record_items", one_by_one)
        runs[name] = _run(tmp_path, monkeypatch, make_debugger, name, True, True, fields)
        singles[name] = len(calls)
    reference = runs["one_by_one"]
    assert any(".backward" in entry for entry in json.loads(reference[0]["dump.json"])["data"])
    assert runs["items"][0] == reference[0]  # dump.json, stack.json, construct.json byte for byte
    assert runs["items"][1] == reference[1]  # losses and gradients
    assert runs["items"][3] == reference[3]  # the open step read back from its journal
    if hotpath.ext is not None:
        assert singles["items"] < singles["one_by_one"] / 2


class _Block(nn.Cell):
    """A Cell with sub-Cells, a keyword argument, a tuple output and no parameters of its own."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.act = nn.ReLU()

    def construct(self, x, scale=1.0):
        h = self.act(self.fc(x)) * scale
        return h, x


class _CellNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = _Block()
        self.head = nn.Dense(8, 4)

    def construct(self, x):
        h, skip = self.block(x, scale=0.5)
        h, _ = self.block(h + skip)  # the same Cell twice: forward 0 and 1
        return self.head(h)


@pytest.mark.parametrize("fields", [{"level": "L0"}, {"level": "mix"}, {"level": "L0", "extra_info": False},
                                    {"level": "L0", "section": {"data_mode": ["forward"]}}],
                         ids=["L0", "mix", "no_extra_info", "forward_only"])
def test_cell_hook_records_queued_at_once_write_the_files_of_one_by_one_records(
        tmp_path, monkeypatch, make_debugger, fields):
    """A Cell hook's records queued at once (``Runtime.queue_cell_lines``: construct edge, stack,
    inputs; parameters and output) write the files that queuing them one by one (``record_parent``,
    ``record_stack``, ``record``) writes, byte for byte, with the same losses and gradients and the
    same journal read back; with the compiled extension every Cell call takes the grouped path."""
    runs, added = {}, {}
    real_added = Runtime._added_to_batch

    def net():
        ms.set_seed(3)
        np.random.seed(3)
        return _CellNet()

    for name in ("one_by_one", "at_once"):
        calls = []

        def counting(self, slots, _calls=calls):  # runs after the stack is read: not in any stack
            _calls.append(len(slots))
            return real_added(self, slots)

        monkeypatch.setattr(Runtime, "_added_to_batch", counting)
        if name == "one_by_one":
            monkeypatch.setattr(Runtime, "queue_cell_lines", lambda self, *args, **kwargs: False)
        runs[name] = _run(tmp_path, monkeypatch, make_debugger, name, True, True, fields, make_net=net)
        added[name] = len(calls)
    reference = runs["one_by_one"]
    data = json.loads(reference[0]["dump.json"])["data"]
    assert any(entry.startswith("Cell.block._Block.forward.1") for entry in data)
    assert runs["at_once"][0] == reference[0]  # dump.json, stack.json, construct.json byte for byte
    assert runs["at_once"][1] == reference[1]  # losses and gradients
    assert runs["at_once"][3] == reference[3]  # the open step read back from its journal
    assert runs["at_once"][2] == reference[2]  # the same journal lines, in the same order
    if hotpath.ext is not None:
        # two steps of 7 Cell calls (block, block.fc, block.act twice, head; the open step calls
        # none): one batch addition instead of two in the pre-hook (input_args, input_kwargs) and
        # in the forward hook (parameters, output)
        assert added["one_by_one"] - added["at_once"] == 2 * 7 * 2


@pytest.mark.parametrize("fields", [{"level": "L0"}, {"level": "mix"}, {"level": "L0", "extra_info": False}],
                         ids=["L0", "mix", "no_extra_info"])
def test_parameter_gradients_queued_at_once_write_the_files_of_the_general_path(
        tmp_path, monkeypatch, make_debugger, fields):
    """A Cell's parameter gradients queued in one step (``Runtime.queue_param_grad``) write the files
    that ``Runtime.record_param_grad`` writes, byte for byte, with the same losses, gradients and
    journal read back; with the compiled extension no parameter gradient takes the general path."""
    runs, general = {}, {}
    real_record = Runtime.record_param_grad

    def net():
        ms.set_seed(3)
        np.random.seed(3)
        return _CellNet()

    for name in ("general", "at_once"):
        calls = []

        def counting(self, entry, *args, _calls=calls):
            _calls.append(entry)
            return real_record(self, entry, *args)

        monkeypatch.setattr(Runtime, "record_param_grad", counting)
        if name == "general":
            monkeypatch.setattr(Runtime, "queue_param_grad", lambda self, *args: False)
        runs[name] = _run(tmp_path, monkeypatch, make_debugger, name, True, True, fields, make_net=net)
        general[name] = len(calls)
    reference = runs["general"]
    data = json.loads(reference[0]["dump.json"])["data"]
    assert any(".parameters_grad." in entry and "weight" in data[entry] for entry in data)
    assert runs["at_once"][0] == reference[0]  # dump.json, stack.json, construct.json byte for byte
    assert runs["at_once"][1] == reference[1]  # losses and gradients
    assert runs["at_once"][3] == reference[3]  # the open step read back from its journal
    assert runs["at_once"][2] == reference[2]  # the same journal lines, in the same order
    assert general["general"] > 0
    if hotpath.ext is not None:
        assert general["at_once"] == 0
