"""Reading dumps back through ``msprobe.dump``: the schema version (a future one is refused with an
upgrade hint, a reference-tool dump without one loads), and a long step's journal written and streamed
with memory bounded by a batch, not by the step."""
from __future__ import annotations

import json
import os
import tracemalloc

import numpy as np
import pytest
from mindspore import Tensor, ops

import msprobe.dump
import msprobe.engine.writer
from conftest import load_step, only_step_dir
from msprobe.dump import DumpFormatError


def test_journal_writing_keeps_memory_flat_and_reader_streams(make_debugger, dump_dir, monkeypatch):
    n = 20_000                        # traced by tracemalloc (5x slower); 50k untraced: ~4 s
    # the writer mirrors a step live only up to LIVE_STATE_BYTES of journal (4 MB by default), then
    # reads the journal back: a small cap here shows memory is bounded by the cap, not the step
    monkeypatch.setattr(msprobe.engine.writer, "LIVE_STATE_BYTES", 128 << 10)
    debugger = make_debugger(task="statistics", level="L1", extra_info=False)
    debugger.start()
    rt = debugger.service.runtime
    t = Tensor(np.array(1.5, np.float32))
    names = [f"Functional.tiny.{i}.forward" for i in range(n)]
    tracemalloc.start()
    try:
        for name in names:            # the path every hooked call takes: record -> batch -> journal
            rt.record(name, "input_args", [t], "input")
        rt.flush()
        _, writer_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    journal = os.path.join(rt.writer.directory, "dump.journal")
    journal_bytes = os.path.getsize(journal)
    # bounded by one batch (512 records), not the step: holding the step's records as Python objects
    # would take several times the journal's size
    assert journal_bytes > 2 << 20
    assert writer_peak < min(1.5 * (1 << 20), journal_bytes / 2), (writer_peak, journal_bytes)
    # an unfinished step (journal) is streamed line by line
    tracemalloc.start()
    try:
        count = sum(1 for _ in msprobe.dump.iter_entries(rt.writer.directory))
        _, reader_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n and reader_peak < 256 << 10, reader_peak
    debugger.stop()
    debugger.step()
    d = only_step_dir(dump_dir, 0)
    pieces = list(msprobe.dump.iter_entries(d))    # a finished dump.json: loaded, yielded per key
    assert len(pieces) == n and pieces[0].entry == names[0] and pieces[0].key == "input_args"
    assert pieces[-1].value[0]["Max"] == 1.5


def _write_dump(directory, doc):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "dump.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f)


@pytest.mark.no_format_check  # writes a future-schema dump and a reference-tool dump on purpose
def test_schema_version(tmp_path, make_debugger, dump_dir):
    debugger = make_debugger(task="statistics", level="L1")
    debugger.start()
    ops.relu(Tensor(np.ones(2, np.float32)))
    debugger.stop()
    debugger.step()
    d, dump = load_step(dump_dir)
    assert dump.header["schema"] == "msprobe-mindspore/2"
    future = dict(json.load(open(os.path.join(d, "dump.json"), encoding="utf-8")), schema="msprobe-mindspore/999")
    _write_dump(tmp_path / "future" / "step0" / "rank0", future)
    with pytest.raises(DumpFormatError, match=r"schema 'msprobe-mindspore/999' is not supported.*upgrade"):
        msprobe.dump.load(str(tmp_path / "future" / "step0" / "rank0"))
    with pytest.raises(DumpFormatError):
        list(msprobe.dump.iter_entries(str(tmp_path / "future" / "step0" / "rank0")))
    # a reference-tool dump (seed example: no "schema" key) loads
    leaf = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [32, 16, 28, 28], "Max": 1.38,
            "Min": -1.33, "Mean": 0.037, "Norm": 236.2, "data_name": "Functional.relu.0.forward.input.0.npy"}
    seed = {"task": "tensor", "level": "L1", "framework": "mindspore", "dump_data_dir": "/dump/path",
            "data": {"Functional.relu.0.forward": {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]}}}
    _write_dump(tmp_path / "ref" / "step0" / "rank0", seed)
    old = msprobe.dump.load(str(tmp_path / "ref" / "step0" / "rank0"))
    assert old.complete and old.data["Functional.relu.0.forward"]["output"][0]["Max"] == 1.38
    assert "schema" not in old.header
