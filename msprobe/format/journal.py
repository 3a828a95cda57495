"""The journal: the append-only JSON-lines file a step is written to while it runs, and the one
place that knows what a line holds: one constructor per line kind (below), and one interpreter,
:meth:`Replay.apply`, shared by the writer (live, as records are appended), the reader (on a journal
file, complete or cut short, also streamed as :class:`Piece` items) and watch mode (through the
accessors :func:`subject`, :func:`stack_definition`, :func:`stack_ids`, :func:`parent_of`,
:func:`piece_of`).

Line kinds:

==================  ==================================================  ======================================
constructor         line                                                effect
==================  ==================================================  ======================================
:func:`header`      ``{"h": {task, level, framework, dump_data_dir,     first line (repeated after a rename)
                    schema, run_id, msprobe_version}}``
:func:`key_line`    ``{"e": entry, "k": key, "v": value}``              ``data[entry][key] = value``
:func:`item_line`   ``{"e": entry, "k": key, "i": index, "n": size,     item ``index`` of a list of ``size``
                    "v": leaf}``                                        (backward gradients, one by one)
:func:`value_line`  ``{"e": entry, "v": value}``                        ``data[entry] = value`` (debug level)
:func:`path_line`   ``{"e": entry, "p": [key or index, ...], "v": leaf}``  a nested item (debug gradients)
:func:`stack_ref`   ``{"e": entry, "stack": id}``                       ``entry`` ran from stack ``id``
                    ``{"e": entry, "stack": id, "v": {key: value}}``    the same, then ``data[entry][key] = value``
                                                                        for each key in order (a whole call)
:func:`stack_frames`  ``{"s": id, "f": [frames]}``                      the frames of stack ``id``
:func:`construct_edge`  ``{"c": name, "p": parent}``                    ``construct.json[name] = parent``
==================  ==================================================  ======================================
"""
from __future__ import annotations

import json
import os
import uuid
from typing import NamedTuple, Optional

import orjson

from msprobe._version import __version__ as VERSION
from msprobe.format.npy import write_unnamed

#: the format version written (docs/FORMAT.md, "Version")
SCHEMA = "msprobe-mindspore/2"
#: earlier versions still read: 1 differs only in ``anomalies.json``'s ``stack`` (two-line frames)
OLDER_SCHEMAS = ("msprobe-mindspore/1",)

JOURNAL = "dump.journal"
TENSOR_DIR = "dump_tensor_data"

#: this process's run id (32 lowercase hex digits), written into every file with a top-level object;
#: a forked child gets its own (see :func:`run_id`)
_RUN_ID = [uuid.uuid4().hex]


def _new_run_id() -> None:
    _RUN_ID[0] = uuid.uuid4().hex


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_run_id)


def run_id() -> str:
    """The id of this run: chosen once per process (a forked child chooses its own), the same in
    every file the process writes, so files of different runs under one ``dump_path`` (an earlier
    run's directory moved aside, a heartbeat) can be told apart."""
    return _RUN_ID[0]


def identity() -> dict:
    """``{"run_id", "msprobe_version"}`` of this process: the fields that name the writing run."""
    return {"run_id": _RUN_ID[0], "msprobe_version": VERSION}


# ---------------------------------------------------------------------------------------- constructors
def header(task: str, level: str, framework: str, dump_data_dir: Optional[str],
           run: Optional[str] = None, mode: Optional[str] = None) -> dict:
    """The header line (first line of a journal; repeated after the step directory was renamed).

    Args:
        task, level, framework: the dump's config (``framework`` is ``"mindspore"``).
        dump_data_dir: absolute path of ``dump_tensor_data/``, or ``None`` when no tensor is saved.
        run: the run id; default :func:`run_id`.
        mode: ``"GRAPH_MODE"`` when the step ran in MindSpore's GRAPH_MODE (added to the line), or
            ``None`` (PyNative: no field).
    """
    fields = {"task": task, "level": level, "framework": framework, "dump_data_dir": dump_data_dir,
              "schema": SCHEMA, "run_id": run or _RUN_ID[0], "msprobe_version": VERSION}
    if mode is not None:
        fields["mode"] = mode
    return {"h": fields}


def key_line(entry: str, key: str, value) -> dict:
    """``data[entry][key] = value`` (``value``: a recorded value, e.g. a list of leaves)."""
    return {"e": entry, "k": key, "v": value}


