"""One side of a comparison: the records of a step/rank directory in a compact, streamed index.

A *record* is one value of an entry (a tensor or a scalar argument), named by its place in the entry
(``input.0``, ``kwargs.dtype``, ``output.1``, ``parameters.weight``; for parameter gradients the
parameter name; for the debug level ``debug`` and its nesting path). Records are read through
:func:`msprobe.dump.iter_bodies` one entry at a time and kept as flat arrays (about 60 bytes per
record plus the entry names), never as the parsed JSON bodies.
"""
from __future__ import annotations

import re
from array import array
from typing import NamedTuple, Optional

from msprobe.dump import iter_bodies

TENSOR_TYPES = ("mindspore.Tensor", "numpy.ndarray")
STATS = ("Max", "Min", "Mean", "Norm")
_NAN = float("nan")
_COUNT = re.compile(r"^\d+$")


class Record(NamedTuple):
    """One value of an entry (see the module docstring)."""

    key: str                 # place in the entry: "input.0", "output.0", "parameters.weight", ...
    kind: str                # leaf "type": "mindspore.Tensor", "int", "float", "str", ...
    dtype: Optional[str]     # MindSpore dtype name for tensors (``Float32``); the type for values
    shape: Optional[tuple]   # () for 0-d and non-tensor values
    stats: tuple             # (Max, Min, Mean, Norm), None where not recorded
    md5: Optional[str]
    data_name: Optional[str]
    value: object            # non-tensor values: the value itself

    @property
    def is_tensor(self) -> bool:
        return self.kind in TENSOR_TYPES

    @property
    def flow(self) -> str:
        """``"in"`` for inputs (positional, keyword, parameters of a forward call; the incoming
        gradient of a backward entry), ``"out"`` otherwise."""
        head = self.key.split(".", 1)[0]
        return "in" if head in ("input", "kwargs", "parameters") else "out"


def entry_records(entry: str, body) -> list:
    """The :class:`Record` list of one entry body of ``dump.json``, in written order."""
    out = []
    if ".parameters_grad." in entry or entry.endswith(".parameters_grad"):
        for pname, value in (body or {}).items():
            _walk(value, pname, out, single_list=True)
    elif entry.endswith(".debug"):
        _walk(body, "debug", out)
    elif isinstance(body, dict):
        for key, value in body.items():
            head = {"input_args": "input", "input_kwargs": "kwargs"}.get(key, key)
            _walk(value, head, out)
    return out


def _walk(value, path: str, out: list, single_list: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, dict):
        if isinstance(value.get("type"), str):
            out.append(_leaf(path, value))
            return
        for k, v in value.items():
            _walk(v, f"{path}.{k}", out)
    elif isinstance(value, list):
        if single_list and len(value) == 1:
            _walk(value[0], path, out)
            return
        for i, v in enumerate(value):
            _walk(v, f"{path}.{i}", out)


def _stat(v):
    if isinstance(v, bool):
        return float(v)
    return float(v) if isinstance(v, (int, float)) else None


def _leaf(path: str, leaf: dict) -> Record:
    kind = leaf["type"]
    if kind in TENSOR_TYPES or "shape" in leaf:
        return Record(path, kind, leaf.get("dtype"), tuple(leaf.get("shape") or ()),
                      tuple(_stat(leaf.get(s)) for s in STATS), leaf.get("md5"),
                      leaf.get("data_name"), None)
    value = leaf.get("value")
    number = _stat(value)
    stats = (number,) * 4 if number is not None else (None,) * 4
    return Record(path, kind, kind, (), stats, leaf.get("md5"), leaf.get("data_name"), value)


