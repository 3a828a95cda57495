"""Which kind of non-finite value a record holds is decided from what its tensor holds (NaN count
when counted, else Max/Min), not from Mean or Norm: a gradient of +Inf beside -Inf (Mean NaN) is
``inf`` in watch mode, and a float64 tensor whose Norm overflows holds no NaN/Inf at all (no
``anomalies.json``, no first-diff producer). Real MindSpore, CPU, PyNative."""
from __future__ import annotations

import glob
import json
import logging
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import msprobe.dump
from msprobe.mindspore import PrecisionDebugger


class SignedSqrt(nn.Cell):
    """``h + sqrt(h * 0 + c)``: with c = 0 the gradient of sqrt is ±Inf (the sign of the incoming
    gradient, from the head's weights of both signs); the backward of ``h * 0`` then makes NaN."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4, weight_init="ones", bias_init="ones")
        self.head = nn.Dense(4, 1, weight_init=Tensor(np.array([[1.0, -1.0, 1.0, 1.0]], np.float32)))

    def construct(self, x, c):
        h = self.fc(x)
        return self.head(h + ops.sqrt(h * 0.0 + c)).sum()


def _run(tmp_path, level, watch, summary_mode=None):
    dump_path = os.path.join(str(tmp_path), "dump")
    cfg = {"task": "statistics", "dump_path": dump_path, "level": level, "watch": watch}
    if summary_mode:
        cfg["statistics"] = {"summary_mode": summary_mode}
    path = os.path.join(str(tmp_path), "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    debugger = PrecisionDebugger(config_path=path)
    net = SignedSqrt()
    opt = nn.SGD(net.trainable_params(), 0.001)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    x = Tensor(np.full((2, 4), 0.5, np.float32))
    for step in range(3):
        debugger.start(net)
        _, grads = grad_fn(x, Tensor(np.float32(0.0 if step == 1 else 1.0)))
        opt(grads)
        debugger.stop()
        debugger.step()
    debugger.close()
    (d,) = glob.glob(os.path.join(dump_path, "step1", "*"))
    with open(os.path.join(d, "anomalies.json")) as f:
        return json.load(f), msprobe.dump.load(d).data


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("summary_mode", [None, ["max", "min", "mean", "l2norm", "nan count"]])
def test_plus_and_minus_inf_is_inf_not_nan(tmp_path, caplog, level, summary_mode):
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        found, data = _run(tmp_path, level, {"history": 64}, summary_mode)
    producer = "Functional.sqrt.0.backward"
    (leaf,) = data[producer]["output"]
    assert (leaf["Max"], leaf["Min"]) == (float("inf"), float("-inf")) and leaf["Mean"] != leaf["Mean"]
    assert (found["producer"], found["kind"]) == (producer, "inf")
    (message,) = [r.getMessage() for r in caplog.records if "watch found" in r.getMessage()]
    assert message.startswith(f"msprobe: watch found Inf first produced by {producer} at step 1")


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_watching_nan_only_skips_an_inf_gradient_and_names_the_first_nan(tmp_path, level):
    found, data = _run(tmp_path, level, {"history": 64, "anomaly": ["nan"]})
    assert found["producer"] != "Functional.sqrt.0.backward" and found["kind"] == "nan"
    outputs = data[found["producer"]]["output"]
    assert any(leaf and leaf["Max"] != leaf["Max"] for leaf in outputs), outputs

