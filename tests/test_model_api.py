"""``mindspore.train.Model`` with the MsprobeStep / MsprobeInitStep callbacks (seed: Model API usage),
real MindSpore, CPU, PyNative, dataset_sink_mode=False."""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import msprobe.dump
from msprobe.mindspore import MsprobeInitStep, MsprobeStep, PrecisionDebugger

ms.set_device("CPU")
ms.runtime.launch_blocking()

BATCHES = 3


class Head(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(16, 2)

    def construct(self, x):
        return self.fc(x)


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.act = nn.ReLU()
        self.head = Head()

    def construct(self, x):
        return self.head(self.act(self.fc1(x)))


def make_dataset():
    r = np.random.RandomState(0)
    data = {"data": r.randn(2 * BATCHES, 8).astype(np.float32),
            "label": r.randn(2 * BATCHES, 2).astype(np.float32)}
    return ds.NumpySlicesDataset(data, shuffle=False).batch(2)


def make_model(seed=0):
    ms.set_seed(seed)
    net = MLP()
    return net, Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.1))


def make_debugger(tmp_path, level, task="statistics", step=None):
    dump_path = os.path.join(str(tmp_path), "dump")
    cfg = {"task": task, "dump_path": dump_path, "level": level, "step": step or [],
           task: {"scope": [], "list": [], "data_mode": ["all"]}}
    path = os.path.join(str(tmp_path), "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return PrecisionDebugger(config_path=path), dump_path


def step_dirs(dump_path):
    return sorted(int(os.path.basename(p)[4:]) for p in glob.glob(os.path.join(dump_path, "step*")))


def load(dump_path, step):
    (d,) = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
    return msprobe.dump.load(d)


L0_CELLS = {"Cell.fc1.Dense", "Cell.act.ReLU", "Cell.head.Head", "Cell.head.fc.Dense"}


def l0_names():
    names = set()
    for c in L0_CELLS:
        names |= {f"{c}.forward.0", f"{c}.backward.0"}
    return names | {"Cell.fc1.Dense.parameters_grad.0", "Cell.head.fc.Dense.parameters_grad.0"}


class Losses(Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_step_end(self, run_context):
        self.losses.append(run_context.original_args().net_outputs.asnumpy().tobytes())


def reference_losses():
    _, model = make_model()
    rec = Losses()
    model.train(1, make_dataset(), callbacks=[rec], dataset_sink_mode=False)
    return rec.losses


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_model_train_with_msprobe_step(tmp_path, level):
    debugger, dump_path = make_debugger(tmp_path, level)
    net, model = make_model()
    if level in ("L0", "mix"):
        debugger.start(net)  # seed: once before train, so the tool knows the network
    rec = Losses()
    model.train(1, make_dataset(), callbacks=[MsprobeStep(debugger), rec], dataset_sink_mode=False)
    assert rec.losses == reference_losses()  # training unchanged by the tool
    assert step_dirs(dump_path) == list(range(BATCHES))  # one directory per training step
    for step in range(BATCHES):
        dump = load(dump_path, step)
        assert dump.complete
        cells = {k for k in dump.data if k.startswith("Cell.")}
        apis = {k for k in dump.data if not k.startswith("Cell.")}
        if level == "L1":
            assert not cells
        else:
            assert cells == l0_names(), step
            assert dump.construct["Cell.head.fc.Dense.forward.0"] == "Cell.head.Head.forward.0"
            assert dump.construct["Cell.head.fc.Dense.backward.0"] == "Cell.head.Head.backward.0"
        if level == "L0":
            assert not apis
        else:
            # the loss function's APIs forward and backward; the optimizer runs as one Jit entry
            assert any(k.startswith("Functional.square.") for k in apis)
            assert any(k.endswith(".backward") for k in apis)
        if level == "L1":  # no model given to start(): Primitive ops (Dense's MatMul) not captured
            assert not any(k.startswith("Primitive.") for k in apis)
        if level == "mix":
            assert "Primitive.matmul.MatMul.0.forward" in apis
            assert dump.construct["Primitive.matmul.MatMul.0.forward"] == "Cell.fc1.Dense.forward.0"
        if level == "mix":
            relu = [k for k in apis if "relu" in k.lower() and k.endswith("forward")]
            assert relu and all(dump.construct[k] == "Cell.act.ReLU.forward.0" for k in relu)


def test_model_train_step_list_only_dumps_selected(tmp_path):
    debugger, dump_path = make_debugger(tmp_path, "L0", step=[1])
    net, model = make_model()
    debugger.start(net)
    model.train(1, make_dataset(), callbacks=[MsprobeStep(debugger)], dataset_sink_mode=False)
    assert step_dirs(dump_path) == [1]
    assert set(load(dump_path, 1).data) == l0_names()
    for _, cell in net.cells_and_names():
        assert not cell._forward_pre_hook and not cell._forward_hook
    assert all(p.hooks() == [] for p in net.trainable_params())


class ResumeAt(Callback):
    """Stands for the framework's resume logic: sets cur_step_num before other callbacks see it
    (Model._train does ``cb_params.cur_step_num = initial_step`` when resuming from a checkpoint)."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_begin(self, run_context):
        run_context.original_args().cur_step_num = self.step


class SeenSteps(Callback):
    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_step_begin(self, run_context):
        self.steps.append(run_context.original_args().cur_step_num)


@pytest.mark.parametrize("level", ["L1", "L0"])
def test_msprobe_init_step_resume(tmp_path, level):
    debugger, dump_path = make_debugger(tmp_path, level)
    net, model = make_model()
    if level == "L0":
        debugger.start(net)  # opens the dump before MsprobeInitStep knows the starting step
    seen = SeenSteps()
    model.train(1, make_dataset(), dataset_sink_mode=False,
                callbacks=[ResumeAt(5), MsprobeInitStep(), MsprobeStep(debugger), seen])
    assert seen.steps == [6, 7, 8]  # MindSpore's numbering after 5 finished steps
    # the first dumped step is the callback's current step number, then one per step
    assert step_dirs(dump_path) == [5, 6, 7]
    for step in (5, 6, 7):
        data = load(dump_path, step).data
        assert data
        if level == "L0":
            assert set(data) == l0_names()


def test_msprobe_init_step_without_resume_starts_at_zero(tmp_path):
    debugger, dump_path = make_debugger(tmp_path, "L1")
    _, model = make_model()
    # initial_epoch does not move cb_params.cur_step_num in MindSpore 2.10: numbering starts at 0
    model.train(2, make_dataset(), dataset_sink_mode=False, initial_epoch=1,
                callbacks=[MsprobeInitStep(), MsprobeStep(debugger)])
    assert step_dirs(dump_path) == [0, 1, 2]
