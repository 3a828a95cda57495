"""Per-step reports written next to ``dump.json``.

* ``anomalies.json`` — only when some recorded value is non-finite (NaN/±Inf): every *producer* in
  execution order (an entry whose recorded inputs are all finite and whose output is not; a
  backward entry's inputs include its forward call's), the
  first of them as ``first_producer`` with its call stack, and the first entry holding any
  non-finite value. Computed from the statistics already in ``dump.json``: no extra tensor reads.
  A ``Jit.*`` entry is a compiled region: the calls inside it are not hooked (in GRAPH_MODE its Cells are
  recorded, with it as their parent), so a NaN made between them is named by the region.
* ``coverage.json`` — only when something ran that the dump could not see: functions bound to a
  wrapped API before ``start()`` (``not_captured``, filled by :mod:`msprobe.capture.coverage`),
  compiled regions recorded as one ``Jit`` entry (``compiled_regions``), async handles never waited
  (``unwaited_async_handles``).
* An empty step's ``dump.json`` carries ``empty_reason`` (see :data:`EMPTY_REASON`), so "ran but
  recorded nothing" and "never written" can be told apart.

Execution order = the order in which entries first appear in the journal (a call's stack and inputs
are journaled before its outputs, a Cell's before those of the calls inside it).
"""
from __future__ import annotations

import json
import math
import os
import re

from msprobe.format import naming
from msprobe.format.frames import frame_lines
from msprobe.format.producer import element_kinds

ANOMALIES = "anomalies.json"
#: watch mode's magnitude kinds (``anomalies.json``'s ``kind``) and how texts name them
MAGNITUDE_KINDS = {"max_abs": "a value beyond max_abs", "norm_jump": "a Norm jump beyond norm_jump"}
COVERAGE = "coverage.json"
EMPTY_REASON = "no recorded call between start() and stop() in this step"
COMPILED_NOTE = "ran as one compiled graph (mindspore.jit); calls inside it are not captured"
#: a compiled region whose Cells were recorded (GRAPH_MODE at L0/mix: ``construct.json`` places them in it)
COMPILED_CELLS_NOTE = ("ran as one compiled graph (mindspore.jit); the Cells it called are recorded inside it "
                       "(construct.json), the APIs and Primitives between them are not")

_STEP_RE = re.compile(r"step(\d+)$")


def leaves(value):
    """Yield every tensor-like leaf (dict with ``type`` and ``dtype``) of an entry body."""
    if isinstance(value, dict):
        if "type" in value and "dtype" in value:
            yield value
        else:
            for v in value.values():
                yield from leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from leaves(v)


def scalar_values(value):
    """Yield the value of every recorded argument of an entry body that is not a tensor (a dict with
    ``type`` and ``value``, no ``dtype``: a Python number, string, ...)."""
    if isinstance(value, dict):
        if "type" in value and "dtype" not in value:
            if "value" in value:
                yield value["value"]
        elif "type" not in value:
            for v in value.values():
                yield from scalar_values(v)
    elif isinstance(value, list):
        for v in value:
            yield from scalar_values(v)


def non_finite(leaf: dict) -> bool:
    """True when a statistic of ``leaf`` is NaN or ±Inf (JSON then needs its ``NaN``/``Infinity``
    tokens); whether its tensor holds a NaN/Inf element is :func:`msprobe.format.producer.element_kinds`."""
    for key in ("Max", "Min", "Mean", "Norm"):
        v = leaf.get(key)
        if isinstance(v, float) and not math.isfinite(v):
            return True
    return False


def _any_non_finite(value) -> bool:
    """Whether a tensor of ``value`` holds a NaN/Inf element (Mean/Norm non-finite alone is none:
    :func:`msprobe.format.producer.element_kinds`)."""
    return any(element_kinds(leaf) for leaf in leaves(value))


def find_anomalies(data: dict, construct: dict | None = None) -> dict | None:
    """``{"first_producer", "producers", "first_non_finite"}`` for one step's ``data``, or ``None``
    when every recorded value is finite.

    A producer's recorded tensor inputs are finite and its output is not (a NaN/Inf Python number
    argument does not count: :func:`msprobe.format.producer.input_role`); the inputs of the entries that
    also feed an entry (:func:`msprobe.format.naming.upstream_names`: a backward entry's forward
    call) count as its inputs, so the gradient of a call fed a NaN in its forward is a propagator.
    ``construct`` (``construct.json``: entry -> parent Cell entry) makes ``first_producer`` the
    innermost one: a Cell whose output turned NaN is a producer, and so is the API inside it that
    made the NaN (mix level); the first producer with no other producer inside it is named.

    ``first_non_finite`` is the first entry holding a NaN/Inf in the order the values were made
    (:func:`_made_order`): an entry's inputs when it starts, its output when it returns, after the
    calls inside it; so the API that made a NaN comes before the enclosing Cell's output.
    """
    producers, bad, fed_bad = [], [], {}
    for name, body in data.items():
        if not isinstance(body, dict):
            if _any_non_finite(body):
                bad.append((name, True))
            continue
        out_bad = _any_non_finite(body.get("output"))
        in_bad = fed_bad[name] = any(_any_non_finite(v) for k, v in body.items() if k != "output")
        if out_bad or in_bad:
            bad.append((name, in_bad))
        if out_bad and not in_bad and not any(fed_bad.get(n) for n in naming.upstream_names(name)):
            producers.append(name)
    if not bad:
        return None
    made = _made_order(data, construct or {})
    first_bad = min(bad, key=lambda item: made(*item))[0]
    return {"first_producer": _innermost_first(producers, construct or {}), "producers": producers,
            "first_non_finite": first_bad}


