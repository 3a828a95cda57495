"""Independent bookkeeping and checks for the invisibility matrix (tests/test_invisible_matrix.py).

:class:`CallCounter` counts, without the tool, every sub-Cell call (and whether a gradient reached its
outputs) and every call of the APIs listed in ``support_wrap_ops.yaml`` and of the Primitives held by
the model's Cells, with its own wrappers; the dump written by the tool must account for each of them.
:func:`check_statistics` recomputes Max/Min/Mean/Norm of every saved ``.npy`` in float64.
"""
from __future__ import annotations

import collections
import glob
import json
import math
import os
import re

import numpy as np
from mindspore import Tensor, nn
from mindspore.common.recompute import _RecomputeCell, _WrapCell
from mindspore.ops import Primitive

from msprobe.capture.api import load_api_list, resolve_targets
from msprobe.tensors.scan import SUM_TOLERANCE


def _tensors(value):
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


_FLOATS = {"Float16", "Float32", "Float64", "BFloat16"}


def _is_float(t) -> bool:
    return str(t.dtype) in _FLOATS


class CallCounter:
    """Counts Cell, API and Primitive calls of one step between :meth:`start` and :meth:`stop`.

    ``cells[(path, Class)]`` = number of calls, ``cell_grads`` = ``{(path, Class, k)}`` calls whose
    outputs received a gradient, ``jit_cells`` = ``{(path, Class)}`` run inside a ``mindspore.jit``
    construct (the tool records them under ``graph/``), ``apis["Prefix.name"]`` = number of calls not
    nested in another counted call nor inside a jit construct.
    """

    def __init__(self, net):
        self.paths = {}
        #: Cells with a custom ``bprop``: in GRAPH_MODE their backward is not recorded (README)
        self.bprop_cells = sorted(f"{name}|{type(cell).__name__}" for name, cell in net.cells_and_names()
                                  if name and getattr(cell, "has_bprop", False))
        for name, cell in net.cells_and_names():
            if isinstance(cell, (_RecomputeCell, _WrapCell)):  # MindSpore's recompute wrappers, not layers
                continue
            if name and id(cell) not in self.paths:
                self.paths[id(cell)] = (name, type(cell).__name__)
        self.net = net
        # the listed names; other names of them (ops.functional) are recorded only from code outside
        # MindSpore, and these nets call them only by the listed names
        self.targets = resolve_targets(load_api_list())
        self.prims = []
        seen = set()
        for _, cell in net.cells_and_names():
            for attr, value in list(vars(cell).items()):
                if isinstance(value, Primitive) and id(value) not in seen:
                    seen.add(id(value))
                    self.prims.append((value, f"Primitive.{attr}.{type(value).__name__}"))
        self._undo = []
        self.reset()

    def reset(self):
        self.cells = collections.Counter()
        self.cell_grads = set()
        self.jit_cells = set()
        self.apis = collections.Counter()
        self.depth = 0
        self.jit_depth = 0

    # ------------------------------------------------------------------ installs
    def start(self):
        self.reset()
        counter = self
        original_call = nn.Cell.__call__

        def cell_call(cell, *args, **kwargs):
            key = counter.paths.get(id(cell))
            if key is None:
                return original_call(cell, *args, **kwargs)
            k = counter.cells[key]
            counter.cells[key] += 1
            if counter.jit_depth:
                counter.jit_cells.add(key)
            jit = hasattr(type(cell).construct, "__wrapped__") and "construct" not in vars(cell)
            if jit:  # run the jit construct as Python so its children are counted
                cell.construct = type(cell).construct.__wrapped__.__get__(cell)
                counter.jit_depth += 1
            try:
                out = original_call(cell, *args, **kwargs)
            finally:
                if jit:
                    del cell.construct
                    counter.jit_depth -= 1
            for t in _tensors(out):
                if _is_float(t):
                    try:
                        t.register_hook(lambda g, k=k: counter.cell_grads.add((*key, k)))
                    except Exception:  # not part of a gradient graph
                        pass
            return out

        nn.Cell.__call__ = cell_call
        self._undo.append(lambda: setattr(nn.Cell, "__call__", original_call))

        # Cell.recompute(): the forward MindSpore re-runs inside the backward counts as the calls it
        # repeats (their numbers again), not as new calls
        saved = []
        construct, bprop = _RecomputeCell.construct, _RecomputeCell.bprop

        def rc_construct(cell, *args, **kwargs):
            saved.append((collections.Counter(counter.cells), collections.Counter(counter.apis)))
            return construct(cell, *args, **kwargs)

        def rc_bprop(cell, *args):
            if not saved:
                return bprop(cell, *args)
            real = counter.cells, counter.apis
            counter.cells, counter.apis = saved.pop()
            try:
                return bprop(cell, *args)
            finally:
                counter.cells, counter.apis = real

        _RecomputeCell.construct, _RecomputeCell.bprop = rc_construct, rc_bprop
        self._undo.append(lambda: (setattr(_RecomputeCell, "construct", construct),
                                   setattr(_RecomputeCell, "bprop", bprop)))

        for owner, attr, api in self.targets:
            raw = vars(owner).get(attr) if isinstance(owner, type) else None
            if isinstance(raw, classmethod):
                continue
            original = getattr(owner, attr)
            wrapper = self._wrap(original, api)
            setattr(owner, attr, staticmethod(wrapper) if isinstance(raw, staticmethod) else wrapper)
            if isinstance(owner, type) and raw is not None:
                self._undo.append(lambda o=owner, a=attr, r=raw: setattr(o, a, r))
            elif isinstance(owner, type):
                self._undo.append(lambda o=owner, a=attr: delattr(o, a))
            else:
                self._undo.append(lambda o=owner, a=attr, r=original: setattr(o, a, r))

        for prim, api in self.prims:
            cls = type(prim)
            call = self._wrap(cls.__call__, api)
            prim.__class__ = type(cls.__name__, (cls,), {"__call__": call})
            self._undo.append(lambda p=prim, c=cls: setattr(p, "__class__", c))

    def _wrap(self, original, api):
        counter = self

        # the shape of the tool's own wrappers: MindSpore may compile a function that reaches a wrapped
        # name (a recompute's backward, an optimizer's MultitypeFuncGraph), and its graph parser
        # takes only a plain condition and a call here
        def wrapper(*args, **kwargs):
            if counter.depth or counter.jit_depth:
                return original(*args, **kwargs)
            return counter.count(api, original, args, kwargs)

        return wrapper

    def count(self, api, original, args, kwargs):
        """Count one call of ``api`` and run it (calls inside it are not counted)."""
        self.apis[api] += 1
        self.depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            self.depth -= 1

    def stop(self):
        while self._undo:
            self._undo.pop()()

    def snapshot(self) -> dict:
        return {"cells": {f"{p}|{c}": n for (p, c), n in self.cells.items()},
                "cell_grads": sorted(f"{p}|{c}|{k}" for p, c, k in self.cell_grads),
                "jit_cells": sorted(f"{p}|{c}" for p, c in self.jit_cells),
                "bprop_cells": self.bprop_cells,
                "apis": dict(self.apis)}


