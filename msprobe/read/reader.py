"""Reader: loads what the writer wrote (``step{N}/rank{R}`` or ``proc{pid}`` directories).

A finished step has ``dump.json`` and no journal. A step whose process died (or has not called
``step()`` yet) still has ``dump.journal``; :func:`load` then replays the journal (every record flushed
before the kill) and returns ``complete=False``.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from msprobe.format import naming
from msprobe.read import report
from msprobe.format.journal import JOURNAL, OLDER_SCHEMAS, SCHEMA, TENSOR_DIR, Piece, pieces, read_journal, replay

SUPPORTED_SCHEMAS = (SCHEMA, *OLDER_SCHEMAS)
_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(rank\d*|proc\d+)$")


class DumpFormatError(ValueError):
    """The directory does not hold a dump this reader understands (the message says why)."""


@dataclass
class StepDump:
    """One step of one rank.

    Attributes:
        directory: the ``step{N}/rank{R}`` directory.
        header: ``task``, ``level``, ``framework``, ``dump_data_dir``, ``schema``, ``run_id``,
            ``msprobe_version`` (the last two absent in files written before they existed), and for a
            finished step ``abnormal``/``empty_reason`` when present.
        data: ``dump.json["data"]``: entry name -> body.
        stacks: entry name -> list of frame strings (forward entries).
        construct: entry name -> parent entry name or ``None``.
        complete: False when read from an unfinished journal.
    """

    directory: str
    header: dict
    data: dict
    stacks: dict = field(default_factory=dict)
    construct: dict = field(default_factory=dict)
    complete: bool = True

    def tensor_path(self, leaf: dict) -> str:
        """Absolute path of a leaf's ``.npy`` file."""
        return os.path.join(self.directory, TENSOR_DIR, leaf["data_name"])

    def load_tensor(self, leaf: dict):
        """The saved array of a leaf (bf16 files included)."""
        from msprobe.format.npy import load_npy

        return load_npy(self.tensor_path(leaf))


def _ungroup(stacks: dict) -> dict:
    out = {}
    for names, frames in stacks.values():
        for name in names:
            out[name] = frames
    return out


def load(directory: str) -> StepDump:
    """Load one ``step{N}/rank{R}`` directory.

    Raises:
        FileNotFoundError: neither ``dump.json`` nor a journal exists.
        DumpFormatError: the files carry a schema this reader does not support.
    """
    journal = os.path.join(directory, JOURNAL)
    if os.path.exists(journal):
        header, data, stacks, construct = replay(read_journal(journal))
        complete = False
    else:
        path = os.path.join(directory, "dump.json")
        if not os.path.exists(path):
            path = os.path.join(directory, "debug.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no dump.json, debug.json or {JOURNAL} in {directory}")
        with open(path, encoding="utf-8") as f:
            dump = json.load(f)
        header = {k: v for k, v in dump.items() if k != "data"}
        data = dump.get("data", {})
        stacks = _load_optional(os.path.join(directory, "stack.json"))
        construct = _load_optional(os.path.join(directory, "construct.json"))
        complete = True
    _check_schema(directory, header)
    return StepDump(directory, header, data, _ungroup(stacks), construct, complete)


def iter_entries(directory: str):
    """Yield the data of one ``step{N}/rank{R}`` directory as :class:`Piece` items, in written order.

    An unfinished step (``dump.journal``) is streamed line by line: memory does not grow with the
    dump, and one entry may come in several pieces (inputs, then outputs, then gradients). A finished
    step's ``dump.json`` is one JSON document and is loaded whole, then yielded one key at a time.

    Raises:
        FileNotFoundError: no dump in ``directory``. DumpFormatError: unsupported schema.
    """
    journal = os.path.join(directory, JOURNAL)
    if os.path.exists(journal):
        yield from pieces(read_journal(journal), on_header=lambda fields: _check_schema(directory, fields))
        return
    dump = load(directory)
    for entry, body in dump.data.items():
        if isinstance(body, dict) and not ("type" in body and "dtype" in body):
            for key, value in body.items():
                yield Piece(entry, key, value)
        else:
            yield Piece(entry, None, body)


