"""The writer and the reader without MindSpore: hand-made journal lines (made by the constructors of
msprobe.format.journal) are written by StepWriter and the step's files by msprobe.engine.step_files,
then read back through msprobe.dump (finished step, interrupted step, torn journal) and compared
with what was written. A subprocess checks that the writer, format and reader modules do not import
MindSpore."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import msprobe
import msprobe.dump as dump
import msprobe.engine.writer as writer_module
from msprobe.engine.step_files import StepExtras, dump_document, write_step
from msprobe.engine.writer import StepWriter
from msprobe.format import journal, validate_dump_tree, validate_file
from msprobe.format.frames import frame_line
from msprobe.format.journal import Piece

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACK = "File /abs/train.py, line 42, in construct, \n x = ops.relu(x)"
CELL = "Cell.net.Net.forward.0"
RELU = "Functional.relu.0.forward"
RELU_BWD = "Functional.relu.0.backward"
SHAPE = "Tensor.shape.0.backward"  # a backward entry that never gets a gradient


def leaf(**stats):
    body = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [2, 3], "Max": 1.5, "Min": -0.5,
            "Mean": 0.25, "Norm": 2.0}
    body.update(stats)
    return body


class Slot:
    """What the runtime hands the writer in place of a tensor: an object whose ``leaf`` is filled in
    when the batch's statistics are computed."""

    def __init__(self, finished: dict):
        self.leaf = finished


def lines_of_a_step(nan: bool = False):
    """A mix-level step: a Cell, an API inside it (forward and backward, one gradient at a time),
    a parameter gradient, a stack and construct edges (one to a backward that stays empty)."""
    out = leaf(Max=math.nan, Min=math.nan, Mean=math.nan, Norm=math.nan) if nan else leaf()
    return [
        journal.stack_frames(0, [STACK]),
        journal.stack_ref(CELL, 0),
        journal.construct_edge(CELL, None),
        journal.key_line(CELL, "input_args", [leaf()]),
        journal.key_line(CELL, "input_kwargs", {}),
        journal.key_line(CELL, "parameters", {"weight": Slot(leaf())}),
        journal.stack_ref(RELU, 0),
        journal.construct_edge(RELU, CELL),
        journal.key_line(RELU, "input_args", [Slot(leaf()), {"type": "bool", "value": False}]),
        journal.key_line(RELU, "input_kwargs", {}),
        journal.key_line(RELU, "output", [Slot(out)]),
        journal.key_line(CELL, "output", [leaf()]),
        journal.construct_edge(SHAPE, CELL),
        journal.construct_edge(RELU_BWD, "Cell.net.Net.backward.0"),
        journal.construct_edge("Cell.net.Net.backward.0", None),
        journal.item_line(RELU_BWD, "input", 0, 1, leaf()),
        journal.item_line(RELU_BWD, "output", 1, 2, leaf()),
        journal.key_line("Cell.net.Net.backward.0", "input", [leaf()]),
        journal.key_line("Cell.net.Net.parameters_grad.0", "weight", [leaf()]),
    ]


def expected_data(nan: bool = False):
    out = leaf(Max=math.nan, Min=math.nan, Mean=math.nan, Norm=math.nan) if nan else leaf()
    return {
        CELL: {"input_args": [leaf()], "input_kwargs": {}, "parameters": {"weight": leaf()},
               "output": [leaf()]},
        RELU: {"input_args": [leaf(), {"type": "bool", "value": False}], "input_kwargs": {}, "output": [out]},
        RELU_BWD: {"input": [leaf()], "output": [None, leaf()]},
        "Cell.net.Net.backward.0": {"input": [leaf()]},
        "Cell.net.Net.parameters_grad.0": {"weight": [leaf()]},
    }


