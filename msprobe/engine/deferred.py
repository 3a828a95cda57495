"""Outputs recorded later than their call returns.

A call that returns a work handle (an asynchronous collective) has its output recorded after the
handle's first ``wait()`` (:mod:`msprobe.capture.async_handles` wraps the ``wait``). Until then the
call waits here, with the :attr:`~msprobe.engine.runtime.Runtime.step_token` of its step and the
function that gives the handle its own ``wait`` back. The runtime owns one :class:`DeferredOutputs`
and releases what is still waiting when the step ends, so nothing of the user's is kept after
``step()``.
"""
from __future__ import annotations

import threading


class DeferredOutputs:
    """Calls whose output is still to be recorded: ``key -> (entry, value, token, undo)``."""

    def __init__(self):
        self._items: dict = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key, entry: str, value, token, undo) -> None:
        """Keep ``value`` (the call's output, to be recorded as ``entry`` of the step ``token``) until
        :meth:`take` or :meth:`release`; ``undo()`` restores the handle (called once, by either)."""
        with self._lock:
            self._items[key] = (entry, value, token, undo)

    def take(self, key):
        """The completed call ``key``: ``(entry, value, token)`` after calling its ``undo``, or
        ``None`` when it is not waiting (released at step end, or taken already)."""
        with self._lock:
            item = self._items.pop(key, None)
        if item is None:
            return None
        entry, value, token, undo = item
        undo()
        return entry, value, token

    def release(self) -> list:
        """Forget every waiting call (step end), calling each ``undo``; returns their entry names."""
        with self._lock:
            items, self._items = list(self._items.values()), {}
        for _, _, _, undo in items:
            undo()
        return [entry for entry, _, _, _ in items]