def iter_bodies(directory: str):
    """Yield ``(entry, body)`` of one ``step{N}/rank{R}`` directory in written (execution) order,
    after first yielding ``(None, header)`` (for ``dump.json``: the keys written before ``data``, i.e.
    ``task``, ``level``, ``framework``, ``dump_data_dir``, ``schema``, ``run_id``, ``msprobe_version``;
    the keys written after it, ``abnormal``, ``partial``, ``empty_reason``, are added to that same
    dict once the last entry has been read; :func:`load` has all at once).

    A finished ``dump.json`` is streamed: it is parsed one entry at a time from 1 MiB chunks, so
    memory does not grow with the dump (the JSON libraries that stream do not accept the ``NaN`` /
    ``Infinity`` tokens a dump holds). An unfinished step's journal is replayed whole (:func:`load`),
    since one entry's pieces may be far apart in it.

    Raises:
        FileNotFoundError: no dump in ``directory``. DumpFormatError: unsupported schema or a
        ``dump.json`` that is not a JSON object with a ``data`` object.
    """
    path = _data_file(directory)
    if path is None:
        dump = load(directory)
        yield None, dump.header
        yield from dump.data.items()
        return
    with open(path, encoding="utf-8") as f:
        members = _ObjectStream(f, path)
        header, seen_data = {}, False
        for key in members.keys():
            if key != "data":
                header[key] = members.value()
                continue
            _check_schema(directory, header)
            yield None, header
            inner = _ObjectStream(f, path, members)
            for entry in inner.keys():
                yield entry, inner.value()
            members.take_over(inner)
            seen_data = True
        if seen_data:  # the keys after data (abnormal, partial, empty_reason) are in header now
            return
    raise DumpFormatError(f"{path}: no \"data\" object")


def load_stacks(directory: str) -> dict:
    """Entry name -> list of stack frame strings, from ``stack.json`` ({} when absent); an unfinished
    step's journal is replayed."""
    if _data_file(directory) is None:
        return load(directory).stacks
    return _ungroup(_load_optional(os.path.join(directory, "stack.json")))


def load_construct(directory: str) -> dict:
    """Entry name -> parent Cell entry name or None, from ``construct.json`` ({} when absent)."""
    if _data_file(directory) is None:
        return load(directory).construct
    return _load_optional(os.path.join(directory, "construct.json"))