def new_writer(directory, task="statistics", level="mix", **kw):
    return StepWriter(str(directory), {"task": task, "level": level, "framework": "mindspore"},
                      tensor_data=kw.pop("tensor_data", False), extra_info=kw.pop("extra_info", True), **kw)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def same(a, b) -> bool:
    """Equality with NaN equal to NaN (statistics of a NaN tensor)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_finished_step_reads_back_what_was_written(tmp_path):
    step = tmp_path / "dump" / "step2" / "rank0"
    writer = new_writer(step)
    writer.append(lines_of_a_step())
    write_step(writer, StepExtras())
    writer.close()
    assert sorted(os.listdir(step)) == ["construct.json", "dump.json", "stack.json"]
    loaded = dump.load(str(step))
    assert loaded.complete
    assert loaded.data == expected_data()
    assert list(loaded.data) == list(expected_data())        # execution order = first line's order
    assert loaded.stacks == {CELL: [STACK], RELU: [STACK]}
    assert loaded.construct == {CELL: None, RELU: CELL, RELU_BWD: "Cell.net.Net.backward.0",
                                "Cell.net.Net.backward.0": None}   # the empty backward is pruned
    assert dump.load_stacks(str(step)) == loaded.stacks
    assert dump.load_construct(str(step)) == loaded.construct
    bodies = list(dump.iter_bodies(str(step)))
    assert bodies[0][0] is None and bodies[0][1]["run_id"] == journal.run_id()
    assert dict(bodies[1:]) == expected_data()
    pieces = list(dump.iter_entries(str(step)))
    assert pieces[0] == Piece(CELL, "input_args", [leaf()])
    rebuilt = {}
    for p in pieces:
        rebuilt.setdefault(p.entry, {})[p.key] = p.value
    assert rebuilt == expected_data()


def test_interrupted_step_reads_back_from_its_journal(tmp_path):
    step = tmp_path / "dump" / "step0" / "proc7"
    writer = new_writer(step)
    lines = lines_of_a_step()
    writer.append(lines[:12])
    writer.append(lines[12:])
    # the process is killed here: no dump.json, the journal stays, its last write torn
    with open(step / journal.JOURNAL, "ab") as f:
        f.write(b'{"e": "Functional.relu.1.forward", "k": "inp')
    loaded = dump.load(str(step))
    assert not loaded.complete
    assert loaded.data == expected_data()
    assert loaded.header == journal.header("statistics", "mix", "mindspore", None)["h"]
    # the journal's construct is the raw one (pruning belongs to whoever writes construct.json)
    assert loaded.construct[SHAPE] == CELL
    pieces = list(dump.iter_entries(str(step)))
    assert Piece(RELU_BWD, "output", leaf(), index=1) in pieces
    assert [p for p in pieces if p.entry == RELU_BWD] == [
        Piece(RELU_BWD, "input", leaf(), index=0), Piece(RELU_BWD, "output", leaf(), index=1)]
    # the writer's live state and a replay of its journal agree
    assert writer.replayed()[1] == loaded.data


def test_stopped_step_has_files_and_journal_both_readable(tmp_path):
    """stop(): files written, journal kept until step(); the reader takes the journal."""
    step = tmp_path / "dump" / "step1" / "rank3"
    writer = new_writer(step)
    writer.append(lines_of_a_step(nan=True))
    write_step(writer, StepExtras())
    assert {"dump.json", journal.JOURNAL, "anomalies.json"} <= set(os.listdir(step))
    assert same(dump.load(str(step)).data, expected_data(nan=True))
    assert not dump.load(str(step)).complete
    anomalies = read_json(step / "anomalies.json")
    assert anomalies["first_producer"] == RELU and anomalies["step"] == 1
    assert anomalies["stack"] == [frame_line(STACK)]   # one line per frame (stack.json: two)
    writer.close()
    assert same(dump.load(str(step)).data, expected_data(nan=True))


def test_a_format_1_dump_with_two_line_anomaly_frames_is_still_read(tmp_path):
    """Format 2 writes ``anomalies.json``'s frames on one line (as the commands print them); a dump of
    format 1 (``"schema": "msprobe-mindspore/1"``, two-line frames there) stays valid and readable, and
    ``read_report`` gives its frames in the one-line form."""
    step = tmp_path / "dump" / "step1" / "rank3"
    writer = new_writer(step)
    writer.append(lines_of_a_step(nan=True))
    write_step(writer, StepExtras())
    writer.close()
    assert read_json(step / "dump.json")["schema"] == journal.SCHEMA == "msprobe-mindspore/2"
    new_form = dump.read_report(str(step), dump.ANOMALIES)
    for name, edit in (("dump.json", lambda d: d.update(schema="msprobe-mindspore/1")),
                       ("anomalies.json", lambda d: d.update(stack=[STACK]))):
        doc = read_json(step / name)
        edit(doc)
        (step / name).write_text(json.dumps(doc), encoding="utf-8")
    validate_dump_tree(str(tmp_path / "dump"))
    assert dump.load(str(step)).header["schema"] == "msprobe-mindspore/1"
    assert dump.read_report(str(step), dump.ANOMALIES)["stack"] == new_form["stack"] == [frame_line(STACK)]


def test_run_id_and_version_in_every_file_with_a_top_level_object(tmp_path):
    step = tmp_path / "dump" / "step0" / "rank0"
    writer = new_writer(step)
    writer.append(lines_of_a_step(nan=True))
    extras = StepExtras()
    extras.add_note("not_captured", [{"name": "relu", "module": "train", "api": "Functional.relu",
                                      "call_as": "mindspore.ops.relu", "reason": "bound before start()"}])
    write_step(writer, extras)
    first_line = next(journal.read_journal(str(step / journal.JOURNAL)))
    header = journal.decode(first_line)
    assert header[0] == "header"
    run = journal.run_id()
    assert len(run) == 32 and int(run, 16) >= 0
    for fields in (header[1][0], read_json(step / "dump.json"), read_json(step / "anomalies.json")):
        assert fields["run_id"] == run
        assert fields["msprobe_version"] == msprobe.__version__
    dump_json = read_json(step / "dump.json")
    assert list(dump_json) == ["task", "level", "framework", "dump_data_dir", "schema", "run_id",
                               "msprobe_version", "data"]
    # the seed-shaped files keep their shape: keyed by stack id / entry name, note kind
    assert set(read_json(step / "stack.json")) == {"0"}
    assert "run_id" not in read_json(step / "construct.json")
    assert set(read_json(step / "coverage.json")) == {"not_captured"}
    writer.close()
    for name in os.listdir(step):
        validate_file(str(step / name))


def test_run_id_is_one_per_process():
    code = "from msprobe.format import journal; print(journal.run_id())"
    ids = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT)).stdout.strip() for _ in range(2)}
    assert len(ids) == 2 and journal.run_id() not in ids


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_has_its_own_run_id():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, journal.run_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert len(child) == 32 and child != journal.run_id()


def test_writer_writes_what_it_is_given(tmp_path):
    """No pruning, no reports, no reason of its own: StepWriter.write puts the documents it is
    handed into the directory (None removes one)."""
    step = tmp_path / "dump" / "step0" / "rank0"
    writer = new_writer(step)
    writer.append(lines_of_a_step())
    header, data, stacks, construct = writer.replayed()
    assert construct[SHAPE] == CELL                     # the raw edges, as journaled
    writer.write({"dump.json": dump_document(header, data), "construct.json": construct,
                  "stack.json": stacks})
    assert read_json(step / "construct.json")[SHAPE] == CELL
    assert "anomalies.json" not in os.listdir(step)
    writer.write({"construct.json": None})
    assert "construct.json" not in os.listdir(step)
    writer.close()


def test_empty_step_reason_is_given_as_data(tmp_path):
    step = tmp_path / "dump" / "step0" / "rank0"
    writer = new_writer(step, task="structure", level="L0")
    writer.append([journal.construct_edge(CELL, None)])
    why = "task 'structure' records the call structure (construct.json, stack.json), no data"
    write_step(writer, StepExtras(), why)
    writer.close()
    written = read_json(step / "dump.json")
    assert written["data"] == {} and written["empty_reason"] == why
    assert read_json(step / "construct.json") == {CELL: None}


def test_abnormal_end_and_notes_come_from_the_extras(tmp_path):
    step = tmp_path / "dump" / "step0" / "rank0"
    writer = new_writer(step)
    writer.append(lines_of_a_step()[:6])
    extras = StepExtras()
    extras.mark_abnormal("the program ended with ValueError: boom")
    extras.mark_abnormal("a later reason is not kept")
    write_step(writer, extras)
    assert read_json(step / "dump.json")["abnormal"] == "the program ended with ValueError: boom"
    assert not extras.changed
    mtime = os.stat(step / "dump.json").st_mtime_ns
    write_step(writer, extras)                          # nothing new: nothing rewritten
    assert os.stat(step / "dump.json").st_mtime_ns == mtime
    extras.add_note("unwaited_async_handles", [{"entry": "MintDistributed.all_reduce.0.forward",
                                                "note": "handle never waited; output not recorded"}])
    write_step(writer, extras)
    assert read_json(step / "coverage.json")["unwaited_async_handles"][0]["entry"] == \
        "MintDistributed.all_reduce.0.forward"
    writer.close()


def test_journal_read_back_when_the_live_mirror_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "LIVE_STATE_BYTES", 256)
    step = tmp_path / "dump" / "step0" / "rank0"
    writer = new_writer(step)
    writer.append(lines_of_a_step())
    assert writer._state is None                       # beyond the cap: read back from the journal
    write_step(writer, StepExtras())
    writer.close()
    assert dump.load(str(step)).data == expected_data()


def test_relocated_step_keeps_its_records(tmp_path):
    """proc{pid} renamed to rank{R} when the rank becomes known: a second header line names the new
    dump_data_dir; the reader takes the last one."""
    old = tmp_path / "dump" / "step0" / "proc9"
    writer = new_writer(old, task="tensor", tensor_data=True)
    writer.append(lines_of_a_step()[:6])
    new = tmp_path / "dump" / "step0" / "rank1"
    writer.relocate(str(new))
    writer.append(lines_of_a_step()[6:])
    loaded = dump.load(str(new))
    assert loaded.header["dump_data_dir"] == str(new / journal.TENSOR_DIR)
    assert loaded.data == expected_data()
    write_step(writer, StepExtras())
    writer.close()
    assert read_json(new / "dump.json")["dump_data_dir"] == str(new / journal.TENSOR_DIR)
    assert not old.exists()


def test_debug_level_lines_round_trip(tmp_path):
    step = tmp_path / "dump" / "step0" / "rank0"
    writer = new_writer(step, level="debug", extra_info=False, data_file="debug.json")
    writer.append([
        journal.value_line("x.0.debug", {"a": [leaf(), {"type": "int", "value": 3}]}),
        journal.value_line("x_grad.0.debug", {"a": [None, None]}),
        journal.path_line("x_grad.0.debug", ("a", 0), leaf(Max=0.5)),
        journal.value_line("empty.0.debug", []),
        journal.value_line("t_grad.0.debug", None),
        journal.path_line("t_grad.0.debug", (), leaf()),
    ])
    write_step(writer, StepExtras())
    writer.close()
    assert sorted(os.listdir(step)) == ["debug.json"]
    assert dump.load(str(step)).data == {
        "x.0.debug": {"a": [leaf(), {"type": "int", "value": 3}]},
        "x_grad.0.debug": {"a": [leaf(Max=0.5), None]},
        "empty.0.debug": [],
        "t_grad.0.debug": leaf()}


def test_every_constructor_makes_a_valid_line_the_interpreter_decodes():
    made = {
        "header": (journal.header("tensor", "L1", "mindspore", "/d/step0/rank0/dump_tensor_data"),
                   ("tensor", "L1", "mindspore", "/d/step0/rank0/dump_tensor_data")),
        "set_key": (journal.key_line(RELU, "output", [leaf()]), (RELU, "output", [leaf()])),
        "set_item": (journal.item_line(RELU_BWD, "output", 1, 2, leaf()), (RELU_BWD, "output", 1, 2, leaf())),
        "set_entry": (journal.value_line("x.0.debug", leaf()), ("x.0.debug", leaf())),
        "set_path": (journal.path_line("x_grad.0.debug", ("a", 0), leaf()), ("x_grad.0.debug", ["a", 0], leaf())),
        "stack_ref": (journal.stack_ref(RELU, 4), (RELU, 4)),
        "stack_frames": (journal.stack_frames(4, [STACK]), (4, [STACK])),
        "construct_edge": (journal.construct_edge(RELU, CELL), (RELU, CELL)),
    }
    from msprobe.format import validate_document

    assert tuple(made) == journal.KINDS
    for kind, (line, fields) in made.items():
        validate_document(line, "journal")
        got_kind, got = journal.decode(line)
        assert got_kind == kind and journal.line_kind(line) == kind
        if kind == "header":
            assert got[0]["schema"] == journal.SCHEMA and tuple(got[0].values())[:4] == fields
        else:
            assert got == fields
    assert journal.decode({"x": 1}) is None


def test_validated_tree(tmp_path):
    """Everything a writer makes validates (the conftest also checks at teardown)."""
    step = tmp_path / "dump" / "step5" / "rank0"
    writer = new_writer(step)
    writer.append(lines_of_a_step(nan=True))
    write_step(writer, StepExtras())
    assert len(validate_dump_tree(str(tmp_path))) == 5  # journal, dump, stack, construct, anomalies
    writer.close()


def test_writer_format_and_reader_do_not_import_mindspore():
    code = ("import sys\n"
            "import msprobe.engine.writer, msprobe.engine.step_files, msprobe.format, msprobe.read.reader\n"
            "import msprobe.read.report, msprobe.dump\n"
            "bad = sorted(m for m in sys.modules if m == 'mindspore' or m.startswith('mindspore.')\n"
            "             or m.startswith('msprobe.tensors') or m == 'msprobe.engine.runtime')\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_dumping_does_not_need_the_validator():
    """jsonschema is for checking dumps, not for writing them: the tool imports without it (an
    environment that installs msprobe with only its runtime needs, e.g. beside mindformers)."""
    code = ("import sys\n"
            "import msprobe.mindspore, msprobe.dump\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jsonschema', 'referencing')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_files_after_the_live_mirror_is_released_are_the_mirrored_ones(tmp_path, nan):
    """stop() frees the step's records (release_live_state, before the GC window closes); lines that
    come later (gradients after stop()) are read back from the journal: every file is byte for byte
    the one of a writer that kept its mirror, with NaN tokens too."""
    lines = lines_of_a_step(nan)
    written = {}
    for name, release in (("kept", False), ("released", True)):
        step = tmp_path / name / "step0" / "rank0"
        writer = new_writer(step)
        writer.append(lines[:11])
        write_step(writer, StepExtras())
        if release:
            writer.release_live_state()
            assert writer._state is None
        writer.append(lines[11:])
        write_step(writer, StepExtras())
        written[name] = {f: (step / f).read_bytes().replace(str(tmp_path / name).encode(), b"")
                         for f in sorted(os.listdir(step)) if f != journal.JOURNAL}
        writer.close()
        assert dump.load(str(step)).data.keys() == expected_data(nan).keys()
    assert set(written["kept"]) >= {"dump.json", "stack.json", "construct.json"}
    assert written["released"] == written["kept"]


@pytest.mark.parametrize("compiled", [True, False])
def test_documents_are_written_whole_replacing_older_versions(tmp_path, monkeypatch, compiled):
    """StepWriter.write's documents: the bytes of encode_json, written once and again over the
    first version, no temporary file left, with the compiled file helper and without it; a failed
    document raises OSError naming it, after the documents before it."""
    from msprobe.format import npy

    if not compiled:
        monkeypatch.setattr(npy, "_npy_files", None)
    elif npy._npy_files is None:
        pytest.skip("msprobe.format._npy_files is not built")
    docs = {"dump.json": {"data": {RELU: {"Max": float("nan")}}}, "stack.json": {"0": [STACK]},
            "construct.json": {CELL: None}}
    for version in (1, 2):
        docs["construct.json"] = {CELL: None, f"v{version}": CELL}
        journal.atomic_write_documents([(str(tmp_path / name), obj, name == "dump.json")
                                        for name, obj in docs.items()])
        assert sorted(os.listdir(tmp_path)) == sorted(docs)
        for name, obj in docs.items():
            assert (tmp_path / name).read_bytes() == journal.encode_json(obj, name == "dump.json")
    missing = tmp_path / "gone" / "stack.json"
    with pytest.raises(OSError) as err:
        journal.atomic_write_documents([(str(tmp_path / "first.json"), {}, False), (str(missing), {}, False),
                                        (str(tmp_path / "last.json"), {}, False)])
    assert (tmp_path / "first.json").exists() and not (tmp_path / "last.json").exists()
    assert err.value.filename in (str(missing), f"{missing}.tmp{os.getpid()}")
