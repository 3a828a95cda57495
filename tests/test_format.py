"""The dump format's JSON Schemas (msprobe.format): hand-made valid and invalid documents, strict JSON
parsing, journal lines, tensor-file checks, and a round trip through the writer (no MindSpore calls)."""
from __future__ import annotations

import copy
import json
import math
import os

import pytest
from jsonschema import Draft202012Validator

from msprobe.engine.step_files import StepExtras, write_step
from msprobe.engine.writer import StepWriter
from msprobe.format.journal import OLDER_SCHEMAS, SCHEMA
from msprobe.read.reader import SUPPORTED_SCHEMAS
from msprobe.format import (SCHEMA_VERSION, FormatError, schema, validate_document, validate_dump_tree,
                            validate_file)

SCHEMA_NAMES = ("common", "dump", "debug", "stack", "construct", "anomalies", "coverage", "journal")


def tensor(**extra):
    leaf = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [2, 3], "Max": 1.5, "Min": -0.5,
            "Mean": 0.25, "Norm": 2.0}
    leaf.update(extra)
    return leaf


def dump_doc(data=None, **top):
    doc = {"task": "statistics", "level": "mix", "framework": "mindspore", "dump_data_dir": None,
           "schema": SCHEMA_VERSION,
           "data": data if data is not None else {
               "Cell.fc1.Dense.forward.0": {
                   "input_args": [tensor()], "input_kwargs": {}, "output": [tensor()],
                   "parameters": {"weight": tensor(), "bias": tensor(shape=[3])}},
               "Functional.relu.0.forward": {
                   "input_args": [tensor(), {"type": "bool", "value": False}],
                   "input_kwargs": {"approximate": {"type": "str", "value": "none"}},
                   "output": [tensor()]},
               "Functional.relu.0.backward": {"input": [tensor()], "output": [tensor(), None]},
               "Cell.fc1.Dense.backward.0": {"input": [tensor()]},
               "Cell.fc1.Dense.parameters_grad.0": {"weight": [tensor()], "bias": [tensor(shape=[3])]},
               "Jit.SGD.0.forward": {"input_args": [[tensor(), tensor()]], "input_kwargs": {},
                                     "output": [{"type": "bool", "value": True}]},
           }}
    doc.update(top)
    return doc


def error_of(document, name):
    with pytest.raises(FormatError) as info:
        validate_document(document, name)
    return info.value


def test_schema_version_is_the_writers():
    """The schemas accept the version written and the earlier ones the readers still read."""
    assert SCHEMA_VERSION == SCHEMA
    assert schema("common")["$defs"]["schema_version"]["enum"] == [SCHEMA, *OLDER_SCHEMAS]
    assert set(SUPPORTED_SCHEMAS) == {SCHEMA, *OLDER_SCHEMAS}


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_schemas_are_valid_draft_2020_12(name):
    doc = schema(name)
    Draft202012Validator.check_schema(doc)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_valid_dump_json():
    validate_document(dump_doc(), "dump")
    list_grads = {"input": [tensor()], "output": [[tensor(), None, tensor()], None]}   # ops.concat([a, b, c])
    validate_document(dump_doc({"Functional.concat.0.backward": list_grads}), "dump")


def test_seed_example_with_schema_key_is_valid():
    """The seed's L1 dump.json example ("dump.json文件说明"), plus the version key this tool adds."""
    leaf = tensor(shape=[32, 16, 28, 28], data_name="Functional.relu.0.forward.input.0.npy")
    data = {"Functional.relu.0.forward": {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]},
            "Functional.relu.0.backward": {"input": [leaf], "output": [leaf]}}
    validate_document(dump_doc(data, task="tensor", level="L1",
                               dump_data_dir="/dump/path/step0/rank0/dump_tensor_data"), "dump")


