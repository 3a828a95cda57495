"""Which entries are recorded: the ``list`` filter of config.json (spec §2.4).

A ``list`` item matches an entry when it is a substring of the entry's full name (``"relu"`` matches
``Functional.relu.0.forward``). An empty list selects everything. Filtering never changes call
numbering: counters advance for every call, recorded or not.
"""
from __future__ import annotations


class Selector:
    """Decides, per entry name, whether its data is recorded."""

    def __init__(self, config):
        self.items = tuple(config.api_list) if config.level != "L2" else ()

    def selects(self, entry: str) -> bool:
        if not self.items:
            return True
        return any(item in entry for item in self.items)

    def reset(self) -> None:
        """Per-step reset (stateless for ``list``)."""
