"""API-level (L1) capture: wrappers around the functions and Tensor methods listed in
``support_wrap_ops.yaml`` (seed: "修改API支持列表").

Wrappers are installed at ``start()`` of a dumped step and stay installed until the ``stop()`` of a
step whose next step is not dumped (or ``close()``, exit, collection of the debugger; see
:mod:`msprobe.mindspore.service`), so identity checks written outside the dumped steps see
MindSpore's own objects, and a debugger that is constructed but not started costs nothing. A
wrapper keeps ``__name__``, ``__qualname__``, ``__doc__`` and ``__wrapped__`` of the
original, and when the dump is not running or the call is nested inside another recorded call it
forwards directly to the original.

MindSpore exports one function object under several public names: ``mindspore.ops.cast`` is
``mindspore.ops.functional.cast`` (``F.cast`` in mindformers and in MindSpore's own layers), is
``mindspore.ops.function.array_func.zeros_like``'s ``ops`` twin, and ``mint`` re-exports ``ops``
functions. Patching one module attribute leaves the others calling the original, so every public
binding of a listed function in :data:`ALIAS_MODULES` of the namespace it is listed for is wrapped
too (:func:`alias_targets`) and recorded under the listed API's name. Calls that MindSpore's own code in the defining module makes
through its module globals (``array_func`` functions calling each other) are internal steps, not API
calls, and are not recorded.
"""
from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import sys

import yaml

from msprobe.capture.calls import CallRecorder
from msprobe.capture.semantics import is_inplace
from msprobe.tensors import hotpath

SUPPORT_WRAP_OPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support_wrap_ops.yaml")

#: yaml key -> (object whose attributes are wrapped, entry prefix)
NAMESPACES = {
    "ops": ("mindspore.ops", "Functional"),
    "tensor": ("mindspore:Tensor", "Tensor"),
    "mint.ops": ("mindspore.mint", "Mint"),
    "mint.nn.functional": ("mindspore.mint.nn.functional", "MintFunctional"),
    "communication.comm_func": ("mindspore.communication.comm_func", "Distributed"),
    "mint.distributed": ("mindspore.mint.distributed", "MintDistributed"),
}


#: modules re-exporting listed functions, with the entry prefix of their family (``.*``: every
#: public sub-module of that package)
ALIAS_MODULES = (
    ("mindspore.ops", "Functional"),
    ("mindspore.ops.functional", "Functional"),
    ("mindspore.ops.function", "Functional"),
    ("mindspore.ops.function.*", "Functional"),
    ("mindspore.mint", "Mint"),
    ("mindspore.mint.nn.functional", "MintFunctional"),
)


