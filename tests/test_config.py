"""Tests for msprobe.engine.config: config.json and keyword arguments parsed into one typed object,
every error naming the key, the value and what is allowed (README "Configuration")."""
import json
import logging
import os

import numpy as np
import pytest

from msprobe.engine.config import ConfigError, DumpConfig, load_config, parse_index_list


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def load(tmp_path, data, **kwargs):
    return load_config(write(tmp_path, data), **kwargs)


BASE = {"dump_path": "./out"}


# --------------------------------------------------------------------------- defaults

def test_packaged_defaults():
    cfg = load_config()
    assert cfg.task == "statistics"
    assert cfg.dump_path == os.path.abspath("./dump_path")
    assert (cfg.rank, cfg.step, cfg.level) == ((), (), "L1")
    assert cfg.extra_info is True and cfg.async_dump is False
    assert cfg.scope == () and cfg.api_list == () and cfg.tensor_list == ()
    assert cfg.data_mode == ("all",)
    assert cfg.summary_mode == "statistics" and cfg.md5 is False
    assert (cfg.precision, cfg.device, cfg.stat_precision) == ("low", "host", "high")
    assert cfg.framework == "mindspore"
    assert cfg.last_step is None


def test_dump_path_is_absolute_and_not_created(tmp_path):
    cfg = load(tmp_path, {"dump_path": str(tmp_path / "a" / ".." / "dump")})
    assert cfg.dump_path == str(tmp_path / "dump")
    assert not (tmp_path / "dump").exists()


def test_missing_sections_and_fields_use_defaults(tmp_path):
    cfg = load(tmp_path, {"dump_path": "x", "task": "tensor"})
    assert cfg.task == "tensor" and cfg.level == "L1" and cfg.data_mode == ("all",)


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.level = "L0"


def test_unknown_keys_ignored(tmp_path):
    cfg = load(tmp_path, {**BASE, "seed": 1, "is_deterministic": True,
                          "statistics": {"slice": [], "bench_path": "x", "summary_mode": "md5"}})
    assert cfg.md5


# --------------------------------------------------------------------------- overrides

def test_kwargs_override_file(tmp_path):
    cfg = load(tmp_path, {"task": "statistics", "dump_path": "a", "level": "L0", "step": [1]},
               dump_path="b", level="mix", step=["3-4", 0])
    assert cfg.dump_path == os.path.abspath("b")
    assert cfg.level == "mix" and cfg.step == (0, 3, 4)


def test_task_kwarg_switches_task_and_section(tmp_path):
    data = {**BASE, "task": "statistics",
            "statistics": {"list": ["stat_only"], "summary_mode": "md5"},
            "tensor": {"list": ["relu"], "data_mode": ["forward"]}}
    stats = load(tmp_path, data)
    assert stats.task == "statistics" and stats.api_list == ("stat_only",) and stats.md5
    tensor = load(tmp_path, data, task="tensor")
    assert tensor.task == "tensor"
    assert tensor.api_list == ("relu",) and tensor.data_mode == ("forward",)
    assert tensor.summary_mode == "statistics"


def test_statistics_only_keys(tmp_path):
    data = {**BASE, "statistics": {"tensor_list": ["conv"], "device": "device", "precision": "low"}}
    cfg = load(tmp_path, data)
    assert cfg.tensor_list == ("conv",) and cfg.device == "device" and cfg.stat_precision == "low"
    assert cfg.precision == "low"  # common precision is a different key


def test_structure_forces_mix_with_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        cfg = load(tmp_path, {**BASE, "task": "structure", "level": "L1"})
    assert cfg.level == "mix"
    assert any("mix" in r.getMessage() for r in caplog.records)
    assert load(tmp_path, {**BASE, "task": "structure", "level": "L0"}).level == "L0"


def test_structure_section_is_read(tmp_path):
    cfg = load(tmp_path, {**BASE, "task": "structure", "level": "L0",
                          "structure": {"data_mode": ["backward"]}})
    assert cfg.data_mode == ("backward",)


def test_tensor_list_ignored_for_debug(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        cfg = load(tmp_path, {**BASE, "level": "debug", "statistics": {"tensor_list": ["x"]}})
    assert cfg.tensor_list == ()
    assert any("tensor_list" in r.getMessage() for r in caplog.records)


def _inactive_filter_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "the active task is" in r.getMessage()]


