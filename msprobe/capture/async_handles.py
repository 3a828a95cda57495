"""Asynchronous calls that return a work handle.

A collective called with ``async_op=True`` (``mint.distributed``, or any custom API) returns a handle —
alone or inside a tuple such as ``(out, handle)`` — and its result exists only after
``handle.wait()``. Statistics taken when the call returns would describe an unfinished buffer. So when
a recorded call returns an object with a callable ``wait`` (not a Tensor), its forward ``output`` is
*not* recorded at return; the handle's ``wait`` is wrapped instead and the output is recorded right
after the first ``wait()`` that returns normally — exactly once (later waits go straight through,
a wait that raises records nothing). The class is recognised by the return value, not by how
``async_op`` was passed, so positional and keyword forms behave the same.

Handles never waited are released at ``step()``: their ``wait`` is restored, they are forgotten (the
pending list never grows across steps), one WARNING names them, and ``coverage.json`` lists them under
``unwaited_async_handles``. A handle whose ``wait`` cannot be replaced (no instance attributes) is
recorded at return, as before, with one WARNING.
"""
from __future__ import annotations

import logging
import threading
import weakref

from mindspore import Tensor

from msprobe.capture.semantics import as_output_list, written_output

logger = logging.getLogger("msprobe")

_registries: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_unwrappable_warned = False


def _find_handle(out):
    """The work handle in a call's return value (the value itself, or an item of a tuple/list)."""
    if out is None or isinstance(out, (Tensor, str, bytes, int, float)):
        return None
    if isinstance(out, (tuple, list)):
        for item in out:
            if item is not None and not isinstance(item, Tensor) and callable(getattr(item, "wait", None)):
                return item
        return None
    return out if callable(getattr(out, "wait", None)) else None


class PendingHandles:
    """Handles of one runtime whose output is still to be recorded: ``id(handle) -> pending``."""

    def __init__(self, runtime):
        self.rt = runtime
        self.pending: dict = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.pending)

    def defer(self, fwd: str, api: str, args: tuple, kwargs: dict, out) -> bool:
        """Record ``fwd``'s output after the first successful ``wait()`` of the handle in ``out``.
        Returns False when ``out`` holds no handle (or it cannot be wrapped): record now."""
        global _unwrappable_warned
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
            self._complete(key)
            return result

        try:
            handle.wait = wait
        except (AttributeError, TypeError):
            if not _unwrappable_warned:
                _unwrappable_warned = True
                logger.warning("msprobe: %s returned a %s whose wait() cannot be wrapped; its output "
                               "is recorded when the call returns, possibly before completion",
                               fwd, type(handle).__name__)
            return False
        with self._lock:
            self.pending[key] = (handle, fwd, value, self.rt.writer)
        return True

    def _complete(self, key: int) -> None:
        with self._lock:
            item = self.pending.pop(key, None)
        if item is None:
            return
        handle, fwd, value, writer = item
        _restore(handle)
        rt = self.rt
        with rt.tool_code():
            try:
                rt.record(fwd, "output", value, "output", writer=writer)
            except Exception as exc:  # tool failure: keep training
                logger.warning("msprobe: failed to record %s after wait(): %r", fwd, exc)

    def release(self) -> list:
        """Forget every handle not waited yet (step end); returns their entry names."""
        with self._lock:
            items, self.pending = list(self.pending.values()), {}
        names = []
        for handle, fwd, _, _ in items:
            _restore(handle)
            names.append(fwd)
        if names:
            logger.warning("msprobe: %d async handle(s) were never waited before step end, their "
                           "outputs are not recorded: %s", len(names), ", ".join(names))
        return names


def _restore(handle) -> None:
    try:
        del handle.wait
    except (AttributeError, TypeError):
        pass


def pending_for(runtime) -> PendingHandles:
    """The pending-handle registry of ``runtime`` (created on first use)."""
    registry = _registries.get(runtime)
    if registry is None:
        registry = _registries[runtime] = PendingHandles(runtime)
    return registry


def defer_until_wait(runtime, fwd: str, api: str, args: tuple, kwargs: dict, out) -> bool:
    """Called by the recorder before recording a forward output; True when it was deferred."""
    if _find_handle(out) is None:
        return False
    return pending_for(runtime).defer(fwd, api, args, kwargs, out)


def release_pending(runtime) -> None:
    """Step end: release unwaited handles and list them in the step's ``coverage.json``."""
    registry = _registries.get(runtime)
    if registry is None or not registry.pending:
        return
    names = registry.release()
    if names:
        runtime.add_note("unwaited_async_handles",
                         [{"entry": n, "note": "handle never waited; output not recorded"} for n in names])
