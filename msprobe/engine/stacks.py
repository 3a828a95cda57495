"""Call-stack capture, interned per code location (seed: ``stack.json``).

A stack is identified by the ``(code object, last instruction)`` of every frame, read in one tight loop
(about 5 µs for 45 frames; building ``(code, f_lineno)`` pairs and filtering on the way took 20 µs).
Rendering (line numbers, source lines, leaving out frames inside the msprobe package so the innermost
frame shown is the user's call site) happens once per distinct stack.
"""
from __future__ import annotations

import linecache
import os
import sys

from msprobe.tensors import hotpath

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: frames walked at most (tool and library frames included); ``max_depth`` limits the rendered ones
MAX_WALK = 256


class StackTable:
    """Maps each distinct call stack to a small integer id and keeps its rendered frames.

    Args:
        max_depth: most frames rendered per stack (outside the msprobe package), innermost first.
    """

    def __init__(self, max_depth: int = 64):
        self.max_depth = max_depth
        self._ids: dict[tuple, int] = {}
        self._by_render: dict[tuple, int] = {}
        self.rendered: list[list[str]] = []

    def current(self) -> int:
        """Id of the calling thread's stack, rendering it if new."""
        ext = hotpath.ext
        if ext is not None:
            key = ext.stack_key(1, MAX_WALK)  # the same key, walked in C
        else:
            key = stack_key(sys._getframe(1))
        sid = self._ids.get(key)
        if sid is None:  # several instructions of one line (``f(a) + f(b)``) render alike: one id
            rendered = self._render(key)
            sid = self._by_render.get(tuple(rendered))
            if sid is None:
                sid = self._by_render[tuple(rendered)] = len(self.rendered)
                self.rendered.append(rendered)
            self._ids[key] = sid
        return sid

    def _render(self, key: tuple) -> list[str]:
        lines = []
        for i in range(0, len(key), 2):
            code, lasti = key[i], key[i + 1]
            if code.co_filename.startswith(_PACKAGE_DIR):
                continue
            if len(lines) == self.max_depth:
                break
            line = _line_of(code, lasti)
            source = linecache.getline(code.co_filename, line).strip()
            lines.append(f"File {code.co_filename}, line {line}, in {code.co_name}, \n {source}")
        return lines


def stack_key(frame) -> tuple:
    """``(code, f_lasti, code, f_lasti, ...)`` from ``frame`` outwards, at most ``MAX_WALK`` frames."""
    key = []
    append = key.append
    depth = 0
    while frame is not None and depth < MAX_WALK:
        append(frame.f_code)
        append(frame.f_lasti)
        frame = frame.f_back
        depth += 1
    return tuple(key)


def _line_of(code, lasti: int) -> int:
    """Source line of the instruction at byte offset ``lasti`` (what ``frame.f_lineno`` gives)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno
