"""Primitive capture (L1/mix with ``start(model)``; spec §3.4): Primitive instances held by the
model's Cells (``nn.Dense`` -> ``MatMul``, ``BiasAdd``; ``nn.Conv2d`` -> ``Conv2D`` ...).

Python looks ``__call__`` up on the type, so each hooked instance gets its class swapped to a cached
subclass whose ``__call__`` records the call; the handle swaps the original class back. Entries are
named ``Primitive.{attribute}.{PrimitiveClass}.{n}.{forward|backward}``.
"""
from __future__ import annotations

import functools

from mindspore.ops import Primitive

from msprobe.core.handles import Handle, HandleSet

_PROBE = "_msprobe_probe"
_SUBCLASSES: dict = {}


def _hooked_class(cls):
    sub = _SUBCLASSES.get(cls)
    if sub is not None:
        return sub
    original_call = cls.__call__

    def __call__(self, *args, **kwargs):
        probe = self.__dict__.get(_PROBE)
        if probe is None:
            return original_call(self, *args, **kwargs)
        recorder, api, inplace = probe
        rt = recorder.rt
        if not rt.running or rt.busy():
            return original_call(self, *args, **kwargs)
        return recorder.call(api, functools.partial(original_call, self), args, kwargs, inplace)

    sub = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                      "__qualname__": cls.__qualname__})
    _SUBCLASSES[cls] = sub
    return sub


def _is_side_effect(prim) -> bool:
    attrs = getattr(prim, "attrs", None) or {}
    return bool(attrs.get("side_effect_mem", False))


def install_primitive_hooks(recorder, cells, keep=None) -> HandleSet:
    """Hook the Primitive attributes of ``cells`` (an iterable of ``nn.Cell``), each instance once;
    ``keep(api_name) -> bool`` (optional) skips Primitives that could never be recorded."""
    handles = HandleSet()
    seen = set()
    for cell in cells:
        for attr, value in list(vars(cell).items()):
            if not isinstance(value, Primitive) or id(value) in seen or _PROBE in value.__dict__:
                continue
            seen.add(id(value))
            api = f"Primitive.{attr}.{type(value).__name__}"
            if keep is None or keep(api):
                handles.add(_hook(value, recorder, api))
    return handles


def _hook(prim, recorder, api: str) -> Handle:
    original_class = type(prim)
    prim.__class__ = _hooked_class(original_class)
    prim.__dict__[_PROBE] = (recorder, api, _is_side_effect(prim))

    def undo():
        prim.__dict__.pop(_PROBE, None)
        prim.__class__ = original_class

    return Handle(undo, api)