def item_line(entry: str, key: str, index: int, size: int, value) -> dict:
    """Item ``index`` (0-based) of the ``size``-item list ``data[entry][key]`` (``key``: ``input`` or
    ``output`` of a backward entry; the other items stay null until their own line arrives)."""
    return {"e": entry, "k": key, "i": index, "n": size, "v": value}


def value_line(entry: str, value) -> dict:
    """``data[entry] = value``, the whole entry (debug level)."""
    return {"e": entry, "v": value}


def path_line(entry: str, path, value) -> dict:
    """The item of ``data[entry]`` at ``path`` (keys and indices, outermost first) becomes
    ``value``; an empty path replaces the entry (debug-level gradients)."""
    return {"e": entry, "p": list(path), "v": value}


def stack_ref(entry: str, stack_id: int, body: Optional[dict] = None) -> dict:
    """``entry`` ran from the call stack ``stack_id`` (defined by a :func:`stack_frames` line).

    ``body``: ``{key: value}`` set into ``data[entry]`` in order right after, as if by one
    :func:`key_line` each: a recorded call's stack, ``input_args``, ``input_kwargs`` and ``output``
    in one line (the same records as the four lines, a quarter of the lines to encode and replay)."""
    if body is None:
        return {"e": entry, "stack": stack_id}
    return {"e": entry, "stack": stack_id, "v": body}


def stack_frames(stack_id: int, frames: list) -> dict:
    """The frames (strings, innermost first) of call stack ``stack_id``; journaled once, before the
    stack's first :func:`stack_ref`."""
    return {"s": stack_id, "f": frames}


def construct_edge(name: str, parent: Optional[str]) -> dict:
    """``construct.json[name] = parent`` (the enclosing Cell entry, or ``None`` at the top)."""
    return {"c": name, "p": parent}


# ---------------------------------------------------------------------------------------- interpreter
#: the kinds of journal lines (the ``$defs`` of ``schemas/journal.json``), in constructor order
KINDS = ("header", "set_key", "set_item", "set_entry", "set_path", "stack_ref", "stack_frames",
         "construct_edge")


def line_kind(line: dict) -> Optional[str]:
    """The kind of a journal line (one of :data:`KINDS`), told by its keys alone, or ``None``; also
    for a malformed line (the validator then names what its kind misses)."""
    if "e" in line:
        if "stack" in line:
            return "stack_ref"
        if "p" in line:
            return "set_path"
        if "i" in line or "n" in line:
            return "set_item"
        if "k" in line:
            return "set_key"
        return "set_entry"
    if "c" in line:
        return "construct_edge"
    if "s" in line:
        return "stack_frames"
    if "h" in line:
        return "header"
    return None


class Replay:
    """Applies journal lines in order; :meth:`apply` is the one definition of what a line means.

    :meth:`apply` tells a line's kind (:func:`line_kind`) and calls the handler of that kind (``on_header``, ``on_key``,
    ``on_item``, ``on_value``, ``on_path``, ``on_stack_ref``, ``on_stack_frames``,
    ``on_construct_edge``), returning what the handler returns. This class's handlers rebuild
    ``(header, data, stacks, construct)`` (:meth:`result`); the writer keeps one live, as records are
    appended, so ``dump.json`` is written without reading the journal back. :func:`decode` uses the
    same dispatch to name a single line's kind and fields.
    """

    def __init__(self):
        self.header, self.data, self.construct = {}, {}, {}
        self._frames, self._stack_names = {}, {}
        self._valued: set = set()  # entries set whole by a value line (debug level)

    def apply(self, rec: dict):
        kind = line_kind(rec)
        if kind == "set_key":
            return self.on_key(rec["e"], rec["k"], rec["v"])
        if kind == "set_item":
            return self.on_item(rec["e"], rec["k"], rec["i"], rec["n"], rec["v"])
        if kind == "stack_ref":
            body = rec.get("v")
            if body is None:
                return self.on_stack_ref(rec["e"], rec["stack"])
            return self.on_stack_ref(rec["e"], rec["stack"], body)
        if kind == "construct_edge":
            return self.on_construct_edge(rec["c"], rec["p"])
        if kind == "stack_frames":
            return self.on_stack_frames(rec["s"], rec["f"])
        if kind == "set_entry":
            return self.on_value(rec["e"], rec["v"])
        if kind == "set_path":
            return self.on_path(rec["e"], rec["p"], rec["v"])
        if kind == "header":
            return self.on_header(rec["h"])
        return None

    def apply_all(self, lines) -> None:
        """:meth:`apply` each of ``lines`` (dicts), in order."""
        for rec in lines:
            self.apply(rec)

    # handlers: rebuild the step's files
    def on_header(self, fields: dict):
        self.header = fields

    def on_key(self, entry: str, key: str, value):
        self.data.setdefault(entry, {})[key] = value

    def on_item(self, entry: str, key: str, index: int, size: int, value):
        body = self.data.setdefault(entry, {})
        seq = body.get(key)
        if not isinstance(seq, list) or len(seq) < size:
            seq = (seq or []) + [None] * (size - len(seq or []))
            body[key] = seq
        seq[index] = value

    def on_value(self, entry: str, value):
        self.data[entry] = value
        self._valued.add(entry)

    def on_path(self, entry: str, path: list, value):
        if path:
            _set_path(self.data.get(entry), path, value)
        else:  # the saved variable is a single tensor: its gradient is the whole entry
            self.data[entry] = value

    def on_stack_ref(self, entry: str, stack_id: int, body: Optional[dict] = None):
        got = self.data.setdefault(entry, {})  # an entry's place in data is its first line's
        self._stack_names.setdefault(stack_id, []).append(entry)
        if body is not None:
            got.update(body)

    def on_stack_frames(self, stack_id: int, frames: list):
        self._frames[stack_id] = frames

    def on_construct_edge(self, name: str, parent):
        self.construct[name] = parent

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


class Piece(NamedTuple):
    """One piece of an entry's data, as :func:`pieces` and ``msprobe.dump.iter_entries`` yield it.

    ``key`` is ``None`` when ``value`` is the whole entry (debug level) or a nested item; ``index``
    is set for one item of a list (a gradient arriving on its own, journal only); ``path`` for a
    nested item (debug-level gradients, journal only).
    """

    entry: str
    key: Optional[str]
    value: object
    index: Optional[int] = None
    path: Optional[tuple] = None


class _Decoder(Replay):
    """:meth:`Replay.apply`'s dispatch returning ``(kind, fields)`` for one line, keeping nothing."""

    def __init__(self):  # stateless: one instance serves every thread
        pass

    def on_header(self, fields):
        return "header", (fields,)

    def on_key(self, entry, key, value):
        return "set_key", (entry, key, value)

    def on_item(self, entry, key, index, size, value):
        return "set_item", (entry, key, index, size, value)

    def on_value(self, entry, value):
        return "set_entry", (entry, value)

    def on_path(self, entry, path, value):
        return "set_path", (entry, path, value)

    def on_stack_ref(self, entry, stack_id, body=None):
        if body is None:
            return "stack_ref", (entry, stack_id)
        return "stack_ref", (entry, stack_id, body)

    def on_stack_frames(self, stack_id, frames):
        return "stack_frames", (stack_id, frames)

    def on_construct_edge(self, name, parent):
        return "construct_edge", (name, parent)


_DECODER = _Decoder()


def decode(line: dict):
    """``(kind, fields)`` of one journal line: kind one of :data:`KINDS` (:func:`line_kind`), fields
    what the line's constructor was given, in order (the header: its one dict); ``None`` for a line
    of no known kind."""
    return _DECODER.apply(line)


def piece_of(line: dict) -> Optional[Piece]:
    """The data a line carries as a :class:`Piece`, or ``None`` (header, stack, construct lines).
    A stack use with a body carries one piece per key: this is its first (:func:`pieces` yields
    all)."""
    found = _DECODER.apply(line)
    if found is not None and found[0] == "stack_ref" and len(found[1]) == 3:
        return next(iter(_body_pieces(found[1])), None)
    return _piece(found)


def _body_pieces(fields) -> list:
    entry, _, body = fields
    return [Piece(entry, key, value) for key, value in body.items()]


