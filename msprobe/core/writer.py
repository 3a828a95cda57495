"""Writer: one per dumped step and rank directory (``{dump_path}/step{N}/rank{R}/``).

During the step, records are appended to ``dump.journal`` (JSON lines) at every flush, so a crash or
kill loses at most the records not yet flushed. ``write_files()`` (at ``stop()``) and ``close()`` (at
``step()``/exit) replay the journal into the seed's files: ``dump.json``, ``stack.json``,
``construct.json``; ``close()`` then removes the journal. :func:`replay` is shared with the reader.

Journal line kinds:

* ``{"e": entry, "k": key, "v": value}`` — set ``data[entry][key] = value``
* ``{"e": entry, "k": key, "i": index, "n": size, "v": leaf}`` — set item ``index`` of a list of
  ``size`` (backward gradients arrive one by one)
* ``{"e": entry, "v": value}`` — set ``data[entry] = value`` (debug level: any nesting)
* ``{"e": entry, "p": [key or index, ...], "v": leaf}`` — set a nested item (debug gradients)
* ``{"e": entry, "stack": id}`` and ``{"s": id, "f": [frames]}`` — interned call stacks
* ``{"c": name, "p": parent}`` — construct.json edge
* ``{"h": header}`` — first line: task, level, framework, dump_data_dir, schema
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time

import orjson

from msprobe.core import report
from msprobe.core.messages import announce

logger = logging.getLogger("msprobe")

SCHEMA = "msprobe-mindspore/1"

#: journal text (bytes) up to which a step's records are also kept live in memory, so ``dump.json``
#: is written without reading the journal back; a bigger step drops the mirror and reads back
#: (writer memory stays bounded however many calls a step makes)
LIVE_STATE_BYTES = 4 << 20
JOURNAL = "dump.journal"
TENSOR_DIR = "dump_tensor_data"


def _atomic_write_json(path: str, obj, non_finite: bool = True) -> None:
    """Write ``obj`` as compact JSON to ``path`` through a temporary file; ``non_finite=False``
    promises no NaN/Inf floats inside (then the faster encoder is used, see :func:`encode_json`)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        data = encode_json(obj, non_finite)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:  # disk full: leave no half-written temporary file behind
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


class Replay:
    """Applies journal records in order: the one definition of what a journal line means.

    Used by the reader on a journal file and by :class:`StepWriter` live, as records are appended,
    so ``dump.json`` is written without reading the journal back.
    """

    def __init__(self):
        self.header, self.data, self.construct = {}, {}, {}
        self._frames, self._stack_names = {}, {}
        self._valued: set = set()  # entries set whole by a {"e", "v"} line (debug level)

    def apply(self, rec: dict) -> None:
        entry = rec.get("e")
        if entry is not None:
            data = self.data
            if "p" in rec:
                if rec["p"]:
                    _set_path(data.get(entry), rec["p"], rec["v"])
                else:  # the saved variable is a single tensor: its gradient is the whole entry
                    data[entry] = rec["v"]
                return
            if "k" not in rec and "v" in rec:
                data[entry] = rec["v"]
                self._valued.add(entry)
                return
            body = data.setdefault(entry, {})
            if "k" in rec:
                if "i" in rec:
                    seq = body.get(rec["k"])
                    if not isinstance(seq, list) or len(seq) < rec["n"]:
                        seq = (seq or []) + [None] * (rec["n"] - len(seq or []))
                        body[rec["k"]] = seq
                    seq[rec["i"]] = rec["v"]
                else:
                    body[rec["k"]] = rec["v"]
            if "stack" in rec:
                self._stack_names.setdefault(rec["stack"], []).append(entry)
        elif "c" in rec:
            self.construct[rec["c"]] = rec["p"]
        elif "s" in rec:
            self._frames[rec["s"]] = rec["f"]
        elif "h" in rec:
            self.header = rec["h"]

    def result(self):
        """``(header, data, stacks, construct)``; ``stacks`` in the grouped ``stack.json`` form
        ``{"0": [[names], [frames]], ...}``."""
        # entries that never got a value (only a stack reference) are not data entries; an entry
        # whose value is empty (debug level: save([], "x")) is
        data = {k: v for k, v in self.data.items() if v or k in self._valued}
        stacks = {}
        for sid, names in self._stack_names.items():
            stacks[str(len(stacks))] = [names, self._frames.get(sid, [])]
        return self.header, data, stacks, self.construct


def replay(lines):
    """Rebuild ``(header, data, stacks, construct)`` from journal lines (dicts), in order."""
    state = Replay()
    for rec in lines:
        state.apply(rec)
    return state.result()


_PLAIN = (str, int, bool, type(None))


