"""Watch mode: statistics of every recorded call are computed as usual, but kept in memory only (the
open step, and the last ``history`` entries of the steps before it), and written out as normal step
directories the moment a *producer* of an anomaly is seen (README "Watch mode").

A producer is the first record, in execution order, whose inputs hold no anomaly and whose output
does (forward: ``input_args``/``input_kwargs``/``parameters`` -> ``output``; backward: ``input``, the
gradient w.r.t. the call's outputs, and its forward call's inputs -> ``output``, the gradient w.r.t.
its inputs). An input anomaly is a watched NaN/Inf, or with ``max_abs`` a value beyond the bound: a
call passing such a value on is a propagator (of a NaN/Inf output only when an input is NaN/Inf:
:func:`blocks`). At mix level the API inside a Cell finishes before the
Cell, so the innermost producer comes first.

Objects:

* :class:`Watch` — one per runtime, lives for the whole run: the history (the open step's entries
  and the ring of earlier ones), stack definitions,
  whether (and where) the anomaly was found, the heartbeat file.
* :class:`WatchWriter` — one per step, with the interface of :class:`msprobe.engine.writer.StepWriter`
  that the runtime uses; memory only until the trigger (its ``target``, the writer of the step's files,
  is ``None`` until then), then it forwards everything of its step to a real ``StepWriter`` so the step
  directory is complete when the step ends. Journal lines are read through the accessors of
  :mod:`msprobe.format.journal`.

Cost: a flushed batch is resolved and encoded in one call (:func:`msprobe.engine.flush.encode_batch`,
what the writer of a dumped step uses) and kept as that text (:mod:`msprobe.engine.watch_history`);
nothing is written in a clean step but the heartbeat. The pieces of a batch are checked one by one
only when the batch holds a non-finite float (or ``max_abs``/``norm_jump`` asks for every output):
statistics show NaN/Inf in their own floats, so a batch without one has no anomaly of those kinds.
"""
from __future__ import annotations

import logging
import math
import os
import re
import time

from msprobe.read import report
from msprobe.tensors import stats
from msprobe.engine import layout, watch_history
from msprobe.engine.flush import encode_batch
from msprobe.engine.step_files import StepExtras, write_step
from msprobe.engine.watch_history import History
from msprobe.engine.watch_loss import WATCHED, LossCheck
from msprobe.engine.writer import StepWriter
from msprobe.format import journal, naming
from msprobe.format.journal import SCHEMA, TENSOR_DIR
from msprobe.format.producer import PASSED_ON, SCALAR, SCALAR_NOTE, element_kinds, input_role

logger = logging.getLogger("msprobe")

HEARTBEAT = "watch_heartbeat.{who}.json"
_PROC_HEARTBEAT = re.compile(r"^watch_heartbeat\.proc(\d+)\.json$")


def _slots(value):
    """Every tensor slot (an object with ``leaf`` and ``tensor``) inside a journal record value."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _slots(v)
    elif isinstance(value, list):
        for v in value:
            yield from _slots(v)
    elif hasattr(value, "leaf") and hasattr(value, "tensor"):
        yield value


#: Primitive classes that exchange data between ranks (their output may come from another rank)
_COLLECTIVE_PRIMITIVES = ("AllReduce", "AllGather", "Broadcast", "ReduceScatter", "AlltoAll", "AllToAll",
                          "Send", "Receive", "Reduce", "CollectiveScatter", "CollectiveGather")


def is_collective(entry: str) -> bool:
    """Whether ``entry`` names a communication call (``Distributed.*``, ``MintDistributed.*``, or a
    collective Primitive): a non-finite output of it with finite local inputs was made on another rank."""
    head = entry.split(".", 1)[0]
    if head in ("Distributed", "MintDistributed"):
        return True
    if head == "Primitive":
        parts = entry.split(".")
        return len(parts) > 2 and parts[2] in _COLLECTIVE_PRIMITIVES
    return False


class WatchAnomaly(RuntimeError):
    """Raised in the training thread when ``watch.on_anomaly`` is ``"raise"``; the dump of the
    anomaly (step directories, ``anomalies.json``) is complete when it is raised."""


def _non_finite_kind(leaf: dict, kinds) -> str | None:
    """``"nan"``/``"inf"`` when ``leaf``'s tensor holds that kind of element (and it is watched),
    else None (:func:`msprobe.format.producer.element_kinds`: a Mean NaN from +Inf beside -Inf is
    no NaN element)."""
    for kind in element_kinds(leaf):
        if kind in kinds:
            return kind
    return None


_INF = float("inf")
_NON_FINITE = ("nan", "inf")


def _beyond(leaf: dict, bound: float) -> bool:
    """Whether ``leaf``'s largest absolute value (from its Max and Min) exceeds ``bound``."""
    top, low = leaf.get("Max"), leaf.get("Min")
    return isinstance(top, (int, float)) and isinstance(low, (int, float)) and max(abs(top), abs(low)) > bound
