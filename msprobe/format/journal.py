"""The journal: the append-only JSON-lines file a step is written to while it runs, and the one
definition of what each line means (:class:`Replay`), shared by the writer (live, as records are
appended) and the reader (on a journal file, complete or cut short).

Journal line kinds (each built by one constructor below):

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
import os

import orjson

SCHEMA = "msprobe-mindspore/1"

JOURNAL = "dump.journal"
TENSOR_DIR = "dump_tensor_data"


def atomic_write_json(path: str, obj, non_finite: bool = True) -> None:
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
