"""``mindspore.train`` callbacks (seed: "MsprobeStep", "MsprobeInitStep")."""
from __future__ import annotations

from mindspore.train import Callback


class MsprobeStep(Callback):
    """Start the dump at each training step's beginning; stop and ``step()`` at its end.

    Args:
        debugger (PrecisionDebugger): the debugger; for L0/mix call ``debugger.start(model)`` once
            before ``Model.train`` so it knows the network.
    """

    def __init__(self, debugger):
        super().__init__()
        self.debugger = debugger

    def on_train_step_begin(self, run_context):
        self.debugger.start()

    def on_train_step_end(self, run_context):
        self.debugger.stop()
        self.debugger.step()


class MsprobeInitStep(Callback):
    """When training resumes, number dump steps from the callback's current step number.

    Uses the most recently created ``PrecisionDebugger``. ``cur_step_num`` counts steps already done,
    so the first step run is numbered ``cur_step_num``.
    """

    def on_train_begin(self, run_context):
        from msprobe.mindspore.debugger import PrecisionDebugger

        debugger = PrecisionDebugger.latest()
        if debugger is None:
            return
        cb_params = run_context.original_args()
        debugger.set_init_step(int(getattr(cb_params, "cur_step_num", 0) or 0))
