"""Cell-level (L0) and mix dump on real MindSpore (CPU, PyNative): names, structure, values, and
training results unchanged by the tool: keyword arguments, non-tensor outputs, custom bprop,
namedtuple outputs, a Cell called several times, backward labels, parameter gradients, eval loops,
direct ``construct`` calls, in-place writes after a Cell, identity Cells.
"""
from __future__ import annotations

import collections
import glob
import json
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

import msprobe.dump
from msprobe.mindspore import PrecisionDebugger
from tests.conftest import only_step_dir

ms.set_device("CPU")
ms.runtime.launch_blocking()

Pair = collections.namedtuple("Pair", ["logits", "aux", "sl"])


# ---------------------------------------------------------------------------------------- network
class Sub(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)

    def construct(self, x):
        return self.fc(x)


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.sub = Sub()

    def construct(self, x):
        return ops.relu(self.sub(x))


class Scale(nn.Cell):
    """Keyword tensors and plain keyword values."""

    def construct(self, x, scale=None, mode="slow"):
        return x * scale if mode == "fast" else x


class Multi(nn.Cell):
    """Outputs of mixed kinds: bool mask, int tensor, None, float tensor, int, str."""

    def construct(self, x):
        return (x > 0, ops.argmax(x, -1), None, x * 1.5, 3, "tag")


class Doubler(nn.Cell):
    """A custom bprop."""

    def construct(self, x):
        return x * 2

    def bprop(self, x, out, dout):
        return (dout * 2,)


class NT(nn.Cell):
    """A namedtuple output with a dict, a list holding None, and a slice."""

    def construct(self, x):
        return Pair(x + 1, {"a": x * 2, "b": [x - 1, None]}, slice(0, 2))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = Block()  # three levels: block -> sub -> fc
        self.shared = nn.Dense(8, 8)  # called three times
        self.scale = Scale()
        self.multi = Multi()
        self.dbl = Doubler()
        self.nt = NT()
        self.proj = nn.Dense(16, 16, has_bias=False)  # a 3-d (4, 8, 16) input

    def construct(self, x, z):
        h = self.block(x)
        y0 = self.shared(h)
        y1 = self.shared(h)
        y2 = self.shared(h)
        loss = 1 * y0.sum() + 2 * y1.sum() + 3 * y2.sum()
        s = self.scale(h, scale=Tensor(3.0, ms.float32), mode="fast")
        m = self.multi(s)
        d = self.dbl(m[3])
        p = self.nt(d)
        assert type(p) is Pair and isinstance(p.aux, dict) and isinstance(p.sl, slice)  # types kept
        w = self.proj(z)
        return loss + 0.1 * (p.logits.sum() + p.aux["a"].sum() + p.aux["b"][0].sum()) + 0.01 * w.sum()


def build_net(seed: int = 0) -> Net:
    ms.set_seed(seed)
    np.random.seed(seed)
    return Net()


def make_inputs(seed: int = 1):
    r = np.random.RandomState(seed)
    return (Tensor(r.randn(4, 8).astype(np.float32)),
            Tensor(r.randn(4, 8, 16).astype(np.float32)))


CELLS = ["block.Block", "block.sub.Sub", "block.sub.fc.Dense", "shared.Dense", "scale.Scale",
         "multi.Multi", "dbl.Doubler", "nt.NT", "proj.Dense"]
CALLS = {"shared.Dense": 3}
GRAD_CELLS = ["block.sub.fc.Dense", "shared.Dense", "proj.Dense"]


def expected_names(forward=True, backward=True, grads=True, head="Cell"):
    names = set()
    for c in CELLS:
        for k in range(CALLS.get(c, 1)):
            if forward:
                names.add(f"{head}.{c}.forward.{k}")
            if backward:
                names.add(f"{head}.{c}.backward.{k}")
    if grads:
        names |= {f"{head}.{c}.parameters_grad.0" for c in GRAD_CELLS}
    return names


