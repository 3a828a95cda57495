"""Mutation guard: flush pending records before an in-place operation changes a tensor.

Hooks keep references to tensors and statistics are read later (deferred). An in-place operation
(``x.add_(1)``, ``x[0] = 5``, ``x += y``, ``ops.assign`` and its other names such as
``mindspore.ops.functional.assign``) could change a referenced tensor before the
flush, so while the dump runs every in-place Tensor method and in-place functional API that is not
already wrapped for capture gets a thin guard: if anything is pending, flush first, then run the
original. Cost when nothing is pending: one attribute check.
"""
from __future__ import annotations

import functools

import mindspore
from mindspore import Tensor

from msprobe.capture.api import alias_modules
from msprobe.capture.semantics import COLLECTIVE_WRITES, is_inplace
from msprobe.engine.handles import AttributePatches


def inplace_targets(exclude: set) -> list:
    """``[(owner, attribute)]`` of in-place Tensor methods and ops functions not in ``exclude``."""
    return [t for t in _candidates() if t not in exclude]


@functools.lru_cache(maxsize=1)
def _candidates() -> tuple:
    out = []
    for name in dir(Tensor):
        if is_inplace(f"Tensor.{name}") and name not in ("requires_grad_",) and callable(getattr(Tensor, name, None)):
            out.append((Tensor, name))
    functions = [getattr(mindspore.ops, name, None)
                 for name in ("assign", "assign_add", "assign_sub", "scatter_update", "scatter_nd_update")]
    functions = {id(f): f for f in functions if callable(f)}
    for module, _ in [(mindspore.ops, None)] + alias_modules():  # F.assign is ops.assign, too
        for name, value in list(vars(module).items()):
            if not name.startswith("_") and functions.get(id(value)) is value and (module, name) not in out:
                out.append((module, name))
    try:  # torch-style collectives write into their arguments (all_reduce(tensor), ...)
        import mindspore.mint.distributed as dist
    except Exception:  # communication unavailable in this build
        dist = None
    for name in COLLECTIVE_WRITES if dist is not None else ():
        if callable(getattr(dist, name, None)):
            out.append((dist, name))
    return tuple(out)


def guard_patches(runtime, targets: list) -> AttributePatches:
    """The guard as a prepared :class:`~msprobe.engine.handles.AttributePatches` over ``targets``
    (``[(owner, attribute)]``, e.g. from :func:`inplace_targets`): built once, applied per step."""
    items = []
    for owner, name in targets:
        if isinstance(vars(owner).get(name), (staticmethod, classmethod)):
            continue
        original = getattr(owner, name)

        def guarded(*args, __original=original, **kwargs):
            if runtime.has_pending and not runtime.busy():
                runtime.flush(settle=False)  # read before the change; files may follow
            return __original(*args, **kwargs)

        functools.update_wrapper(guarded, original)
        items.append((owner, name, guarded))
    return AttributePatches(items)
