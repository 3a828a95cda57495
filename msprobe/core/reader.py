"""Reader: loads what the writer wrote (``step{N}/rank{R}`` or ``proc{pid}`` directories).

A finished step has ``dump.json`` and no journal. A step whose process died (or has not called
``step()`` yet) still has ``dump.journal``; :func:`load` then replays the journal (every record flushed
before the kill) and returns ``complete=False``.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

from msprobe.core.writer import JOURNAL, SCHEMA, TENSOR_DIR, read_journal, replay

SUPPORTED_SCHEMAS = (SCHEMA,)
_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(rank\d*|proc\d+)$")


class DumpFormatError(ValueError):
    """The directory does not hold a dump this reader understands (the message says why)."""


@dataclass
class StepDump:
    """One step of one rank.

    Attributes:
        directory: the ``step{N}/rank{R}`` directory.
        header: ``task``, ``level``, ``framework``, ``dump_data_dir``, ``schema``.
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
        from msprobe.core.stats import load_npy

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
    schema = header.get("schema", SCHEMA)
    if schema not in SUPPORTED_SCHEMAS:
        raise DumpFormatError(f"{directory}: dump schema {schema!r} is not supported by this reader "
                              f"(supported: {', '.join(SUPPORTED_SCHEMAS)}); upgrade msprobe")
    return StepDump(directory, header, data, _ungroup(stacks), construct, complete)


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


def _leaves(value):
    if isinstance(value, dict):
        if "type" in value and "dtype" in value:
            yield value
        else:
            for v in value.values():
                yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)


def _non_finite(leaf: dict) -> bool:
    for key in ("Max", "Min", "Mean", "Norm"):
        v = leaf.get(key)
        if isinstance(v, float) and not math.isfinite(v):
            return True
    return False


def summarize(dump_path: str) -> str:
    """A one-screen text summary: steps, entries, forward/backward counts, first non-finite entry."""
    lines = [f"dump at {os.path.abspath(dump_path)}"]
    first_bad = None
    for step, rank, path in iter_step_dirs(dump_path):
        dump = load(path)
        fwd = sum(1 for k in dump.data if ".forward" in k)
        bwd = sum(1 for k in dump.data if ".backward" in k)
        grads = sum(1 for k in dump.data if ".parameters_grad." in k)
        prefixes = sorted({k.split(".", 1)[0] for k in dump.data})
        state = "" if dump.complete else "  (INCOMPLETE)"
        lines.append(f"  step{step}/{rank}: {len(dump.data)} entries ({fwd} forward, {bwd} backward, "
                     f"{grads} parameter-gradient) prefixes: {', '.join(prefixes)}{state}")
        if first_bad is None:
            for name, body in dump.data.items():
                if any(_non_finite(leaf) for leaf in _leaves(body)):
                    first_bad = f"step{step}/{rank}: {name}"
                    break
    lines.append(f"  first entry with a non-finite value: {first_bad or 'none'}")
    return "\n".join(lines)