# ---------------------------------------------------------------------------------------- helpers
def make_debugger(tmp_path, task="statistics", level="L0", data_mode=("all",), step=None, name="dump"):
    dump_path = os.path.join(str(tmp_path), name)
    section = {"scope": [], "list": [], "data_mode": list(data_mode)}
    cfg = {"task": task, "dump_path": dump_path, "level": level, "step": step or [],
           "extra_info": True, task: section}
    path = os.path.join(str(tmp_path), f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return PrecisionDebugger(config_path=path), dump_path


def load_step(dump_path, step):
    dirs = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
    assert len(dirs) == 1, dirs
    return msprobe.dump.load(dirs[0])


from msprobe.read.report import leaves  # noqa: E402  (every tensor-like leaf of an entry body)


def train(net, x, z, steps, debugger=None, lr=0.1):
    """SGD steps; returns per-step (loss, {param name: grad}) as numpy."""
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    step_fn = ms.value_and_grad(net, None, opt.parameters)
    out = []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(net)
        loss, grads = step_fn(x, z)
        if debugger is not None:
            debugger.stop()
        out.append((loss.asnumpy().copy(),
                    {p.name: g.asnumpy().copy() for p, g in zip(opt.parameters, grads)}))
        opt(grads)
        if debugger is not None:
            debugger.step()
    return out


def assert_same_training(a, b):
    assert len(a) == len(b)
    for (la, ga), (lb, gb) in zip(a, b):
        assert la.tobytes() == lb.tobytes()
        assert ga.keys() == gb.keys()
        for k in ga:
            assert ga[k].tobytes() == gb[k].tobytes(), k


@pytest.fixture(scope="module")
def reference_run():
    """Tool-off training, 3 steps (shared by the bitwise comparisons)."""
    x, z = make_inputs()
    return train(build_net(), x, z, 3)


@pytest.fixture(scope="module")
def l0_tensor_run(tmp_path_factory, reference_run):
    tmp = tmp_path_factory.mktemp("l0t")
    debugger, dump_path = make_debugger(tmp, task="tensor", level="L0")
    net = build_net()
    x, z = make_inputs()
    result = train(net, x, z, 3, debugger)
    return net, result, dump_path


# ---------------------------------------------------------------------------------------- names/structure
def test_l0_exact_entry_names_every_step(l0_tensor_run):
    _, _, dump_path = l0_tensor_run
    for step in range(3):
        dump = load_step(dump_path, step)
        assert set(dump.data) == expected_names(), step
        assert dump.complete
        assert not any(k.startswith("Cell.Net") for k in dump.data)  # root not recorded


def test_l0_construct_parents_three_levels(l0_tensor_run):
    dump = load_step(l0_tensor_run[2], 0)
    c = dump.construct
    assert c["Cell.block.Block.forward.0"] is None
    assert c["Cell.block.sub.Sub.forward.0"] == "Cell.block.Block.forward.0"
    assert c["Cell.block.sub.fc.Dense.forward.0"] == "Cell.block.sub.Sub.forward.0"
    assert c["Cell.block.Block.backward.0"] is None
    assert c["Cell.block.sub.Sub.backward.0"] == "Cell.block.Block.backward.0"
    assert c["Cell.block.sub.fc.Dense.backward.0"] == "Cell.block.sub.Sub.backward.0"
    # top-level siblings (custom-bprop Cell included) do not become each other's parents
    for cell in CELLS:
        if not cell.startswith("block."):
            for k in range(CALLS.get(cell, 1)):
                assert c[f"Cell.{cell}.forward.{k}"] is None, cell
                assert c[f"Cell.{cell}.backward.{k}"] is None, cell
    assert set(c) == {n for n in expected_names(grads=False)}


def test_l0_forward_record_contents(l0_tensor_run):
    dump = load_step(l0_tensor_run[2], 0)
    d = dump.data
    fc = d["Cell.shared.Dense.forward.0"]
    assert set(fc) == {"input_args", "input_kwargs", "output", "parameters"}
    assert fc["input_kwargs"] == {}
    assert set(fc["parameters"]) == {"weight", "bias"}
    assert d["Cell.block.Block.forward.0"]["parameters"] == {}
    # keyword tensor with stats, keyword str as a plain value
    kw = d["Cell.scale.Scale.forward.0"]["input_kwargs"]
    assert kw["scale"]["Max"] == 3.0 and kw["scale"]["Min"] == 3.0 and kw["scale"]["shape"] == []
    assert kw["mode"] == {"type": "str", "value": "fast"}
    assert kw["scale"]["data_name"] == "Cell.scale.Scale.forward.0.kwargs.scale.npy"
    # one record per element
    out = d["Cell.multi.Multi.forward.0"]["output"]
    assert len(out) == 6
    mask, idx, none, xf, three, tag = out
    assert mask["dtype"] == "Bool" and mask["Max"] is True and mask["Min"] is False
    assert mask["Mean"] is None and mask["Norm"] is None
    assert idx["dtype"].startswith("Int") and isinstance(idx["Max"], int)
    assert none is None and three == {"type": "int", "value": 3} and tag == {"type": "str", "value": "tag"}
    assert xf["dtype"] == "Float32"
    # stable paths for namedtuple/dict/list
    nt = d["Cell.nt.NT.forward.0"]["output"]
    assert set(nt) == {"logits", "aux", "sl"}
    assert nt["aux"]["a"]["data_name"] == "Cell.nt.NT.forward.0.output.aux.a.npy"
    assert nt["aux"]["b"][1] is None
    assert nt["sl"] == {"type": "slice", "value": [0, 2, None]}
    assert nt["logits"]["data_name"] == "Cell.nt.NT.forward.0.output.logits.npy"


def test_l0_stacks_start_at_the_line_that_called_the_cell(l0_tensor_run):
    """A Cell's stack is read inside MindSpore's Cell.__call__ (its forward pre-hook): those frames
    are left out, so the innermost frame is the line that called the Cell (the user's
    ``self.block(x)``; ``self.sub(x)`` for a nested Cell), as an API's stack starts at its call."""
    _, _, dump_path = l0_tensor_run
    step_dir = only_step_dir(dump_path, 0)
    stacks = msprobe.dump.load_stacks(step_dir)
    here = os.path.abspath(__file__)
    expected = {"Cell.block.Block.forward.0": "h = self.block(x)",
                "Cell.block.sub.Sub.forward.0": "return ops.relu(self.sub(x))",
                "Cell.block.sub.fc.Dense.forward.0": "return self.fc(x)",
                "Cell.shared.Dense.forward.2": "y2 = self.shared(h)"}
    for entry, source in expected.items():
        innermost = stacks[entry][0]
        assert innermost.startswith(f"File {here}, line ") and innermost.endswith(source), (entry, innermost)
    cells = [e for e in stacks if e.startswith("Cell.")]
    assert len(cells) == sum(CALLS.get(c, 1) for c in CELLS)
    for entry in cells:
        assert not any(name in stacks[entry][0] for name in ("cell.py", "_run_forward_pre_hook", "jit_forbidden"))
        assert stacks[entry][0].startswith(f"File {here}, line ")


def test_user_receives_same_types_under_tool(tmp_path):
    debugger, _ = make_debugger(tmp_path)
    net = build_net()
    x, _ = make_inputs()
    debugger.start(net)
    p = net.nt(x)
    debugger.stop()
    assert type(p) is Pair and type(p.aux) is dict and type(p.aux["b"]) is list and p.aux["b"][1] is None
    assert p.sl == slice(0, 2)


def test_shared_cell_forward_k_pairs_with_backward_k(l0_tensor_run):
    dump = load_step(l0_tensor_run[2], 0)
    for k in range(3):
        bwd = dump.data[f"Cell.shared.Dense.backward.{k}"]
        assert bwd["input"][0]["Max"] == k + 1 and bwd["input"][0]["Min"] == k + 1
        # gradient w.r.t. the input of call k is (k+1) * W^T 1: scale check against call 0
        g_in = dump.load_tensor(bwd["output"][0])
        g0 = dump.load_tensor(dump.data["Cell.shared.Dense.backward.0"]["output"][0])
        np.testing.assert_allclose(g_in, (k + 1) * g0, rtol=1e-6)
        fwd = dump.data[f"Cell.shared.Dense.forward.{k}"]
        assert fwd["output"][0]["data_name"] == f"Cell.shared.Dense.forward.{k}.output.0.npy"


def test_custom_bprop_forward_and_backward(l0_tensor_run):
    dump = load_step(l0_tensor_run[2], 0)
    fwd = dump.data["Cell.dbl.Doubler.forward.0"]
    x_in = dump.load_tensor(fwd["input_args"][0])
    np.testing.assert_array_equal(dump.load_tensor(fwd["output"][0]), x_in * 2)
    bwd = dump.data["Cell.dbl.Doubler.backward.0"]
    dout = dump.load_tensor(bwd["input"][0])
    # d loss / d out = 0.1 * (1 + 2 + 1) from the NT Cell; the record equals the bprop output
    np.testing.assert_allclose(dout, np.full((4, 8), 0.4, np.float32), rtol=1e-6)
    np.testing.assert_array_equal(dump.load_tensor(bwd["output"][0]), dout * 2)


def test_backward_labels(l0_tensor_run):
    """backward input = grad w.r.t. the Cell's output; backward output = grad w.r.t. its input."""
    dump = load_step(l0_tensor_run[2], 0)
    bwd = dump.data["Cell.multi.Multi.backward.0"]
    # Pinned: backward "input" is indexed over the output's tensors (mask, idx, x*1.5); only the
    # floating-point one gets a gradient, the others are null. Only x*1.5 is used downstream (by
    # the Doubler, whose bprop sends 2 * 0.4 back).
    assert len(bwd["input"]) == 3 and bwd["input"][0] is None and bwd["input"][1] is None
    g_out = dump.load_tensor(bwd["input"][2])
    np.testing.assert_allclose(g_out, np.full((4, 8), 0.8, np.float32), rtol=1e-6)
    assert len(bwd["output"]) == 1
    np.testing.assert_allclose(dump.load_tensor(bwd["output"][0]), g_out * 1.5, rtol=1e-6)


def test_tensor_files_match_statistics(l0_tensor_run):
    dump = load_step(l0_tensor_run[2], 0)
    files = set(os.listdir(os.path.join(dump.directory, "dump_tensor_data")))
    for name in ("Cell.shared.Dense.forward.0.parameters.weight.npy",
                 "Cell.shared.Dense.parameters_grad.0.weight.npy",
                 "Cell.shared.Dense.forward.0.input.0.npy",
                 "Cell.scale.Scale.forward.0.kwargs.scale.npy",
                 "Cell.shared.Dense.backward.2.input.0.npy",
                 "Cell.shared.Dense.backward.2.output.0.npy"):
        assert name in files, name
    seen = 0
    for entry, body in dump.data.items():
        for leaf in leaves(body):
            if leaf["dtype"] == "Bool":
                continue
            arr = dump.load_tensor(leaf).astype(np.float64)
            seen += 1
            assert leaf["Max"] == arr.max(), entry
            assert leaf["Min"] == arr.min(), entry
            assert leaf["Mean"] == pytest.approx(arr.mean(), rel=1e-6, abs=1e-12), entry
            assert leaf["Norm"] == pytest.approx(np.sqrt((arr ** 2).sum()), rel=1e-6), entry
    assert seen == len(files) - 1  # every file but the bool mask was checked


def test_param_grads_equal_framework_each_step(l0_tensor_run, reference_run):
    net, result, dump_path = l0_tensor_run
    assert_same_training(result, reference_run)
    prefix = {"block.sub.fc.weight": "block.sub.fc.Dense", "block.sub.fc.bias": "block.sub.fc.Dense",
              "shared.weight": "shared.Dense", "shared.bias": "shared.Dense", "proj.weight": "proj.Dense"}
    for step in range(3):
        dump = load_step(dump_path, step)
        grads = result[step][1]
        assert set(grads) == set(prefix)
        for pname, cell in prefix.items():
            entry = dump.data[f"Cell.{cell}.parameters_grad.0"]
            leaf = entry[pname.rsplit(".", 1)[-1]]
            assert isinstance(leaf, list) and len(leaf) == 1
            np.testing.assert_array_equal(dump.load_tensor(leaf[0]), grads[pname])
            assert dump.load_tensor(leaf[0]).tobytes() == grads[pname].tobytes()
    # no hook left on parameters or Cells after the last stop()
    for p in net.trainable_params():
        assert p.hooks() == []
    for _, cell in net.cells_and_names():
        assert not cell._forward_pre_hook and not cell._forward_hook


def test_hooks_not_duplicated_across_steps(tmp_path):
    debugger, _ = make_debugger(tmp_path)
    net = build_net()
    x, z = make_inputs()
    step_fn = ms.value_and_grad(net, None, net.trainable_params())
    for step in range(3):
        debugger.start(net)
        assert len(net.shared._forward_pre_hook) == 1 and len(net.shared._forward_hook) == 1
        # registered at the first Cell call under a gradient, then kept while the capture is parked
        assert len(net.shared.weight.hooks()) == (1 if step else 0)
        step_fn(x, z)
        assert len(net.shared.weight.hooks()) == 1
        debugger.stop()
        assert not net.shared._forward_pre_hook
        # parameter-gradient hooks stay until step(): a backward after stop() is still recorded
        assert len(net.shared.weight.hooks()) == 1
        debugger.start(net)       # a second start in the same step adds no second hook
        step_fn(x, z)
        assert len(net.shared.weight.hooks()) == 1
        debugger.stop()
        debugger.step()
        assert len(net.shared.weight.hooks()) == 1   # every step is dumped: parked for the next one
    debugger.close()
    assert net.shared.weight.hooks() == []


# ---------------------------------------------------------------------------------------- mix
def test_mix_training_bitwise_and_api_parents(tmp_path, reference_run):
    debugger, dump_path = make_debugger(tmp_path, task="statistics", level="mix")
    x, z = make_inputs()
    result = train(build_net(), x, z, 3, debugger)
    assert_same_training(result, reference_run)
    dump = load_step(dump_path, 0)
    cells = {k for k in dump.data if k.startswith("Cell.")}
    assert cells == expected_names()
    apis = [k for k in dump.data if not k.startswith("Cell.")]
    assert apis, "mix records API calls too"
    c = dump.construct
    relu = [k for k in apis if ".relu." in k and k.endswith("forward")]
    assert relu and all(c[k] == "Cell.block.Block.forward.0" for k in relu)
    argmax = [k for k in apis if "argmax" in k.lower() and k.endswith("forward")]
    assert argmax and all(c[k] == "Cell.multi.Multi.forward.0" for k in argmax)
    # every API name has a parent entry that is a Cell name (or null), never another API
    for k in apis:
        assert k in c, k
        assert c[k] is None or c[k].startswith("Cell."), (k, c[k])


# ---------------------------------------------------------------------------------------- data_mode
@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_data_mode_filters_directions(tmp_path, mode):
    debugger, dump_path = make_debugger(tmp_path, data_mode=[mode])
    x, z = make_inputs()
    train(build_net(), x, z, 1, debugger)
    names = set(load_step(dump_path, 0).data)
    if mode == "forward":
        assert names == expected_names(backward=False, grads=False)
    else:
        assert names == expected_names(forward=False)


# ---------------------------------------------------------------------------------------- list of models
def test_list_of_models_gets_index(tmp_path):
    debugger, dump_path = make_debugger(tmp_path, data_mode=["forward"])
    a, b = build_net(0), build_net(1)
    x, z = make_inputs()
    debugger.start([a, b])
    a(x, z)
    b.block(x)
    debugger.stop()
    debugger.step()
    names = set(load_step(dump_path, 0).data)
    assert names == (expected_names(backward=False, grads=False, head="Cell.0")
                     | {"Cell.1.block.Block.forward.0", "Cell.1.block.sub.Sub.forward.0",
                        "Cell.1.block.sub.fc.Dense.forward.0"})


# ---------------------------------------------------------------------------------------- eval loop
def test_forward_only_eval_no_backward_hooks(tmp_path):
    debugger, dump_path = make_debugger(tmp_path, step=[0, 1])
    net = build_net()
    x, z = make_inputs()
    cells = [c for _, c in net.cells_and_names()]

    def hook_counts():
        return (sum(len(c._forward_pre_hook) + len(c._forward_hook) + len(c._backward_hook)
                    + len(c._backward_pre_hook) for c in cells),
                sum(len(p.hooks()) for p in net.trainable_params()))

    before = hook_counts()
    assert before == (0, 0)
    for _ in range(2):
        debugger.start(net)
        during = hook_counts()
        assert during[0] > 0
        net(x, z)
        debugger.stop()
        assert hook_counts() == before
        debugger.step()
    for step in range(2):
        names = set(load_step(dump_path, step).data)
        assert names == expected_names(backward=False, grads=False)
    # nothing is left behind after the last step either
    assert hook_counts() == before


# ------------------------------------------------------------------------ direct construct call
def test_direct_construct_call_is_not_merged(tmp_path):
    debugger, dump_path = make_debugger(tmp_path, task="tensor", data_mode=["forward"])
    net = build_net()
    x, _ = make_inputs()
    debugger.start(net)
    net.shared(x)
    net.shared.construct(x * 2)  # bypasses Cell.__call__ and its hooks
    net.shared(x * 3)
    net.dbl.construct(x)  # custom-bprop Cell: the construct wrapper must not pop a frame
    net.dbl(x)
    debugger.stop()
    debugger.step()
    dump = load_step(dump_path, 0)
    assert set(dump.data) == {"Cell.shared.Dense.forward.0", "Cell.shared.Dense.forward.1",
                              "Cell.dbl.Doubler.forward.0"}
    in0 = dump.load_tensor(dump.data["Cell.shared.Dense.forward.0"]["input_args"][0])
    in1 = dump.load_tensor(dump.data["Cell.shared.Dense.forward.1"]["input_args"][0])
    np.testing.assert_array_equal(in0, x.asnumpy())
    np.testing.assert_array_equal(in1, (x * 3).asnumpy())
    assert dump.construct["Cell.dbl.Doubler.forward.0"] is None


# ------------------------------------------------------------------------- in-place after a Cell
class InplaceNet(nn.Cell):
    def __init__(self, how):
        super().__init__()
        self.a = nn.Dense(8, 8)
        self.b = nn.Dense(8, 1)
        self.how = how

    def construct(self, x):
        y = self.a(x)
        # in-place on Cell A's output. NB: on MindSpore 2.10 CPU `y.add_(1)` returns a new tensor
        # and leaves y unchanged (checked below), so ops.assign and __setitem__ are the real cases.
        if self.how == "assign":
            ops.assign(y, y + 1)
        elif self.how == "setitem":
            y[:] = y + 1
        else:
            y.add_(1)
        return self.b(y).sum()


def test_add__does_not_mutate_on_cpu():
    y = Tensor(np.ones((2,), np.float32))
    y.add_(1)
    assert y.asnumpy().tolist() == [1.0, 1.0]  # MindSpore 2.10 CPU behaviour, tool off


def _train_inplace(debugger=None, steps=2, how="assign"):
    ms.set_seed(3)
    net = InplaceNet(how)
    x = Tensor(np.random.RandomState(5).randn(4, 8).astype(np.float32))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    fn = ms.value_and_grad(net, None, opt.parameters)
    out = []
    for _ in range(steps):
        if debugger:
            debugger.start(net)
        loss, grads = fn(x)
        if debugger:
            debugger.stop()
        out.append((loss.asnumpy().copy(), {p.name: g.asnumpy().copy() for p, g in zip(opt.parameters, grads)}))
        opt(grads)
        if debugger:
            debugger.step()
    return out


@pytest.mark.parametrize("level,how", [("L0", "assign"), ("L0", "setitem"), ("L0", "add_"),
                                       ("mix", "assign"), ("mix", "setitem")])
def test_inplace_after_cell(tmp_path, level, how):
    debugger, dump_path = make_debugger(tmp_path, task="tensor", level=level)
    with_tool = _train_inplace(debugger, how=how)
    assert_same_training(with_tool, _train_inplace(how=how))
    for step in range(2):
        dump = load_step(dump_path, step)
        # Pinned: the tool takes backward data through tensor probes, not Cell backward hooks, so
        # the in-place add_ on A's output does not hide A's backward: both entries exist. A's
        # backward input is the gradient reaching A's output (through add_, i.e. B's weight).
        assert "Cell.a.Dense.backward.0" in dump.data and "Cell.b.Dense.backward.0" in dump.data
        g_a = dump.load_tensor(dump.data["Cell.a.Dense.backward.0"]["input"][0])
        w_b = with_tool[step][1]  # grads only; compare shape and against B's backward output
        g_b_in = dump.data["Cell.b.Dense.backward.0"]
        assert g_a.shape == (4, 8)
        assert "input" in g_b_in
        assert set(k for k in dump.data if k.startswith("Cell.")) == {
            "Cell.a.Dense.forward.0", "Cell.b.Dense.forward.0", "Cell.a.Dense.backward.0",
            "Cell.b.Dense.backward.0", "Cell.a.Dense.parameters_grad.0", "Cell.b.Dense.parameters_grad.0"}
        np.testing.assert_array_equal(
            dump.load_tensor(dump.data["Cell.a.Dense.parameters_grad.0"]["weight"][0]), w_b["a.weight"])
        # A's forward output was recorded before add_ ran (value at hook time)
        a_out = dump.load_tensor(dump.data["Cell.a.Dense.forward.0"]["output"][0])
        b_in = dump.load_tensor(dump.data["Cell.b.Dense.forward.0"]["input_args"][0])
        np.testing.assert_allclose(b_in, a_out + (0 if how == "add_" else 1), rtol=1e-6)


# --------------------------------------------------------------------------------- identity Cell
class Identity(nn.Cell):
    def construct(self, x):
        return x


class IdNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ident = Identity()
        self.fc = nn.Dense(4, 4)

    def construct(self, x):
        return self.ident(self.fc(x)).sum()


def test_identity_cell(tmp_path):
    debugger, dump_path = make_debugger(tmp_path)
    net = IdNet()
    x = Tensor(np.ones((2, 4), np.float32))
    debugger.start(net)
    # forward only (no grad): the user gets back the very same object
    assert net.ident(x) is x
    # under grad too: the tool only observes the autograd graph (nothing is added to it), so the
    # Cell's output is the very object it returned
    seen = {}

    def f(t):
        h = net.fc(t)
        out = net.ident(h)
        seen["same"] = out is h
        return out.sum()

    _, g = ms.value_and_grad(f, None, net.trainable_params())(x)
    debugger.stop()
    debugger.step()
    ref = ms.value_and_grad(lambda t: net.fc(t).sum(), None, net.trainable_params())(x)[1]
    for a, b in zip(g, ref):
        assert a.asnumpy().tobytes() == b.asnumpy().tobytes()
    assert seen["same"] is True
    assert "Cell.ident.Identity.backward.1" in load_step(dump_path, 0).data


# ---------------------------------------------------------------------------------------- jit Cell
class JitSub(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inner = nn.Dense(8, 8)

    @ms.jit
    def construct(self, x):
        return ops.relu(self.inner(x)) * 2


class JitNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.pre = nn.Dense(8, 8)
        self.jsub = JitSub()

    def construct(self, x):
        return self.jsub(self.pre(x)).sum()


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_jit_cell_inside_pynative(tmp_path, level):
    debugger, dump_path = make_debugger(tmp_path, level=level)
    ms.set_seed(7)
    net = JitNet()
    x = Tensor(np.random.RandomState(2).randn(4, 8).astype(np.float32))
    fn = ms.value_and_grad(net, None, net.trainable_params())
    ref_loss, ref_grads = fn(x)
    debugger.start(net)
    loss, grads = fn(x)
    debugger.stop()
    debugger.step()
    assert loss.asnumpy().tobytes() == ref_loss.asnumpy().tobytes()
    for a, b in zip(grads, ref_grads):
        assert a.asnumpy().tobytes() == b.asnumpy().tobytes()
    # with a jit Cell the dump has the seed's two subtrees: pynative/ (hooks) and graph/ (probes
    # inside the compiled graph, tests/test_graph_mode.py); the jit Cell itself is in pynative/ only
    assert sorted(os.listdir(dump_path)) == ["graph", "pynative"]
    dump = load_step(os.path.join(dump_path, "pynative"), 0)
    cells = {k for k in dump.data if k.startswith("Cell.")}
    # the jit Cell is captured as one unit; its sub-Cells (inside the compiled graph) are not
    assert "Cell.jsub.JitSub.forward.0" in cells
    assert not any(k.startswith("Cell.jsub.inner.") for k in cells)
    fwd = dump.data["Cell.jsub.JitSub.forward.0"]
    assert fwd["input_args"][0]["shape"] == [4, 8] and fwd["output"][0]["shape"] == [4, 8]
    assert "Cell.pre.Dense.forward.0" in cells
    # nothing from inside the compiled graph (relu runs only there); at mix the region is one Jit entry
    assert not any(".relu." in k for k in dump.data)
    if level == "mix":
        assert dump.construct["Jit.JitSub.0.forward"] == "Cell.jsub.JitSub.forward.0"
    # parameters living inside the jit Cell: their gradients are in graph/, not in pynative/
    assert not any("parameters_grad" in k and "jsub" in k for k in dump.data)


# ---------------------------------------------------------------------------------------------- Cell node hooks
class _Scale(nn.Cell):
    """Uses its input once, or twice when ``twice`` is set (the structure changes between calls)."""

    def __init__(self):
        super().__init__()
        self.twice = False

    def construct(self, x, y):
        out = x * 3.0 + y
        return out * x if self.twice else out


class _ScaleNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.s = _Scale()

    def construct(self, x):
        a, b = ops.split(x * 1.0, 2, 1)               # two inputs from one producer node
        first = self.s(a * 1.0, b * 1.0)              # call 0: one consumer per input
        second = self.s(a * 2.0, b * 1.0)             # call 1: the same, weighted by 2 in the loss
        self.s.twice = True
        third = self.s(a * 1.0, b * 1.0)              # call 2: x now has two consumers inside
        fourth = self.s(a, b)                         # call 3: inputs straight from the split
        self.s.twice = False
        fifth = self.s(a, a)                          # call 4: the same tensor at both positions
        return (first + second * 2 + third + fourth + fifth).sum()


def test_cell_input_gradients_summed_over_the_cells_own_consumers(tmp_path):
    """A Cell's backward ``output`` is what the Cell's own autograd nodes send to each input: the
    sum over its consumers inside the Cell when there are several, however the structure changes
    from call to call, and the same value at each position of a tensor passed twice."""
    debugger, dump_path = make_debugger(tmp_path, task="tensor", level="L0")
    net = _ScaleNet()
    x = Tensor(np.arange(1, 9, dtype=np.float32).reshape(2, 4))
    debugger.start(net)
    ms.grad(net)(x)
    debugger.stop()
    debugger.step()
    net.s.twice = False
    (step_dir,) = glob.glob(os.path.join(dump_path, "step0", "*"))
    dump = msprobe.dump.load(step_dir)
    assert not os.path.exists(os.path.join(step_dir, "dump_error_info.log"))
    a, b = x.asnumpy()[:, :2], x.asnumpy()[:, 2:]
    grads = {k: [None if g is None else dump.load_tensor(g)
                 for g in dump.data[f"Cell.s._Scale.backward.{k}"]["output"]]
             for k in range(5)}
    # d(loss)/d(x_in) of a call = its weight * 3, d/d(y_in) = its weight; twice: (3 x_in + y) x_in
    np.testing.assert_array_equal(grads[0][0], np.full((2, 2), 3.0, np.float32))
    np.testing.assert_array_equal(grads[0][1], np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(grads[1][0], np.full((2, 2), 6.0, np.float32))
    np.testing.assert_array_equal(grads[1][1], np.full((2, 2), 2.0, np.float32))
    for k in (2, 3):
        np.testing.assert_allclose(grads[k][0], 6 * a + b, rtol=1e-6)   # d/dx of (3x + y) x
        np.testing.assert_allclose(grads[k][1], a, rtol=1e-6)
    np.testing.assert_array_equal(grads[4][0], np.full((2, 2), 4.0, np.float32))   # 3a + a
    np.testing.assert_array_equal(grads[4][1], np.full((2, 2), 4.0, np.float32))


@pytest.mark.parametrize("host_copy", [True, False])
def test_forward_parameters_are_the_values_before_the_optimizer_update(tmp_path, monkeypatch, host_copy):
    """Forward ``parameters`` are snapshots taken when the Cell ran, not the values the optimizer
    wrote before stop(): a host copy on CPU with synchronous launch, a device copy otherwise."""
    import msprobe.tensors.stats as stats

    if not host_copy:
        monkeypatch.setattr(stats, "synchronous_cpu", lambda: False)
    debugger, dump_path = make_debugger(tmp_path, task="tensor", level="L0")
    net = _Outer2()
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=0.5)
    grad_fn = ms.value_and_grad(lambda a: net(a).sum(), None, params)
    x = Tensor(np.ones((2, 4), np.float32))
    before = net.fc.weight.asnumpy().copy()
    debugger.start(net)
    _, g = grad_fn(x)
    opt(g)                                    # updates the weights in place before stop()
    debugger.stop()
    debugger.step()
    after = net.fc.weight.asnumpy()
    assert not np.array_equal(before, after)
    dump = load_step(dump_path, 0)
    saved = dump.load_tensor(dump.data["Cell.fc.Dense.forward.0"]["parameters"]["weight"])
    np.testing.assert_array_equal(saved, before)
    assert dump.data["Cell.fc.Dense.forward.0"]["parameters"]["weight"]["Max"] == float(before.max())


@pytest.mark.parametrize("summary_mode", ["statistics", "md5"])
def test_forward_parameter_statistics_are_read_when_the_cell_ran(tmp_path, monkeypatch, summary_mode):
    """Statistics task, CPU, synchronous launch: a Cell's own Parameters are read at its forward
    hook (no copy kept for the flush), so their statistics (and CRC-32) are those of the values
    before the optimizer's in-place update, equal to the float64 recomputation of that copy."""
    import zlib

    from msprobe.tensors import hotpath

    read_now = []
    if hotpath.ext is not None:
        real = hotpath.ext.fill_parameters

        class Counting:  # the extension module's attributes cannot be set: a stand-in around it
            def __getattr__(self, name):
                return getattr(real.__self__, name)

            @staticmethod
            def fill_parameters(slots, md5=False):
                read_now.append(real(slots, md5))
                return read_now[-1]

        monkeypatch.setattr(hotpath, "ext", Counting())
    dump_path = os.path.join(str(tmp_path), "dump")
    config_path = os.path.join(str(tmp_path), "config.json")
    with open(config_path, "w") as f:
        json.dump({"task": "statistics", "dump_path": dump_path, "level": "L0",
                   "statistics": {"summary_mode": summary_mode}}, f)
    debugger = PrecisionDebugger(config_path=config_path)
    net = _Outer2()
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=0.5)
    grad_fn = ms.value_and_grad(lambda a: net(a).sum(), None, params)
    x = Tensor(np.ones((2, 4), np.float32))
    before = {"weight": net.fc.weight.asnumpy().copy(), "bias": net.fc.bias.asnumpy().copy()}
    debugger.start(net)
    _, g = grad_fn(x)
    opt(g)                                    # updates the weights in place before stop()
    debugger.stop()
    debugger.step()
    assert not np.array_equal(before["weight"], net.fc.weight.asnumpy())
    recorded = load_step(dump_path, 0).data["Cell.fc.Dense.forward.0"]["parameters"]
    for name, value in before.items():
        wide = value.astype(np.float64)
        leaf = recorded[name]
        assert (leaf["Max"], leaf["Min"]) == (float(value.max()), float(value.min()))
        assert leaf["Mean"] == float(wide.mean())
        assert leaf["Norm"] == float(np.sqrt((wide * wide).sum()))
        if summary_mode == "md5":
            assert leaf["md5"] == f"{zlib.crc32(value.tobytes()) & 0xFFFFFFFF:08x}"
    if hotpath.ext is not None:
        assert read_now == [2]  # weight and bias, at Cell.fc's one forward hook


class _Consumers(nn.Cell):
    """Uses its input in four places (three operations, one of them taking it twice)."""

    def construct(self, x):
        return ops.relu(x * 1.7) + ops.tanh(x) + x * x * 0.5


class _ConsumersNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.c = _Consumers()

    def construct(self, x):
        return (self.c(x) * 3.0).sum()


def test_cell_input_gradient_sum_has_the_bits_of_mindspores_gradient(tmp_path, monkeypatch):
    """The parts of a Cell's input gradient (four uses inside it) are added by the tool, in arrival
    order; the recorded backward output has the bits of the gradient MindSpore computes for that
    input, which only the Cell uses."""
    from msprobe.capture import backward

    sums = []
    real = backward._sum
    monkeypatch.setattr(backward, "_sum", lambda a, b: sums.append(real(a, b)) or sums[-1])
    debugger, dump_path = make_debugger(tmp_path, task="tensor", level="L0")
    net = _ConsumersNet()
    x = Tensor(np.random.default_rng(5).standard_normal((3, 7)).astype(np.float32))
    expected = ms.grad(net)(x).asnumpy()
    debugger.start(net)
    got = ms.grad(net)(x).asnumpy()
    debugger.stop()
    debugger.step()
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    dump = load_step(dump_path, 0)
    recorded = dump.load_tensor(dump.data["Cell.c._Consumers.backward.0"]["output"][0])
    assert np.array_equal(recorded.view(np.uint32), expected.view(np.uint32))
    assert len(sums) >= 2  # the parts were summed by the tool


class _Outer2(nn.Cell):
    def __init__(self):
        super().__init__()
        ms.set_seed(3)
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        return ops.relu(self.fc(x))


class _HalfHead(nn.Cell):
    """Dense(4, 4) then a ``Cell.to_float(float16)`` Dense(4, 2)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Dense(4, 4)
        self.b = nn.Dense(4, 2).to_float(ms.float16)

    def construct(self, x):
        return self.b(self.a(x))


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_to_float_cells_record_inputs_as_passed_and_outputs_as_computed(make_debugger, dump_dir, level):
    """README "Mixed precision": MindSpore casts inside each op's launch, after the hooks."""
    debugger, net = make_debugger(task="statistics", level=level), _HalfHead()
    debugger.start(net)
    net(Tensor(np.ones((2, 4), np.float32)))
    debugger.stop()
    debugger.step()
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data

    def dtypes(entry):
        body = data[entry]
        return [a["dtype"] for a in body["input_args"]], [o["dtype"] for o in body["output"]]

    assert dtypes("Cell.b.Dense.forward.0") == (["Float32"], ["Float16"])
    assert dtypes("Cell.a.Dense.forward.0") == (["Float32"], ["Float32"])
    if level == "mix":
        assert dtypes("Primitive.matmul.MatMul.1.forward") == (["Float32", "Float32"], ["Float16"])
        assert not [e for e in data if "cast" in e.lower()]


@pytest.mark.parametrize("registration", ["together", "one by one"])
def test_user_forward_hooks_keep_their_order_around_the_tools(tmp_path, monkeypatch, registration):
    """The tool's Cell hooks are appended after the user's hooks already on a Cell and before the ones
    the user adds while the dump is on, as ``register_forward_pre_hook``/``register_forward_hook`` append
    them (``together``: the tool fills MindSpore's hook dictionaries for all Cells at once; ``one by one``:
    through the public calls, what runs on a MindSpore that keeps hooks otherwise). A user pre-hook before
    the tool's changes what the tool records as the input, one after it does not; the user's output hook
    after the tool's changes the output the caller gets, not the recorded one. After ``stop()`` only the
    user's hooks are left and their handles still remove them."""
    from msprobe.capture.cells import cell as cell_module

    if registration == "one by one":
        monkeypatch.setattr(cell_module, "_hook_dicts", lambda: None)
    debugger, dump_path = make_debugger(tmp_path, data_mode=("forward",))
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(4, 3)])
    fc = net[0]
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    early = fc.register_forward_pre_hook(lambda c, args: (args[0] * 2,))
    debugger.start(net)
    late = fc.register_forward_pre_hook(lambda c, args: (args[0] + 100,))
    late_out = fc.register_forward_hook(lambda c, args, out: out * 0)
    out = net(x)
    debugger.stop()
    debugger.step()
    assert not out.asnumpy().any()  # the user's output hook ran after the tool's
    entry = load_step(dump_path, 0).data["Cell.0.Dense.forward.0"]
    recorded = np.float32(x.asnumpy() * 2)  # the early hook's value, before the late one's + 100
    assert entry["input_args"][0]["Max"] == float(recorded.max())
    assert entry["input_args"][0]["Min"] == float(recorded.min())
    expected = (x.asnumpy() * 2 + 100) @ fc.weight.asnumpy().T + fc.bias.asnumpy()
    assert entry["output"][0]["Max"] == pytest.approx(float(expected.max()), rel=1e-6)
    assert len(fc._forward_pre_hook) == 2 and len(fc._forward_hook) == 1
    assert not fc._forward_pre_hook_with_kwargs and not fc._forward_hook_always_called
    for handle in (early, late, late_out):
        handle.remove()
    assert not fc._forward_pre_hook and not fc._forward_hook


