"""One side of a comparison: the records of a step/rank directory in a compact, streamed index.

A *record* is one value of an entry (a tensor or a scalar argument), named by its place in the entry
(``input.0``, ``kwargs.dtype``, ``output.1``, ``parameters.weight``; for parameter gradients the
parameter name; for the debug level ``""`` (the saved value) or its nesting path, ``0.k``). Records are read through
:func:`msprobe.dump.iter_bodies` one entry at a time and kept as flat arrays (about 60 bytes per
record plus the entry names), never as the parsed JSON bodies.
"""
from __future__ import annotations

import os
from array import array
from typing import Iterator, NamedTuple, Optional

from msprobe.dump import iter_bodies
from msprobe.format import naming
from msprobe.format.naming import api_key

TENSOR_TYPES = ("mindspore.Tensor", "numpy.ndarray")
STATS = ("Max", "Min", "Mean", "Norm")
_NAN = float("nan")
_NO_EXTRA = (None, None, None)


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
        return flow_of(self.key)


_IN_HEADS = ("input", "kwargs", "parameters")


_FLOWS = {}


def flow_of(key: str) -> str:
    """``"in"`` or ``"out"`` for a record key (see :attr:`Record.flow`)."""
    flow = _FLOWS.get(key)
    if flow is None:
        flow = "in" if key.split(".", 1)[0] in _IN_HEADS else "out"
        if len(_FLOWS) < 100_000:
            _FLOWS[key] = flow
    return flow


def entry_records(entry: str, body) -> list:
    """The :class:`Record` list of one entry body of ``dump.json``, in written order."""
    out = []
    if naming.is_param_grad(entry):
        for pname, value in (body or {}).items():
            _walk(value, pname, out, single_list=True)
    elif naming.is_debug(entry):  # the saved value itself; nested items by their index path
        _walk(body, "", out)
    elif isinstance(body, dict):
        for key, value in body.items():
            if key == "error" and isinstance(value, str):  # a Cell whose forward raised: no output
                out.append(Record("error", "error", "error", (), (None,) * 4, None, None, value))
                continue
            head = {"input_args": "input", "input_kwargs": "kwargs"}.get(key, key)
            _walk(value, head, out)
    return out


def _walk(value, path: str, out: list, single_list: bool = False) -> None:
    if value is None:
        return
    if value.__class__ is list and not single_list:  # the common case: a list of leaves
        for i, v in enumerate(value):
            if v.__class__ is dict and v.get("type").__class__ is str:
                out.append(_leaf(f"{path}.{i}" if path else str(i), v))
            else:
                _walk(v, f"{path}.{i}" if path else str(i), out)
        return
    if isinstance(value, dict):
        if isinstance(value.get("type"), str):
            out.append(_leaf(path, value))
            return
        for k, v in value.items():
            _walk(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list):
        if single_list and len(value) == 1:
            _walk(value[0], path, out)
            return
        for i, v in enumerate(value):
            _walk(v, f"{path}.{i}" if path else str(i), out)


def _stat(v):
    cls = v.__class__
    if cls is float:
        return v
    if cls is int or cls is bool:
        return float(v)
    return None


def _leaf(path: str, leaf: dict) -> Record:
    kind = leaf["type"]
    get = leaf.get
    if kind in TENSOR_TYPES or "shape" in leaf:
        shape = get("shape")
        return Record(path, kind, get("dtype"), tuple(shape) if shape else (),
                      (_stat(get("Max")), _stat(get("Min")), _stat(get("Mean")), _stat(get("Norm"))),
                      get("md5"), get("data_name"), None)
    value = get("value")
    number = _stat(value)
    return Record(path, kind, kind, (), (number,) * 4, get("md5"), get("data_name"), value)


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
        strings, string_ids, metas, meta_ids = self._strings, self._string_ids, self._metas, self._meta_ids
        for rec in records:
            key = string_ids.get(rec.key)
            if key is None:
                key = self._intern(strings, string_ids, rec.key)
            meta_key = (rec.kind, rec.dtype, rec.shape)
            meta = meta_ids.get(meta_key)
            if meta is None:
                meta = self._intern(metas, meta_ids, meta_key)
            self._key.append(key)
            self._meta.append(meta)
            mx, mn, mean, norm = rec.stats
            if mx is not None and mn is not None and mean is not None and norm is not None:
                self._stats.extend(rec.stats)
                self._present.append(15)
            else:
                self._stats.extend(_NAN if v is None else v for v in rec.stats)
                self._present.append(sum(1 << i for i, v in enumerate(rec.stats) if v is not None))
            if rec.md5 is not None or rec.data_name is not None or rec.value is not None:
                self._extra[len(self._key) - 1] = (rec.md5, rec.data_name, rec.value)
        self._start.append(len(self._key))

    def __len__(self) -> int:
        return len(self.names)

    def records(self, i: int) -> list:
        """The :class:`Record` list of entry number ``i``."""
        out = []
        keys, meta, metas, strings = self._key, self._meta, self._metas, self._strings
        stats, present, extra = self._stats, self._present, self._extra
        for n in range(self._start[i], self._start[i + 1]):
            kind, dtype, shape = metas[meta[n]]
            st = tuple(stats[4 * n:4 * n + 4])
            bits = present[n]
            if bits != 15:
                st = tuple(v if bits >> k & 1 else None for k, v in enumerate(st))
            md5, data_name, value = extra.get(n, _NO_EXTRA) if extra else _NO_EXTRA
            out.append(Record(strings[keys[n]], kind, dtype, shape, st, md5, data_name, value))
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

    def record_names(self) -> Iterator[str]:
        """Every record's name ``{entry}.{key}`` (what ``--ignore`` patterns match), in order."""
        start, keys, strings = self._start, self._key, self._strings
        for i, name in enumerate(self.names):
            for n in range(start[i], start[i + 1]):
                yield f"{name}.{strings[keys[n]]}"

    def dtypes(self) -> set:
        """The dtypes its records hold (``Float32``, ``Int64``, ...; None for non-tensor values)."""
        return {meta[1] for meta in self._metas}

    def has_md5(self) -> bool:
        return any(extra[0] is not None for extra in self._extra.values())

    def has_tensor_files(self) -> bool:
        return any(extra[1] is not None for extra in self._extra.values())


def api_name(entry: str) -> str:
    """``api_key`` without the direction (``Functional.relu``), used by name mappings."""
    key = api_key(entry)
    return key.rsplit(".", 1)[0] if "." in key else key



#: both dump files at least this large: the golden side is read in a second process meanwhile
PARALLEL_MIN_BYTES = 16 << 20


def load_sides(target_dir: str, golden_dir: str):
    """``(Side(target_dir), Side(golden_dir))``; for two large ``dump.json`` files the golden one is
    read in a spawned worker process while this one reads the target (both cores busy), else (or
    if the worker cannot run) one after the other."""
    sizes = [os.path.getsize(p) if p else 0 for p in map(_dump_file, (target_dir, golden_dir))]
    if min(sizes) >= PARALLEL_MIN_BYTES and (os.cpu_count() or 1) > 1:
        try:
            from concurrent.futures import ProcessPoolExecutor
            import multiprocessing

            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                future = pool.submit(Side, golden_dir)
                target = Side(target_dir)
                return target, future.result()
        except (OSError, RuntimeError, ImportError) as exc:  # no worker: read it here
            import logging

            logging.getLogger(__name__).info("reading %s in this process (%s)", golden_dir, exc)
    return Side(target_dir), Side(golden_dir)


def _dump_file(directory: str):
    for name in ("dump.json", "debug.json"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None
