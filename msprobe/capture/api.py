"""API-level (L1) capture: wrappers around the functions and Tensor methods listed in
``support_wrap_ops.yaml`` (seed: "修改API支持列表"; spec §3.2).

Wrappers are installed at ``start()`` and removed at ``stop()``, so identity checks written outside a
start/stop window see MindSpore's own objects, and a debugger that is constructed but not started
costs nothing. A wrapper keeps ``__name__``, ``__qualname__``, ``__doc__`` and ``__wrapped__`` of the
original, and when the dump is not running or the call is nested inside another recorded call it
forwards directly to the original.
"""
from __future__ import annotations

import functools
import importlib
import os

import yaml

from msprobe.capture.calls import CallRecorder
from msprobe.capture.semantics import is_inplace

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


def make_wrapper(runtime, recorder: CallRecorder, original, api: str):
    """A function that records calls of ``original`` as API ``api`` while the dump runs."""
    inplace = is_inplace(api)

    def wrapper(*args, **kwargs):
        if not runtime.running or runtime.busy():
            return original(*args, **kwargs)
        return recorder.call(api, original, args, kwargs, inplace)

    functools.update_wrapper(wrapper, original)
    return wrapper


def build_wrappers(runtime, targets: list, recorder: CallRecorder | None = None) -> list:
    """``[(owner, attribute, wrapper)]`` for every target (static methods stay static; class
    methods are skipped: they are bound to the class, not API calls on data)."""
    recorder = recorder or CallRecorder(runtime)
    out = []
    for owner, attr, api in targets:
        raw = vars(owner).get(attr) if isinstance(owner, type) else None
        if isinstance(raw, classmethod):
            continue
        wrapper = make_wrapper(runtime, recorder, getattr(owner, attr), api)
        out.append((owner, attr, staticmethod(wrapper) if isinstance(raw, staticmethod) else wrapper))
    return out