def test_l0_model_without_sub_cells_says_nothing_is_recorded(tmp_path, caplog):
    """L0 records the Cells inside the model given to ``start()``: a model that is one layer has
    none, and the user is told once, with the level that records its API calls; the step's
    dump.json says it is empty."""
    import logging

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="L0")
    net = nn.Dense(4, 1)
    grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, net.trainable_params())
    x = Tensor(np.ones((2, 4), np.float32))
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for _ in range(2):
            debugger.start(net)
            grad_fn(x)
            debugger.stop()
            debugger.step()
    said = [r.getMessage() for r in caplog.records if "has none" in r.getMessage()]
    assert said == ["msprobe: level L0 records the Cells inside the model given to start(); Dense has none, "
                    "so nothing is recorded (level L1 or mix records its API calls)"]
    with open(os.path.join(only_step_dir(str(tmp_path / "dump"), 0), "dump.json")) as f:
        assert json.load(f)["data"] == {}


class _CastNet(nn.Cell):
    """``b`` gets ``a``'s output cast to ``dtype``: Float16 against its Float32 weight raises in MatMul."""

    def __init__(self, dtype):
        super().__init__()
        self.a, self.b, self.dtype = nn.Dense(4, 4), nn.Dense(4, 2), dtype

    def construct(self, x):
        return self.b(self.a(x).astype(self.dtype))


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_cell_whose_forward_raised_says_so(tmp_path, level):
    """A Cell whose forward raised has ``"error": "the call raised {type}: ..."`` and no ``output``;
    a Cell called (and returning) inside the program's own ``except`` block is recorded as usual;
    at L0 ``first-diff`` against a run that did not raise says the target run's call raised there."""
    from test_compare import cli

    x = Tensor(np.ones((2, 4), np.float32))
    dumps = {}
    for name, dtype in (("f16", ms.float16), ("f32", ms.float32)):
        ms.set_seed(3)
        net = _CastNet(dtype)
        dumps[name] = str(tmp_path / name)
        debugger = PrecisionDebugger(dump_path=dumps[name], task="statistics", level=level)
        debugger.start(net)
        try:
            net(x)
        except TypeError as exc:
            assert name == "f16" and "MatMul" in str(exc)
            net.a(x)  # inside the except block: returns normally
        debugger.stop()
        debugger.step()
        debugger.close()
    data = msprobe.dump.load(only_step_dir(dumps["f16"], 0)).data
    raised = data["Cell.b.Dense.forward.0"]
    assert "output" not in raised and raised["error"].startswith("the call raised TypeError: For 'MatMul'")
    assert set(raised["parameters"]) == {"weight", "bias"}
    assert "error" not in data["Cell.a.Dense.forward.1"] and data["Cell.a.Dense.forward.1"]["output"][0]["Max"]
    out = cli("first-diff", only_step_dir(dumps["f16"], 0), only_step_dir(dumps["f32"], 0)).stdout
    if level == "L0":  # at mix the MatMul inside it comes first (an API call that raised has no output)
        assert "Cell.b.Dense.forward.0" in out.splitlines()[0]
        assert "the target run's call raised TypeError: For 'MatMul'" in out.splitlines()[1]