def _resolve(value, flags: list):
    """A journal record's value with tensor slots replaced by their finished leaves; ``flags[0]``
    is set when the value holds a non-finite float (a statistic, so the anomaly report has work to
    do, or an argument), which JSON can only carry as the ``NaN``/``Infinity`` tokens."""
    kind = type(value)
    if kind is dict:
        return {k: _resolve(v, flags) for k, v in value.items()}
    if kind is list:
        return [_resolve(v, flags) for v in value]
    if kind in _PLAIN:
        return value
    if kind is float:
        if not flags[0] and not math.isfinite(value):
            flags[0] = True
        return value
    leaf = getattr(value, "leaf", None)
    if leaf is None:
        return value
    if not flags[0] and report.non_finite(leaf):
        flags[0] = True
    return leaf


def encode_json(obj, non_finite: bool, line: bool = False) -> bytes:
    """Compact UTF-8 JSON of ``obj`` (newline-terminated when ``line``). orjson when it can; the json
    module when ``obj`` may hold a non-finite float (orjson would write null where the dump format
    has the ``NaN``/``Infinity`` tokens) or an integer beyond 64 bits (orjson refuses it)."""
    if not non_finite:
        try:
            return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE if line else None)
        except TypeError:
            pass
    return (json.dumps(obj, ensure_ascii=False) + ("\n" if line else "")).encode("utf-8")


def _set_path(container, path, value) -> None:
    for key in path[:-1]:
        if container is None:
            return
        container = container[key]
    if container is not None:
        container[path[-1]] = value


def read_journal(path: str):
    """Yield journal records; a torn last line (killed mid-write) is skipped."""
    # errors="replace": a write cut short by a full disk may end inside a multi-byte character
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                break