def _made_order(data: dict, construct: dict):
    """``key(name, at_start)``: when an entry's values were made, for sorting. An entry is recorded
    (takes its place in ``data``) when it starts; its inputs are made then (``at_start``), its
    output when it returns, after every entry ``construct`` places inside it."""
    position = {name: i for i, name in enumerate(data)}
    ends = dict(position)  # entry -> position of the last entry inside it (itself when none)
    for name, i in position.items():
        parent, seen = construct.get(name), set()
        while parent is not None and parent not in seen:  # a cycle in a damaged file ends the walk
            seen.add(parent)
            if parent in ends and ends[parent] < i:
                ends[parent] = i
            parent = construct.get(parent)

    def key(name: str, at_start: bool) -> tuple:
        if at_start:
            return position[name], 0, 0
        # returns after the last entry inside it; of entries ending there, the inner one first
        return ends[name], 1, ends[name] - position[name]
    return key


def ancestors(names, construct: dict) -> set:
    """Every Cell entry enclosing one of ``names``, following ``construct.json`` parents."""
    found = set()
    for name in names:
        parent = construct.get(name)
        while parent is not None and parent not in found:  # a parent seen before: its chain is in
            found.add(parent)
            parent = construct.get(parent)
    return found


def _innermost_first(producers: list, construct: dict):
    """The first of ``producers`` (execution order) that encloses no other producer."""
    enclosing = ancestors(producers, construct)
    for name in producers:
        if name not in enclosing:
            return name
    return producers[0] if producers else None


def _stack_of(stacks: dict, entry: str):
    """``stack.json`` frames of ``entry``; a backward entry has those of its forward call (where the
    call was made: the backward itself runs inside MindSpore's engine)."""
    forward = naming.forward_of(entry)
    for names, frames in stacks.values():
        if entry in names or (forward is not None and forward in names):
            return frames
    return None


def step_of(directory: str):
    m = _STEP_RE.search(os.path.dirname(os.path.abspath(directory)))
    return int(m.group(1)) if m else None


def step_reports(directory: str, data: dict, stacks: dict, notes: dict, scan: bool = True,
                 construct: dict | None = None, extra: dict | None = None,
                 identity: dict | None = None) -> dict:
    """The documents ``anomalies.json`` and ``coverage.json`` of one step directory:
    ``{ANOMALIES: object or None, COVERAGE: object or None}`` (``None``: the file has no content and
    an earlier version must go).

    Args:
        directory: the step/rank directory (its ``step{N}`` parent gives ``step``).
        data, stacks, construct: the step's replayed ``dump.json`` data, ``stack.json`` (grouped form)
            and ``construct.json`` (for :func:`find_anomalies`).
        notes: coverage notes, key -> list of JSON items.
        scan: ``False`` when the caller knows every value is finite (the anomaly scan is skipped).
        extra: fields added to ``anomalies.json`` (watch mode: what triggered it); it is then
            written even when no statistic is non-finite (a magnitude bound).
        identity: ``run_id``/``msprobe_version`` of the run, added to ``anomalies.json``.
    """
    found = find_anomalies(data, construct) if scan else None
    if found is None and extra:
        found = {"first_producer": extra.get("producer"), "producers": [extra.get("producer")],
                 "first_non_finite": None}
    if found is not None:
        first = found["first_producer"]
        magnitude = bool(extra) and extra.get("kind") in MAGNITUDE_KINDS and found is not None \
            and found.get("first_non_finite") is None
        found = dict(found, step=step_of(directory),
                     rule=(f"watch mode: producer = the first recorded call whose output shows "
                           f"{MAGNITUDE_KINDS[extra['kind']]} while its inputs do not"
                           if magnitude else
                           "producer = inputs finite, output NaN/Inf (a backward entry's inputs include "
                           "its forward call's); entries in execution order; "
                           "first_producer = the first that encloses no other producer"),
                     stack=frame_lines(_stack_of(stacks, first)) if first else None)
        if first and first.startswith("Jit."):
            what = MAGNITUDE_KINDS[extra["kind"]] if magnitude else "the NaN/Inf"
            found["note"] = (f"{first} {COMPILED_CELLS_NOTE}; {what} appeared inside that region, outside "
                             "the Cells recorded in it" if first in ancestors(data, construct or {}) else
                             f"{first} {COMPILED_NOTE}; {what} appeared inside that region")
        if extra:
            found.update(extra)
        if identity:
            found.update(identity)
    coverage = {k: list(v) for k, v in notes.items() if v}
    compiled = [name for name in data if name.startswith("Jit.") and ".forward" in name]
    if compiled:
        enclosing = ancestors(data, construct or {})
        coverage["compiled_regions"] = [
            {"entry": name, "note": COMPILED_CELLS_NOTE if name in enclosing else COMPILED_NOTE}
            for name in compiled]
    return {ANOMALIES: found, COVERAGE: coverage or None}


def without_empty_backward(construct: dict, data: dict) -> dict:
    """``construct`` without the backward entries that never received a gradient (a call whose
    outputs carry none, e.g. ``shape``) and enclose nothing that did: they are not in ``dump.json``."""
    needed = ancestors(data, construct)
    return {name: parent for name, parent in construct.items()
            if name in data or name in needed or ".backward" not in name}


def read_report(directory: str, name: str):
    """The parsed report ``name`` (``anomalies.json``/``coverage.json``) of a step dir, or ``None``.
    An ``anomalies.json`` of format 1, whose ``stack`` holds ``stack.json``'s two-line frames, is
    returned with them on one line, as format 2 writes them (:func:`msprobe.format.frames.frame_line`)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        found = json.load(f)
    if name == ANOMALIES and isinstance(found, dict) and isinstance(found.get("stack"), list):
        found["stack"] = frame_lines(found["stack"])
    return found
