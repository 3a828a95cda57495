"""Disk use of the tensor task: a byte budget and a size estimate.

* ``tensor_budget_mb`` (``tensor`` section of config.json): once the ``.npy`` data saved in this run
  reaches the budget, the dump switches to statistics for the rest of the run (one WARNING); the
  entries already written keep their files, later entries get statistics only, and the dump stays
  valid. The check is made per recorded value, so the run may exceed the budget by the tensors of
  one call. Bytes are counted as written: the tensor's size in its dtype, bf16 as float32.
* After the first dumped step closes, one INFO line gives what it wrote and an estimate for the
  configured steps (``step 0 wrote 12.3 MB in ...; 5 configured steps ≈ 61.5 MB``).
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger("msprobe")

_MB = 1 << 20


def _slot_bytes(slot) -> int:
    tensor = slot.tensor
    n = getattr(tensor, "nbytes", None)
    if not isinstance(n, int):
        n = slot.nbytes()
    if slot.dtype == "BFloat16":  # saved upcast to float32
        n *= 2
    return n


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
        self.spent += sum(_slot_bytes(s) for s in slots if s.data_name)
        if self.spent >= self.limit:
            self.exhausted = True
            logger.warning("msprobe: tensor_budget_mb=%g reached (%.1f MB of .npy data saved); the dump "
                           "switches to statistics for the rest of the run (no more .npy files)",
                           self.limit_mb, self.spent / _MB)

    def estimate_after_step(self, directory: str | None, step: int, configured_steps: int) -> None:
        """Log once, after the first dumped step, what it wrote and what the run may write."""
        if self._estimated or not directory or not os.path.isdir(directory):
            return
        self._estimated = True
        size = _tree_bytes(directory)
        if configured_steps:
            total = f"{configured_steps} configured steps ≈ {size * configured_steps / _MB:.1f} MB"
        else:
            total = f"every further step (no step list) ≈ {size / _MB:.1f} MB more"
        logger.info("msprobe: step %d wrote %.1f MB in %s; %s", step, size / _MB, directory, total)


def _tree_bytes(directory: str) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
