"""A reminder that ``step()`` ends a training step, said when a step's recording windows look like
several training steps.

``start()``/``stop()`` may open several recording windows in one step on purpose (the seed's
start-stop-start-stop-step, gradient accumulation: several forward and backward passes, one optimizer
update). A loop that calls ``start()``/``stop()`` per iteration and never ``step()`` writes every
iteration into the same step directory, its calls numbered on (``….forward.0``, ``….forward.1``, ...),
which nothing else points out. What tells the two apart is an optimizer update inside the step: the
model's Parameters change between two windows of one step. A few of them (the smallest) are read at
the start of a step's first window and compared at each later window, so a single forgotten
``step()`` is said at the next window. Without a model there are no Parameters to read: the
reminder is then said when one step has had :data:`MANY_WINDOWS` windows. Each is a WARNING said at most once per debugger; what is
written is never changed.
"""
from __future__ import annotations

import logging
import weakref

import numpy as np

logger = logging.getLogger("msprobe")

#: windows of one step without a model after which the reminder is said
MANY_WINDOWS = 8
#: Parameters read per model (the smallest trainable ones: reading them costs little)
_WATCHED = 4


class StepWindows:
    """Counts the recording windows of the current step and says, once, when they look like
    training steps of their own."""

    def __init__(self):
        self._step = None
        self._windows = 0
        self._values = None  # [(Parameter, its bytes)] read at the first window of the step
        #: the models and the Parameters read, weakly (choosing them walks the models: ~0.5 ms for a
        #: small LM, more than reading them), chosen again when a model or a Parameter changes
        self._watched: tuple = ((), ())
        self.said = False

    def reset(self) -> None:
        """Forget the step (at ``step()``): neither a Parameter nor its bytes are kept past its step."""
        self._step, self._windows, self._values = None, 0, None

    def window_starts(self, step: int, models, wait) -> None:
        """A recording window of step ``step`` begins (``start()`` switched recording on).

        Args:
            step (int): the current step number.
            models (list[tuple[int | None, nn.Cell]] | None): the models given to ``start()``.
            wait (callable): called before the Parameters are read; waits for the device and keeps
                a failure of the user's operation for the user
                (:meth:`msprobe.engine.runtime.Runtime.wait_for_device`).
        """
        if self.said:
            return
        if step != self._step:
            self.reset()
            self._step = step
        self._windows += 1
        try:
            self._check(step, models, wait)
        except Exception as exc:  # a reminder only: never in the way of the dump
            logger.debug("msprobe: reading the Parameters between windows failed: %r", exc)
            self._values = None

    def _check(self, step: int, models, wait) -> None:
        if not models:
            if self._windows == MANY_WINDOWS:
                self._say(f"start() was called {MANY_WINDOWS} times in step {step} without step(): every "
                          f"window is written into step {step}'s directory, its calls numbered on")
            return
        wait()  # an asynchronous failure of the user's is met here, not in the reads below
        if self._values is None:
            self._values = [(p, p.asnumpy().tobytes()) for p in self._parameters(models)]
            return
        changed = [p.name for p, before in self._values if p.asnumpy().tobytes() != before]
        if changed:
            self._say(f"the model's Parameters changed between two start() calls of step {step} "
                      f"({len(changed)} of the {len(self._values)} smallest ones compared changed: {', '.join(changed)}): an "
                      "optimizer update ran inside the step, and every iteration until the next step() is "
                      f"written into step {step}'s directory, its calls numbered on")

    def _parameters(self, models) -> list:
        """The Parameters to read (:func:`_smallest`), those chosen at an earlier step while the
        models are the same and each of those still exists and is trainable."""
        roots, chosen = self._watched
        params = [ref() for ref in chosen]
        if (len(roots) == len(models) and all(ref() is root for ref, (_, root) in zip(roots, models))
                and all(p is not None and p.requires_grad for p in params)):
            return params
        params = _smallest(models)
        self._watched = (tuple(weakref.ref(root) for _, root in models), tuple(map(weakref.ref, params)))
        return params

    def _say(self, what: str) -> None:
        self.said = True
        self._values = None
        logger.warning("msprobe: %s. If each start()/stop() is a training step, call debugger.step() "
                       "after stop() at its end; several start()/stop() in one step are meant for parts "
                       "of a step (e.g. gradient accumulation) (said once)", what)


def _smallest(models) -> list:
    """The smallest trainable Parameters of each model (at most :data:`_WATCHED` each)."""
    out = []
    for _, root in models:
        out += sorted(root.trainable_params(), key=lambda p: (int(np.prod(p.shape)), p.name))[:_WATCHED]
    return out