class Side:
    """The records of one step/rank directory, streamed once into compact arrays.

    Attributes:
        directory: the step/rank directory. header: ``task``, ``level``, ... of its ``dump.json``.
        names: entry names in written (execution) order.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.header = {}
        self.names = []
        self._start = array("q", [0])
        self._key = array("i")
        self._meta = array("i")
        self._stats = array("d")
        self._present = bytearray()
        self._extra = {}                       # record index -> (md5, data_name, value)
        self._strings, self._string_ids = [], {}
        self._metas, self._meta_ids = [], {}
        for entry, body in iter_bodies(directory):
            if entry is None:
                self.header = body
                continue
            self._add(entry, entry_records(entry, body))
        self.index = {name: i for i, name in enumerate(self.names)}

    def _intern(self, table: list, ids: dict, value) -> int:
        found = ids.get(value)
        if found is None:
            found = ids[value] = len(table)
            table.append(value)
        return found

    def _add(self, entry: str, records: list) -> None:
        self.names.append(entry)
        for rec in records:
            n = len(self._key)
            self._key.append(self._intern(self._strings, self._string_ids, rec.key))
            self._meta.append(self._intern(self._metas, self._meta_ids, (rec.kind, rec.dtype, rec.shape)))
            bits = 0
            for i, v in enumerate(rec.stats):
                if v is not None:
                    bits |= 1 << i
                self._stats.append(_NAN if v is None else v)
            self._present.append(bits)
            if rec.md5 is not None or rec.data_name is not None or rec.value is not None:
                self._extra[n] = (rec.md5, rec.data_name, rec.value)
        self._start.append(len(self._key))

    def __len__(self) -> int:
        return len(self.names)

    def records(self, i: int) -> list:
        """The :class:`Record` list of entry number ``i``."""
        out = []
        for n in range(self._start[i], self._start[i + 1]):
            kind, dtype, shape = self._metas[self._meta[n]]
            bits = self._present[n]
            stats = tuple(self._stats[4 * n + k] if bits >> k & 1 else None for k in range(4))
            md5, data_name, value = self._extra.get(n, (None, None, None))
            out.append(Record(self._strings[self._key[n]], kind, dtype, shape, stats, md5,
                              data_name, value))
        return out

    def record_start(self, i: int) -> int:
        """Index of entry ``i``'s first record in :meth:`stat_arrays`."""
        return self._start[i]

    def stat_arrays(self):
        """``(stats, present)``: numpy views of every record's (Max, Min, Mean, Norm) as an
        ``(n, 4)`` float64 array (NaN where not recorded) and of the bit mask of recorded ones."""
        if getattr(self, "_np", None) is None or len(self._np[1]) != len(self._present):
            import numpy as np

            self._np = (np.frombuffer(self._stats, dtype=np.float64).reshape(-1, 4),
                        np.frombuffer(bytes(self._present), dtype=np.uint8).astype(np.int64))
        return self._np

    def signature(self, i: int) -> tuple:
        """What order-preserving alignment compares: the entry's API (or Cell class) and direction,
        plus every record's place, dtype and shape."""
        metas = tuple((self._key[n], self._meta[n]) for n in range(self._start[i], self._start[i + 1]))
        return api_key(self.names[i]), tuple((self._strings[k], self._metas[m][1:]) for k, m in metas)

    def has_md5(self) -> bool:
        return any(extra[0] is not None for extra in self._extra.values())

    def has_tensor_files(self) -> bool:
        return any(extra[1] is not None for extra in self._extra.values())


def api_key(entry: str) -> str:
    """The entry's API or Cell class and its direction, without call counter or Cell path:
    ``Functional.relu.3.forward`` -> ``Functional.relu.forward``; ``Cell.layer.0.fc.Dense.forward.2``
    -> ``Cell.Dense.forward``; ``Cell.fc.Dense.parameters_grad.0`` -> ``Cell.Dense.parameters_grad``."""
    parts = entry.split(".")
    if parts[0] == "Cell" and len(parts) >= 4 and _COUNT.match(parts[-1]):
        return f"Cell.{parts[-3]}.{parts[-2]}"
    if len(parts) >= 3 and parts[-1] in ("forward", "backward") and _COUNT.match(parts[-2]):
        return ".".join(parts[:-2] + parts[-1:])
    if len(parts) >= 3 and parts[-1] == "debug" and _COUNT.match(parts[-2]):
        return ".".join(parts[:-2] + parts[-1:])
    return entry


def api_name(entry: str) -> str:
    """``api_key`` without the direction (``Functional.relu``), used by name mappings."""
    key = api_key(entry)
    return key.rsplit(".", 1)[0] if "." in key else key

