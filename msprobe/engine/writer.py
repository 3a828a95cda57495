"""Writer: one per dumped step and rank directory (``{dump_path}/step{N}/rank{R}/``). It writes what it
is given and decides nothing about the content.

During the step, journal lines (:mod:`msprobe.format.journal`) are appended to ``dump.journal`` at every
flush, so a crash or kill loses at most the lines not yet flushed; the writer keeps what they say
replayed (:meth:`StepWriter.replayed`). :meth:`StepWriter.write` writes the JSON documents it is handed
(``dump.json``, ``stack.json``, ... built from the replayed records by :mod:`msprobe.engine.step_files`),
:meth:`StepWriter.close` removes the journal. No MindSpore, no statistics code: the writer can be driven
with hand-made records.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time

from msprobe.engine.messages import announce as show
from msprobe.format import journal
from msprobe.format.journal import JOURNAL, TENSOR_DIR, Replay, atomic_write_documents, encode_json, read_journal
from msprobe.read.report import non_finite

logger = logging.getLogger("msprobe")

#: journal text (bytes) up to which a step's records are also kept live in memory, so ``dump.json``
#: is written without reading the journal back; a bigger step drops the mirror and reads back
#: (writer memory stays bounded however many calls a step makes)
LIVE_STATE_BYTES = 4 << 20
_PLAIN = (str, int, bool, type(None))


def resolve_slots(value, flags: list):
    """A journal line's value with tensor slots (objects with a finished ``leaf`` dict) replaced by
    their leaves; ``flags[0]`` is set when the value holds a non-finite float (a statistic or an
    argument), which JSON can only carry as the ``NaN``/``Infinity`` tokens."""
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
    if not flags[0] and non_finite(leaf):
        flags[0] = True
    return leaf


def encode_lines(records: list):
    """``(text, resolved, non_finite)`` of journal lines: ``resolved`` the lines with tensor slots
    replaced by their leaves (:func:`resolve_slots`), ``text`` their newline-terminated JSON
    (bytes-like), ``non_finite`` whether one holds a NaN/Inf float. The compiled per-call path
    (``msprobe.tensors.hotpath``) has an equivalent the runtime hands to :class:`StepWriter`."""
    resolved, text, any_non_finite = [], bytearray(), False
    for r in records:
        flags = [False]
        rec = {k: resolve_slots(v, flags) for k, v in r.items()}
        resolved.append(rec)
        text += encode_json(rec, flags[0], line=True)  # orjson's bytes over-allocate: not kept
        any_non_finite = any_non_finite or flags[0]
    return text, resolved, any_non_finite


def _read_back(path: str) -> list | None:
    """The journal lines (dicts) of the file ``path``, decoded as :func:`msprobe.format.journal.decode_line`
    decodes a line (orjson, ``NaN``/``Infinity`` tokens through the json module), or ``None`` when
    a line is not valid JSON in UTF-8 (then :func:`~msprobe.format.journal.read_journal`, which
    stops at such a line, decides). A torn last line (no newline) is left out, as that reader does."""
    with open(path, "rb") as f:
        text = f.read()
    lines = text.split(b"\n")
    lines.pop()  # after the last newline: empty, or a torn line
    try:
        return [journal.decode_line(line) for line in lines]
    except ValueError:  # orjson's and json's decode errors, invalid UTF-8 included
        return None


class StepWriter:
    """Append-only writer for one ``step{N}/rank{R}`` directory.

    Args:
        directory: the step/rank directory (created here).
        header: dict with ``task``, ``level``, ``framework`` (strings; optional ``run_id``, default
            :func:`msprobe.format.journal.run_id`, and ``mode``, ``"GRAPH_MODE"``); the header line
            adds ``dump_data_dir``, ``schema`` and ``msprobe_version``.
        tensor_data: whether ``.npy`` files are saved (creates ``dump_tensor_data/``).
        extra_info: the step has ``stack.json``/``construct.json`` and reports (read by whoever builds
            the documents; the writer writes what it is given).
        data_file: ``dump.json``, or ``debug.json`` for the debug level.
        line_encoder: function with the contract of :func:`encode_lines` (default: that one).
        line_replayer: ``callable(state, resolved lines)`` with the effect of
            :meth:`Replay.apply_all <msprobe.format.journal.Replay.apply_all>` (the default) on the
            live state.

    Raises:
        OSError: the directory or the journal cannot be created.
    """

    def __init__(self, directory: str, header: dict, tensor_data: bool, extra_info: bool,
                 data_file: str = "dump.json", line_encoder=None, line_replayer=None):
        self.directory = directory
        self._encode_lines = line_encoder or encode_lines
        self._replay_lines = line_replayer or Replay.apply_all
        self.tensor_dir = os.path.join(directory, TENSOR_DIR) if tensor_data else None
        self.extra_info = extra_info
        self.data_file = data_file
        os.makedirs(self.tensor_dir or directory, exist_ok=True)
        self._kind = (header["task"], header["level"], header["framework"], header.get("run_id"),
                      header.get("mode"))
        self.closed = False
        #: tool errors written to ``dump_error_info.log`` in this step (:meth:`error`)
        self.error_count = 0
        #: journal lines appended since the documents were last written (:meth:`write`)
        self.dirty = True
        #: held while lines are appended or documents written; hold it around :meth:`replayed`
        #: and :meth:`write` so no line lands between reading the records and writing the files
        self.lock = threading.RLock()
        self._journal_path = os.path.join(directory, JOURNAL)
        self._journal = open(self._journal_path, "ab")
        self._state = Replay()  # what the journal says so far, kept live (no read-back at stop())
        self._journal_bytes = 0
        self._non_finite = False
        self._written: set = set()  # names of the documents written into the directory
        self.append([self._header_line()])
        self.last_flush = time.monotonic()

    def _header_line(self) -> dict:
        task, level, framework, run, mode = self._kind
        return journal.header(task, level, framework, self.tensor_dir, run, mode)

    @property
    def target(self) -> "StepWriter":
        """The writer that writes this step's files: itself (watch mode's writer may have none yet)."""
        return self

    @property
    def non_finite(self) -> bool:
        """Whether some journaled value holds a non-finite float (``dump.json`` then needs the
        ``NaN``/``Infinity`` tokens, and the anomaly report has work to do)."""
        return self._non_finite

    def append(self, records: list) -> None:
        """Append journal lines (dicts made by the constructors of :mod:`msprobe.format.journal`; values
        may hold tensor slots, see :func:`resolve_slots`) and hand them to the OS (survives a
        process kill). Raises ``OSError`` when the write fails."""
        if not records or self.closed:
            return
        text, resolved, non_finite = self._encode_lines(records)
        if non_finite:
            self._non_finite = True
        with self.lock:
            self._journal.write(text)
            self._journal.flush()
            self.dirty = True
            self._journal_bytes += len(text)
            if self._state is not None and self._journal_bytes > LIVE_STATE_BYTES:
                self._state = None  # too big to mirror: replayed() reads the journal back
            if self._state is not None:
                self._replay_lines(self._state, resolved)
        self.last_flush = time.monotonic()

    def replayed(self):
        """``(header, data, stacks, construct)`` of everything journaled so far (see
        :meth:`msprobe.format.journal.Replay.result`); the caller must not modify them."""
        with self.lock:
            state = self._state
            if state is None:
                state = Replay()
                lines = _read_back(self._journal_path)
                if lines is None:  # a line the fast reader refuses: the reader's own rules decide
                    state.apply_all(read_journal(self._journal_path))
                else:
                    self._replay_lines(state, lines)
            return state.result()

    def release_live_state(self) -> None:
        """Forget the live mirror of the journal (``stop()``, once the step's files are written): the
        step's records are freed before the garbage collector's window closes (``gc_window.py``),
        so no collection finds them alive and promotes them. Lines appended later go to the journal
        only, and :meth:`replayed` reads it back."""
        with self.lock:
            self._state = None
            self._journal_bytes = LIVE_STATE_BYTES + 1  # no mirror from here on

    def write(self, documents: dict, non_finite: tuple = ()) -> None:
        """Write JSON documents into the step directory, each atomically.

        Args:
            documents: file name -> JSON object, or ``None`` to remove an earlier version of that file.
            non_finite: names of the documents that may hold NaN/Inf floats (written with the
                ``NaN``/``Infinity`` tokens; the others with the faster encoder).

        Raises:
            OSError: a write failed (the files written before it stay).
        """
        with self.lock:
            batch = []  # (path, document, non_finite) written together, in order
            for name, document in documents.items():
                path = os.path.join(self.directory, name)
                if document is None:
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass
                    self._written.discard(name)
                    continue
                batch.append((path, document, name in non_finite))
            paths = [path for path, _, _ in batch]
            try:
                atomic_write_documents(batch)
            except OSError as exc:  # the documents before the failed one are written
                del paths[paths.index(exc.filename) if exc.filename in paths else 0:]
                raise
            finally:
                self._written.update(os.path.basename(path) for path in paths)
            self.dirty = False

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
        with self.lock:
            self._journal.close()
            os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
            os.rename(self.directory, directory)
            self.directory = directory
            if self.tensor_dir is not None:
                self.tensor_dir = os.path.join(directory, TENSOR_DIR)
            self._journal_path = os.path.join(directory, JOURNAL)
            self._journal = open(self._journal_path, "ab")
        self.append([self._header_line()])

    def abandon(self, message: str) -> None:
        """Stop writing after a failed write: no more files; the journal stays (readable, the step
        loads with ``complete=False``); ``message`` goes to ``dump_error_info.log`` if possible."""
        with self.lock:
            self.closed = True
            try:
                self._journal.close()
            except OSError:
                pass
        self._log_error(message)

    def discard_if_empty(self) -> bool:
        """Close and delete this step directory if nothing was journaled but the header (a step
        opened by ``start()`` and renumbered by ``set_init_step`` before anything ran)."""
        with self.lock:
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
        for name in self._written:
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

    def close(self, announce: bool = True) -> None:
        """End the step: remove the journal (write the final documents first, :meth:`write`).
        Idempotent. ``announce``: show ``dump.json is at <directory>`` (the seed's message); watch
        mode names the history steps it writes at once in its own message instead."""
        if self.closed:
            return
        with self.lock:
            self.closed = True
            self._journal.close()
            os.remove(self._journal_path)
        if announce:
            show(f"{self.data_file} is at {self.directory}")  # the seed's message, once per step
