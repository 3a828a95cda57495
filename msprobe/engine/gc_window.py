"""A larger gen-0 garbage-collector threshold while a step is captured.

A dumped step makes container objects that live until its files are written: pending records (up to
512 tensors between flushes) and the writer's live mirror of the journal. A young collection that
finds them alive moves them to an older generation; every tenth one promotes them to the oldest, and
once enough were promoted a full collection walks MindSpore's ~175k tracked objects (80-120 ms). At
CPython's default gen-0 threshold (700) that came every ~10 dumped steps; at 5000 the records still
met ~0.9 young collections per step and a full one every ~33 steps (≈3.3 ms per step on average on
the benchmark LM at L1, none tool-off). With :data:`CAPTURE_GEN0` no collection runs during a step
of that size, and ``stop()`` writes the step's files and frees its records (the writer's mirror,
:meth:`msprobe.engine.writer.StepWriter.release_live_state`) *before* the threshold is restored, so
none of them is ever promoted: ≈0.1 ms of collections per step, no full collection in 40 steps.

The threshold is raised at ``start()`` and restored at the end of ``stop()``, unless something else
changed it in between (then the newer setting stays). Only the collection *schedule* changes: cyclic
garbage made during a step lives at most that many allocations longer; nothing is left uncollected.
"""
from __future__ import annotations

import gc

from msprobe.engine.handles import Handle

#: gen-0 threshold while capturing (CPython's default is 700): above the container objects one
#: dumped step of the benchmark LM keeps alive at once (a few thousand)
CAPTURE_GEN0 = 20000


def widen_gen0() -> Handle:
    """Raise the gen-0 threshold to at least :data:`CAPTURE_GEN0`; the handle restores the old one.

    Returns a no-op handle when the collector is disabled or already collects less often.
    """
    before = gc.get_threshold()
    if not gc.isenabled() or before[0] == 0 or before[0] >= CAPTURE_GEN0:
        return Handle(lambda: None, "gen-0 GC threshold (unchanged)")
    ours = (CAPTURE_GEN0,) + before[1:]
    gc.set_threshold(*ours)

    def restore() -> None:
        if gc.get_threshold() == ours:  # changed by someone else since: theirs wins
            gc.set_threshold(*before)

    return Handle(restore, f"gen-0 GC threshold {before[0]} -> {CAPTURE_GEN0}")