# ------------------------------------------------- a Cell whose calls take different backward paths
class Switch(nn.Cell):
    """Two outputs when ``pair`` (several autograd nodes), else one output made by one node."""

    def construct(self, x, pair=False):
        if pair:
            return x * 2.0, x * 3.0
        return x * 2.0


class SwitchNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.sw = Switch()

    def construct(self, x):
        h = self.fc(x)
        a, b = self.sw(h, pair=True)
        c = self.sw(h)
        return (a + b + c * c).sum()


def _exact_stats(values):
    v = np.asarray(values, np.float64)
    return v.max(), v.min(), v.mean(), float(np.sqrt((v * v).sum()))


def test_cell_calls_taking_different_backward_paths_record_the_framework_gradients(tmp_path):
    """The Cell's first call (two outputs) is observed by the general path, its second (one output
    of one autograd node) could be taken by the compiled common case: the backward entries of both
    hold the gradients MindSpore computes (w.r.t. the outputs and the Cell's own share of the
    input's gradient), as a float64 recomputation of them gives."""
    net = SwitchNet()
    x = Tensor(np.array([[1.0, -2.0, 0.5], [0.25, 1.5, -1.0]], np.float32))
    debugger, dump_path = make_debugger(tmp_path)
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    for _ in range(2):  # the second step's calls run after the first step's
        debugger.start(net)
        grad_fn(x)
        debugger.stop()
        debugger.step()
    debugger.service.close()
    h = net.fc(x).asnumpy()
    c = h * np.float32(2.0)
    ones = np.ones_like(h)
    for step in range(2):
        data = load_step(dump_path, step).data
        first, second = data["Cell.sw.Switch.backward.0"], data["Cell.sw.Switch.backward.1"]
        expected = {"first input": [ones, ones], "first output": [ones * np.float32(5.0)],
                    "second input": [c * np.float32(2.0)], "second output": [c * np.float32(4.0)]}
        got = {"first input": first["input"], "first output": first["output"],
               "second input": second["input"], "second output": second["output"]}
        for key, arrays in expected.items():
            assert len(got[key]) == len(arrays), key
            for leaf, array in zip(got[key], arrays):
                assert (leaf["Max"], leaf["Min"], leaf["Mean"], leaf["Norm"]) == _exact_stats(array), (step, key)