@pytest.mark.parametrize("leaf", [
    {"type": "int", "value": 3}, {"type": "float", "value": float("nan")}, {"type": "str", "value": ""},
    {"type": "slice", "value": [0, None, 2]}, {"type": "ellipsis", "value": "..."},
    {"type": "mindspore.dtype", "value": "Float16"}, {"type": "float32", "value": 1.5},
    {"type": "bool_", "value": True}, {"type": "int64", "value": 2 ** 70},
    tensor(dtype="Bool", Max=True, Min=False, Mean=None, Norm=None),
    tensor(dtype="Int32", shape=[], Max=7, Min=7, Mean=7, Norm=7),
    tensor(shape=[0, 4], Max=None, Min=None, Mean=None, Norm=None),
    tensor(Max=math.nan, Min=math.nan, Mean=math.nan, Norm=math.nan),
    tensor(Max=math.inf, Min=-math.inf, Mean=math.nan, Norm=math.inf),
    tensor(md5="0a1b2c3d"),
    tensor(dtype="BFloat16", data_name="Tensor.add.0.forward.output.0.npy", stored_as="bfloat16->float32"),
    tensor(Max=None, Min=None, Mean=None, Norm=None, error="RuntimeError('device lost')"),
    {"type": "numpy.ndarray", "dtype": "<U3", "shape": [2], "Max": None, "Min": None, "Mean": None,
     "Norm": None, "error": "TypeError('no statistics of dtype <U3')"},
    {"logits": tensor(), "aux": [None, {"type": "int", "value": 1}]},    # a namedtuple / dict
    {"type": {"type": "str", "value": "a dict with a key named type"}},
    [[tensor()], []],
])
def test_valid_values(leaf):
    validate_document(dump_doc({"Tensor.add.0.forward": {"input_args": [leaf]}}), "dump")


INVALID_DUMPS = [
    (lambda d: d.pop("schema"), "", "'schema' is a required property"),
    (lambda d: d.update(schema="msprobe-mindspore/3"), "/schema", "is not one of"),
    (lambda d: d.update(level="L2"), "/level", "is not one of"),
    (lambda d: d.update(framework="pytorch"), "/framework", "'mindspore' was expected"),
    (lambda d: d.update(dump_data_dir="relative/dump_tensor_data"), "/dump_data_dir", "does not match"),
    (lambda d: d.update(extra=1), "", "'extra' was unexpected"),
    (lambda d: d.update(empty_reason="why"), "", "should not be valid"),
    (lambda d: d["data"].clear(), "", "'empty_reason' is a required property"),
    (lambda d: d.update(task="tensor"), "/dump_data_dir", "None is not of type 'string'"),
    (lambda d: d["data"].update({"relu": {}}), "/data", "'relu' does not match any of the regexes"),
    (lambda d: d["data"]["Functional.relu.0.forward"].update(parameters={}),
     "/data/Functional.relu.0.forward", "'parameters' was unexpected"),
    (lambda d: d["data"]["Functional.relu.0.backward"].update(input_args=[]),
     "/data/Functional.relu.0.backward", "'input_args' was unexpected"),
    (lambda d: d["data"]["Cell.fc1.Dense.backward.0"].clear(),
     "/data/Cell.fc1.Dense.backward.0", "should be non-empty"),
    (lambda d: d["data"]["Functional.relu.0.backward"]["output"].append({"type": "int", "value": 1}),
     "/data/Functional.relu.0.backward/output/2/type", "'int' is not one of ['mindspore.Tensor', 'numpy.ndarray']"),
    (lambda d: d["data"]["Cell.fc1.Dense.forward.0"]["parameters"].update(scale=None),
     "/data/Cell.fc1.Dense.forward.0/parameters/scale", "None is not of type 'object'"),
    (lambda d: d["data"]["Cell.fc1.Dense.parameters_grad.0"].update(weight=tensor()),
     "/data/Cell.fc1.Dense.parameters_grad.0/weight", "is not of type 'array'"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"].append(1.5),
     "/data/Functional.relu.0.forward/input_args/2", "is not valid under any of the given schemas"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].pop("shape"),
     "/data/Functional.relu.0.forward/input_args/0", "'shape' is a required property"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(shape=[2, -1]),
     "/data/Functional.relu.0.forward/input_args/0/shape/1", "less than the minimum of 0"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(Max="1.5"),
     "/data/Functional.relu.0.forward/input_args/0/Max", "is not of type"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(Mean=None),
     "/data/Functional.relu.0.forward/input_args/0/Mean", "None is not of type 'number'"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(shape=[0]),
     "/data/Functional.relu.0.forward/input_args/0/Norm", "2.0 is not of type 'null'"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(dtype="Bool", Min=True, Mean=None, Norm=None),
     "/data/Functional.relu.0.forward/input_args/0/Max", "1.5 is not of type 'boolean'"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(dtype="float32"),
     "/data/Functional.relu.0.forward/input_args/0/dtype", "does not match"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(md5="ABCDEF12"),
     "/data/Functional.relu.0.forward/input_args/0/md5", "does not match"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(data_name="a/b.npy"),
     "/data/Functional.relu.0.forward/input_args/0/data_name", "does not match"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(stored_as="bfloat16->float32"),
     "/data/Functional.relu.0.forward/input_args/0", "'data_name' is a dependency of 'stored_as'"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][0].update(requires_grad=True),
     "/data/Functional.relu.0.forward/input_args/0", "'requires_grad' was unexpected"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"][1].update(value=0),
     "/data/Functional.relu.0.forward/input_args/1/value", "0 is not of type 'boolean'"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"].append({"type": "slice", "value": [1]}),
     "/data/Functional.relu.0.forward/input_args/2/value", "is too short"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"].append({"type": "int"}),
     "/data/Functional.relu.0.forward/input_args/2", "'value' is a required property"),
    (lambda d: d["data"]["Functional.relu.0.forward"]["input_args"].append({"type": "np.float32", "value": 1}),
     "/data/Functional.relu.0.forward/input_args/2/type", "does not match"),
]