# ---------------------------------------------------------------------------------------------- dumps
def step_dumps(dump_path: str, step: int) -> dict:
    """``{path of dump.json: its content}`` of every subtree (``pynative/``, ``graph/`` or none)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(dump_path, "**", f"step{step}", "*", "dump.json"),
                                 recursive=True)):
        if ".previous-" in path:
            continue
        with open(path) as f:
            out[path] = json.load(f)
    return out


_API = re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_CELL = re.compile(r"^Cell\.(?P<body>.+)\.(?P<dir>forward|backward|parameters_grad)\.(?P<k>\d+)$")


#: ``amp.auto_mixed_precision(level="O1")`` rewrites a network's classes (``mindspore.rewrite``) into new
#: ones named ``<Class>Opt`` then ``<Class>Opt_<n>`` with a process-wide counter: each build of the same
#: network has other class names
_REWRITTEN = re.compile(r"(?<=Opt)_\d+(?=\.(forward|backward)\.\d+$)")


def _one_rewrite(name: str) -> str:
    """A Cell entry name with the rewrite counter of its class name removed."""
    return _REWRITTEN.sub("", name)


def check_names(names: set, counts: dict, level: str, graph_mode: bool) -> list:
    """Failures: counted calls without their entry (and entries of calls that were not counted)."""
    fails = []
    if level in ("L0", "mix"):
        want_f, want_b = set(), set()
        for key, n in counts["cells"].items():
            path, cls = key.split("|")
            for k in range(n):
                want_f.add(f"Cell.{path}.{cls}.forward.{k}")
        for key in counts["cell_grads"]:
            path, cls, k = key.split("|")
            if graph_mode and f"{path}|{cls}" in counts["bprop_cells"]:
                continue  # GRAPH_MODE records a custom-bprop Cell's forward only
            want_b.add(f"Cell.{path}.{cls}.backward.{k}")
        have_f = {n for n in names if n.startswith("Cell.") and ".forward." in n}
        have_b = {n for n in names if n.startswith("Cell.") and ".backward." in n}
        want_f, want_b, have_f, have_b = (set(map(_one_rewrite, s)) for s in (want_f, want_b, have_f, have_b))
        for label, want, have in (("forward", want_f, have_f), ("backward", want_b, have_b)):
            if want - have:
                fails.append(f"Cell {label} entries missing: {sorted(want - have)}")
            if have - want:
                fails.append(f"Cell {label} entries of calls not counted: {sorted(have - want)}")
    if level in ("L1", "mix") and not graph_mode:
        have = collections.defaultdict(set)
        for name in names:
            m = _API.match(name)
            if m and not name.startswith(("Cell.", "Jit.")) and m["dir"] == "forward":
                have[m["api"]].add(int(m["n"]))
        for api in sorted(set(have) | set(counts["apis"])):
            want = set(range(counts["apis"].get(api, 0)))
            if want - have[api]:
                fails.append(f"API {api}: calls {sorted(want - have[api])} of {len(want)} missing")
            if have[api] - want:
                fails.append(f"API {api}: entries {sorted(have[api] - want)} for {len(want)} counted calls")
    return fails


def check_unrecorded_jit(dumps: dict, function: str) -> list:
    """Failures of an L0 step whose model ran inside the ``mindspore.jit`` function ``function`` (its
    ``__name__``): ``dumps`` (:func:`step_dumps`) must hold no Cell entry (the Cells ran compiled, with
    the tool's hooks off), and each ``coverage.json`` beside them must name the function in
    ``jit_functions_not_recorded``."""
    fails = []
    for path, content in dumps.items():
        cells = sorted(n for n in content["data"] if n.startswith("Cell."))
        if cells:
            fails.append(f"Cell entries recorded inside the compiled {function}: {cells[:6]}")
        coverage = os.path.join(os.path.dirname(path), "coverage.json")
        noted = []
        if os.path.exists(coverage):
            with open(coverage) as f:
                noted = [n["function"] for n in json.load(f).get("jit_functions_not_recorded", [])]
        if function not in noted:
            fails.append(f"coverage.json does not list {function} in jit_functions_not_recorded: {noted}")
    return fails


# ---------------------------------------------------------------------------------------------- statistics
def _leaves(value, path=""):
    if isinstance(value, dict):
        if "data_name" in value or ("Max" in value and "dtype" in value):
            yield path, value
            return
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")


def expected_statistics(arr: np.ndarray, dtype: str) -> dict:
    """Max/Min/Mean/Norm of ``arr`` recomputed in float64 (bool: any/all and no Mean/Norm; empty:
    all None)."""
    if arr.size == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if dtype == "Bool" or arr.dtype == np.bool_:
        return {"Max": bool(arr.any()), "Min": bool(arr.all()), "Mean": None, "Norm": None}
    a = arr.astype(np.float64)
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt(np.sum(a * a)))}


def _same(x, y, key, arr=None) -> bool:
    """Max/Min exact; Mean and Norm within the tool's documented float64 tolerance
    (:data:`msprobe.tensors.scan.SUM_TOLERANCE`: of mean(|x|) for the Mean, of the Norm itself), since
    the tool's sums and numpy's are added in different orders."""
    if x is None or y is None or isinstance(x, bool) or isinstance(y, bool):
        return x is y or (x == y and type(x) is type(y))
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if x == y:
        return True
    if key == "Norm":
        return math.isclose(x, y, rel_tol=SUM_TOLERANCE, abs_tol=0.0)
    if key == "Mean" and arr is not None and arr.size:
        return abs(x - y) <= SUM_TOLERANCE * float(np.mean(np.abs(arr.astype(np.float64))))
    return False


def check_statistics(dump_path: str) -> tuple:
    """``(failures, number of leaves checked, {dtype: count})`` over every tensor file of every step."""
    fails, checked, dtypes = [], 0, collections.Counter()
    for path in sorted(glob.glob(os.path.join(dump_path, "**", "dump.json"), recursive=True)):
        if ".previous-" in path:
            continue
        with open(path) as f:
            data = json.load(f)["data"]
        tensor_dir = os.path.join(os.path.dirname(path), "dump_tensor_data")
        for entry, body in data.items():
            for where, leaf in _leaves(body):
                if "data_name" not in leaf:
                    continue
                arr = np.load(os.path.join(tensor_dir, leaf["data_name"]))
                want = expected_statistics(arr, leaf.get("dtype"))
                checked += 1
                dtypes[f"{leaf.get('dtype')}{'(0-d)' if arr.ndim == 0 else ''}"] += 1
                if list(arr.shape) != list(leaf.get("shape", [])):
                    fails.append(f"{entry}{where}: shape {leaf.get('shape')} but .npy {list(arr.shape)}")
                for key, value in want.items():
                    if not _same(leaf.get(key), value, key, arr):
                        fails.append(f"{entry}{where} ({leaf.get('dtype')}, shape {list(arr.shape)}): "
                                     f"{key} {leaf.get(key)!r}, float64 recomputation {value!r}")
    return fails, checked, dict(dtypes)