def test_filter_in_another_task_section_is_named_once_at_construction(tmp_path, caplog):
    """A ``list`` in section 'tensor' while the task is statistics is not read: the user must not
    believe the dump is filtered. One WARNING when the PrecisionDebugger is built, naming the field,
    the section and the active task; the config is still accepted (no filter applied)."""
    from msprobe.mindspore import PrecisionDebugger

    data = {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L1",
            "tensor": {"list": ["relu"]}}
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        debugger = PrecisionDebugger(write(tmp_path, data))
    assert debugger.config.api_list == ()
    assert _inactive_filter_warnings(caplog) == [
        f"{tmp_path / 'config.json'}: 'tensor.list' (['relu']) is ignored: the active task is 'statistics', "
        "which reads section 'statistics' only; move it to section 'statistics', or set \"task\": \"tensor\""]
    caplog.clear()
    # the task argument selects the section: the statistics section's scope is then the ignored one
    data = {**BASE, "statistics": {"scope": ["Cell.a", "Cell.b"], "data_mode": ["forward"]}}
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        load(tmp_path, data, task="tensor")
    (said,) = _inactive_filter_warnings(caplog)
    assert "'statistics.scope' (['Cell.a', 'Cell.b']), 'statistics.data_mode' (['forward']) are ignored" in said
    assert "the active task is 'tensor'" in said


def test_inactive_filter_advice_holds_for_each_field(tmp_path, caplog):
    """Each misplaced filter is named, and the advice names only sections that read the field:
    ``tensor_list`` is read in section 'statistics' only, and task 'structure' records no data."""
    cases = [
        ({"task": "statistics", "tensor": {"tensor_list": ["relu"]}},
         "'tensor.tensor_list' (['relu']) is ignored: the active task is 'statistics', which reads "
         "section 'statistics' only; move it to section 'statistics'"),
        ({"task": "tensor", "statistics": {"tensor_list": ["relu"]}},
         "'statistics.tensor_list' (['relu']) is ignored: the active task is 'tensor', which reads "
         "section 'tensor' only; 'tensor_list' is read only in section 'statistics': set \"task\": "
         "\"statistics\" to use it"),
        ({"task": "statistics", "structure": {"list": ["relu"]}},
         "'structure.list' (['relu']) is ignored: the active task is 'statistics', which reads section "
         "'statistics' only; move it to section 'statistics'"),
    ]
    for data, expected in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="msprobe"):
            load(tmp_path, {**BASE, **data})
        assert _inactive_filter_warnings(caplog) == [f"{tmp_path / 'config.json'}: {expected}"], data


