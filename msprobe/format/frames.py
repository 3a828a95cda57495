"""Stack frames as the commands print them, and as ``anomalies.json`` holds them: one line each.

``stack.json`` keeps the seed's form of a frame, two lines: ``"File {path}, line {n}, in {function},
\\n {source line}"``. What the ``msprobe`` commands print (``show`` and ``first-diff``, as text or
``--json``, and the HTML report), and ``anomalies.json``'s ``stack`` (format version 2; version 1
copied the two-line form), is that text without its line break, ``"File {path}, line {n}, in
{function},  {source line}"``, in ``stack.json``'s order: innermost frame first.
"""
from __future__ import annotations

from typing import Iterable, List, Optional


def frame_line(frame: str) -> str:
    """One ``stack.json`` frame as one line (its line break removed; a one-line frame is returned
    unchanged)."""
    return frame.replace("\n", "")


def frame_lines(frames: Optional[Iterable[str]]) -> Optional[List[str]]:
    """:func:`frame_line` of each frame, in the same order (innermost first); ``None`` stays ``None``."""
    return None if frames is None else [frame_line(f) for f in frames]
