"""Call-stack capture, interned per code location (seed: ``stack.json``).

Walking frames costs a few microseconds; rendering them (reading source lines) happens once per
distinct stack. Frames inside the msprobe package are left out, so the innermost frame shown is the
user's call site.
"""
from __future__ import annotations

import linecache
import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class StackTable:
    """Maps each distinct call stack to a small integer id and keeps its rendered frames."""

    def __init__(self, max_depth: int = 64):
        self.max_depth = max_depth
        self._ids: dict[tuple, int] = {}
        self.rendered: list[list[str]] = []

    def current(self) -> int:
        """Id of the calling thread's stack (user frames only), rendering it if new."""
        frame = sys._getframe(1)
        key = []
        depth = 0
        while frame is not None and depth < self.max_depth:
            code = frame.f_code
            if not code.co_filename.startswith(_PACKAGE_DIR):
                key.append((code, frame.f_lineno))
                depth += 1
            frame = frame.f_back
        key = tuple(key)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self.rendered)
            self.rendered.append([self._render(code, line) for code, line in key])
        return sid

    @staticmethod
    def _render(code, line: int) -> str:
        source = linecache.getline(code.co_filename, line).strip()
        return f"File {code.co_filename}, line {line}, in {code.co_name}, \n {source}"
