"""Asynchronous calls that return a work handle.

A collective called with ``async_op=True`` (``mint.distributed``, or any custom API) returns a handle —
alone or inside a tuple such as ``(out, handle)`` — and its result exists only after
``handle.wait()``. Statistics taken when the call returns would describe an unfinished buffer. So when
a recorded call returns an object with a callable ``wait`` (not a Tensor), its forward ``output`` is
*not* recorded at return; the handle's ``wait`` is wrapped instead and the output is recorded right
after the first ``wait()`` that returns normally — exactly once (later waits go straight through,
a wait that raises records nothing). The class is recognised by the return value, not by how
``async_op`` was passed, so positional and keyword forms behave the same.

The waiting calls belong to the runtime (:class:`msprobe.engine.deferred.DeferredOutputs`), with the
step token of their step. Handles never waited are released when the step ends
(:meth:`msprobe.engine.runtime.Runtime.end_step`): their ``wait`` is restored, they are forgotten (the
pending list never grows across steps), one WARNING names them, and ``coverage.json`` lists them under
``unwaited_async_handles``. A handle whose ``wait`` cannot be replaced (no instance attributes) is
recorded at return, as before, with one WARNING.
"""
from __future__ import annotations

import logging

from mindspore import Tensor

from msprobe.capture.semantics import as_output_list, written_output

logger = logging.getLogger("msprobe")


#: exact types that are no work handle: looked up before ``isinstance(x, Tensor)``, which asks the
#: ``abc`` machinery of ``mindspore.Tensor`` in Python for every value that is not a Tensor
_NO_HANDLE = frozenset((type(None), Tensor, str, bytes, int, float, bool))


def _find_handle(out):
    """The work handle in a call's return value (the value itself, or an item of a tuple/list)."""
    kind = type(out)
    if kind in _NO_HANDLE or (kind is not tuple and kind is not list
                              and isinstance(out, (Tensor, str, bytes, int, float))):
        return None
    if isinstance(out, (tuple, list)):
        for item in out:
            if type(item) in _NO_HANDLE:
                continue
            if not isinstance(item, Tensor) and callable(getattr(item, "wait", None)):
                return item
        return None
    return out if callable(getattr(out, "wait", None)) else None


def pending_for(runtime):
    """The calls of ``runtime`` waiting for a ``wait()`` (its
    :class:`~msprobe.engine.deferred.DeferredOutputs`; ``len()`` is their number)."""
    return runtime.deferred


def defer_until_wait(runtime, fwd: str, api: str, args: tuple, kwargs: dict, out) -> bool:
    """Called by the recorder before recording a forward output: when ``out`` holds a work handle,
    record ``fwd``'s output after the handle's first successful ``wait()`` instead. Returns True
    when it was deferred, False when ``out`` holds no handle (or it cannot be wrapped): record now."""
    handle = _find_handle(out)
    if handle is None:
        return False
    if handle is out:  # the result is the written argument (collectives) or nothing
        value = as_output_list(written_output(api, args, kwargs, None))
    else:
        value = [None if item is handle else item for item in out]
    original_wait = handle.wait
    key = id(handle)

    def wait(*a, **k):
        result = original_wait(*a, **k)
        _complete(runtime, key)
        return result

    try:
        handle.wait = wait
    except (AttributeError, TypeError):
        if runtime.first_time(("unwrappable wait",)):
            logger.warning("msprobe: %s returned a %s whose wait() cannot be wrapped; its output "
                           "is recorded when the call returns, possibly before completion",
                           fwd, type(handle).__name__)
        return False
    runtime.deferred.add(key, fwd, value, runtime.step_token, lambda: _restore(handle))
    return True


def _complete(rt, key: int) -> None:
    item = rt.deferred.take(key)
    if item is None:
        return
    fwd, value, token = item
    with rt.tool_code():
        try:
            rt.record(fwd, "output", value, "output", token=token)
        except Exception as exc:  # tool failure: keep training
            logger.warning("msprobe: failed to record %s after wait(): %r", fwd, exc)


def _restore(handle) -> None:
    try:
        del handle.wait
    except (AttributeError, TypeError):
        pass
