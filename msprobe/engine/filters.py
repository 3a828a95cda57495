"""Which entries are recorded: ``scope`` and ``list`` of config.json.

* ``list``: an item matches an entry when it is a substring of the entry's full name (``"relu"``
  matches ``Functional.relu.0.forward``). In ``mix``, a Cell whose name matches is *expanded*: every API
  and sub-Cell that runs inside it is recorded too.
* ``scope``: ``[first, last]`` names of two calls (API names ``Functional.relu.0.forward`` at L1, Cell
  names ``Cell.fc1.Dense.forward.0`` at L0, either in mix). Every call from ``first`` to ``last``
  inclusive (in forward order) is recorded, with its forward and backward data. Unlike the reference
  tool, the last API's output and the last Cell's own record (and everything inside it) are included.
* ``scope`` and ``list`` combine with AND. An empty filter selects everything.
* Forward and backward entries of a call are selected on their own names (a ``list`` may name just
  ``X.relu.0.backward``). A Cell's ``parameters_grad`` entries are recorded when that Cell's backward
  entry was selected in the step, or (no scope) when a ``list`` item matches their name.

Filtering never changes call numbering: counters advance for every call, recorded or not.
"""
from __future__ import annotations

import re

from msprobe.engine.config import ConfigError

_API_NAME = re.compile(r"^(Distributed|MintDistributed|Functional|Tensor|Mint|MintFunctional|Primitive|Jit|\w+)\..+\.\d+\.(forward|backward)$")
_CELL_NAME = re.compile(r"^Cell\..+\.(forward|backward)\.\d+$")


def call_key(entry: str) -> str:
    """The call an entry belongs to, direction removed (``X.relu.0.forward`` -> ``X.relu.0``)."""
    parts = entry.split(".")
    if len(parts) >= 3 and parts[-1] in ("forward", "backward"):
        return ".".join(parts[:-1])
    if len(parts) >= 3 and parts[-2] in ("forward", "backward"):
        return ".".join(parts[:-2] + parts[-1:])
    return entry


def _check_scope(scope: tuple, level: str, section: str = "statistics") -> None:
    if not scope:
        return
    for i, name in enumerate(scope):
        is_cell = bool(_CELL_NAME.match(name))
        is_api = not is_cell and bool(_API_NAME.match(name))
        ok = {"L0": is_cell, "L1": is_api, "mix": is_cell or is_api}.get(level, True)
        if not ok:
            allowed = {"L0": "a Cell name like 'Cell.fc1.Dense.forward.0'",
                       "L1": "an API name like 'Functional.relu.0.forward'"}.get(
                level, "an API or Cell entry name")
            raise ConfigError(f"{section}.scope[{i}]", name, allowed, reason=f"not a valid bound at level {level}")


class Selector:
    """Decides, per entry name, whether its data is recorded. Stateful across a step (scope range);
    :meth:`reset` at each step."""

    def __init__(self, config):
        self.level = config.level
        self.items = tuple(config.api_list) if config.level != "L2" else ()
        self.scope = tuple(config.scope)
        _check_scope(self.scope, self.level, config.task)
        self._first = call_key(self.scope[0]) if self.scope else None
        self._last = call_key(self.scope[1]) if self.scope else None
        self._last_is_cell = bool(self.scope) and self.scope[1].startswith("Cell.")
        self.reset()

    def may_record_api(self, api: str) -> bool:
        """Whether any entry ``{api}.{n}.{forward|backward}`` of this API can ever be recorded.

        Only at L1 with a ``list`` can an API be ruled out (in mix a matching Cell records everything
        inside it). APIs named by a ``scope`` bound are always kept: their calls must be counted.
        Used to skip wrapping APIs that could never be recorded.
        """
        if self.level != "L1" or not self.items:
            return True
        if any(bound.startswith(api + ".") for bound in self.scope):
            return True
        return any(_could_match(item, api) for item in self.items)

    def reset(self) -> None:
        self._open = not self.scope
        self._met: set = set()  # the scope bounds (0 start, 1 end) a call of this step matched
        self._closing = False
        self._expanded: list = []
        self._bwd_cells: set = set()
        self._hit: set = set()  # the list items an entry name of this step contained

    def selects(self, entry: str) -> bool:
        key = call_key(entry)
        if self.scope:
            self._met.update(i for i, bound in enumerate((self._first, self._last)) if key == bound)
            if self._closing and key != self._last and not entry.endswith("backward"):
                self._open, self._closing = False, False
            if not self._open and key == self._first:
                self._open = True
            if not self._open:
                if self.items:  # a list item met outside the scope still matched a call
                    self._matches(entry)
                return False
            if key == self._last and not self._last_is_cell:
                self._closing = True
        if not self.items:
            return True
        return self._matches(entry) or bool(self._expanded)

    def _matches(self, entry: str) -> bool:
        """Whether a ``list`` item is a substring of ``entry``; every such item is noted as met."""
        hit = False
        for item in self.items:
            if item in entry:
                self._hit.add(item)
                hit = True
        return hit

    def unmatched_items(self) -> list:
        """The ``list`` items no entry name of this step contained (asked at its end), in config order."""
        return [item for item in self.items if item not in self._hit]

    def unmatched_scope(self) -> str | None:
        """What went wrong with ``scope`` in this step, for a warning at its end: each bound (start,
        end) that matched no call of the step, and what that did; None when both matched or there
        is no scope."""
        if not self.scope:
            return None
        missed = [f"{which} {self.scope[i]!r}" for i, which in enumerate(("start", "end"))
                  if i not in self._met]
        if not missed:
            return None
        effect = ("the scope never opened and nothing was selected" if 0 not in self._met
                  else "the scope stayed open to the step's end")
        return (f"the config's scope {' and '.join(missed)} matched no call of this step, so "
                f"{effect}")

    def note_backward(self, cell_prefix: str) -> None:
        """The backward entry of a call of Cell ``cell_prefix`` was selected in this step."""
        self._bwd_cells.add(cell_prefix)

    def selects_param_grad(self, cell_prefix: str, entry: str) -> bool:
        """Parameter gradients of a Cell: recorded when the Cell's backward data was
        selected in this step, or (no scope) when a ``list`` item matches the entry name. Does not
        change the scope state (it is asked during the backward pass)."""
        if cell_prefix in self._bwd_cells:
            return True
        if self.scope:
            return False
        return not self.items or self._matches(entry)

    def enter_cell(self, entry: str) -> None:
        """A Cell call started (its selection already made); mix expands list-matched Cells."""
        if self.level == "mix" and self.items and any(item in entry for item in self.items):
            self._expanded.append(entry)

    def exit_cell(self, entry: str) -> None:
        """A Cell call finished: closes a Cell-bounded scope and ends its list expansion."""
        if self._expanded and self._expanded[-1] == entry:
            self._expanded.pop()
        if self.scope and self._last_is_cell and call_key(entry) == self._last:
            self._met.add(1)
            self._open = False


def _could_match(item: str, api: str) -> bool:
    """Is ``item`` a substring of ``{api}.{n}.{forward|backward}`` for some call number ``n``?

    ``n`` only matters through the digits the item itself contains, so trying each digit run of the
    item (and 0) as ``n`` decides it exactly.
    """
    for n in {"0", *re.findall(r"\d+", item)}:
        for direction in ("forward", "backward"):
            if item in f"{api}.{n}.{direction}":
                return True
    return False