def test_filters_that_select_everything_or_match_the_active_section_are_not_named(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        load_config(None)                                     # the packaged default: both sections
        load(tmp_path, {**BASE, "statistics": {"list": ["relu"]}, "tensor": {"list": ["relu"],
                                                                             "data_mode": ["all"]}})
    assert _inactive_filter_warnings(caplog) == []


def test_async_dump_tensor_with_list_ok(tmp_path):
    cfg = load(tmp_path, {**BASE, "task": "tensor", "async_dump": True, "tensor": {"list": ["relu"]}})
    assert cfg.async_dump
    assert load(tmp_path, {**BASE, "task": "tensor", "async_dump": True, "level": "debug"}).async_dump


def test_empty_level_defaults_to_l1(tmp_path):
    assert load(tmp_path, {**BASE, "level": ""}).level == "L1"


def test_pathlike_config_path(tmp_path):
    assert load_config(write(tmp_path, BASE)).task == "statistics"
    assert load_config(str(write(tmp_path, BASE))).task == "statistics"


def test_direct_construction_validates():
    assert DumpConfig(task="tensor", dump_path="d").dump_path == os.path.abspath("d")
    with pytest.raises(ConfigError, match="'level'"):
        DumpConfig(task="tensor", dump_path="d", level="L9")


# --------------------------------------------------------------------------- step / rank

@pytest.mark.parametrize("value, expected", [
    (None, ()),
    ([], ()),
    ([0, "2", "4-6", 1, 1], (0, 1, 2, 4, 5, 6)),
    ([5, 3, "3"], (3, 5)),
    (["7-7"], (7,)),
    ([1_000_000], (1_000_000,)),
    (["0-3", "2-5"], (0, 1, 2, 3, 4, 5)),
])
def test_parse_index_list(value, expected):
    assert parse_index_list(value, "step") == expected


def test_step_and_rank_from_file(tmp_path):
    cfg = load(tmp_path, {**BASE, "step": ["2-3", 0, 0], "rank": [1, "0"]})
    assert cfg.step == (0, 2, 3) and cfg.rank == (0, 1)
    assert cfg.last_step == 3
    assert [cfg.dumps_step(s) for s in range(5)] == [True, False, True, True, False]


def test_dumps_rank():
    everyone = DumpConfig(task="statistics", dump_path="d")
    assert everyone.dumps_rank(None) and everyone.dumps_rank(5)
    assert everyone.dumps_step(123)
    only0 = DumpConfig(task="statistics", dump_path="d", rank=[0])
    assert only0.dumps_rank(None) and only0.dumps_rank(0) and not only0.dumps_rank(1)
    only1 = DumpConfig(task="statistics", dump_path="d", rank=[1])
    assert not only1.dumps_rank(None) and only1.dumps_rank(1)


# --------------------------------------------------------------------------- data_mode

F_IN, F_OUT, B_IN, B_OUT = ("forward", "input"), ("forward", "output"), ("backward", "input"), ("backward", "output")


@pytest.mark.parametrize("data_mode, allowed", [
    (["all"], {F_IN, F_OUT, B_IN, B_OUT}),
    (["forward"], {F_IN, F_OUT}),
    (["backward"], {B_IN, B_OUT}),
    (["input"], {F_IN, B_IN}),
    (["output"], {F_OUT, B_OUT}),
    (["forward", "input"], {F_IN}),
    (["output", "backward"], {B_OUT}),
    (["forward", "backward", "input"], {F_IN, B_IN}),
    (["forward", "backward", "input", "output"], {F_IN, F_OUT, B_IN, B_OUT}),
])
def test_data_mode_allows(tmp_path, data_mode, allowed):
    cfg = load(tmp_path, {**BASE, "statistics": {"data_mode": data_mode}})
    for pair in (F_IN, F_OUT, B_IN, B_OUT):
        assert cfg.allows(*pair) == (pair in allowed), pair


def test_allows_rejects_unknown_kind():
    with pytest.raises(ValueError):
        load_config().allows("sideways", "input")


# --------------------------------------------------------------------------- invalid configs

# (file content, load kwargs, field named in the message, bad value as shown, an allowed value/form)
INVALID = [
    ({**BASE, "task": "overflow_check"}, {}, "'task'", "'overflow_check'", "'statistics'"),
    ({**BASE, "task": "free_benchmark"}, {}, "'task'", "'free_benchmark'", "'exception_dump'"),
    ({**BASE, "task": "acc_check"}, {}, "'task'", "'acc_check'", "'tensor'"),
    ({**BASE, "task": 3}, {}, "'task'", "3", "'structure'"),
    (BASE, {"task": "nan_check"}, "argument 'task'", "'nan_check'", "'statistics'"),
    ({"task": "statistics"}, {}, "'dump_path'", "invalid value null", "non-empty path"),
    ({"dump_path": ""}, {}, "'dump_path'", "''", "non-empty path"),
    ({"dump_path": 42}, {}, "'dump_path'", "42", "path string"),
    (BASE, {"dump_path": ["x"]}, "argument 'dump_path'", "['x']", "path string"),
    ({**BASE, "level": "L3"}, {}, "'level'", "'L3'", "'L0', 'L1', 'L2', 'mix', 'debug'"),
    (BASE, {"level": "l1"}, "argument 'level'", "'l1'", "'L1'"),
    ({**BASE, "step": 3}, {}, "'step'", "3", "list of integers"),
    ({**BASE, "step": [0, 1, "5-2"]}, {}, "'step[2]'", "'5-2'", "A <= B"),
    ({**BASE, "step": [True]}, {}, "'step[0]'", "invalid value true", "list of integers"),
    ({**BASE, "step": [-1]}, {}, "'step[0]'", "-1", "[0, 1000000]"),
    ({**BASE, "rank": [1_000_001]}, {}, "'rank[0]'", "1000001", "[0, 1000000]"),
    ({**BASE, "rank": ["a-b"]}, {}, "'rank[0]'", "'a-b'", "'3-5'"),
    ({**BASE, "rank": [1.5]}, {}, "'rank[0]'", "1.5", "list of integers"),
    (BASE, {"step": [0, "x"]}, "argument 'step[1]'", "'x'", "'3-5'"),
    ({**BASE, "async_dump": "yes"}, {}, "'async_dump'", "'yes'", "true/false"),
    ({**BASE, "extra_info": 1}, {}, "'extra_info'", "1", "true/false"),
    ({**BASE, "precision": "medium"}, {}, "'precision'", "'medium'", "'high'"),
    ({**BASE, "statistics": {"data_mode": ["all", "input"]}}, {}, "'statistics.data_mode'",
     "['all', 'input']", "'forward'"),
    ({**BASE, "statistics": {"data_mode": ["forward", "sideways"]}}, {}, "'statistics.data_mode[1]'",
     "'sideways'", "'backward'"),
    ({**BASE, "statistics": {"data_mode": []}}, {}, "'statistics.data_mode'", "[]", "non-empty"),
    ({**BASE, "statistics": {"data_mode": ["input", "output", "forward", "backward", "input"]}}, {},
     "'statistics.data_mode'", "'backward', 'input']", "at most 4"),
    ({**BASE, "statistics": {"data_mode": "forward"}}, {}, "'statistics.data_mode'", "'forward'",
     "a non-empty list"),
    ({**BASE, "task": "tensor", "tensor": {"data_mode": ["in"]}}, {}, "'tensor.data_mode[0]'", "'in'",
     "'input'"),
    ({**BASE, "statistics": {"summary_mode": "xor"}}, {}, "'statistics.summary_mode'", "'xor'",
     "'md5'"),
    ({**BASE, "statistics": {"summary_mode": "sha"}}, {}, "'statistics.summary_mode'", "'sha'",
     "'statistics'"),
    ({**BASE, "statistics": {"summary_mode": ["max", "median"]}}, {}, "'statistics.summary_mode[1]'",
     "'median'", "'l2norm'"),
    ({**BASE, "task": "tensor", "tensor": {"summary_mode": 5}}, {}, "'tensor.summary_mode'", "5",
     "'md5'"),
    ({**BASE, "statistics": {"scope": "Cell.a.forward.0"}}, {}, "'statistics.scope'",
     "'Cell.a.forward.0'", "exactly 2"),
    ({**BASE, "statistics": {"scope": ["a", "b", "c"]}}, {}, "'statistics.scope'", "['a', 'b', 'c']",
     "exactly 2"),
    ({**BASE, "statistics": {"list": "relu"}}, {}, "'statistics.list'", "'relu'", "list of strings"),
    ({**BASE, "task": "tensor", "tensor": {"list": ["relu", 3]}}, {}, "'tensor.list[1]'", "3",
     "list of strings"),
    ({**BASE, "level": "L2", "statistics": {"list": ["name-regex(([)"]}}, {}, "'statistics.list[0]'",
     "'name-regex(([)'", "name-regex("),
    ({**BASE, "statistics": {"tensor_list": [None]}}, {}, "'statistics.tensor_list[0]'", "invalid value null",
     "list of strings"),
    ({**BASE, "statistics": {"device": "gpu"}}, {}, "'statistics.device'", "'gpu'", "'host'"),
    ({**BASE, "statistics": {"precision": "mid"}}, {}, "'statistics.precision'", "'mid'", "'low'"),
    ({**BASE, "statistics": ["not", "an", "object"]}, {}, "'statistics'", "['not', 'an', 'object']",
     "JSON object"),
    ({**BASE, "task": "tensor", "async_dump": True}, {}, "'async_dump'", "invalid value true",
     "non-empty 'tensor.list'"),
    ({**BASE, "async_dump": True, "statistics": {"summary_mode": "md5"}}, {}, "'async_dump'", "invalid value true",
     "without 'md5'"),
    ({**BASE, "async_dump": True, "statistics": {"summary_mode": ["max", "md5"]}}, {}, "'async_dump'",
     "invalid value true", "without 'md5'"),
    ("{\"task\": \"statistics\",\n  \"dump_path\": }", {}, "'config_path'", "config.json",
     "valid JSON"),
    ("[1, 2]", {}, "'<top level>'", "[1, 2]", "JSON object"),
]


@pytest.mark.parametrize("data, kwargs, field, shown, allowed", INVALID,
                         ids=[f"{i:02d}-{case[2]}" for i, case in enumerate(INVALID)])
def test_invalid_config(tmp_path, data, kwargs, field, shown, allowed):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, data, **kwargs)
    message = str(info.value)
    assert field in message
    assert shown in message
    assert "allowed:" in message and allowed in message


