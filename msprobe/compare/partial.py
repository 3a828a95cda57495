"""Comparing a dump that holds only part of its step (``dump.json`` ``partial``: watch mode's history
kept the step's last entries) with a dump of the whole step: on the entries both hold.

A partial step holds the end of its step, in written order, from some call on. The entries of the
other dump written before the counterpart of that call are not in it because they were left out,
not because the runs executed different calls: they are dropped from the pairs (no row, no verdict)
and a note says which side is partial and from which call it is compared.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from msprobe.compare.records import Side

Pair = Tuple[Optional[int], Optional[int], str]


def overlap(target: Side, golden: Side, pairs: List[Pair], step: Optional[int] = None
            ) -> Tuple[List[Pair], Optional[str]]:
    """The ``pairs`` (:func:`msprobe.compare.matching.match`) restricted to where a partial side
    begins, and the note that says so (``None``, pairs unchanged: neither side is partial, or the
    partial side shares no entry with the other).

    Args:
        target, golden: the two sides; ``header["partial"]`` marks a partial one.
        pairs: ``(target index, golden index, how)`` in target execution order.
        step: the step number, for the note.
    """
    notes = []
    for partial, name in ((0, "target"), (1, "golden")):
        side = (target, golden)[partial]
        if not side.header.get("partial"):
            continue
        first = next((p for p in pairs if p[0] is not None and p[1] is not None), None)
        if first is None:
            continue
        full, begin = 1 - partial, first[1 - partial]
        kept = [p for p in pairs if not (p[partial] is None and p[full] is not None and p[full] < begin)]
        left_out = len(pairs) - len(kept)
        pairs = kept
        where = f"step {step}" if step is not None else "its step"
        other = "golden" if name == "target" else "target"
        notes.append(f"the {name} dump is a partial history of {where} ({side.header['partial']}): it "
                     f"begins at {side.names[first[partial]]}; compared from there on, the {left_out} "
                     f"{other} entries before it are left out")
    return pairs, "; ".join(notes) or None
