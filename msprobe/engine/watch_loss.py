"""Watch mode: whether what is watched computes the loss, said once per run.

A loss computed outside what the level records (a loss Cell applied to the model's output outside the
model given to ``start()``; at L0 also functions such as ``ops.mse_loss`` in the model's own
``construct``) is not watched: its NaN/Inf would go unreported without a word. This is decided from
what was watched, not from the model's class: in the first step that records a forward call, the last
forward call watched before the step's first backward entry (without backward entries: the step's
last forward call) computes the loss when one of its outputs holds a single value. When none does,
one line says what the level watches (in the mode the step ran in: in GRAPH_MODE the APIs inside
compiled code are not watched) and which call was the last one it saw.
"""
from __future__ import annotations

import math

from msprobe.engine.messages import announce
from msprobe.format import naming
from msprobe.read import report
from msprobe.tensors import stats

#: what each level watches, as the line says it
WATCHED = {
    "L0": "the Cells inside the model given to start() (not the operations of its own construct: a loss "
          "computed there by functions such as ops.mse_loss is not watched either)",
    "mix": "the Cells and Primitives inside the model given to start(), and the APIs of "
           "support_wrap_ops.yaml called anywhere between start() and stop()",
    "L1": "the Primitives inside the model given to start(), and the APIs of support_wrap_ops.yaml "
          "called anywhere between start() and stop()",
}
_COMPILED = ("called from Python between start() and stop() outside compiled code (the model's Cells and the "
             "functions ms.value_and_grad/ms.grad make, such as after_grad, run compiled in GRAPH_MODE: "
             "the APIs and Primitives inside them are not watched)")
#: what each level watches in GRAPH_MODE, where Python hooks do not run inside compiled graphs
WATCHED_IN_GRAPH_MODE = {
    "L0": WATCHED["L0"],
    "mix": "the Cells inside the model given to start() (through the probes compiled into its graph), and "
           "the APIs of support_wrap_ops.yaml " + _COMPILED,
    "L1": "the APIs of support_wrap_ops.yaml " + _COMPILED,
}


class LossCheck:
    """Fed the watched pieces of data of a run in execution order until it has decided.

    Args:
        level: the dump level (``L0``, ``L1``, ``mix``).
    """

    def __init__(self, level: str):
        self.level = level
        #: decided (and said, when the loss was not watched): nothing more is looked at
        self.done = False
        #: the last forward call with an output seen in the open step: (entry, output shapes)
        self._last = None

    def see(self, pieces, step: int) -> None:
        """Note the watched ``pieces`` (:class:`msprobe.format.journal.Piece`, in journal order) of
        step ``step``; the first backward piece decides."""
        for piece in pieces:
            if self.done:
                return
            if naming.direction_of(piece.entry) == naming.BACKWARD:
                if self._last is not None:
                    self._decide(step)
            elif piece.key == "output":
                self._last = (piece.entry, [leaf.get("shape") for leaf in report.leaves(piece.value)])

    def end_step(self, step: int) -> None:
        """Step ``step`` ended: decide from its last forward call (none: no forward call was watched)."""
        if not self.done:
            self._decide(step)

    def _decide(self, step: int) -> None:
        self.done = True
        if self._last is None:
            seen = f"it watched no forward call in step {step}, so no loss either"
        else:
            entry, shapes = self._last
            if any(isinstance(s, list) and math.prod(s) == 1 for s in shapes):
                return  # a single value: the loss is computed by a watched call
            shown = ", ".join(str(s) for s in shapes) or "no tensor"
            seen = (f"the last forward call it watched in step {step}, {entry}, returns no single value "
                    f"(output {shown}), so the loss is computed by code it does not watch")
        # at L1/mix a loss computed by functions is watched already: another level is advice at L0 only
        functions = ", or use level L1/mix for a loss computed by functions," if self.level == "L0" else ""
        watched = (WATCHED_IN_GRAPH_MODE if stats.graph_mode() else WATCHED)[self.level]
        announce(f"msprobe watch mode watches {watched}; {seen}: a loss Cell outside the model "
                 "(such as nn.SoftmaxCrossEntropyWithLogits applied to its output) is not watched, and its "
                 "NaN/Inf goes unreported: give start() a Cell that computes the loss (e.g. "
                 f"nn.WithLossCell(net, loss_fn)){functions} to watch it too")
