"""GRAPH_MODE at L0/mix: an error MindSpore's compiler raises inside a probed Cell reaches the program
with the type and first line it has without the tool, and its "Traceback of Net Construct Code" keeps
every frame of the tool-off message in order, with the probe wrapper's frames of
``msprobe/capture/cells/graph_probes.py`` added between them (README, "Reliability"). Real MindSpore, CPU."""
from __future__ import annotations

import os
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from msprobe.mindspore import PrecisionDebugger

_FRAME = re.compile(r"^# \d+ In file (.+?):")


class Mismatch(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Dense(4, 5), nn.Dense(4, 3)

    def construct(self, x):
        return self.b(self.a(x)).sum()      # 5 features into a Dense taking 4


def _raise(tmp_path, level):
    net = Mismatch()
    debugger = None
    if level is not None:
        debugger = PrecisionDebugger(dump_path=os.path.join(str(tmp_path), "dump"), level=level)
        debugger.start(net)
    try:
        with pytest.raises(Exception) as info:
            ms.value_and_grad(net, None, net.trainable_params())(Tensor(np.ones((2, 4), np.float32)))
    finally:
        if debugger is not None:
            debugger.close()
    return info.value


def _frames(message):
    return [m.group(1) for m in map(_FRAME.match, message.splitlines()) if m]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_compile_error_keeps_type_first_line_and_frames(tmp_path, level):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        off = _raise(tmp_path, None)
        on = _raise(tmp_path, level)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert type(on) is type(off)
    assert str(on).splitlines()[0] == str(off).splitlines()[0]
    tool = os.path.join("msprobe", "capture", "cells", "graph_probes.py")
    on_frames = _frames(str(on))
    assert [f for f in on_frames if not f.endswith(tool)] == _frames(str(off))
    assert any(f.endswith(tool) for f in on_frames)   # the documented difference