class StepWriter:
    """Append-only writer for one ``step{N}/rank{R}`` directory.

    Args:
        directory: the step/rank directory (created here).
        header: dict with ``task``, ``level``, ``framework``.
        tensor_data: whether ``.npy`` files are saved (creates ``dump_tensor_data/``).
        extra_info: write ``stack.json`` and ``construct.json``.
        data_file: ``dump.json``, or ``debug.json`` for the debug level.
        empty_reason: ``callable() -> str`` asked, when a step recorded nothing, why (written as
            ``empty_reason``); default :data:`msprobe.core.report.EMPTY_REASON`.
    """

    def __init__(self, directory: str, header: dict, tensor_data: bool, extra_info: bool,
                 data_file: str = "dump.json", empty_reason=None):
        self.directory = directory
        self.tensor_dir = os.path.join(directory, TENSOR_DIR) if tensor_data else None
        self.extra_info = extra_info
        self.data_file = data_file
        os.makedirs(self.tensor_dir or directory, exist_ok=True)
        self.header = dict(header, dump_data_dir=self.tensor_dir, schema=SCHEMA)
        self.closed = False
        #: tool errors reported through :meth:`error` in this step
        self.error_count = 0
        #: coverage notes of this step (``coverage.json``): key -> list of JSON items
        self.notes: dict = {}
        self._lock = threading.Lock()
        self._journal_path = os.path.join(directory, JOURNAL)
        self._journal = open(self._journal_path, "ab")
        self._dirty = True
        self.abnormal = None  # why the step ended abnormally (exception, skipped stop()), if it did
        self._empty_reason = empty_reason or (lambda: report.EMPTY_REASON)
        self._state = Replay()  # what the journal says so far, kept live (no read-back at stop())
        self._journal_bytes = 0
        self._non_finite = [False]
        #: fields added to ``anomalies.json`` (watch mode: step, rank, kind, cell, trigger)
        self.anomaly_extra = None
        self.append([{"h": self.header}])
        self.last_flush = time.monotonic()

    def append(self, records: list) -> None:
        """Append journal records (dicts) and hand them to the OS (survives a process kill)."""
        if not records or self.closed:
            return
        resolved, text = [], bytearray()
        for r in records:
            flags = [False]
            rec = {k: _resolve(v, flags) for k, v in r.items()}
            resolved.append(rec)
            text += encode_json(rec, flags[0], line=True)  # orjson's bytes over-allocate: not kept
            if flags[0]:
                self._non_finite[0] = True
        with self._lock:
            self._journal.write(text)
            self._journal.flush()
            self._dirty = True
            self._journal_bytes += len(text)
            if self._state is not None and self._journal_bytes > LIVE_STATE_BYTES:
                self._state = None  # too big to mirror: write_files reads the journal back
            if self._state is not None:
                for rec in resolved:
                    self._state.apply(rec)
        self.last_flush = time.monotonic()

    def error(self, message: str) -> None:
        """Record a tool error in ``dump_error_info.log`` (the training goes on)."""
        self.error_count += 1
        logger.warning("msprobe: %s", message)
        self._log_error(message)

    def _log_error(self, message: str) -> None:
        try:
            with open(os.path.join(self.directory, "dump_error_info.log"), "a", encoding="utf-8") as f:
                f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + message + "\n")
        except OSError:  # the disk may be full: the log message is all we can give
            pass

    def relocate(self, directory: str) -> None:
        """Rename this step's directory to ``directory`` (rank found after ``start()``); the journal
        goes on there and a new header line records the new ``dump_data_dir``."""
        with self._lock:
            self._journal.close()
            os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
            os.rename(self.directory, directory)
            self.directory = directory
            if self.tensor_dir is not None:
                self.tensor_dir = os.path.join(directory, TENSOR_DIR)
            self.header = dict(self.header, dump_data_dir=self.tensor_dir)
            self._journal_path = os.path.join(directory, JOURNAL)
            self._journal = open(self._journal_path, "ab")
        self.append([{"h": self.header}])

    def abandon(self, message: str) -> None:
        """Stop writing after a failed write: no more files; the journal stays (readable, the step
        loads with ``complete=False``); ``message`` goes to ``dump_error_info.log`` if possible."""
        with self._lock:
            self.closed = True
            try:
                self._journal.close()
            except OSError:
                pass
        self._log_error(message)

    def write_files(self) -> None:
        """Write ``dump.json`` (and stack/construct) from everything journaled so far."""
        with self._lock:
            if not self._dirty:
                return
            state = self._state or Replay()
            if self._state is None:
                for rec in read_journal(self._journal_path):
                    state.apply(rec)
            header, data, stacks, construct = state.result()
            if header.get("task") != "structure":
                construct = _without_empty_backward(construct, data)
            dump = {k: header.get(k) for k in ("task", "level", "framework", "dump_data_dir")}
            dump["schema"] = header.get("schema", SCHEMA)
            dump["data"] = data
            if self.abnormal:
                dump["abnormal"] = self.abnormal
            if not data:  # an empty step is written with its reason, never left missing
                dump["empty_reason"] = self._empty_reason()
            _atomic_write_json(os.path.join(self.directory, self.data_file), dump, self._non_finite[0])
            if self.extra_info:
                _atomic_write_json(os.path.join(self.directory, "stack.json"), stacks, False)
                _atomic_write_json(os.path.join(self.directory, "construct.json"), construct, False)
                # anomalies.json / coverage.json are extra files too (extra_info: false -> dump.json only)
                report.write_step_reports(self.directory, data, stacks, self.notes, _atomic_write_json,
                                          scan=self._non_finite[0] or self.anomaly_extra is not None,
                                          construct=construct, extra=self.anomaly_extra)
            self._dirty = False

    def mark_abnormal(self, reason: str) -> None:
        """Record in ``dump.json["abnormal"]`` why this step ended abnormally (first reason kept)."""
        with self._lock:
            if self.abnormal is None:
                self.abnormal = reason
                self._dirty = True

    def add_note(self, key: str, items: list) -> None:
        """Add ``items`` to ``coverage.json[key]`` of this step (written with the next files)."""
        if items:
            with self._lock:
                self.notes.setdefault(key, []).extend(items)
                self._dirty = True

    def discard_if_empty(self) -> bool:
        """Close and delete this step directory if nothing was journaled but the header (a step
        opened by ``start()`` and renumbered by ``set_init_step`` before anything ran)."""
        with self._lock:
            if self.closed:
                return False
            with open(self._journal_path, encoding="utf-8") as f:
                if sum(1 for _ in f) > 1:
                    return False
            self.closed = True
            self._journal.close()
            os.remove(self._journal_path)
        if os.path.exists(os.path.join(self.directory, "dump_error_info.log")):
            return True  # keep a directory that reports tool errors
        for name in (self.data_file, "stack.json", "construct.json", report.ANOMALIES, report.COVERAGE):
            try:
                os.remove(os.path.join(self.directory, name))
            except OSError:
                pass
        for path in (self.tensor_dir, self.directory, os.path.dirname(self.directory)):
            if path:
                try:
                    os.rmdir(path)  # only when empty
                except OSError:
                    pass
        return True

    def close(self) -> None:
        """Write the final files and remove the journal. Idempotent."""
        if self.closed:
            return
        self.write_files()
        with self._lock:
            self.closed = True
            self._journal.close()
            os.remove(self._journal_path)
        announce(f"{self.data_file} is at {self.directory}")  # the seed's message, once per step


def _without_empty_backward(construct: dict, data: dict) -> dict:
    """``construct`` without the backward entries that never received a gradient (a call whose
    outputs carry none, e.g. ``shape``) and enclose nothing that did: they are not in ``dump.json``."""
    needed = report.ancestors(data, construct)
    return {name: parent for name, parent in construct.items()
            if name in data or name in needed or ".backward" not in name}