@pytest.mark.parametrize("field, value, hint", [
    ("level", "l1", "did you mean 'L1'?"),
    ("level", "MIX", "did you mean 'mix'?"),
    ("task", "statistic", "did you mean 'statistics'?"),
])
def test_invalid_choice_suggests_the_close_value(tmp_path, field, value, hint):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, {**BASE, field: value})
    assert hint in str(info.value) and info.value.field == field


def test_invalid_choice_far_from_every_value_has_no_suggestion(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, {**BASE, "level": "kernel"})
    assert "did you mean" not in str(info.value)


def test_invalid_json_reports_position(tmp_path):
    with pytest.raises(ConfigError, match=r"line 2 column \d+"):
        load(tmp_path, "{\"task\": \"statistics\",\n  \"dump_path\": }")


def test_error_attributes(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, {**BASE, "step": [0, 1, "9-3"]})
    assert info.value.field == "step[2]" and info.value.value == "9-3"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("config_path, shown", [
    (123, "123"),
    (["a.json"], "['a.json']"),
])
def test_config_path_type(config_path, shown):
    with pytest.raises(ConfigError) as info:
        load_config(config_path)
    assert "'config_path'" in str(info.value) and shown in str(info.value)


def test_config_path_missing_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(missing) in str(info.value) and "'config_path'" in str(info.value)


