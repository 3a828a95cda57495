"""A step's files, built from its replayed records beside the writer.

The writer (:class:`msprobe.engine.writer.StepWriter`) journals lines and writes the documents it is
handed; this module decides what they hold: ``dump.json`` (or ``debug.json``) from the replayed
``data`` plus what the runtime knows about the step (:class:`StepExtras`: why it ended abnormally,
and why it is empty, passed as text), ``stack.json``, ``construct.json`` without the backward entries
that never received a gradient, and the reports ``anomalies.json`` / ``coverage.json``
(:mod:`msprobe.read.report`).
"""
from __future__ import annotations

from msprobe.read import report

#: written as ``empty_reason`` when the caller gives none (no known cause)
DEFAULT_EMPTY_REASON = report.EMPTY_REASON


class StepExtras:
    """What a step's files say beyond its records; one per open step (the runtime's, or a fresh
    one for a history step written by watch mode).

    Attributes:
        notes: ``coverage.json`` items by key (``not_captured``, ``unwaited_async_handles``, ...).
        abnormal: why the step ended abnormally (``dump.json["abnormal"]``), or ``None``.
        partial: what of the step's records the files leave out, when they hold only part of a step
            that ran to its end (watch mode's history: ``dump.json["partial"]``), or ``None``.
        anomaly_extra: fields added to ``anomalies.json`` (watch mode: what triggered it), or ``None``.
        note: what the user must know to read the step's records (``dump.json["note"]``: level L1 in
            GRAPH_MODE records compiled calls only), or ``None``.
        changed: something changed since the files were last written.
    """

    def __init__(self):
        self.notes: dict = {}
        self.abnormal: str | None = None
        self.partial: str | None = None
        self.anomaly_extra: dict | None = None
        self.note: str | None = None
        self.changed = True

    def set_note(self, note: str | None) -> None:
        """Set ``dump.json["note"]`` (``None``: no note)."""
        if note != self.note:
            self.note = note
            self.changed = True

    def add_note(self, key: str, items: list) -> None:
        """Add ``items`` (JSON objects) to ``coverage.json[key]`` (written with the next files)."""
        if items:
            self.notes.setdefault(key, []).extend(items)
            self.changed = True

    def mark_abnormal(self, reason: str) -> None:
        """Record why the step ended abnormally (the first reason is kept)."""
        if self.abnormal is None:
            self.abnormal = reason
            self.changed = True


def dump_document(header: dict, data: dict, abnormal: str | None = None,
                  empty_reason: str | None = None, partial: str | None = None,
                  note: str | None = None) -> dict:
    """``dump.json``/``debug.json``: the header's fields (``task``, ``level``, ``framework``,
    ``dump_data_dir``, ``schema``, ``run_id``, ``msprobe_version``, ``mode`` when present, in that
    order), ``data``, then
    ``abnormal``, ``partial`` and ``note`` when given and ``empty_reason`` exactly when ``data`` is empty
    (default :data:`DEFAULT_EMPTY_REASON`)."""
    dump = {k: header[k] for k in ("task", "level", "framework", "dump_data_dir", "schema") if k in header}
    for k in ("run_id", "msprobe_version", "mode"):
        if header.get(k) is not None:
            dump[k] = header[k]
    dump["data"] = data
    if abnormal:
        dump["abnormal"] = abnormal
    if partial:
        dump["partial"] = partial
    if note:
        dump["note"] = note
    if not data:  # an empty step is written with its reason, never left missing
        dump["empty_reason"] = empty_reason or DEFAULT_EMPTY_REASON
    return dump


def write_step(writer, extras: StepExtras, empty_reason: str | None = None) -> None:
    """Write the files of ``writer``'s step from everything journaled so far (``stop()``, ``step()``,
    watch mode's trigger); nothing when neither the journal nor ``extras`` changed since the last
    call, or when the writer has no files to write (closed, or watch mode before its trigger).

    Args:
        writer: a :class:`~msprobe.engine.writer.StepWriter`, or watch mode's writer (its
            ``target``).
        extras: the step's :class:`StepExtras`.
        empty_reason: why nothing was recorded, written only when ``data`` is empty.

    Raises:
        OSError: a write failed.
    """
    target = writer.target
    if target is None or target.closed or not (target.dirty or extras.changed):
        return
    with target.lock:  # no line lands between reading the records and writing the files
        header, data, stacks, construct = target.replayed()
        documents = {target.data_file: dump_document(header, data, extras.abnormal, empty_reason,
                                                     extras.partial, extras.note)}
        if target.extra_info:
            if header.get("task") != "structure":
                construct = report.without_empty_backward(construct, data)
            documents["stack.json"] = stacks
            documents["construct.json"] = construct
            # anomalies.json / coverage.json are extra files too (extra_info: false -> dump.json only)
            identity = {k: header[k] for k in ("run_id", "msprobe_version") if header.get(k) is not None}
            documents.update(report.step_reports(
                target.directory, data, stacks, extras.notes,
                scan=target.non_finite or extras.anomaly_extra is not None, construct=construct,
                extra=extras.anomaly_extra, identity=identity))
        target.write(documents, non_finite=(target.data_file,) if target.non_finite else ())
        extras.changed = False