def _piece(found) -> Optional[Piece]:
    if found is None:
        return None
    kind, fields = found
    if kind == "set_key":
        return Piece(fields[0], fields[1], fields[2])
    if kind == "set_item":
        return Piece(fields[0], fields[1], fields[4], index=fields[2])
    if kind == "set_entry":
        return Piece(fields[0], None, fields[1])
    if kind == "set_path":
        return Piece(fields[0], None, fields[2], path=tuple(fields[1]))
    return None


def pieces(lines, on_header=None):
    """Yield the data of journal ``lines`` as :class:`Piece` items, in journal order (one entry may
    come in several pieces); ``on_header(fields)`` is called for each header line."""
    for line in lines:
        found = _DECODER.apply(line)
        if found is not None and found[0] == "header":
            if on_header is not None:
                on_header(found[1][0])
            continue
        if found is not None and found[0] == "stack_ref" and len(found[1]) == 3:
            yield from _body_pieces(found[1])
            continue
        piece = _piece(found)
        if piece is not None:
            yield piece


def subject(line: dict) -> Optional[str]:
    """The entry a line is about (data, stack use or construct edge), or ``None`` (header, frames).
    Told by :func:`line_kind` alone (called for every line watch mode keeps)."""
    kind = line_kind(line)
    if kind is None or kind == "header" or kind == "stack_frames":
        return None
    return line["c"] if kind == "construct_edge" else line["e"]


def entry_of(line: dict) -> tuple:
    """``(subject(line), sets data)``: the entry a line is about (``None`` for header and stack-frames
    lines) and whether it sets data of that entry, so that the entry is in ``dump.json`` (a key,
    item, entry or path line, or a stack use with a body). One pass over the line's keys, with the
    rules of :func:`line_kind` (watch mode calls it for every line it keeps)."""
    if "e" in line:
        return line["e"], "stack" not in line or bool(line.get("v"))
    if "c" in line:
        return line["c"], False
    return None, False


def stack_definition(line: dict):
    """``(stack id, frames)`` of a stack-frames line, else ``None``."""
    return (line["s"], line["f"]) if line_kind(line) == "stack_frames" else None


def stack_ids(lines) -> set:
    """The stack ids the stack-use lines among ``lines`` refer to."""
    ids = set()
    for line in lines:
        found = _DECODER.apply(line)
        if found is not None and found[0] == "stack_ref":
            ids.add(found[1][1])
    return ids


def parent_of(line: dict, name: str):
    """``(True, parent)`` when ``line`` is the construct edge of ``name``, else ``(False, None)``."""
    found = _DECODER.apply(line)
    if found is not None and found[0] == "construct_edge" and found[1][0] == name:
        return True, found[1][1]
    return False, None


# ---------------------------------------------------------------------------------------- files
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


def decode_line(text: bytes) -> dict:
    """The journal line (dict) that :func:`encode_json` encoded as ``text`` (one line, its newline
    optional); the ``NaN``/``Infinity`` tokens of a line holding non-finite floats are read too."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # orjson reads no NaN/Infinity tokens
        return json.loads(text)


def atomic_write_documents(documents: list) -> None:
    """Write each ``(path, obj, non_finite)`` of ``documents`` as compact JSON (:func:`encode_json`;
    ``non_finite=False`` promises no NaN/Inf floats inside, then the faster encoder is used), in
    order, each replacing ``path`` atomically: through the compiled file helper when it is built
    (:func:`msprobe.format.npy.write_unnamed`: no named temporary file for a path that does not exist
    yet, one directory descriptor for the batch), else through ``{path}.tmp{pid}`` renamed over it.

    Raises:
        OSError: the first document that could not be written (``filename`` is its path); the
            ones before it are written, none after it.
    """
    encoded = [(path, encode_json(obj, non_finite)) for path, obj, non_finite in documents]
    if not write_unnamed(encoded):
        for path, data in encoded:
            _atomic_write_bytes(path, data)


def _atomic_write_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:  # disk full: leave no half-written temporary file behind
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def _set_path(container, path, value) -> None:
    for key in path[:-1]:
        if container is None:
            return
        container = container[key]
    if container is not None:
        container[path[-1]] = value


def read_journal(path: str):
    """Yield journal lines (dicts) of the file ``path``; a torn last line (killed mid-write) is
    skipped, and so is everything after a line that is not JSON."""
    # errors="replace": a write cut short by a full disk may end inside a multi-byte character
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                break
