"""L2 (kernel level): drive MindSpore's native kernel dump from our config, then re-shape its output.

MindSpore dumps every kernel of a compiled graph (GRAPH_MODE networks and ``@ms.jit`` functions run
from PyNative; pure PyNative ops are not dumped) when the environment variable
``MINDSPORE_DUMP_CONFIG`` names a native dump json.  Measured on MindSpore 2.10 CPU:

* the variable is read when the *first graph is compiled*, not at ``import mindspore``: setting it
  after the import, after ``set_context`` and after building the network (even after PyNative ops)
  works; setting it after the first ``@ms.jit`` / GRAPH_MODE run has no effect for the rest of the
  process, and so does unsetting it (there is no public way to re-parse it on CPU);
* the dump ``path`` may hold only letters, digits, ``-``, ``_`` and ``/`` (else a RuntimeError at
  the first compile), so the raw tree lives in ``dump_path/_msprobe_kernel/raw`` or, when
  ``dump_path`` has other characters, in a temporary directory;
* CPU accepts ``saved_data: "tensor"`` only, so statistics are computed here from the tensors;
* ``support_device`` has no effect on CPU, so the ``rank`` filter is applied here;
* native layout ``<raw>/rank_{r}/<net>/<graph_id>/<iteration>/<file>``, file
  ``{OpType}.{scope}.{task}.{stream}.{timestamp}.{input|output}.{i}.{format}.{dtype}.npy``; names
  over 255 bytes are written as ``<random digits>.npy`` with ``<new>,<original>`` rows in the
  directory's ``mapping.csv``;
* ``iteration`` counts graph runs of the whole process; with one graph per training step it equals
  the step number, with several graphs per step it does not (see :class:`KernelDump`).

:meth:`KernelDump.collect` turns that into the seed's layout
``dump_path/rank_{r}/{timestamp}/step_{n}/`` (step ``n`` = MindSpore iteration ``n``), with
``statistic.csv`` (task ``statistics``, tensors deleted) or the tensor files (task ``tensor``);
names over 255 bytes become a 32-digit name listed in that directory's ``mapping.csv``.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from msprobe.engine import layout
from msprobe.engine.config import ConfigError
from msprobe.engine.handles import Handle
from msprobe.format.naming import kernel_file_name
from msprobe.format.npy import load_npy, npy_complete, read_npy_header
from msprobe.tensors.stats import compute_stats, pynative_executor

__all__ = ["KernelDump", "kernel_file_name", "ENV_VAR", "STATISTIC_HEADER"]

logger = logging.getLogger("msprobe")

ENV_VAR = "MINDSPORE_DUMP_CONFIG"
PRIVATE_DIR = "_msprobe_kernel"  # no dot: MindSpore rejects it in the dump path
_NATIVE_PATH_RE = re.compile(r"^[A-Za-z0-9_/-]+$")
NET_NAME = "Net"
STATISTIC_FILE = "statistic.csv"
MAPPING_FILE = "mapping.csv"

#: leading columns of MindSpore's statistic.csv (string found in libmindspore_tools.so, 2.10)
STATISTIC_HEADER = ("Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot",
                    "Data Size", "Data Type", "Shape")
#: summary item (our config name) -> MindSpore statistic column, in MindSpore's column order
_STAT_COLUMNS = (
    ("max", "Max Value"), ("min", "Min Value"), ("mean", "Avg Value"),
    ("negative zero count", "Negative Zero Count"), ("positive zero count", "Positive Zero Count"),
    ("zero count", "Zero Count"), ("nan count", "NaN Count"),
    ("negative inf count", "Negative Inf Count"), ("positive inf count", "Positive Inf Count"),
    ("l2norm", "L2Norm Value"), ("md5", "MD5"), ("hash", "MD5"),
)
_DEFAULT_ITEMS = ("max", "min", "mean", "l2norm")

_DATA_MODES = {("all",): 0, ("input",): 1, ("output",): 2}
_TASKS = ("statistics", "tensor")

_FILE_RE = re.compile(
    r"^(?P<op>[^.]+)\.(?P<scope>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)\."
    r"(?P<io>input|output)\.(?P<slot>\d+)\.(?P<fmt>[^.]+)\.(?P<dtype>[^.]+)\.npy$")


# ------------------------------------------------------------------------------------ statistics

#: summary item -> the name of the same count in :func:`msprobe.tensors.stats.compute_stats`
_COUNTS = {"nan count": "NanCount", "positive inf count": "PosInfCount",
           "negative inf count": "NegInfCount", "zero count": "ZeroCount"}
_SIGNED_ZERO_COUNTS = ("negative zero count", "positive zero count")


def _load(path: str) -> Tuple[np.ndarray, str, int]:
    """(array, dtype name, payload bytes); bf16 (``'<E2'``) decoded to float32 exactly."""
    header = read_npy_header(path)
    arr = load_npy(path)
    return arr, "bfloat16" if header.bfloat16 else arr.dtype.name, header.payload_bytes


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return repr(float(value))


def _stat_values(arr: np.ndarray, path: str, items: Tuple[str, ...]) -> List[str]:
    """The statistic.csv values of ``items`` for the array read from ``path``.

    Max/Min/Mean/L2Norm and the NaN/Inf/zero counts follow :func:`msprobe.tensors.stats.compute_stats`,
    with MindSpore's csv conventions on top: bool tensors are counted as 0/1 (with a mean and a norm),
    Mean and L2Norm are always written as floats, and a non-float tensor has no NaN, Inf or signed
    zero. ``md5`` is the MD5 of the file's payload bytes.
    """
    counts = tuple(_COUNTS[i] for i in items if i in _COUNTS)
    stats = compute_stats(arr.astype(np.uint8) if arr.dtype.kind == "b" else arr, counts=counts)
    values = {"max": stats["Max"], "min": stats["Min"],
              "mean": None if stats["Mean"] is None else float(stats["Mean"]),
              "l2norm": None if stats["Norm"] is None else float(stats["Norm"])}
    values.update((item, stats[key]) for item, key in _COUNTS.items() if key in stats)
    floats = arr.dtype.kind == "f"
    out = []
    for item in items:
        if item in values:
            out.append(_fmt(values[item]))
        elif item in ("md5", "hash"):
            with open(path, "rb") as fh:
                fh.seek(read_npy_header(path).offset)
                out.append(hashlib.md5(fh.read()).hexdigest())
        elif item in _SIGNED_ZERO_COUNTS and not floats:
            out.append("0")
        elif item in _SIGNED_ZERO_COUNTS:
            negative = np.signbit(arr) if item == "negative zero count" else ~np.signbit(arr)
            out.append(str(int(((arr == 0) & negative).sum())))
        else:  # pragma: no cover - filtered in _stat_items
            out.append("")
    return out


def _stat_items(summary_mode) -> Tuple[str, ...]:
    if summary_mode in (None, "statistics"):
        return _DEFAULT_ITEMS
    if summary_mode == "md5":
        return _DEFAULT_ITEMS + ("md5",)
    wanted = set(summary_mode if not isinstance(summary_mode, str) else (summary_mode,))
    items, seen = [], set()
    for item, column in _STAT_COLUMNS:
        if item in wanted and column not in seen:
            items.append(item)
            seen.add(column)
    unknown = wanted - {i for i, _ in _STAT_COLUMNS}
    if unknown:
        logger.warning("L2 statistic.csv has no column for summary item(s) %s; ignored",
                       ", ".join(sorted(unknown)))
    return tuple(items) or _DEFAULT_ITEMS


def _synchronize() -> None:
    """Wait for launched kernels (and so their dump files): PyNative runs jit graphs async."""
    ms = sys.modules.get("mindspore")
    if ms is None:
        return
    try:
        # the PyNative executor's sync waits for queued work on every device; runtime.synchronize()
        # would log "CPU device is not supported" on CPU and do nothing
        pynative_executor().sync()
    except Exception as exc:  # noqa: BLE001 - best effort; partial files are retried anyway
        logger.debug("L2 kernel dump: synchronize failed: %s", exc)


# ------------------------------------------------------------------------------------ KernelDump

class KernelDump:
    """L2: drives MindSpore's native kernel dump from our config.

    ``install()`` must run before the process compiles its first graph (first GRAPH_MODE Cell call
    or ``@ms.jit`` call); MindSpore reads ``MINDSPORE_DUMP_CONFIG`` once, at that point.
    ``collect()`` re-shapes whatever MindSpore has written so far and can be called at every step.

    Step numbers are MindSpore's iteration counter, which counts graph runs process-wide: exact for
    one graph per step (``TrainOneStepCell``, ``Model.train``, one ``@ms.jit`` train step); with
    several graphs per step (e.g. a jitted grad function plus a separate optimizer graph) it advances
    faster than the training step and its values are not a simple step count.
    """

    def __init__(self, config):
        task = getattr(config, "task", None)
        if task not in _TASKS:
            raise ConfigError("task", task, ", ".join(map(repr, _TASKS)),
                              "level L2 dumps kernels as statistics or tensors")
        data_mode = tuple(getattr(config, "data_mode", ("all",)) or ("all",))
        if data_mode not in _DATA_MODES:
            raise ConfigError("data_mode", list(data_mode), "exactly one of 'all', 'input', 'output'",
                              "level L2 takes exactly one of all/input/output")
        self.task = task
        self.dump_path = os.path.abspath(config.dump_path)
        self.collected: set = set()  # step directories written by collect() so far
        self.rank = tuple(getattr(config, "rank", ()) or ())
        self.step = tuple(getattr(config, "step", ()) or ())
        self.api_list = tuple(getattr(config, "api_list", ()) or ())
        self.data_mode = data_mode
        self.summary_mode = getattr(config, "summary_mode", "statistics")
        self.stat_items = _stat_items(self.summary_mode)
        self.private_dir = os.path.join(self.dump_path, PRIVATE_DIR)
        self.raw_dir = os.path.join(self.private_dir, "raw")
        self.json_path = os.path.join(self.private_dir, "kernel_dump.json")
        self.timestamp = time.strftime("%Y%m%d%H%M%S")
        self.enabled: Optional[bool] = None  # decided by install()

    # -- native config --------------------------------------------------------------------------

    def native_config(self) -> dict:
        """The MindSpore dump json this config maps to."""
        return {
            "common_dump_settings": {
                "op_debug_mode": 0,
                "dump_mode": 1 if self.api_list else 0,
                "path": self.raw_dir,
                "net_name": NET_NAME,
                "iteration": "|".join(str(s) for s in self.step) if self.step else "all",
                "saved_data": "tensor",
                "input_output": _DATA_MODES[self.data_mode],
                "kernels": list(self.api_list),
                "support_device": list(self.rank) if self.rank else list(range(8)),
                "file_format": "npy",
            },
            "e2e_dump_settings": {"enable": True, "trans_flag": True},
        }

    def install(self) -> Handle:
        """Write the native json and point ``MINDSPORE_DUMP_CONFIG`` at it.

        On a rank excluded by ``rank`` nothing is set (MindSpore ignores ``support_device`` on CPU).
        The handle restores the previous value of the variable; MindSpore itself keeps dumping if
        it already compiled a graph with the variable set (it parses the config only once).
        """
        rank = layout.launch_rank()  # configured before the first graph compiles, often before init()
        self.enabled = not self.rank or rank in self.rank
        if not self.enabled:
            logger.info("L2 kernel dump: rank %d not in rank %s; nothing dumped", rank, list(self.rank))
            return Handle(lambda: None, "kernel dump (rank excluded)")
        if not _NATIVE_PATH_RE.match(self.raw_dir):
            # MindSpore accepts only letters, digits, '-', '_' and '/' in the dump path
            raw_dir = tempfile.mkdtemp(prefix="msprobe_kernel_")
            if not _NATIVE_PATH_RE.match(raw_dir):
                os.rmdir(raw_dir)
                raise ConfigError("dump_path", self.dump_path, "a path of letters, digits, '-', "
                                  "'_' and '/'", "MindSpore's kernel dump rejects other characters")
            logger.warning("L2 kernel dump: dump_path %r has characters MindSpore's dump rejects; "
                           "raw kernel files go to %s first", self.dump_path, raw_dir)
            self.raw_dir = raw_dir
        os.makedirs(self.raw_dir, exist_ok=True)
        os.makedirs(self.private_dir, exist_ok=True)
        tmp = self.json_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.native_config(), fh, indent=4)
        os.replace(tmp, self.json_path)
        previous = os.environ.get(ENV_VAR)
        os.environ[ENV_VAR] = self.json_path
        logger.info("L2 kernel dump: %s=%s", ENV_VAR, self.json_path)

        def undo():
            if os.environ.get(ENV_VAR) == self.json_path:
                if previous is None:
                    os.environ.pop(ENV_VAR, None)
                else:
                    os.environ[ENV_VAR] = previous

        return Handle(undo, f"env {ENV_VAR}")

    # -- post-processing ------------------------------------------------------------------------

    def step_dir(self, rank: int, step: int) -> str:
        return os.path.join(self.dump_path, f"rank_{rank}", self.timestamp, f"step_{step}")

    def collect(self) -> List[str]:
        """Move/convert everything MindSpore has written so far into the seed layout.

        Returns the step directories written to by this call (sorted).  Files are consumed from the
        raw tree, so calling it again only handles new files; a file still being written is left
        for the next call.
        """
        _synchronize()
        written = set()
        if not os.path.isdir(self.raw_dir):
            return []
        for rank, step, src_dir in self._raw_iteration_dirs():
            if self.rank and rank not in self.rank:
                continue
            if self._collect_dir(src_dir, self.step_dir(rank, step)):
                written.add(self.step_dir(rank, step))
        self.collected |= written
        return sorted(written)

    def place(self) -> str:
        """Where the collected kernel dump is: ``the L2 kernel dump is at <dump_path>: 2 step directories
        (rank_0/<timestamp>/step_0, ...)``, or that nothing was collected there."""
        if not self.collected:
            return f"the L2 kernel dump at {self.dump_path} holds no kernel data (no kernel file was collected)"
        names = [os.path.relpath(d, self.dump_path) for d in sorted(self.collected)]
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return (f"the L2 kernel dump is at {self.dump_path}: {len(names)} step "
                f"director{'y' if len(names) == 1 else 'ies'} ({shown})")

    def _raw_iteration_dirs(self) -> Iterable[Tuple[int, int, str]]:
        for rank_name in sorted(os.listdir(self.raw_dir)):
            m = re.fullmatch(r"rank_(\d+)", rank_name)
            net_dir = os.path.join(self.raw_dir, rank_name, NET_NAME)
            if not m or not os.path.isdir(net_dir):
                continue
            for graph in sorted(os.listdir(net_dir)):
                graph_dir = os.path.join(net_dir, graph)
                if not graph.isdigit() or not os.path.isdir(graph_dir):
                    continue
                for iteration in sorted(os.listdir(graph_dir), key=lambda s: (len(s), s)):
                    it_dir = os.path.join(graph_dir, iteration)
                    if iteration.isdigit() and os.path.isdir(it_dir):
                        yield int(m.group(1)), int(iteration), it_dir

    def _collect_dir(self, src_dir: str, dst_dir: str) -> bool:
        native_map = _read_mapping(os.path.join(src_dir, MAPPING_FILE))
        entries = []
        for fname in os.listdir(src_dir):
            if fname == MAPPING_FILE or not fname.endswith(".npy"):
                continue
            original = native_map.get(fname, fname)
            match = _FILE_RE.match(original)
            entries.append((int(match.group("ts")) if match else 0, original, fname, match))
        if not entries:
            return False
        entries.sort()
        os.makedirs(dst_dir, exist_ok=True)
        rows, mapping_rows, done = [], [], 0
        for _, original, fname, match in entries:
            src = os.path.join(src_dir, fname)
            if not npy_complete(src):
                continue
            done += 1
            if self.task == "statistics" and match is not None:
                rows.append(self._stat_row(src, match))
                os.remove(src)
                continue
            new_name = kernel_file_name(original)
            if new_name != original:
                mapping_rows.append((new_name, original))
            shutil.move(src, os.path.join(dst_dir, new_name))
        if rows:
            _append_csv(os.path.join(dst_dir, STATISTIC_FILE),
                        STATISTIC_HEADER + tuple(dict(_STAT_COLUMNS)[i] for i in self.stat_items), rows)
        if mapping_rows:
            _append_csv(os.path.join(dst_dir, MAPPING_FILE), None, mapping_rows)
        return done > 0

    def _stat_row(self, path: str, match: "re.Match") -> List[str]:
        arr, dtype_name, nbytes = _load(path)
        shape = "(" + ",".join(str(d) for d in arr.shape) + ")"
        head = [match.group("op"), match.group("scope"), match.group("task"), match.group("stream"),
                match.group("ts"), match.group("io"), match.group("slot"), str(nbytes), dtype_name,
                shape]
        return head + _stat_values(arr, path, self.stat_items)


def _read_mapping(path: str) -> Dict[str, str]:
    """MindSpore's ``<new name>,<original name>`` rows (no header)."""
    out: Dict[str, str] = {}
    if os.path.isfile(path):
        with open(path, newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                if len(row) >= 2:
                    out[row[0]] = row[1]
    return out


def _append_csv(path: str, header, rows) -> None:
    new = not os.path.exists(path)
    with open(path, "a", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        if new and header:
            writer.writerow(header)
        writer.writerows(rows)