@pytest.mark.parametrize("mutate,pointer,message", INVALID_DUMPS)
def test_invalid_dump_json_names_pointer_and_reason(mutate, pointer, message):
    doc = dump_doc()
    mutate(doc)
    error = error_of(doc, "dump")
    assert error.pointer == pointer, error
    assert message in error.reason, error
    assert str(error).startswith(f"<document>: at {pointer or '/'}: ")


def test_the_fast_validator_rejects_what_jsonschema_rejects():
    """jsonschema_rs (when installed) decides alone that a document is valid, so it must reject every
    document jsonschema rejects; it accepts the valid examples."""
    from msprobe.format.validate import _URN, _fast_validator

    fast = _fast_validator(_URN + "dump")
    if fast is None:
        pytest.skip("jsonschema_rs is not installed: jsonschema checks every document")
    assert fast.is_valid(dump_doc())
    for mutate, pointer, _ in INVALID_DUMPS:
        doc = dump_doc()
        mutate(doc)
        assert not fast.is_valid(doc), pointer


def debug_doc(data):
    return {"task": "tensor", "level": "debug", "framework": "mindspore",
            "dump_data_dir": "/d/step0/proc7/dump_tensor_data", "schema": SCHEMA_VERSION, "data": data}


def test_debug_json():
    saved = {"k": [tensor(data_name="nested.0.debug.k.0.npy"), {"type": "int", "value": 3}],
             "f": {"type": "float", "value": 1.5}}
    grads = {"k": [tensor(data_name="nested_grad.0.debug.k.0.npy"), None], "f": None}
    validate_document(debug_doc({"nested.0.debug": saved, "nested_grad.0.debug": grads,
                                 "logits.0.debug": tensor(data_name="logits.0.debug.npy")}), "debug")
    assert error_of(debug_doc({"Functional.relu.0.forward": tensor()}), "debug").pointer == "/data"
    assert error_of(dict(debug_doc({"x.0.debug": None}), level="L1"), "debug").pointer == "/level"


STACK = "File /a/train.py, line 42, in construct, \n x = ops.relu(x)"


def test_stack_json():
    validate_document({"0": [["Functional.relu.0.forward", "Functional.relu.1.forward"], [STACK]],
                       "1": [["Cell.fc1.Dense.forward.0"], []]}, "stack")
    validate_document({}, "stack")
    assert error_of({"a": [["Functional.relu.0.forward"], []]}, "stack").pointer == ""
    assert error_of({"0": [["Functional.relu.0.forward"]]}, "stack").pointer == "/0"
    assert error_of({"0": [["Functional.relu.0.forward"], ["train.py:42"]]}, "stack").pointer == "/0/1/0"
    assert error_of({"0": [[], [STACK]]}, "stack").pointer == "/0/0"
    assert error_of({"0": [["Functional.relu.0.backward"], [STACK]]}, "stack").pointer == "/0/0/0"


def test_construct_json():
    validate_document({"Cell.fc1.Dense.forward.0": None,
                       "Functional.relu.0.forward": "Cell.fc1.Dense.forward.0",
                       "Functional.relu.0.backward": "Cell.fc1.Dense.backward.0"}, "construct")
    error = error_of({"Functional.relu.0.forward": "Functional.add.0.forward"}, "construct")
    assert error.pointer == "/Functional.relu.0.forward"
    assert error_of({"Functional.relu.0.forward": ["Cell.a.B.forward.0", 3]}, "construct").pointer \
        == "/Functional.relu.0.forward"


