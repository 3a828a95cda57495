"""What first-diff and the report say around a named first difference (synthetic statistics dumps):
the steps that agree are said before it, and the report badges the named entry as what it is."""
from __future__ import annotations

import json
import os

from msprobe.compare.html import write_report
from test_compare import cli


def _leaf(value):
    return {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [4], "Max": value, "Min": value,
            "Mean": value, "Norm": 2 * value}


def _dump(root, name, outputs):
    """One L1 entry per step, ``Functional.relu.0.forward``, input 1.0 and output ``outputs[step]``."""
    for step, value in enumerate(outputs):
        directory = os.path.join(str(root), name, f"step{step}", "rank0")
        os.makedirs(directory)
        data = {"Functional.relu.0.forward": {"input_args": [_leaf(1.0)], "input_kwargs": {},
                                              "output": [_leaf(value)]}}
        with open(os.path.join(directory, "dump.json"), "w") as f:
            json.dump({"task": "statistics", "level": "L1", "framework": "mindspore", "dump_data_dir": None,
                       "schema": "msprobe-mindspore/2", "data": data}, f)
    return os.path.join(str(root), name)


def test_steps_that_agree_are_said_before_the_first_difference(tmp_path):
    target, golden = _dump(tmp_path, "target", [1.0, 1.5]), _dump(tmp_path, "golden", [1.0, 1.0])
    out = cli("first-diff", target, golden, check_code=1).stdout
    lines = out.splitlines()
    assert lines[0] == "step 0 rank0: the runs agree bitwise (every statistic recorded is equal)", out
    assert lines[1].startswith("first difference (step 1 rank0, forward): Functional.relu.0.forward"), out


def test_the_report_badges_the_named_entry_as_the_first_difference(tmp_path):
    target, golden = _dump(tmp_path, "target", [1.5]), _dump(tmp_path, "golden", [1.0])
    with open(write_report(target, str(tmp_path / "report.html"), golden), encoding="utf-8") as f:
        html = f.read()
    assert '<span class="badge v-named" title="error gain verdict: grows">first difference</span>' in html
