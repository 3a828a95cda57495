"""Primitive capture (L1/mix with ``start(model)``): Primitive instances held by the
model's Cells (``nn.Dense`` -> ``MatMul``, ``BiasAdd``; ``nn.Conv2d`` -> ``Conv2D`` ...).

Python looks ``__call__`` up on the type, so each hooked instance gets its class swapped to a cached
subclass whose ``__call__`` records the call; the handle swaps the original class back. Entries are
named ``Primitive.{attribute}.{PrimitiveClass}.{n}.{forward|backward}``.

What a run hooks is kept on the instance (``_msprobe_probe``: runtime, the recorder's method for this
Primitive's calls, API name, in-place flag), removed by the handle. The one module-level cache, ``_SUBCLASSES`` (Primitive class -> its hooked
subclass), is a function of the class only: the subclass's ``__call__`` finds the run through the
instance's probe, so one subclass per class serves every run (and an instance hooked by one
debugger and later by another gets the same class).
"""
from __future__ import annotations

import contextlib

from mindspore.ops import Primitive

from msprobe.capture.semantics import primitive_is_inplace
from msprobe.engine.handles import Handle

_PROBE = "_msprobe_probe"
_SUBCLASSES: dict = {}


def _hooked_class(cls):
    sub = _SUBCLASSES.get(cls)
    if sub is not None:
        return sub
    original_call = cls.__call__

    def __call__(self, *args, **kwargs):
        probe = self.__dict__.get(_PROBE)
        if probe is None or not probe[0].capturing():
            return original_call(self, *args, **kwargs)
        _, record, api, inplace = probe
        # the original bound to this instance (a bound method: cheaper to make than a partial)
        return record(api, original_call.__get__(self, cls), args, kwargs, inplace)

    sub = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                      "__qualname__": cls.__qualname__})
    _SUBCLASSES[cls] = sub
    return sub


def primitive_targets(cells, keep=None) -> list:
    """``[(Primitive instance, api name)]`` held as attributes by ``cells`` (an iterable of
    ``nn.Cell``), each instance once; ``keep(api_name) -> bool`` (optional) drops Primitives that
    could never be recorded. Read once per model; :func:`install_primitive_hooks` applies it."""
    targets = []
    seen = set()
    for cell in cells:
        for attr, value in list(vars(cell).items()):
            if not isinstance(value, Primitive) or id(value) in seen:
                continue
            seen.add(id(value))
            api = f"Primitive.{attr}.{type(value).__name__}"
            if keep is None or keep(api):
                targets.append((value, api))
    return targets


def install_primitive_hooks(recorder, targets: list) -> Handle:
    """Hook the Primitives of :func:`primitive_targets` (an instance hooked already is skipped)."""
    hooked = []
    for prim, api in targets:
        if _PROBE not in prim.__dict__:
            original_class = type(prim)
            prim.__class__ = _hooked_class(original_class)
            inplace = primitive_is_inplace(prim)
            # the recording path is chosen here, once: the common case's when the API and config allow it
            record = recorder.fast_record if recorder.has_fast_path(api, inplace) else recorder.call
            prim.__dict__[_PROBE] = (recorder.rt, record, api, inplace)
            hooked.append((prim, original_class))

    def undo():
        for prim, original_class in reversed(hooked):
            prim.__dict__.pop(_PROBE, None)
            prim.__class__ = original_class
        hooked.clear()

    return Handle(undo, f"{len(hooked)} Primitive hooks")


@contextlib.contextmanager
def unhooked(targets: list):
    """Context in which the Primitives of ``targets`` (``[(Primitive instance, api name)]``) that
    :func:`install_primitive_hooks` hooked have their own class back; hooked again when it ends."""
    swapped = [(prim, type(prim)) for prim, _ in targets if _PROBE in prim.__dict__]
    for prim, hooked in swapped:
        prim.__class__ = hooked.__bases__[0]
    try:
        yield
    finally:
        for prim, hooked in swapped:
            prim.__class__ = hooked
