"""Watch mode's line about what is watched is true for the mode the step ran in: in GRAPH_MODE the
APIs inside the training step that ``ms.value_and_grad`` compiles (``after_grad``) are not watched,
and the line says so instead of "called anywhere between start() and stop()". Real MindSpore, CPU."""
from __future__ import annotations

import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from msprobe.mindspore import PrecisionDebugger


@pytest.mark.parametrize("mode, level", [("graph", "mix"), ("pynative", "mix"), ("pynative", "L1")])
def test_what_is_watched_is_said_for_the_mode(tmp_path, capsys, mode, level):
    path = os.path.join(str(tmp_path), "cfg.json")
    with open(path, "w") as f:
        json.dump({"task": "statistics", "dump_path": os.path.join(str(tmp_path), "dump"), "level": level,
                   "watch": {}}, f)
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    debugger = None
    try:
        debugger = PrecisionDebugger(config_path=path)
        net = nn.SequentialCell(nn.Dense(4, 2), nn.ReLU())
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")   # outside the model
        x, y = Tensor(np.ones((2, 4), np.float32)), Tensor(np.array([1, 0], np.int32))

        def forward(a, b):
            return loss_fn(net(a), b)

        grad_fn = ms.value_and_grad(forward, None, net.trainable_params())
        for _ in range(2):
            debugger.start(net)
            grad_fn(x, y)
            debugger.stop()
            debugger.step()
    finally:
        if debugger is not None:
            debugger.close()
        ms.set_context(mode=ms.PYNATIVE_MODE)
    said = [line for line in capsys.readouterr().out.splitlines() if "watch mode watches" in line]
    assert len(said) == 1, said
    anywhere = "called anywhere between start() and stop()" in said[0]
    assert anywhere == (mode == "pynative"), said[0]
    if mode == "graph":
        assert "outside compiled code" in said[0] and "after_grad" in said[0], said[0]
        assert ("Primitives inside the model" in said[0]) is False, said[0]