def _data_file(directory: str):
    """``dump.json`` (or ``debug.json``) of a finished step, or None when a journal is present."""
    if os.path.exists(os.path.join(directory, JOURNAL)):
        return None
    for name in ("dump.json", "debug.json"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no dump.json, debug.json or {JOURNAL} in {directory}")


class _ObjectStream:
    """Members of one JSON object read from a text file in chunks (``json.JSONDecoder.raw_decode``
    on a sliding buffer). ``parent`` continues a buffer already positioned on the object's ``{``
    (after the parent's ``key:``)."""

    _CHUNK = 1 << 20
    _decoder = json.JSONDecoder()

    def __init__(self, f, path: str, parent: "_ObjectStream" = None):
        self.f, self.path = f, path
        self.buf, self.pos, self.eof, self.dropped = (
            (parent.buf, parent.pos, parent.eof, parent.dropped) if parent else ("", 0, False, 0))
        self._expect("{")

    def take_over(self, other: "_ObjectStream") -> None:
        self.buf, self.pos, self.eof, self.dropped = other.buf, other.pos, other.eof, other.dropped

    def _fill(self) -> bool:
        if self.eof:
            return False
        chunk = self.f.read(self._CHUNK)
        self.dropped += self.pos
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        self.eof = not chunk
        return bool(chunk)

    def _skip_ws(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                raise DumpFormatError(f"{self.path}: truncated JSON (ends at character {self.dropped + self.pos})")

    def _expect(self, char: str) -> None:
        if self._skip_ws() != char:
            raise DumpFormatError(f"{self.path}: invalid JSON: expected {char!r} at character "
                                  f"{self.dropped + self.pos}")
        self.pos += 1

    def value(self):
        """Decode the next JSON value (the buffer grows until the value is complete)."""
        self._skip_ws()
        while True:
            try:
                obj, end = self._decoder.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:  # a number at the buffer's end may go on
                    self.pos = end
                    return obj
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise DumpFormatError(f"{self.path}: invalid or truncated JSON at character "
                                          f"{self.dropped + exc.pos}: {exc.msg}") from None
            self._fill()

    def keys(self):
        """Yield each member's key; the caller must read its value (:meth:`value`) before the next."""
        first = True
        while True:
            char = self._skip_ws()
            if char == "}":
                self.pos += 1
                return
            if not first:
                self._expect(",")
            first = False
            key = self.value()
            self._expect(":")
            yield key


def _check_schema(directory: str, header: dict) -> None:
    schema = header.get("schema", SCHEMA)
    if schema not in SUPPORTED_SCHEMAS:
        raise DumpFormatError(f"{directory}: dump schema {schema!r} is not supported by this reader "
                              f"(supported: {', '.join(SUPPORTED_SCHEMAS)}); upgrade msprobe")


def _load_optional(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_step_dirs(dump_path: str):
    """Yield ``(step, rank_dir_name, path)`` for every step/rank directory, by step then name."""
    found = []
    for step_name in os.listdir(dump_path) if os.path.isdir(dump_path) else ():
        m = _STEP_RE.match(step_name)
        if not m:
            continue
        step_dir = os.path.join(dump_path, step_name)
        for rank_name in os.listdir(step_dir):
            if _RANK_RE.match(rank_name):
                found.append((int(m.group(1)), rank_name, os.path.join(step_dir, rank_name)))
    yield from sorted(found)


_KERNEL_RANK_RE = re.compile(r"^rank_(\d+)$")
_KERNEL_STEP_RE = re.compile(r"^step_(\d+)$")


def iter_kernel_steps(dump_path: str):
    """Yield ``(step, rank, path)`` for every L2 kernel-dump step directory
    (``rank_{id}/{timestamp}/step_{n}``), by step then rank."""
    found = []
    for rank_name in os.listdir(dump_path) if os.path.isdir(dump_path) else ():
        m = _KERNEL_RANK_RE.match(rank_name)
        if not m:
            continue
        rank_dir = os.path.join(dump_path, rank_name)
        for stamp in sorted(os.listdir(rank_dir)):
            stamp_dir = os.path.join(rank_dir, stamp)
            for step_name in os.listdir(stamp_dir) if os.path.isdir(stamp_dir) else ():
                s = _KERNEL_STEP_RE.match(step_name)
                if s:
                    found.append((int(s.group(1)), int(m.group(1)), os.path.join(stamp_dir, step_name)))
    yield from sorted(found)


def load_kernel_statistics(step_dir: str) -> list:
    """Rows of an L2 step's ``statistic.csv`` as dicts (MindSpore's column names); [] if absent."""
    path = os.path.join(step_dir, "statistic.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _first_non_finite_kernel(step_dir: str):
    """Name of the first kernel tensor (execution order) holding NaN/Inf, from statistic.csv (its Max
    and Min: a NaN element makes both NaN, an Inf one shows in one of them; Avg alone is NaN for +Inf
    beside -Inf) or, for the tensor task, from the saved tensors."""
    rows = load_kernel_statistics(step_dir)
    if rows:
        for row in sorted(rows, key=lambda r: int(r.get("Timestamp") or 0)):
            for col in ("Max Value", "Min Value"):
                try:
                    if not math.isfinite(float(row.get(col) or 0)):
                        return f"{row.get('Op Name')} {row.get('IO')} {row.get('Slot')}"
                except ValueError:
                    continue
        return None
    from msprobe.format.npy import load_npy

    for name in sorted(n for n in os.listdir(step_dir) if n.endswith(".npy")):
        arr = load_npy(os.path.join(step_dir, name))
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            return name
    return None


def _summarize_kernel_dump(dump_path: str, lines: list) -> None:
    first_bad = None
    for step, rank, path in iter_kernel_steps(dump_path):
        rows = load_kernel_statistics(path)
        files = sum(1 for n in os.listdir(path) if n.endswith(".npy"))
        what = f"{len(rows)} kernel statistic rows" if rows else f"{files} kernel tensor files"
        lines.append(f"  L2 rank_{rank} step_{step}: {what}")
        if first_bad is None:
            bad = _first_non_finite_kernel(path)
            if bad:
                first_bad = f"rank_{rank} step_{step}: {bad}"
    lines.append(f"  first kernel tensor with a non-finite value: {first_bad or 'none'}")


#: subtrees written when a PyNative network contains ``mindspore.jit`` Cells (README "L0 in GRAPH_MODE")
SUBTREES = ("pynative", "graph")


def _iter_trees(dump_path: str):
    """``(tree label, step, rank dir, path)`` over ``dump_path`` and its ``pynative/``/``graph/``."""
    for step, rank, path in iter_step_dirs(dump_path):
        yield "", step, rank, path
    for tree in SUBTREES:
        for step, rank, path in iter_step_dirs(os.path.join(dump_path, tree)):
            yield f"{tree}/", step, rank, path


def _first_line(text: str) -> str:
    """The first non-empty line of ``text`` (an exception's message may carry MindSpore's C++ stack
    on further lines), marked when lines were left out."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... (full text: dump.json \"abnormal\")"


def _entry_counts(data: dict) -> str:
    """``"3 forward, 3 backward, 2 parameter-gradient"`` for Cell/API entries, ``"2 saved values, 2
    saved gradients"`` for the debug level's (``save()``: ``{name}.{n}.debug`` and
    ``{name}_grad.{n}.debug``); both when a step holds both kinds."""
    debug = [k for k in data if naming.is_debug(k)]
    parts = []
    if len(debug) < len(data) or not data:
        other = [k for k in data if not naming.is_debug(k)]
        parts += [f"{sum(1 for k in other if '.forward' in k)} forward",
                  f"{sum(1 for k in other if '.backward' in k)} backward",
                  f"{sum(1 for k in other if naming.is_param_grad(k))} parameter-gradient"]
    if debug:
        grads = sum(1 for k in debug if naming.direction_of(k) == "backward")
        parts += [f"{len(debug) - grads} saved value{'s' * (len(debug) - grads != 1)}",
                  f"{grads} saved gradient{'s' * (grads != 1)}"]
    return ", ".join(parts)


def summarize(dump_path: str) -> str:
    """A one-screen text summary: steps, entries, forward/backward counts, first non-finite entry and
    the first producer of a non-finite value (inputs finite, output NaN/Inf; see ``anomalies.json``).

    Args:
        dump_path (str): a ``dump_path`` directory (Cell/API dumps or L2 kernel dumps).

    Raises:
        DumpFormatError: ``dump_path`` does not exist or holds no dump.
    """
    lines = [f"dump at {os.path.abspath(dump_path)}"]
    first_bad = first_producer = watch_producer = shown_note = None
    for tree, step, rank, path in _iter_trees(dump_path):
        dump = load(path)
        counts = _entry_counts(dump.data)
        prefixes = sorted({k.split(".", 1)[0] for k in dump.data})
        state = "" if dump.complete else "  (INCOMPLETE)"
        if dump.header.get("abnormal"):
            state += f"  (ABNORMAL: {_first_line(str(dump.header['abnormal']))})"
        if dump.header.get("partial"):
            state += f"  (PARTIAL: {dump.header['partial']})"
        note = dump.header.get("note")
        if note:  # the same note as the step above: said once
            state += f"\n    note: {note}" if note != shown_note else "  (note: as above)"
        shown_note = note
        if not dump.data:  # an empty step: why (dump.json's empty_reason) instead of counts and prefixes
            reason = dump.header.get("empty_reason")
            lines.append(f"  {tree}step{step}/{rank}: 0 entries{f' ({reason})' if reason else ''}{state}")
            continue
        where = f"{tree}step{step}/{rank}"
        lines.append(f"  {where}: {len(dump.data)} entries ({counts}) prefixes: {', '.join(prefixes)}{state}")
        if watch_producer is None:
            watched = report.read_report(path, report.ANOMALIES)
            if isinstance(watched, dict) and watched.get("kind") in report.MAGNITUDE_KINDS \
                    and watched.get("producer"):
                watch_producer = (f"{where}: {watched['producer']} "
                                  f"({report.MAGNITUDE_KINDS[watched['kind']]}, watch mode)")
        if first_bad is None:
            found = report.find_anomalies(dump.data, dump.construct)
            if found is not None:
                first_bad = f"{where}: {found['first_non_finite']}"
                if found["first_producer"]:
                    first_producer = f"{where}: {found['first_producer']}"
    cell_or_api = len(lines) > 1
    if cell_or_api:
        lines.append(f"  first entry with a non-finite value: {first_bad or 'none'}")
        lines.append(f"  first producer of a non-finite value (inputs finite, output not): "
                     f"{first_producer or 'none'}")
        if watch_producer:
            lines.append(f"  first producer of a watch-mode anomaly (anomalies.json): {watch_producer}")
    if any(True for _ in iter_kernel_steps(dump_path)):
        _summarize_kernel_dump(dump_path, lines)
    elif not os.path.isdir(dump_path):
        raise DumpFormatError(f"{dump_path}: no such directory")
    elif not cell_or_api:
        raise DumpFormatError(f"{dump_path}: no dump found (expected step{{N}}/rank{{R}}/ or "
                              "step{N}/proc{pid}/, their pynative/ and graph/ subtrees, or, for L2, "
                              "rank_{id}/{timestamp}/step_{n}/)")
    return "\n".join(lines)