def anomalies_doc(**changes):
    doc = {"first_producer": "Functional.log.0.forward", "producers": ["Functional.log.0.forward"],
           "first_non_finite": "Functional.log.0.forward", "step": 0, "rule": "producer = ...",
           "stack": [STACK]}
    doc.update(changes)
    return doc


def test_anomalies_json():
    validate_document(anomalies_doc(), "anomalies")
    validate_document(anomalies_doc(first_producer=None, producers=[], stack=None,
                                    first_non_finite="Cell.fc1.Dense.forward.0"), "anomalies")
    validate_document(anomalies_doc(first_producer="Jit.Net.0.forward", producers=["Jit.Net.0.forward"],
                                    note="Jit.Net.0.forward ran as one compiled graph"), "anomalies")
    assert error_of(anomalies_doc(first_producer="Jit.Net.0.forward"), "anomalies").reason \
        == "'note' is a required property"
    assert error_of(anomalies_doc(first_producer=None, stack=None), "anomalies").pointer == "/producers"
    assert error_of(anomalies_doc(step="0"), "anomalies").pointer == "/step"


def test_coverage_json():
    validate_document({"compiled_regions": [{"entry": "Jit.SGD.0.forward", "note": "compiled"}],
                       "unwaited_async_handles": [{"entry": "MintDistributed.all_reduce.0.forward",
                                                   "note": "handle never waited"}],
                       "not_captured": [{"name": "relu", "module": "train", "api": "Functional.relu",
                                         "call_as": "mindspore.ops.relu", "reason": "bound early"}]},
                      "coverage")
    assert error_of({}, "coverage").reason == "{} should be non-empty"
    assert error_of({"compiled_regions": [{"entry": "Jit.SGD.0.forward"}]}, "coverage").pointer \
        == "/compiled_regions/0"
    assert error_of({"gaps": []}, "coverage").pointer == ""


HEADER = {"h": {"task": "statistics", "level": "L1", "framework": "mindspore", "dump_data_dir": None,
                "schema": SCHEMA_VERSION}}
JOURNAL_LINES = [
    HEADER,
    {"s": 0, "f": [STACK]},
    {"e": "Functional.relu.0.forward", "stack": 0},
    {"e": "Functional.relu.0.forward", "k": "input_args", "v": [tensor()]},
    {"e": "Functional.relu.0.backward", "k": "output", "i": 1, "n": 2, "v": tensor()},
    {"e": "Cell.fc.Dense.parameters_grad.0", "k": "weight", "v": [tensor()]},
    {"e": "x.0.debug", "v": {"a": None}},
    {"e": "x_grad.0.debug", "p": ["a", 0], "v": tensor()},
    {"c": "Functional.relu.0.forward", "p": None},
]


def test_journal_lines():
    for line in JOURNAL_LINES:
        validate_document(line, "journal")


@pytest.mark.parametrize("line,pointer,message", [
    ({"e": "Functional.relu.0.forward", "k": "output", "i": -1, "n": 2, "v": None}, "/i", "minimum"),
    ({"e": "Functional.relu.0.forward", "k": "output", "i": 0, "v": None}, "", "'n' is a required"),
    ({"e": "Functional.relu.0.forward", "stack": "0"}, "/stack", "is not of type 'integer'"),
    ({"e": "Functional.relu.0.forward", "k": "output", "v": [1]}, "/v/0", "not valid under any"),
    ({"c": "Functional.relu.0.forward"}, "", "'p' is a required property"),
    ({"h": {"task": "statistics"}}, "/h", "is a required property"),
    ({"x": 1}, "", "not a journal line kind"),
])
def test_invalid_journal_lines(line, pointer, message):
    error = error_of(line, "journal")
    assert error.pointer == pointer and message in error.reason, error


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


@pytest.mark.no_format_check
def test_files_are_strict_json(tmp_path):
    nan_dump = dump_doc({"Functional.log.0.forward": {"output": [tensor(Max=math.nan, Min=math.nan,
                                                                          Mean=math.nan, Norm=math.nan)]}})
    validate_file(write(str(tmp_path / "a" / "dump.json"), json.dumps(nan_dump)))
    assert "NaN" in (tmp_path / "a" / "dump.json").read_text()
    path = write(str(tmp_path / "b" / "anomalies.json"), json.dumps(anomalies_doc(step=math.nan)))
    with pytest.raises(FormatError, match=r"anomalies.json: at /: not valid JSON: NaN is not allowed"):
        validate_file(path)
    path = write(str(tmp_path / "c" / "construct.json"), '{"Cell.a.B.forward.0": null, "Cell.a.B.forward.0": null}')
    with pytest.raises(FormatError, match="duplicate key 'Cell.a.B.forward.0'"):
        validate_file(path)
    with pytest.raises(ValueError, match="not a dump file"):
        validate_file(write(str(tmp_path / "notes.json"), "{}"))