_WHAT = {"nan": "NaN", "inf": "Inf", "max_abs": "a value beyond max_abs", "norm_jump": "a Norm jump beyond norm_jump"}


def blocks(output_kind: str, input_kinds) -> bool:
    """Whether inputs holding ``input_kinds`` make a call whose output holds ``output_kind`` a
    propagator. A NaN/Inf output is passed on only from a NaN/Inf input (a finite input beyond
    ``max_abs``, e.g. ``log`` of a large negative value, makes the NaN there); a value beyond
    ``max_abs`` or a Norm jump is passed on from any input anomaly (NaN/Inf or beyond the bound)."""
    if output_kind in _NON_FINITE:
        return any(kind in _NON_FINITE for kind in input_kinds)
    return bool(input_kinds)


class Watch:
    """Run-wide watch state.

    Args:
        settings: the validated ``watch`` section (:class:`msprobe.engine.config.WatchSettings`).
        dump_path: the configured ``dump_path`` (heartbeat files are written there).
        level: the dump level; at ``L0``/``L1``/``mix`` whether the watched calls compute the loss
            is told once (:mod:`msprobe.engine.watch_loss`).
        moves: the run's :class:`msprobe.engine.layout.Moves` (an earlier run's heartbeat moved
            aside is counted with its step directories), or None.
    """

    def __init__(self, settings, dump_path: str, level: str | None = None, moves=None):
        self.settings = settings
        self.dump_path = dump_path
        self.moves = moves
        #: says once when the watched calls of the first step do not compute the loss, or None
        self.loss_check = LossCheck(level) if level in WATCHED else None
        #: the lines kept: the open step whole, the last ``history`` entries before it (``len``: those)
        self.ring = History(settings.history)
        self.stack_frames = self.ring.stack_frames  # stack id -> frames (definitions are never dropped)
        self.triggered = None          # the anomaly found (dict), once
        self.rooms: set = set()        # step directories made room for (an earlier run's moved aside)
        self.steps = 0                 # steps watched (the heartbeat's ``steps_watched``)
        self._last_watched = None      # the step counted last: its other trees' writers add nothing
        #: directory -> the open step's writer of that directory (one per tree: pynative/, graph/)
        self.open_writers: dict = {}
        self._heartbeat_dir = False    # dump_path exists (made once)
        self._heartbeats: dict = {}    # path -> HeartbeatFile (a process without a rank, then with one)
        #: (entry, output leaf ordinal) -> [sum of Norms, count] over earlier records (norm_jump)
        self.norms: dict = {}
        #: every output is checked (not only a batch's non-finite pieces): a bound or a Norm jump
        self.checks_values = settings.max_abs is not None or settings.norm_jump is not None
        #: every input is checked too: one beyond the bound makes its call a propagator
        self.checks_inputs = settings.max_abs is not None

    def output_kind(self, name: str, leaves: list, non_finite: bool) -> str | None:
        """What makes these output leaves of ``name`` an anomaly (``"nan"``, ``"inf"``,
        ``"max_abs"``, ``"norm_jump"``), or None."""
        settings = self.settings
        if non_finite:
            for leaf in leaves:
                kind = _non_finite_kind(leaf, settings.anomaly)
                if kind:
                    return kind
        found = None
        for ordinal, leaf in enumerate(leaves):
            norm = leaf.get("Norm")
            if settings.max_abs is not None and found is None and _beyond(leaf, settings.max_abs):
                found = "max_abs"
            if settings.norm_jump is not None and isinstance(norm, float) and norm == norm and norm != _INF:
                key = (name, ordinal)
                seen = self.norms.get(key)
                if seen is None:
                    self.norms[key] = [norm, 1]
                else:
                    if seen[0] > 0 and norm > settings.norm_jump * seen[0] / seen[1] and found is None:
                        found = "norm_jump"
                    seen[0] += norm
                    seen[1] += 1
        return found

    def input_kinds(self, leaves, non_finite: bool) -> frozenset:
        """The anomaly kinds these input leaves hold (``"nan"``, ``"inf"``, ``"max_abs"``; empty when
        none): a call whose input already holds one passes it on (:func:`blocks` says for which
        output kinds it is then a propagator, never a producer)."""
        settings = self.settings
        bound = settings.max_abs
        found = set()
        for leaf in leaves:
            if non_finite:
                kind = _non_finite_kind(leaf, settings.anomaly)
                if input_role(True, kind is None) == PASSED_ON:
                    found.add(kind)
            if bound is not None and _beyond(leaf, bound):
                found.add("max_abs")
        return frozenset(found)

    def scalar_input(self, value) -> bool:
        """Whether a Python number among the arguments in ``value`` (an input piece's value) is a
        watched NaN/Inf: not an input anomaly (:func:`msprobe.format.producer.input_role`), but the
        call that puts it into a tensor is named with :data:`msprobe.format.producer.SCALAR_NOTE`."""
        kinds = self.settings.anomaly
        for number in report.scalar_values(value):
            if isinstance(number, float) and input_role(False, math.isfinite(number)) == SCALAR \
                    and ("nan" if number != number else "inf") in kinds:
                return True
        return False

    # ------------------------------------------------------------------ history
    @property
    def records(self) -> int:
        """Entries seen so far (the heartbeat's ``records_seen``)."""
        return self.ring.entries_seen

    def keep(self, step: int, directory: str, lines: list, text) -> None:
        """Keep a flushed batch of step ``step`` in the history: ``lines`` its journal lines
        (resolved dicts, in journal order), ``text`` their encoding, one line each (checked when
        the history is written: :func:`msprobe.engine.watch_history.split_lines`)."""
        self.ring.keep(step, directory, lines, bytes(text))  # bytes: a bytearray may hold spare room

    def heartbeat(self, rank, step: int) -> None:
        """Tiny file saying the watch ran (rewritten when each writer of a watched step closes: a
        step with ``pynative/`` and ``graph/`` trees closes two, and is counted once)."""
        if step != self._last_watched:
            self._last_watched = step
            self.steps += 1
        body = {"schema": SCHEMA, **journal.identity(), "mode": "watch", "rank": rank, "last_step": step,
                "steps_watched": self.steps, "records_seen": self.records, "time": time.time(),
                "anomaly": self.triggered}
        try:
            self.heartbeat_file(rank).write(journal.encode_json(body, False))
        except OSError as exc:
            logger.warning("msprobe: watch heartbeat not written: %r", exc)

    def heartbeat_file(self, rank) -> "HeartbeatFile":
        """The heartbeat file of ``rank`` (``None``: this process, ``proc{pid}``). At its first use
        in the run (the first watched step's opening, before the file is written) what an earlier
        run left is moved aside as its step directories are (:func:`msprobe.engine.layout.clear_file_for`):
        a heartbeat of the same name, and those of processes without a rank that no longer run, so
        the only heartbeat of a live process in ``dump_path`` is this run's.

        Raises:
            OSError: ``dump_path`` cannot be made, or a rename failed.
        """
        path = os.path.join(self.dump_path, HEARTBEAT.format(who=layout.rank_dir_name(rank)))
        beat = self._heartbeats.get(path)
        if beat is None:
            if not self._heartbeat_dir:
                os.makedirs(self.dump_path, exist_ok=True)
                self._heartbeat_dir = True
            layout.clear_file_for(path, _PROC_HEARTBEAT, "the watch heartbeat", self.moves)
            beat = self._heartbeats[path] = HeartbeatFile(path)
        return beat


