"""Disk use of the tensor task: a byte budget and a size estimate.

* ``tensor_budget_mb`` (``tensor`` section of config.json): once the ``.npy`` data saved in this run
  reaches the budget, the dump switches to statistics for the rest of the run (one WARNING); the
  entries already written keep their files, later entries get statistics only, and the dump stays
  valid. The check is made per recorded value (a call's inputs, or its outputs), so the run may
  exceed the budget by the tensors of one value. Bytes are counted as the files take them: the
  ``.npy`` header and the tensor's size in its dtype, bf16 as float32.
* After the first dumped step closes, one INFO line gives what it wrote and an estimate for the
  configured steps (``step 0 wrote 12.3 MB in ...; 5 configured steps ≈ 61.5 MB``).

Sizes in messages are in KB below 1 MB (1 KB = 1024 bytes, 1 MB = 1024 KB).
"""
from __future__ import annotations

import logging
import os

from msprobe.format.npy import header_size

logger = logging.getLogger("msprobe")

_MB = 1 << 20


def size_text(n: float) -> str:
    """``n`` bytes as ``"51.2 KB"`` below 1 MB, else ``"12.3 MB"``."""
    return f"{n / 1024:.1f} KB" if n < _MB else f"{n / _MB:.1f} MB"


def _slot_bytes(slot) -> int:
    """Bytes of the ``.npy`` file of ``slot``: header and data."""
    tensor = slot.tensor
    n = getattr(tensor, "nbytes", None)
    if not isinstance(n, int):
        n = slot.nbytes()
    if slot.dtype == "BFloat16":  # saved upcast to float32
        n *= 2
    return n + header_size(slot.shape)


class TensorBudget:
    """Counts ``.npy`` bytes of one run and switches tensor saving off at ``tensor_budget_mb``."""

    def __init__(self, config):
        mb = getattr(config, "tensor_budget_mb", None)
        self.limit = int(mb * _MB) if mb else None
        self.limit_mb = mb  # as configured, for messages
        self.spent = 0
        self.exhausted = False
        self._estimated = False

    def allows(self) -> bool:
        """Whether tensors may still be saved."""
        return not self.exhausted

    def spend(self, slots) -> None:
        """Count the slots about to be saved (those with a file name)."""
        if self.limit is None or self.exhausted:
            return
        value = sum(_slot_bytes(s) for s in slots if s.data_name)
        self.spent += value
        if self.spent >= self.limit:
            self.exhausted = True
            logger.warning("msprobe: tensor_budget_mb=%g (%s) reached: %s of .npy files saved, the last "
                           "recorded value's %s included; the dump switches to statistics for the rest "
                           "of the run (no more .npy files)", self.limit_mb, size_text(self.limit),
                           size_text(self.spent), size_text(value))

    def estimate_after_step(self, directory: str | None, step: int, configured_steps: int) -> None:
        """Log once, after the first dumped step, what it wrote and what the run may write."""
        if self._estimated or not directory or not os.path.isdir(directory):
            return
        self._estimated = True
        size = _tree_bytes(directory)
        if configured_steps:
            total = f"{configured_steps} configured steps ≈ {size_text(size * configured_steps)}"
        else:
            total = f"every further step (no step list) ≈ {size_text(size)} more"
        logger.info("msprobe: step %d wrote %s in %s; %s", step, size_text(size), directory, total)


def _tree_bytes(directory: str) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