@pytest.mark.no_format_check
def test_journal_file_line_numbers_and_torn_tail(tmp_path):
    lines = [json.dumps(line) for line in JOURNAL_LINES]
    path = write(str(tmp_path / "ok" / "dump.journal"), "\n".join(lines) + "\n" + '{"e": "Functional.re')
    validate_file(path)                                  # a torn last line (killed mid-write) is ignored
    bad = lines[:3] + ['{"e": "Functional.relu.0.forward", "stack": -1}'] + lines[3:]
    path = write(str(tmp_path / "bad" / "dump.journal"), "\n".join(bad) + "\n")
    with pytest.raises(FormatError, match=r"dump.journal:4: at /stack: -1 is less than the minimum of 0") as info:
        validate_file(path)
    assert info.value.line == 4
    path = write(str(tmp_path / "nohead" / "dump.journal"), "\n".join(lines[1:]) + "\n")
    with pytest.raises(FormatError, match="first journal line must be the header"):
        validate_file(path)


@pytest.mark.no_format_check
def test_dump_tree_checks_every_file_and_tensor_files(tmp_path):
    step = tmp_path / "dump" / "step0" / "rank0"
    doc = dump_doc({"Functional.relu.0.forward": {"output": [tensor(data_name="Functional.relu.0.forward.output.0.npy")]}},
                   task="tensor", dump_data_dir=str(step / "dump_tensor_data"))
    write(str(step / "dump.json"), json.dumps(doc))
    write(str(step / "stack.json"), "{}")
    write(str(step / "construct.json"), "{}")
    with pytest.raises(FormatError, match=r"dump.json: at /data/Functional.relu.0.forward: data_name "
                                          r"'Functional.relu.0.forward.output.0.npy' has no file"):
        validate_dump_tree(str(tmp_path / "dump"))
    write(str(step / "dump_tensor_data" / "Functional.relu.0.forward.output.0.npy"), "")
    write(str(step / "dump.json"), json.dumps(dict(doc, task="statistics", dump_data_dir=None)))
    with pytest.raises(FormatError, match="data_name 'Functional.relu.0.forward.output.0.npy' while dump_data_dir is null"):
        validate_dump_tree(str(tmp_path / "dump"))
    write(str(step / "dump.json"), json.dumps(doc))
    assert [os.path.basename(p) for p in validate_dump_tree(str(tmp_path / "dump"))] == \
        ["construct.json", "dump.json", "stack.json"]
    write(str(tmp_path / "dump.json"), json.dumps({"task": "statistics", "level": "L1"}))  # a config file
    write(str(tmp_path / "dump" / "step1" / "notes" / "dump.json"), "{}")                  # not a step dir
    assert len(validate_dump_tree(str(tmp_path))) == 3
    write(str(tmp_path / "dump" / "graph" / "step0" / "rank0.previous-20260101-120000" / "construct.json"),
          '{"relu": null}')
    with pytest.raises(FormatError, match=r"graph/step0/rank0.previous-20260101-120000/construct.json: at /: 'relu' is not valid"):
        validate_dump_tree(str(tmp_path / "dump"))


def test_command_line_needs_a_dump_file(tmp_path, capsys):
    """``python -m msprobe.format DIR``: a directory holding no dump file is an error naming it and
    what was looked for; one holding dump files is validated (exit 0)."""
    from msprobe.format.validate import main

    (tmp_path / "empty" / "step0").mkdir(parents=True)
    write(str(tmp_path / "empty" / "dump.json"), "{}")  # not in a step directory: no dump file
    assert main([str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert f"no dump files found under {tmp_path / 'empty'}" in err, err
    assert "dump.json" in err and "step{N}/rank{R}" in err, err
    write(str(tmp_path / "dump" / "step0" / "rank0" / "construct.json"), "{}")
    assert main([str(tmp_path / "dump")]) == 0
    assert capsys.readouterr().out.startswith("1 files valid")
    assert main([str(tmp_path / "dump"), str(tmp_path / "empty")]) == 1


def test_writer_round_trip(tmp_path):
    """Records appended through StepWriter (journal, then dump.json/stack.json/construct.json/
    anomalies.json/coverage.json) validate, while unfinished (journal + files) and after close()."""
    step = str(tmp_path / "dump" / "step3" / "rank0")
    writer = StepWriter(step, {"task": "statistics", "level": "mix", "framework": "mindspore"},
                        tensor_data=False, extra_info=True)
    bad = tensor(Max=math.nan, Min=math.nan, Mean=math.nan, Norm=math.nan)
    writer.append([
        {"s": 0, "f": [STACK]}, {"e": "Functional.log.0.forward", "stack": 0},
        {"c": "Functional.log.0.forward", "p": "Cell.net.Net.forward.0"},
        {"e": "Functional.log.0.forward", "k": "input_args", "v": [tensor()]},
        {"e": "Functional.log.0.forward", "k": "input_kwargs", "v": {}},
        {"e": "Functional.log.0.forward", "k": "output", "v": [bad]},
        {"e": "Functional.log.0.backward", "k": "output", "i": 1, "n": 2, "v": tensor()},
    ])
    extras = StepExtras()
    extras.add_note("unwaited_async_handles", [{"entry": "MintDistributed.all_reduce.0.forward",
                                                "note": "handle never waited; output not recorded"}])
    write_step(writer, extras)
    names = sorted(os.path.basename(p) for p in validate_dump_tree(str(tmp_path / "dump")))
    assert names == ["anomalies.json", "construct.json", "coverage.json", "dump.journal", "dump.json",
                     "stack.json"]
    write_step(writer, extras)
    writer.close()
    assert "dump.journal" not in os.listdir(step)
    validate_dump_tree(str(tmp_path / "dump"))
    with open(os.path.join(step, "anomalies.json"), encoding="utf-8") as f:
        assert json.load(f)["step"] == 3
    with open(os.path.join(step, "dump.json"), encoding="utf-8") as f:
        assert json.load(f)["data"]["Functional.log.0.backward"] == {"output": [None, tensor()]}


def test_empty_step_round_trip(tmp_path):
    step = str(tmp_path / "dump" / "step0" / "proc12")
    writer = StepWriter(step, {"task": "tensor", "level": "debug", "framework": "mindspore"},
                        tensor_data=True, extra_info=False, data_file="debug.json")
    write_step(writer, StepExtras(), "no debugger.save() call in this step")
    writer.close()
    assert sorted(os.listdir(step)) == ["debug.json", "dump_tensor_data"]
    validate_dump_tree(str(tmp_path / "dump"))
    broken = copy.deepcopy(json.load(open(os.path.join(step, "debug.json"), encoding="utf-8")))
    broken.pop("empty_reason")
    assert error_of(broken, "debug").reason == "'empty_reason' is a required property"


def test_entry_of_a_line_is_its_subject_and_whether_dump_json_holds_it():
    """journal.entry_of (one pass, watch mode's history) tells what journal.subject and
    watch_history.has_data tell, for every line kind the constructors make."""
    from msprobe.engine.watch_history import has_data
    from msprobe.format import journal

    leaf = {"type": "int", "value": 1}
    lines = [journal.header("statistics", "L1", "mindspore", None),
             journal.stack_frames(3, ["File a.py, line 1, in f"]),
             journal.stack_ref("Functional.relu.0.forward", 3),
             journal.stack_ref("Functional.relu.0.forward", 3, {"input_args": [leaf]}),
             journal.stack_ref("Functional.relu.0.forward", 3, {}),
             journal.construct_edge("Functional.relu.0.forward", "Cell.net.Net.forward.0"),
             journal.construct_edge("Cell.net.Net.forward.0", None),
             journal.key_line("Functional.relu.0.forward", "output", [leaf]),
             journal.item_line("Functional.relu.0.backward", "input", 0, 1, leaf),
             journal.value_line("Tensor.t.0.debug", leaf),
             journal.path_line("Functional.relu.0.forward", ("output", 0), leaf)]
    kinds = {journal.line_kind(line) for line in lines}
    assert kinds == set(journal.KINDS)
    for line in lines:
        assert journal.entry_of(line) == (journal.subject(line), journal.subject(line) is not None and has_data(line))
    assert [journal.entry_of(line)[1] for line in lines[2:5]] == [False, True, False]