class HeartbeatFile:
    """The heartbeat file, rewritten in place: the document is written over the old one with one
    ``pwrite`` from offset 0, padded with spaces (JSON whitespace) to the file's length, so the file
    never shrinks and holds one whole document, also when the process is killed (a system call is
    not interrupted half-way). Writing a temporary file and renaming it over the old one costs more on
    ext4, which starts writing the new file's data back at such a rename: 0.45 vs 0.10 ms CPU per
    step, 3-20 vs 0.1 ms wall (median) on this loaded 2-core machine, TinyLM watch-L0. A reader racing
    the write could see part of each version and should read again. The file is opened for each write
    and closed after it (no descriptor outlives the write, also at interpreter exit); a file removed
    meanwhile is created again.

    Args:
        path: the heartbeat's path (its directory exists).

    Raises:
        OSError: from ``open``/``fstat``/``pwrite`` (the caller warns).
    """

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    def write(self, data: bytes) -> None:
        """Make ``data`` (one JSON document) the file's content, padded to the file's length."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if len(data) < size:
                data += b" " * (size - len(data))
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)


class WatchWriter:
    """The step's writer in watch mode (same methods as :class:`StepWriter` that the runtime calls).

    Args:
        watch: the run's :class:`Watch`.
        step: step number; directory: the step/rank directory it would write.
        make_writer: ``callable(directory) -> StepWriter`` (the normal writer for that directory).
        rank: this process's rank (``None`` when unknown).
        extras: the step's :class:`~msprobe.engine.step_files.StepExtras` (the runtime's; written with
            the step's files at the trigger, ``anomaly_extra`` set then).
        on_raise: ``callable(exception)`` given the :class:`WatchAnomaly` when ``on_anomaly`` is
            ``"raise"``. level: the dump level (named in messages).
        make_room: ``callable(directory)`` called before anything is written into ``directory``
            (moves an earlier run's directory of that name aside; raises ``OSError``), or None.
    """

    def __init__(self, watch: Watch, step: int, directory: str, rank, make_writer, extras: StepExtras,
                 on_raise=None, level: str = "L1", make_room=None, recording=None):
        self.on_raise = on_raise
        #: callable without arguments: whether the step is still recording (before its stop())
        self._recording = recording if recording is not None else (lambda: True)
        self._make_room = make_room
        self._level = level
        self.watch = watch
        self.step = step
        self.directory = directory
        self.rank = rank
        self.make_writer = make_writer
        self.tensor_dir = None
        self.closed = False
        self.error_count = 0
        self.extras = extras
        self.real: StepWriter | None = None   # after the trigger: the step's real writer
        self.last_flush = time.monotonic()
        self._entries: dict = {}              # entry -> [input bad, output bad] in this step
        self._errors: list = []
        #: (entry, kind): the first entry whose *input* held an anomaly, in this step
        self._first_bad_input = None
        watch.open_writers[directory] = self
        try:  # an earlier run's heartbeat is moved aside as the step opens, not when it ends
            watch.heartbeat_file(rank)
        except OSError:
            pass  # heartbeat() tries again when the step ends, and says why it failed

    # ------------------------------------------------------------------ StepWriter interface
    def append(self, records: list) -> None:
        if self.closed or not records:
            return
        self.last_flush = time.monotonic()
        if self.real is not None:
            self.real.append(records)
            return
        watch = self.watch
        if watch.triggered is not None:
            if watch.triggered.get("step") == self.step:  # another tree of the anomaly's step
                self._open_real()
                self.real.append(records)
                return
            watch.ring.count(self.step, self.directory, records)  # once per run: never written
            return
        text, resolved, non_finite = encode_batch(records)
        if watch.loss_check is not None and not watch.loss_check.done:
            watch.loss_check.see([piece for rec in resolved for piece, _ in _pieces(rec)], self.step)
        found = None
        if non_finite or watch.checks_values:
            outputs, inputs = watch.checks_values, watch.checks_inputs
            for rec in resolved:
                for piece, bad in _pieces(rec):
                    key = piece.key
                    if key is not None and (bad or (outputs if key == "output" else inputs)):
                        producer = self._check(piece, bad)
                        if found is None:
                            found = producer
        if found is None and self._first_bad_input is not None and watch.triggered is None:
            # a non-finite value reached an input without any recorded call producing it: made by
            # code this level does not record (e.g. an API between Cells at L0)
            watch.keep(self.step, self.directory, resolved, text)
            self._trigger_unrecorded(*self._first_bad_input)
            return
        if found is not None and watch.settings.save_tensors:
            self._save_tensors(found, records)  # adds data_name to leaves: encoded again
            text = encode_batch(resolved)[0]
        watch.keep(self.step, self.directory, resolved, text)
        if found is not None:
            self._trigger(found)
        else:
            watch.ring.bound_step()

    def _save_tensors(self, producer: str, records: list) -> None:
        """``save_tensors``: write the producer's tensors of this batch (its output, and its inputs
        when they were recorded in the same flush) as ``.npy`` files of the anomaly's step."""
        directory = os.path.join(self.directory, TENSOR_DIR)
        if self._make_room is not None:  # before the first file: an earlier run's directory is moved aside
            try:
                self._make_room(self.directory)
            except OSError as exc:
                self.error(f"watch: could not make room for {self.directory}: {exc!r}")
                return
        for r in records:
            piece = journal.piece_of(r)
            if piece is None or piece.entry != producer:
                continue
            for slot in _slots(piece.value):
                if slot.tensor is None or not slot.data_name or slot.leaf is None:
                    continue
                try:
                    os.makedirs(directory, exist_ok=True)
                    if slot.type_name == "numpy.ndarray":
                        arr, stored = slot.tensor, "native"
                    else:
                        arr, stored = stats.to_host(slot.tensor, False)
                    stats.save_npy(os.path.join(directory, slot.data_name), arr)
                    slot.leaf["data_name"] = slot.data_name
                    if stored != "native":
                        slot.leaf["stored_as"] = stored
                except Exception as exc:  # the dump goes on without that file
                    self.error(f"watch: could not save {slot.data_name}: {exc!r}")

    def error(self, message: str) -> None:
        self.error_count += 1
        logger.warning("msprobe: %s", message)
        if self.real is not None:
            self.real.error(message)
        else:
            self._errors.append(message)

    @property
    def target(self) -> StepWriter | None:
        """The writer of this step's files: none until the trigger (memory only), then the real one."""
        return self.real

    def mark_abnormal(self, reason: str) -> None:
        """The step ended abnormally (an exception): the flight recorder writes the history (this
        step's own files are written by the runtime, which knows why it may be empty)."""
        if self.real is None:
            written = self.dump_history({"step": self.step, "rank": self.rank, "producer": None,
                                         "kind": None, "cell": None, "trigger": f"abnormal end: {reason}"},
                                        write_current=False)
            if written:
                logger.warning("msprobe: watch: step %s ended abnormally (%s); %s", self.step, reason,
                               written)

    def relocate(self, directory: str) -> None:
        if self.real is not None:
            self.real.relocate(directory)
        if self.watch.open_writers.get(self.directory) is self:
            self._unregister()
            self.watch.open_writers[directory] = self
        self.directory = directory

    def _open_real(self, writer: StepWriter | None = None) -> None:
        """From now on this step's records go to ``writer`` (default: a new one for the directory)."""
        if self.real is None:
            self.real = writer if writer is not None else self.make_writer(self.directory)
            self.tensor_dir = self.real.tensor_dir
            for message in self._errors:
                self.real.error(message)
            self._errors = []

    def _unregister(self) -> None:
        """This writer is done: the watch forgets it (it holds only the open steps' writers)."""
        if self.watch.open_writers.get(self.directory) is self:
            del self.watch.open_writers[self.directory]

    def abandon(self, message: str) -> None:
        self.closed = True
        self._unregister()
        if self.real is not None:
            self.real.abandon(message)

    def discard_if_empty(self) -> bool:
        if self.real is not None:
            discarded = self.real.discard_if_empty()
            if discarded:
                self._unregister()
            return discarded
        self.closed = True
        self._unregister()
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._unregister()
        if self.real is not None:
            self.real.close()
        else:
            self.watch.ring.end_step()
        if self.watch.loss_check is not None:
            self.watch.loss_check.end_step(self.step)
        self.watch.heartbeat(self.rank, self.step)

    # ------------------------------------------------------------------ detection
    def _check(self, piece: journal.Piece, non_finite: bool):
        """Update the entry's input/output state (``non_finite``: the piece holds a non-finite
        value); the entry name when it just became a producer: its output holds an anomaly, and
        neither its own inputs nor those of the entries that feed it too
        (:func:`msprobe.format.naming.upstream_names`: a backward entry's forward call) do."""
        name, key = piece.entry, piece.key
        state = self._entries.get(name)
        if state is None:  # [input kinds, output bad, output's kind, a scalar argument non-finite]
            state = self._entries[name] = [frozenset(), False, None, False]
        watch = self.watch
        if key == "output":
            base = name if piece.index is None else f"{name}[{piece.index}]"
            bad = watch.output_kind(base, list(report.leaves(piece.value)), non_finite)
            if bad and not state[1] and not blocks(bad, state[0]) and not self._fed(name, bad):
                state[1], state[2] = True, bad
                return name
            state[1] = state[1] or bool(bad)
            return None
        bad = watch.input_kinds(report.leaves(piece.value), non_finite)
        if non_finite and not blocks("nan", bad) and watch.scalar_input(piece.value):
            state[3] = True
        if bad:
            # a NaN/Inf reached an input first: made by code the level does not record. A value
            # beyond max_abs first seen in an input (the step's data, e.g. token ids) is no anomaly:
            # the bound applies where a recorded call makes the value
            made = [kind for kind in _NON_FINITE if kind in bad]
            if made and self._first_bad_input is None and not blocks(made[0], state[0]):
                self._first_bad_input = (name, made[0])
            state[0] = state[0] | bad
        return None

    def _fed(self, name: str, kind: str) -> bool:
        """Whether an entry that also feeds ``name`` (its forward call) had inputs that make
        ``name``'s output anomaly of ``kind`` passed on (:func:`blocks`)."""
        for other in naming.upstream_names(name):
            state = self._entries.get(other)
            if state is not None and blocks(kind, state[0]):
                return True
        return False

    def _trigger(self, producer: str) -> None:
        kind, scalar = self._entries[producer][2:]
        cell = None
        for line in self.watch.ring.lines_of(producer):
            found, parent = journal.parent_of(line, producer)
            if found:
                cell = parent
        what = _WHAT[kind]
        received = is_collective(producer)
        clean = "finite" if kind in ("nan", "inf") else "without it"
        inputs = f"tensor inputs {clean}; {SCALAR_NOTE}" if scalar else f"inputs {clean}"
        trigger = f"watch: {what} in the output of {producer}, {inputs}"
        if received:
            trigger += " (a collective: the value came from another rank, whose dump names its producer)"
        written = self.dump_history({"step": self.step, "rank": self.rank, "producer": producer,
                                     "kind": kind, "cell": cell, "via_collective": received,
                                     "trigger": trigger})
        logger.warning("msprobe: watch found %s first produced by %s%s at step %s%s; %s",
                       what, producer, f" (in {cell})" if cell else "", self.step,
                       f"; {SCALAR_NOTE}" if scalar else "", written)
        where = f", rank {self.rank}" if self.rank is not None else ""  # no rank before init(): none named
        self._raise(f"msprobe watch: {what} first produced by {producer} (step {self.step}{where}"
                    f"{', in ' + cell if cell else ''}); its "
                    f"{'tensor ' if scalar else ''}inputs were {clean}"
                    f"{'; ' + SCALAR_NOTE if scalar else ''}. Dump: {self.directory}")

    def _trigger_unrecorded(self, entry: str, kind: str) -> None:
        what = _WHAT[kind]
        written = self.dump_history({
            "step": self.step, "rank": self.rank, "producer": None, "kind": kind, "cell": None,
            "first_non_finite": entry,
            "trigger": f"watch: {what} in the inputs of {entry}, produced by code that "
                       f"is not recorded at level {self._level} (between recorded calls)"})
        logger.warning("msprobe: watch found %s in the inputs of %s at step %s (made by unrecorded "
                       "code); %s", what, entry, self.step, written)
        self._raise(f"msprobe watch: {what} reached the inputs of {entry} (step {self.step}); it was made "
                    f"by code not recorded at level {self._level}. Dump: {self.directory}")

    def _raise(self, message: str) -> None:
        if self.watch.settings.on_anomaly == "raise" and self.on_raise is not None:
            if self._level == "L0":  # no hooked API call before the optimizer's update to raise in
                message += (". At L0 it may be raised as late as stop() or step(): the optimizer "
                            "step of this iteration may already have applied the non-finite update")
            self.on_raise(WatchAnomaly(message))

    def _now_what(self, count: int, write_current: bool) -> str:
        """What the written history holds of this step (``count`` entries so far)."""
        if not write_current:
            return f"step {self.step}, which ended abnormally: {count} entries"
        if not self._recording():  # found at stop(): what the step recorded until then
            return (f"step {self.step}, the anomaly's step: {count} entries, recorded until stop() "
                    "(its files are complete at step())")
        return (f"step {self.step}, the anomaly's step: {count} entries so far, the rest added as "
                "it runs (its files are complete at step())")

    def dump_history(self, found: dict, write_current: bool = True) -> str:
        """Write the history (earlier steps' tail, this step so far) as normal step directories;
        this step's directory stays open and receives the rest of the step. ``found`` describes
        what triggered it (added to this step's ``anomalies.json``). ``write_current``: also write
        this step's files now (else the runtime writes them). Once per run.

        Returns what was written, for the user's message: each directory (relative to
        ``dump_path``) with what it holds (an earlier step whole or its tail, this step so far);
        ``""`` when nothing was written (already triggered, or the step is closed). The earlier
        steps' directories are complete now and say nothing more (no ``dump.json is at`` line:
        that line is for a step that ends)."""
        watch = self.watch
        if watch.triggered is not None or self.closed:
            return ""
        history = watch.ring.by_step()  # decoded first: a batch that cannot be read triggers nothing
        watch.triggered = dict(found)
        self.extras.anomaly_extra = dict(found) if found.get("kind") else None
        self.extras.changed = True
        kept = (f"watch mode keeps only the last {watch.settings.history} entries of the steps before "
                "an anomaly's step; none of this step's data is among them")
        dropped = watch.ring.step_dropped
        totals = dict(watch.ring.step_totals)
        written = []
        for step, directory, lines in history:
            writer = self.make_writer(directory)
            writer.append([journal.stack_frames(sid, watch.stack_frames[sid])
                           for sid in journal.stack_ids(lines) if sid in watch.stack_frames] + lines)
            count = watch_history.data_entries(lines)  # the entries its dump.json holds
            if step == self.step and directory == self.directory:
                self.real = writer
                written.append((directory, self._now_what(count, write_current)))
                continue
            sibling = watch.open_writers.get(directory) if step == self.step else None
            if sibling is not None and sibling.step == step and not sibling.closed:
                sibling._open_real(writer)  # this step's other tree (pynative/ or graph/) goes on too
                written.append((directory, f"step {step}, another tree of it: {count} entries so far, "
                                           "the rest added as it runs"))
                continue
            total = totals.get((step, directory))
            extras = StepExtras()
            if step == self.step:  # no writer of that tree is open any more: only what came so far
                what = f"step {step}, another tree of it: {count} entries"
            elif total is None or total == count:
                what = f"step {step}: all its {count} entries"
            else:
                what = f"step {step}: its last {count} of {total} entries"
                extras.partial = (f"watch mode's history kept the last {count} of this step's {total} "
                                  f"entries (watch.history {watch.settings.history})")
            write_step(writer, extras, kept)
            writer.close(announce=False)
            written.append((directory, what))
        if self.real is None:  # nothing of this step in the history yet
            self.real = self.make_writer(self.directory)
            written.append((self.directory, self._now_what(0, write_current)))
        self.tensor_dir = self.real.tensor_dir
        for message in self._errors:
            self.real.error(message)
        if dropped:
            self.extras.partial = (f"watch mode kept the latest {watch_history.STEP_BYTES / 2 ** 20:g} MiB "
                                   f"of encoded records of this step before the anomaly: its first "
                                   f"{dropped} entries are not in this dump")
            self.extras.changed = True
            self.real.error(f"watch mode keeps the latest {watch_history.STEP_BYTES / 2 ** 20:g} MiB of "
                            f"encoded records of the open step: its first {dropped} entries before the "
                            "anomaly are not in this dump")
        if write_current:  # the trigger's data is recorded: the step is not empty
            write_step(self.real, self.extras)
        watch.ring.clear()
        where = os.path.abspath(watch.dump_path)
        return (f"written now under {where}: "
                + "; ".join(f"{os.path.relpath(d, where)} ({what})" for d, what in written))


def _has_non_finite(value) -> bool:
    """Whether a resolved journal value holds a NaN/Inf float anywhere (a statistic or an argument)."""
    kind = type(value)
    if kind is float:
        return not math.isfinite(value)
    if kind is dict:
        return any(_has_non_finite(v) for v in value.values())
    if kind is list or kind is tuple:
        return any(_has_non_finite(v) for v in value)
    return False


def _pieces(line: dict) -> list:
    """``[(piece, non-finite)]``: the data a resolved line carries, each piece with whether it holds a
    non-finite value. A stack-use line with a body (a whole recorded call: inputs and output) gives
    one piece per key, each checked on its own (its output as well as its inputs)."""
    body = line.get("v") if "stack" in line else None
    if type(body) is dict:
        return [(journal.Piece(line["e"], key, value), _has_non_finite(value)) for key, value in body.items()]
    piece = journal.piece_of(line)
    return [] if piece is None else [(piece, _has_non_finite(piece.value))]