def test_config_path_not_json(tmp_path):
    path = write(tmp_path, BASE, name="config.yaml")
    with pytest.raises(ConfigError, match=r"\.json"):
        load_config(path)


def test_parse_index_list_errors_name_element():
    with pytest.raises(ConfigError, match=r"'rank\[1\]'"):
        parse_index_list([0, {}], "rank")
    with pytest.raises(ConfigError, match="'rank'"):
        parse_index_list("0-3", "rank")


def test_misspelled_keys_warn_with_suggestion(tmp_path, caplog):
    """A typo must not silently change the dump: unknown keys warn and name the closest known key."""
    path = tmp_path / "my_dump.json"
    path.write_text(json.dumps({"levle": "L0", "dump_path": str(tmp_path / "d"),
                                "statistics": {"scopes": []}}))
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        cfg = load_config(path)
    assert cfg.level == "L1"
    text = caplog.text
    assert "my_dump.json: unknown key 'levle'" in text   # the file it came from
    assert "'levle'" in text and "did you mean 'level'" in text
    assert "'scopes'" in text and "did you mean 'scope'" in text


def test_keys_in_the_wrong_place_name_where_they_are_read(tmp_path, caplog):
    """A known key in a place that does not read it (the README table's "where" column) is
    ignored with a warning naming the place that reads it; the key's value is not used."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"),
                                "scope": [], "history": 4,
                                "statistics": {"tensor_budget_mb": 10, "level": "L0", "tensor_list": []},
                                "tensor": {"tensor_list": ["relu"]}}))
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        cfg = load_config(path)
    assert cfg.level == "L1" and cfg.tensor_budget_mb is None
    lines = [r.getMessage() for r in caplog.records]
    assert (f"{path}: key 'tensor_budget_mb' in section 'statistics' is ignored: it is read only in "
            "section 'tensor' (README \"Configuration\")") in lines
    assert any("key 'level' in section 'statistics' is ignored: it is read only at the top level" in m
               for m in lines)
    assert any("key 'scope' at top level is ignored: it is read only in the task section (the object "
               "named after the task)" in m for m in lines)
    assert any("key 'history' at top level is ignored: it is read only in section 'watch'" in m
               for m in lines)
    # the statistics section's tensor_list is read; the tensor section's is named as not read
    assert [m for m in lines if "tensor_list" in m] == [
        f"{path}: 'tensor.tensor_list' (['relu']) is ignored: the active task is 'statistics', which "
        "reads section 'statistics' only; move it to section 'statistics'"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        cfg = load_config(path, task="tensor")               # the tensor section is read now
    assert cfg.tensor_budget_mb is None
    assert any("key 'tensor_list' in section 'tensor' is ignored: it is read only in section 'statistics'"
               in r.getMessage() for r in caplog.records)


def test_name_regex_outside_l2_warns(tmp_path, caplog):
    """name-regex(...) is an L2 feature: at other levels it is a plain substring, and the user is told."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"level": "L1", "dump_path": str(tmp_path / "d"),
                                "statistics": {"list": ["name-regex(relu.*)", "Functional.gelu"]}}))
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        load_config(path)
    assert "name-regex(relu.*)" in caplog.text and "plain substrings" in caplog.text
    caplog.clear()
    path.write_text(json.dumps({"level": "L2", "dump_path": str(tmp_path / "d"),
                                "statistics": {"list": ["name-regex(relu.*)"]}}))
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        load_config(path)
    assert "plain substrings" not in caplog.text


# --------------------------------------------------------------------------- summary_mode items
def _readme_summary_items() -> list:
    """``[(items, effect)]`` of the README's table of ``summary_mode`` list items, in its order."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    table = readme[readme.index("| `summary_mode` list item |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        items, effect = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows.append((tuple(i.strip().strip("`") for i in items.split(",")), effect.replace("\\|", "|")))
    return rows


def test_a_bad_summary_mode_item_lists_exactly_the_readme_table(tmp_path):
    """The error for an unknown ``summary_mode`` item shows every item of the README's table with
    what it adds (the "add nothing" items said to add nothing), and nothing else is accepted."""
    rows = _readme_summary_items()
    assert rows and len({i for items, _ in rows for i in items}) == sum(len(items) for items, _ in rows)
    with pytest.raises(ConfigError) as info:
        load(tmp_path, {**BASE, "statistics": {"summary_mode": ["max", "median"]}})
    message = str(info.value)
    listed = message[message.index("each adding: ") + len("each adding: "):]
    expected = "; ".join(", ".join(repr(i) for i in items) + ": " + effect.replace("`", "")
                         for items, effect in rows)
    assert listed == expected
    for items, _ in rows:  # every item of the table loads
        assert load(tmp_path, {**BASE, "statistics": {"summary_mode": list(items)}}).summary_mode == items


def test_summary_mode_items_add_what_the_readme_table_says(tmp_path):
    """A real L1 dump per row of the README's table: the record gains exactly the keys that row
    names (none for the rows that add nothing)."""
    import mindspore as ms
    from mindspore import Tensor, ops
    import msprobe.dump
    from msprobe.mindspore import PrecisionDebugger
    from tests.conftest import only_step_dir, write_config

    ms.set_device("CPU")
    x = Tensor(np.array([[0.0, -2.0], [3.0, 1.0]], np.float32))
    base = None
    for n, (items, effect) in enumerate(_readme_summary_items() + [((), "")]):
        dump_path = str(tmp_path / f"dump{n}")
        cfg_dir = tmp_path / f"cfg{n}"
        cfg_dir.mkdir()
        section = {"summary_mode": list(items)} if items else {}
        debugger = PrecisionDebugger(write_config(cfg_dir, dump_path=dump_path, level="L1",
                                                  section=section))
        try:
            debugger.start()
            ops.relu(x)
            debugger.stop()
            debugger.step()
        finally:
            debugger.service.close()
        leaf = msprobe.dump.load(only_step_dir(dump_path, 0)).data["Functional.relu.0.forward"]["output"][0]
        if not items:
            base = set(leaf)
            continue
        named = set() if effect.startswith("nothing") else {effect.split("`")[1]}
        rows_keys = set(leaf)
        assert rows_keys - {"NanCount", "PosInfCount", "NegInfCount", "ZeroCount", "MaxAbs", "md5"} \
            == {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm"}, (items, leaf)
        assert rows_keys & {"NanCount", "PosInfCount", "NegInfCount", "ZeroCount", "MaxAbs", "md5"} \
            == named, (items, leaf)
    assert base == {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm"}


def test_watch_inside_the_task_section_is_an_error(tmp_path):
    """A ``watch`` object inside the task section is not read there; ignoring it would dump every
    step of a run meant to be watched, so it is an error naming the field and where it belongs."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"),
                                "statistics": {"watch": {"history": 8}}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.field == "statistics.watch" and err.value.value == {"history": 8}
    assert "a 'watch' object at the top level of config.json" in str(err.value)
    assert "every step dumped" in str(err.value)


@pytest.mark.parametrize("fields,shown", [
    ({"watch": True}, "config field 'watch': invalid value true;"),
    ({"statistics": {"list": [None]}}, "config field 'statistics.list[0]': invalid value null"),
])
def test_error_shows_the_value_as_json(tmp_path, fields, shown):
    """A config file is JSON: its bad values are shown as JSON (``true``, ``null``), not as Python."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"),
                                **fields}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert shown in str(err.value) and "True" not in str(err.value) and "None" not in str(err.value)
