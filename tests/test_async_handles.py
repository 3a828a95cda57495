"""Asynchronous work handles (``async_op=True`` collectives, or a custom API returning a handle): the
forward ``output`` is recorded after the handle's first successful ``wait()``; a handle never waited
in its step is released at the step's end with one warning and listed in ``coverage.json``. Real
MindSpore, CPU; the handle is the user's own object, its ``wait()`` writes the result in place."""
from __future__ import annotations

import logging
import types

import numpy as np
from mindspore import Tensor, ops

from conftest import load_step
from msprobe.capture.async_handles import pending_for
from msprobe.read.report import read_report


class Work:
    """A user-side async work handle: the result is written into ``out`` by ``wait()``."""

    def __init__(self, out, src):
        self.out, self.src, self.waits = out, src, 0

    def wait(self):
        self.waits += 1
        if self.waits == 1:
            self.out.copy_(self.src * 2)   # real in-place write on CPU
        return True


def _fake_comm_module():
    mod = types.ModuleType("fake_comm")

    def all_reduce_async(tensor, op="sum", group=None, async_op=False):
        out = ops.zeros_like(tensor)
        work = Work(out, tensor)
        if async_op:
            return out, work
        work.wait()
        return out

    mod.all_reduce_async = all_reduce_async
    return mod


def test_async_handle_output_recorded_after_first_wait(make_debugger, dump_dir, caplog):
    comm = _fake_comm_module()
    debugger = make_debugger(task="statistics", level="L1")
    debugger.register_custom_api(comm, "all_reduce_async", "FakeComm")
    x = Tensor(np.array([1.0, 3.0], np.float32))
    try:
        with caplog.at_level(logging.WARNING, logger="msprobe"):
            debugger.start()
            out0, h0 = comm.all_reduce_async(x, async_op=True)          # waited once
            h0.wait()
            out1, h1 = comm.all_reduce_async(x, "sum", None, True)      # positional async_op, waited twice
            h1.wait()
            h1.wait()
            out2, h2 = comm.all_reduce_async(x, async_op=True)          # never waited
            out3 = comm.all_reduce_async(x)                             # synchronous
            registry = pending_for(debugger.service.runtime)
            assert len(registry) == 1
            debugger.stop()
            debugger.step()
    finally:
        debugger.restore_custom_api(comm, "all_reduce_async")
    assert len(registry) == 0 and "wait" not in vars(h2) and "wait" not in vars(h0)
    assert h1.waits == 2 and h2.waits == 0
    d, dump = load_step(dump_dir)
    for k in (0, 1):
        out = dump.data[f"FakeComm.all_reduce_async.{k}.forward"]["output"]
        assert out[0]["Max"] == 6.0 and out[0]["Min"] == 2.0 and out[1] is None   # value after wait
    assert "output" not in dump.data["FakeComm.all_reduce_async.2.forward"]
    assert dump.data["FakeComm.all_reduce_async.3.forward"]["output"][0]["Max"] == 6.0
    assert (out0.asnumpy() == [2, 6]).all() and (out2.asnumpy() == 0).all() and (out3.asnumpy() == [2, 6]).all()
    unwaited = read_report(d, "coverage.json")["unwaited_async_handles"]
    assert [u["entry"] for u in unwaited] == ["FakeComm.all_reduce_async.2.forward"]
    assert sum("never waited" in r.getMessage() for r in caplog.records) == 1
    # with the dump off, the wait of a handle released at step end is MindSpore/user code only
    assert h2.wait() is True and (out2.asnumpy() == [2, 6]).all()
