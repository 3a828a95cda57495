"""Writer: one per dumped step and rank directory (``{dump_path}/step{N}/rank{R}/``).

During the step, records are appended to ``dump.journal`` (JSON lines, :mod:`msprobe.format.journal`)
at every flush, so a crash or kill loses at most the records not yet flushed. ``write_files()`` (at
``stop()``) and ``close()`` (at ``step()``/exit) replay the journal into the seed's files: ``dump.json``,
``stack.json``, ``construct.json``; ``close()`` then removes the journal.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time

from msprobe.read import report
from msprobe.tensors import hotpath
from msprobe.engine.messages import announce
from msprobe.format.journal import (JOURNAL, SCHEMA, TENSOR_DIR, Replay, atomic_write_json, encode_json,
                                    read_journal)

logger = logging.getLogger("msprobe")

#: journal text (bytes) up to which a step's records are also kept live in memory, so ``dump.json``
#: is written without reading the journal back; a bigger step drops the mirror and reads back
#: (writer memory stays bounded however many calls a step makes)
LIVE_STATE_BYTES = 4 << 20
_PLAIN = (str, int, bool, type(None))


def resolve_slots(value, flags: list):
    """A journal record's value with tensor slots replaced by their finished leaves; ``flags[0]``
    is set when the value holds a non-finite float (a statistic, so the anomaly report has work to
    do, or an argument), which JSON can only carry as the ``NaN``/``Infinity`` tokens."""
    kind = type(value)
    if kind is dict:
        return {k: resolve_slots(v, flags) for k, v in value.items()}
    if kind is list:
        return [resolve_slots(v, flags) for v in value]
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


class StepWriter:
    """Append-only writer for one ``step{N}/rank{R}`` directory.

    Args:
        directory: the step/rank directory (created here).
        header: dict with ``task``, ``level``, ``framework``.
        tensor_data: whether ``.npy`` files are saved (creates ``dump_tensor_data/``).
        extra_info: write ``stack.json`` and ``construct.json``.
        data_file: ``dump.json``, or ``debug.json`` for the debug level.
        empty_reason: ``callable() -> str`` asked, when a step recorded nothing, why (written as
            ``empty_reason``); default :data:`msprobe.read.report.EMPTY_REASON`.
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
        ext = hotpath.ext
        if ext is not None:  # the same resolution and lines, in C (tensors/hotpath.py)
            text, resolved, non_finite = ext.encode_lines(records, encode_json)
            if non_finite:
                self._non_finite[0] = True
        else:
            resolved, text = [], bytearray()
            for r in records:
                flags = [False]
                rec = {k: resolve_slots(v, flags) for k, v in r.items()}
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
            atomic_write_json(os.path.join(self.directory, self.data_file), dump, self._non_finite[0])
            if self.extra_info:
                atomic_write_json(os.path.join(self.directory, "stack.json"), stacks, False)
                atomic_write_json(os.path.join(self.directory, "construct.json"), construct, False)
                # anomalies.json / coverage.json are extra files too (extra_info: false -> dump.json only)
                report.write_step_reports(self.directory, data, stacks, self.notes, atomic_write_json,
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
