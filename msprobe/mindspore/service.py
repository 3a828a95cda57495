"""DumpService: what gets installed for each level, and the start/stop/step lifecycle (spec §3.1).

* ``start()`` on a dumped step and rank installs the capture for the level and switches recording on:
  L1 -> API wrappers (+ Primitive hooks when a model was given); L0 -> Cell hooks; mix -> both. A
  mutation guard is installed at every level. Everything installed goes into one ``HandleSet``.
* ``stop()`` switches recording off, removes every installed hook and patch, and writes the seed's
  files for what was recorded so far. Gradient probes already attached to tensors still report, so
  ``start - forward - stop - backward - step`` captures the backward too (seed: 采集指定代码块的前反向数据).
* ``step()`` closes the step directory and resets per-step state.
Calling ``start`` twice, or ``stop`` without ``start``, does nothing.
"""
from __future__ import annotations

import atexit
import logging
import weakref

from mindspore import nn

from msprobe.capture.api import install_api_wrappers, load_api_list, resolve_targets
from msprobe.capture.calls import CallRecorder
from msprobe.capture.cell import CellCapture, iter_cells
from msprobe.capture.guard import inplace_targets, install_guard
from msprobe.capture.primitive import install_primitive_hooks
from msprobe.core.handles import HandleSet
from msprobe.core.runtime import Runtime

logger = logging.getLogger("msprobe")

_CELL_LEVELS = ("L0", "mix")
_API_LEVELS = ("L1", "mix")


class DumpService:
    """Owns the runtime and the installed capture of one :class:`PrecisionDebugger`."""

    def __init__(self, config):
        self.config = config
        self.runtime = Runtime(config)
        self.recorder = CallRecorder(self.runtime)
        self.models: list | None = None
        self.finished = False
        self._installed = HandleSet()
        self._api_targets = None
        atexit.register(_close_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ models
    def set_model(self, model) -> None:
        """Remember the model(s) to hook: a Cell, or a list/tuple of Cells (names get the index)."""
        if isinstance(model, nn.Cell):
            self.models = [(None, model)]
        elif isinstance(model, (list, tuple)) and model and all(isinstance(m, nn.Cell) for m in model):
            self.models = [(i, m) for i, m in enumerate(model)]
        else:
            raise TypeError("start(model=...): model must be a mindspore.nn.Cell or a list/tuple of "
                            f"mindspore.nn.Cell, got {type(model).__name__}")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Switch recording on for the current step if it is dumped. Returns whether it is on."""
        rt, cfg = self.runtime, self.config
        if self.finished or rt.running:
            return rt.running
        if cfg.last_step is not None and rt.step > cfg.last_step:
            self._finish()
            return False
        if not cfg.dumps_step(rt.step):
            return False
        if cfg.level in _CELL_LEVELS and self.models is None:
            raise ValueError(f"level {cfg.level!r} needs the model: call debugger.start(model) with the "
                             "network (a mindspore.nn.Cell or a list of Cells)")
        rank = rt.resolve_rank()
        if not cfg.dumps_rank(rank):
            return False
        rt.open_step()
        self._install()
        rt.running = True
        logger.info("msprobe: dump started at step %d (%s)", rt.step, rt.writer.directory)
        return True

    def _install(self) -> None:
        level = self.config.level
        wrapped = set()
        if level in _API_LEVELS:
            if self._api_targets is None:
                self._api_targets = resolve_targets(load_api_list())
            self._installed.add(install_api_wrappers(self.runtime, self._api_targets, self.recorder))
            wrapped = {(owner, attr) for owner, attr, _ in self._api_targets}
            if self.models is not None:
                cells = [cell for _, root in self.models for _, cell in root.cells_and_names()]
                self._installed.add(install_primitive_hooks(self.recorder, cells))
        if level in _CELL_LEVELS:
            self._installed.add(CellCapture(self.runtime).install(self.models))
        self._installed.add(install_guard(self.runtime, inplace_targets(wrapped)))

    def stop(self) -> None:
        rt = self.runtime
        if not rt.running:
            return
        rt.running = False
        self._installed.remove()
        rt.write_files()

    def step(self) -> None:
        self.stop()
        self.runtime.end_step()

    def _finish(self) -> None:
        self.finished = True
        logger.info("msprobe: all configured steps are dumped (last step %s); the dump is switched off",
                    self.config.last_step)

    def close(self) -> None:
        """Flush and close everything (process exit)."""
        self.stop()
        if self.runtime.writer is not None:
            self.runtime.flush()
            self.runtime.writer.close()


def _close_at_exit(ref) -> None:
    service = ref()
    if service is not None:
        try:
            service.close()
        except Exception as exc:  # never fail interpreter exit
            logger.warning("msprobe: could not finish the dump at exit: %r", exc)
