"""Removable handles for every hook or patch the tool installs (lesson "Handles" in STYLE.md).

``Handle.remove()`` is idempotent; a ``HandleSet`` removes its members in reverse install order, so
stacked patches of the same attribute unwind to the exact original object.
"""
from __future__ import annotations

from typing import Callable


class Handle:
    """Undo action for one installed hook or patch. Usable as a context manager."""

    __slots__ = ("_undo", "description")

    def __init__(self, undo: Callable[[], None], description: str = ""):
        self._undo = undo
        self.description = description

    @property
    def active(self) -> bool:
        return self._undo is not None

    def remove(self) -> None:
        """Undo the install. Calling it again does nothing."""
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


class HandleSet:
    """An ordered group of handles removed together (last installed, first removed)."""

    def __init__(self):
        self._handles: list[Handle] = []

    def add(self, handle: Handle) -> Handle:
        self._handles.append(handle)
        return handle

    def __len__(self) -> int:
        return sum(1 for h in self._handles if h.active)

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()


def patch_attribute(owner, name: str, new) -> Handle:
    """Replace ``owner.name`` by ``new``; the handle restores the exact original object.

    If the attribute was inherited (not in ``owner.__dict__``), removal deletes the override instead
    of pinning the inherited value on ``owner``.
    """
    own = name in vars(owner)
    original = vars(owner)[name] if own else getattr(owner, name)
    setattr(owner, name, new)

    def undo():
        if own:
            setattr(owner, name, original)
        else:
            try:
                delattr(owner, name)
            except AttributeError:
                pass

    return Handle(undo, f"{getattr(owner, '__name__', owner)}.{name}")
