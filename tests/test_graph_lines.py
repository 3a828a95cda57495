"""The compiled journal lines of a drain recipe (``msprobe/capture/cells/graph_lines.py``) are the lines
the journal's constructors make for the recipe's records, as ``Runtime.queue_graph_records`` queues
them: edges and stack uses with ``extra_info``, one ``key_line`` per value without. Whole GRAPH_MODE
steps written both ways are compared in ``tests/test_graph_probes.py``."""
from __future__ import annotations

import orjson
import pytest

from msprobe.capture.cells.graph_lines import Lines
from msprobe.format import journal

FWD, BWD = "Cell.fc.Dense.forward.0", "Cell.fc.Dense.backward.0"
#: one of each kind of record a recipe keeps: edges, a stack use with a body of every value kind, a
#: stack use without body, a single value (a parameter gradient)
STEPS = [
    (None, (FWD, None), None),
    (True, FWD, [("input_args", ("s", [0, -1])), ("input_kwargs", ("c", dict)),
                 ("output", ("d", ("logits", 7), [1, 2])), ("parameters", ("p", 11)), ("extra", ("c", list))]),
    (None, (BWD, "Cell.net.Net.backward.0"), None),
    (True, BWD, []),
    (False, "Cell.fc.Dense.parameters_grad.0", [("weight", ("s", [3]))]),
]


def _expected(slots, leaves, sid, extra_info):
    """The lines as the journal's constructors make them for :data:`STEPS`."""
    fwd_body = {"input_args": [slots[0], None], "input_kwargs": {},
                "output": [{"logits": slots[1], 7: slots[2]}], "parameters": dict(leaves[11]), "extra": []}
    grad = journal.key_line("Cell.fc.Dense.parameters_grad.0", "weight", [slots[3]])
    if not extra_info:
        return [journal.key_line(FWD, k, v) for k, v in fwd_body.items()] + [grad]
    return [journal.construct_edge(FWD, None), journal.stack_ref(FWD, sid, fwd_body),
            journal.construct_edge(BWD, "Cell.net.Net.backward.0"), journal.stack_ref(BWD, sid), grad]


@pytest.mark.parametrize("extra_info", [True, False])
def test_compiled_lines_are_the_lines_of_the_records(extra_info):
    slots = [f"slot{i}" for i in range(4)]
    leaves = {11: {"weight": {"Max": 1.0}, "bias": {"Max": 2.0}}}
    lines = Lines(STEPS, extra_info)
    made = lines.make(slots, leaves, 5)
    expected = _expected(slots, leaves, 5, extra_info)
    assert made == expected
    assert [orjson.dumps(line, option=orjson.OPT_NON_STR_KEYS) for line in made] == \
        [orjson.dumps(line, option=orjson.OPT_NON_STR_KEYS) for line in expected]  # key order too
    assert lines.order == [0, 1, 2, 3] and lines.asked == 6
    assert lines.first_stack == (1 if extra_info else None)
    again = lines.make(slots, leaves, 5)  # every call makes its own lines and values
    assert again == made and all(a is not b for a, b in zip(again, made))
    parameters = again[1]["v"]["parameters"] if extra_info else again[3]["v"]
    assert parameters == leaves[11] and parameters is not leaves[11]


def test_arguments_placed_by_their_layout():
    """A Cell's input_args placed as its positional arguments were (a tuple argument nested, ``None``,
    scalars known when the graph compiled; ``True`` and ``1`` stay apart)."""
    steps = [(True, FWD, [("input_args", ("n", [0, [1, 2], -1, ("v", "float", 0.25), ("v", "bool", True),
                                                 ("v", "int", 1), []]))])]
    lines = Lines(steps, True)
    slots = ["slot0", "slot1", "slot2"]
    made = lines.make(slots, {}, 5)
    args = [slots[0], [slots[1], slots[2]], None, {"type": "float", "value": 0.25}, {"type": "bool", "value": True},
            {"type": "int", "value": 1}, []]
    assert made == [journal.stack_ref(FWD, 5, {"input_args": args})]
    assert orjson.dumps(made[0]) == orjson.dumps(journal.stack_ref(FWD, 5, {"input_args": args}))
    assert lines.order == [0, 1, 2] and lines.asked == 1