def _import_owner(spec: str):
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def load_api_list(path: str | None = None) -> dict:
    """Read ``{yaml key: [api names]}`` from ``support_wrap_ops.yaml`` (or ``path``)."""
    with open(path or SUPPORT_WRAP_OPS, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    return {key: list(data.get(key) or []) for key in NAMESPACES}


def resolve_targets(api_list: dict) -> list:
    """``[(owner, attribute, "Prefix.name")]`` for every listed name that exists and is callable."""
    targets = []
    for key, names in api_list.items():
        spec, prefix = NAMESPACES[key]
        try:
            owner = _import_owner(spec)
        except Exception:  # e.g. communication unavailable in this build
            continue
        for name in names:
            holder, attr = owner, name
            if "." in name:  # sub-module attribute such as auto_generate.quant_matmul
                head, attr = name.rsplit(".", 1)
                holder = functools.reduce(getattr, head.split("."), owner) if _has_path(owner, head) else None
            if holder is None or not callable(getattr(holder, attr, None)):
                continue
            if isinstance(getattr(holder, attr), type):  # classes (e.g. mint.nn) are not APIs
                continue
            targets.append((holder, attr, f"{prefix}.{name}"))
    return targets


def _has_path(owner, dotted: str) -> bool:
    try:
        functools.reduce(getattr, dotted.split("."), owner)
        return True
    except AttributeError:
        return False


def alias_modules() -> list:
    """``[(module, entry prefix)]`` of :data:`ALIAS_MODULES` that import in this MindSpore build.

    Found once per process (the package layout on disk does not change while it runs); each call
    returns a new list."""
    return list(_alias_modules())


@functools.lru_cache(maxsize=1)
def _alias_modules() -> tuple:
    out = []
    for spec, prefix in ALIAS_MODULES:
        names = [spec]
        if spec.endswith(".*"):
            try:
                package = importlib.import_module(spec[:-2])
            except Exception:
                continue
            names = [f"{package.__name__}.{info.name}" for info in pkgutil.iter_modules(package.__path__)
                     if not info.name.startswith("_")]
        for name in names:
            try:
                out.append((importlib.import_module(name), prefix))
            except Exception:  # a sub-module this build cannot import (e.g. no communication)
                continue
    return tuple(out)


def alias_targets(targets: list) -> list:
    """``[(module, attribute, api)]``: every public attribute of :func:`alias_modules` holding the
    same function as a module-level entry of ``targets`` (from :func:`resolve_targets`) listed for
    the module's own namespace family (``Functional``: ``mindspore.ops``, ``ops.functional``,
    ``ops.function.*``; ``Mint``; ``MintFunctional``), without being one of them. ``api`` is that
    listed API, so the yaml list and the ``list`` filter decide for all its names in the family. A
    re-export listed for another namespace only (``mint.cumprod`` is ``ops.cumprod``, not in the
    ``mint.ops`` list) is not wrapped: removing a name from one namespace's list stops it there;
    :mod:`msprobe.capture.coverage` reports such a name when the user's code calls it."""
    listed = {}  # id(function) -> (function, [api, ...])
    taken = set()
    for owner, attr, api in targets:
        if isinstance(owner, type):  # Tensor methods have no module aliases
            continue
        obj = getattr(owner, attr)
        listed.setdefault(id(obj), (obj, []))[1].append(api)
        taken.add((id(owner), attr))
    out = []
    for module, prefix in alias_modules():
        for attr, value in list(vars(module).items()):
            hit = listed.get(id(value))
            if hit is None or hit[0] is not value or attr.startswith("_") or (id(module), attr) in taken:
                continue
            api = next((a for a in hit[1] if a.partition(".")[0] == prefix), None)
            if api is None:  # listed for another namespace only (mint.cumprod is ops.cumprod)
                continue
            out.append((module, attr, api))
            taken.add((id(module), attr))
    return out


def _mindspore_internal(caller_globals: dict) -> bool:
    name = caller_globals.get("__name__") or ""
    return name == "mindspore" or name.startswith("mindspore.")


def make_wrapper(runtime, recorder: CallRecorder, original, api: str, home: dict | None = None,
                 method: bool = False):
    """A function that records calls of ``original`` as API ``api`` while the dump runs.

    ``home``: the globals of the module the wrapper is installed in (aliases only); a call made
    through such an alias by MindSpore's own code (a module of the ``mindspore`` package: the
    defining module, or e.g. ``Tensor.__setitem__``'s implementation calling ``F.cast``) is
    MindSpore-internal and is not recorded; user and third-party code (``mindformers``) is.
    ``method``: the wrapper is installed on a class (``Tensor``). There it is the compiled
    ``CallWrapper`` when the extension is built (the same behaviour without a Python frame per
    call); functions of modules stay Python functions, since ``mindspore.jit`` compiles a function
    it finds in a module from its source, which a compiled callable has none of.
    """
    inplace = is_inplace(api)
    # the common case's path (same records, fewer steps) when the API and the config allow it
    record = recorder.fast_record if recorder.has_fast_path(api, inplace) else recorder.call
    ext = hotpath.ext
    if method and ext is not None:  # the same function in C (no Python frame per call)
        wrapper = ext.CallWrapper(runtime, runtime.compiled_call_parts()["forks"], record, original, api,
                                  inplace, home)
        functools.update_wrapper(wrapper, original)
        return wrapper

    if home is None:
        def wrapper(*args, **kwargs):
            if not runtime.capturing():
                return original(*args, **kwargs)
            return record(api, original, args, kwargs, inplace)
    else:
        def wrapper(*args, **kwargs):
            if not runtime.capturing() or _mindspore_internal(sys._getframe(1).f_globals):
                return original(*args, **kwargs)
            return record(api, original, args, kwargs, inplace)

    functools.update_wrapper(wrapper, original)
    return wrapper


def build_wrappers(runtime, targets: list, recorder: CallRecorder | None = None, aliases=()) -> list:
    """``[(owner, attribute, wrapper)]`` for every target and every alias (from
    :func:`alias_targets`); static methods stay static; class methods are skipped (they are bound
    to the class, not API calls on data)."""
    recorder = recorder or CallRecorder(runtime)
    out = []
    for owner, attr, api in targets:
        raw = vars(owner).get(attr) if isinstance(owner, type) else None
        if isinstance(raw, classmethod):
            continue
        wrapper = make_wrapper(runtime, recorder, getattr(owner, attr), api, method=isinstance(owner, type))
        out.append((owner, attr, staticmethod(wrapper) if isinstance(raw, staticmethod) else wrapper))
    for module, attr, api in aliases:
        out.append((module, attr, make_wrapper(runtime, recorder, getattr(module, attr), api, vars(module))))
    return out
