"""Call-stack capture, interned per code location (seed: ``stack.json``).

A stack is identified by the ``(id of the code object, last instruction)`` of every frame, read in one
tight loop (in C when :mod:`msprobe.tensors.hotpath` is built: ~1 µs for 45 frames; building
``(code, f_lineno)`` pairs and filtering on the way took 20 µs, and a key of code objects costs
~0.5 µs per frame to hash).
Rendering (line numbers, source lines, leaving out frames inside the msprobe package so the innermost
frame shown is the user's call site) happens once per distinct stack. A Cell's stack is read inside
MindSpore's ``Cell.__call__`` (its forward pre-hook); those innermost frames of MindSpore's Cell call
(``mindspore/nn/cell.py`` up to ``Cell.__call__``, with what it calls inside the ``mindspore`` package)
are left out too, so a Cell's stack starts, like an API's, at the line that called it. So are, for a
``Jit.{function}.{n}`` entry, the innermost frames of MindSpore's ``jit`` wrapper (its module's
``staging_specialize``, then, for a Cell's compiled ``construct``, MindSpore's Cell call).
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
        #: the code objects of every key in ``_ids``: kept alive, so no id in a key is reused
        self._codes: list[tuple] = []

    def current(self) -> int:
        """Id of the calling thread's stack, rendering it if new."""
        ext = hotpath.ext
        if ext is not None:
            key = ext.stack_key(1, MAX_WALK)  # the same key, walked in C
        else:
            key = stack_key(sys._getframe(1))
        sid = self._ids.get(key)
        if sid is None:
            sid = self._add(key, stack_codes(sys._getframe(1)))  # the frames the key was read from
        return sid

    def of_caller(self, key: tuple) -> int:
        """Id of the stack whose :func:`stack_key` is ``key``, read from the frame calling this method
        (the compiled per-call path reads the key of its caller's frames, then asks here when the
        key is new), rendering it if new."""
        sid = self._ids.get(key)
        if sid is None:
            sid = self._add(key, stack_codes(sys._getframe(1)))
        return sid

    def _add(self, key: tuple, codes: tuple) -> int:
        # several instructions of one line (``f(a) + f(b)``) render alike: one id
        rendered = self._render(codes, key[1::2])
        sid = self._by_render.get(tuple(rendered))
        if sid is None:
            sid = self._by_render[tuple(rendered)] = len(self.rendered)
            self.rendered.append(rendered)
        self._ids[key] = sid
        self._codes.append(codes)
        return sid

    def empty(self) -> int:
        """Id of the stack without frames (a call made inside a compiled graph has no Python stack)."""
        sid = self._by_render.get(())
        if sid is None:
            sid = self._by_render[()] = len(self.rendered)
            self.rendered.append([])
        return sid

    def _render(self, codes: tuple, offsets: tuple) -> list[str]:
        lines = []
        frames = [(code, lasti) for code, lasti in zip(codes, offsets)
                  if not code.co_filename.startswith(_PACKAGE_DIR)]
        for code, lasti in frames[_mindspore_call_frames(frames):]:
            if len(lines) == self.max_depth:
                break
            line = _line_of(code, lasti)
            source = linecache.getline(code.co_filename, line).strip()
            lines.append(f"File {code.co_filename}, line {line}, in {code.co_name}, \n {source}")
        return lines


def _mindspore_call_frames(frames: list) -> int:
    """How many innermost ``(code, lasti)`` of ``frames`` are MindSpore's own machinery of the call
    recorded: the frames of MindSpore's ``jit`` module (the wrapper of a compiled function or
    ``construct``, which calls the executor the tool records at), then MindSpore's call of a Cell
    (:func:`_cell_call_frames`: a Cell whose ``construct`` is compiled)."""
    jit_py = _jit_module_file()
    k = 0
    while k < len(frames) and frames[k][0].co_filename == jit_py:
        k += 1
    return k + _cell_call_frames(frames[k:])


def _jit_module_file() -> str | None:
    """The file of MindSpore's module holding ``jit`` and its executor (``mindspore/graph/api.py``;
    ``mindspore/common/api.py`` in older layouts), None before MindSpore is imported."""
    for name in ("mindspore.graph.api", "mindspore.common.api"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "_JitExecutor"):
            return getattr(module, "__file__", None)
    return None


def _cell_call_frames(frames: list) -> int:
    """How many innermost ``(code, lasti)`` of ``frames`` are MindSpore's call of a Cell: when the
    innermost is in ``mindspore/nn/cell.py``, every frame up to and including the first
    ``Cell.__call__``, all of them inside the ``mindspore`` package; else 0."""
    module = sys.modules.get("mindspore.nn.cell")
    cell_py = getattr(module, "__file__", None)
    if not frames or cell_py is None or frames[0][0].co_filename != cell_py:
        return 0
    package = os.path.dirname(os.path.dirname(cell_py)) + os.sep
    for k, (code, _) in enumerate(frames):
        if not code.co_filename.startswith(package):
            return 0
        if code.co_name == "__call__" and code.co_filename == cell_py:
            return k + 1
    return 0


def stack_key(frame) -> tuple:
    """``(id(code), f_lasti, id(code), f_lasti, ...)`` from ``frame`` outwards, at most ``MAX_WALK``
    frames: ids, because hashing a tuple of code objects hashes each one's bytecode and constants
    (~0.5 us per frame); :class:`StackTable` keeps the code objects, so the ids stay theirs."""
    key = []
    append = key.append
    depth = 0
    while frame is not None and depth < MAX_WALK:
        append(id(frame.f_code))
        append(frame.f_lasti)
        frame = frame.f_back
        depth += 1
    return tuple(key)


def stack_codes(frame) -> tuple:
    """The code objects of the frames :func:`stack_key` reads from ``frame``."""
    codes = []
    while frame is not None and len(codes) < MAX_WALK:
        codes.append(frame.f_code)
        frame = frame.f_back
    return tuple(codes)


def _line_of(code, lasti: int) -> int:
    """Source line of the instruction at byte offset ``lasti`` (what ``frame.f_lineno`` gives)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno
