"""The runtime as the one owner of dump state: step tokens, the recording gate, the step layout.

Real MindSpore tensors, real files; the runtime is driven the way the capture code drives it."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from mindspore import Tensor

import msprobe.dump
from msprobe.engine import layout
from msprobe.engine.config import load_config
from msprobe.engine.runtime import Runtime
from tests.conftest import only_step_dir


def _runtime(dump_dir, **fields):
    return Runtime(load_config(dump_path=dump_dir, level="L1", task="statistics", **fields))


def _gradient(rt, value, token):
    rt.record_item("Functional.relu.0.backward", "input", 0, 1,
                   Tensor(np.full((3,), value, np.float32)), "input", token)


def test_a_record_keeps_the_step_it_was_made_for(dump_dir, caplog):
    """A gradient that arrives after its step was closed is dropped as late, never written into the
    step that is open when it arrives; a record with the open step's token is written there."""
    rt = _runtime(dump_dir)
    first = rt.open_step()
    assert first is not None and rt.step_token == first
    _gradient(rt, 1.0, first)
    rt.end_step()
    assert rt.step_token is None
    second = rt.open_step()
    assert second != first
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _gradient(rt, 3.0, second)
        _gradient(rt, 2.0, first)       # made for step 0, arrives in step 1: would replace 3.0
        _gradient(rt, 4.0, None)        # no step: late too
        rt.end_step()
    step0 = msprobe.dump.load(only_step_dir(dump_dir, 0)).data["Functional.relu.0.backward"]["input"]
    step1 = msprobe.dump.load(only_step_dir(dump_dir, 1)).data["Functional.relu.0.backward"]["input"]
    assert [item["Max"] for item in step0] == [1.0]
    assert [item["Max"] for item in step1] == [3.0]
    assert sum("arrived after its step was closed" in r.getMessage() for r in caplog.records) == 1


def test_errors_and_notes_go_to_the_open_step(dump_dir):
    rt = _runtime(dump_dir)
    token = rt.open_step()
    rt.report_error("probe lost its inputs", token)
    rt.report_error("probe lost its inputs", token)     # every time, unlike tool_error
    rt.add_note("not_captured", [{"name": "x", "module": "m", "api": "a", "call_as": "c", "reason": "r"}])
    directory = rt.step_dir
    rt.end_step()
    with open(os.path.join(directory, "dump_error_info.log"), encoding="utf-8") as f:
        assert f.read().count("probe lost its inputs") == 2
    rt.report_error("after the step", token)             # closed step: a WARNING only
    with open(os.path.join(directory, "dump_error_info.log"), encoding="utf-8") as f:
        assert "after the step" not in f.read()


def test_the_gate_follows_start_stop_and_token_range(dump_dir):
    rt = _runtime(dump_dir)
    assert not rt.capturing()
    rt.open_step()
    rt.begin_capture()
    assert rt.capturing() and rt.active
    with rt.tool_code():
        assert not rt.capturing()       # tool code and recorded calls are not recorded again
    rt.end_capture()
    assert not rt.capturing() and not rt.active
    rt.token_range = (1, 2)
    rt.begin_capture()
    seen = []
    for _ in range(4):
        rt.forward_pass_begins()
        seen.append(rt.capturing())
        rt.forward_pass_ends()
        assert not rt.capturing()       # between passes nothing is recorded
    assert seen == [False, True, True, False]
    rt.end_capture()
    rt.end_step()


def test_once_per_run_messages_belong_to_the_runtime(dump_dir):
    a, b = _runtime(dump_dir), _runtime(dump_dir)
    assert a.first_time(("k", 1)) and not a.first_time(("k", 1))
    assert b.first_time(("k", 1))       # another run asks again


def test_layout_names_steps_by_rank_or_process(tmp_path, monkeypatch):
    assert layout.current_rank() is None          # communication not initialised in this process
    assert layout.step_directory("d", 3, None) == os.path.join("d", "step3", f"proc{os.getpid()}")
    assert layout.step_directory("d", 3, 1) == os.path.join("d", "step3", "rank1")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("RANK_ID", "5")
    assert layout.launch_rank() == 5               # before init(): the launcher's rank
    monkeypatch.delenv("RANK_ID")
    assert layout.launch_rank() == 0


@pytest.mark.no_format_check  # the earlier run's directory holds a placeholder file
def test_layout_moves_an_earlier_run_aside(tmp_path):
    directory = tmp_path / "step0" / "rank0"
    directory.mkdir(parents=True)
    (directory / "dump.json").write_text("{}")
    layout.clear_for(str(directory), 0)
    moved = [n for n in os.listdir(tmp_path / "step0") if n.startswith("rank0.previous-")]
    assert len(moved) == 1 and not directory.exists()
    assert (tmp_path / "step0" / moved[0] / "dump.json").read_text() == "{}"
    assert layout.move_aside(str(directory)) is None   # nothing there: nothing moved
