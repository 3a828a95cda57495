"""L2 kernel dump (msprobe/capture/kernel/kernel_dump.py) against real MindSpore CPU.

MindSpore reads MINDSPORE_DUMP_CONFIG once per process, so every scenario runs in its own
subprocess (small script below, with a timeout).
"""
from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from msprobe.capture.kernel.kernel_dump import (ENV_VAR, STATISTIC_HEADER, KernelDump, _load,
                                         kernel_file_name)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(r"""
    import json, os, shutil, sys, types
    sys.path.insert(0, {repo!r})
    spec = json.loads(sys.argv[1])
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops
    from msprobe.capture.kernel.kernel_dump import KernelDump

    scenario = spec.pop("scenario")
    copy_raw = spec.pop("copy_raw", None)
    ms.set_seed(0)
    ms.set_context(mode=ms.PYNATIVE_MODE if scenario == "jit" else ms.GRAPH_MODE)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 3)
            self.relu = nn.ReLU()
        def construct(self, x):
            return self.relu(self.fc(x))

    net = Net()          # built before start(), as users do
    kd = KernelDump(types.SimpleNamespace(**spec))
    handle = kd.install()  # = PrecisionDebugger(...).start()

    x = ms.Tensor(np.random.RandomState(0).rand(2, 4).astype(np.float32))
    y = ms.Tensor(np.random.RandomState(1).rand(2, 3).astype(np.float32))
    if scenario == "graph":
        step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    elif scenario == "jit":
        loss_fn, opt = nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1)
        def forward(a, b):
            return loss_fn(net(a), b)
        grad_fn = ms.value_and_grad(forward, None, opt.parameters)
        @ms.jit
        def step(a, b):
            loss, grads = grad_fn(a, b)
            opt(grads)
            return loss
    elif scenario == "long":
        class Leaf(nn.Cell):
            def __init__(self):
                super().__init__()
                self.relu = nn.ReLU()
            def construct(self, a):
                return self.relu(a)
        def wrap(inner, depth):
            attr = "deeply_nested_block_with_a_long_attribute_name_level_%d_" % depth + "x" * 24
            class Wrap(nn.Cell):
                def __init__(self):
                    super().__init__()
                    setattr(self, attr, inner)
                def construct(self, a):
                    return getattr(self, attr)(a)
            return Wrap()
        model = Leaf()
        for depth in range(4):
            model = wrap(model, depth)
        step = lambda a, b: model(a)
    steps = {{}}
    for _ in range(2):
        step(x, y)
        if copy_raw and os.path.isdir(kd.raw_dir):
            shutil.copytree(kd.raw_dir, copy_raw, dirs_exist_ok=True)
        for d in kd.collect():      # = debugger.step()
            steps[d] = True
    kd.collect()                    # idempotent: nothing new
    handle.remove()
    print("RESULT" + json.dumps({{"dirs": sorted(steps), "env": os.environ.get({env!r})}}))
""").format(repo=REPO, env=ENV_VAR)


def run_scenario(tmp_path, scenario, **cfg):
    spec = dict(task="statistics", dump_path=str(tmp_path / "dump"), rank=(), step=(), api_list=(),
                data_mode=("all",), summary_mode="statistics", scenario=scenario)
    spec.update(cfg)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "RANK_ID", "RANK")}
    proc = subprocess.run([sys.executable, str(script), json.dumps(spec)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")][-1]
    result = json.loads(line[len("RESULT"):])
    assert result["env"] is None  # handle.remove() restored the (unset) variable
    return result


def step_dirs(dump_path):
    return sorted(glob.glob(os.path.join(dump_path, "rank_0", "*", "step_*")))


def read_stats(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def test_statistics_two_steps_exact(tmp_path):
    raw_copy = tmp_path / "raw_copy"
    res = run_scenario(tmp_path, "graph", copy_raw=str(raw_copy))
    dump = str(tmp_path / "dump")
    dirs = step_dirs(dump)
    assert [os.path.basename(d) for d in dirs] == ["step_0", "step_1"]
    assert sorted(res["dirs"]) == dirs
    assert len({os.path.dirname(d) for d in dirs}) == 1  # one {timestamp} directory
    raw = {}
    for f in glob.glob(str(raw_copy / "rank_0" / "Net" / "*" / "*" / "*.npy")):
        ts, io, slot = os.path.basename(f).split(".")[-6:-3]
        raw[(f.split(os.sep)[-2], ts, io, slot)] = f
    checked = 0
    for d in dirs:
        assert os.listdir(d) == ["statistic.csv"]  # tensors deleted for task statistics
        header, rows = read_stats(os.path.join(d, "statistic.csv"))
        assert tuple(header) == STATISTIC_HEADER + ("Max Value", "Min Value", "Avg Value",
                                                    "L2Norm Value")
        assert len(rows) > 20
        ops_seen = {r[0] for r in rows}
        assert {"MatMul", "BiasAdd", "ReLU", "Parameter"} <= ops_seen
        for r in rows:
            arr, dtype, nbytes = _load(raw[(d.rsplit("_", 1)[1], r[4], r[5], r[6])])
            assert r[8] == dtype and int(r[7]) == nbytes
            assert r[9] == "(" + ",".join(map(str, arr.shape)) + ")"
            if arr.size == 0:
                continue
            f64 = arr.astype(np.float64).ravel()
            assert float(r[10]) == f64.max() and float(r[11]) == f64.min()
            assert float(r[12]) == pytest.approx(f64.mean(), rel=1e-6, abs=1e-12)
            assert float(r[13]) == pytest.approx(np.sqrt((f64 * f64).sum()), rel=1e-6, abs=1e-12)
            checked += 1
    assert checked > 40


def test_step_filter(tmp_path):
    run_scenario(tmp_path, "graph", step=(1,))
    assert [os.path.basename(d) for d in step_dirs(str(tmp_path / "dump"))] == ["step_1"]


def test_list_filter_by_op_type(tmp_path):
    run_scenario(tmp_path, "graph", task="tensor", api_list=("MatMul",))
    dirs = step_dirs(str(tmp_path / "dump"))
    assert len(dirs) == 2
    for d in dirs:
        files = os.listdir(d)
        assert files and all(f.startswith("MatMul.") for f in files)
        assert {f.split(".")[1] for f in files} == {  # forward MatMul and its gradient MatMul
            "Default_network-WithLossCell__backbone-Net_fc-Dense_MatMul-op0",
            "Gradients_Default_network-WithLossCell__backbone-Net_fc-Dense_Grad_MatMul_MatMul-op0"}
        for f in files:
            np.load(os.path.join(d, f))


def test_data_mode_input_only(tmp_path):
    run_scenario(tmp_path, "graph", task="tensor", data_mode=("input",))
    dirs = step_dirs(str(tmp_path / "dump"))
    assert len(dirs) == 2
    for d in dirs:
        files = os.listdir(d)
        assert len(files) > 10
        assert {f.split(".")[-5] for f in files} == {"input"}


def test_jit_function_from_pynative(tmp_path):
    run_scenario(tmp_path, "jit", task="tensor")
    dirs = step_dirs(str(tmp_path / "dump"))
    assert [os.path.basename(d) for d in dirs] == ["step_0", "step_1"]
    for d in dirs:
        names = os.listdir(d)
        assert any(n.startswith("MatMul.") for n in names)
        assert any(n.startswith("ReluGrad.") for n in names)  # backward is inside the jit graph


def test_long_names_mapping(tmp_path):
    run_scenario(tmp_path, "long", task="tensor")
    dirs = step_dirs(str(tmp_path / "dump"))
    assert len(dirs) == 2
    for d in dirs:
        with open(os.path.join(d, "mapping.csv"), newline="") as fh:
            mapping = dict(csv.reader(fh))
        assert len(mapping) == 2  # ReLU input and output
        for new, original in mapping.items():
            assert re.fullmatch(r"\d{32}\.npy", new)
            assert original.startswith("ReLU.Default_deeply_nested_block")
            assert len(original.encode()) > 255
            assert np.load(os.path.join(d, new)).shape == (2, 4)
        assert set(os.listdir(d)) - set(mapping) - {"mapping.csv"}  # the short Parameter file


def test_long_names_statistics_keep_full_op_name(tmp_path):
    run_scenario(tmp_path, "long")
    for d in step_dirs(str(tmp_path / "dump")):
        assert os.listdir(d) == ["statistic.csv"]
        _, rows = read_stats(os.path.join(d, "statistic.csv"))
        relu = [r for r in rows if r[0] == "ReLU"]
        assert len(relu) == 2 and len(relu[0][1]) > 200


# ------------------------------------------------------------------ in-process (no MindSpore run)

def make_cfg(tmp_path, **kw):
    cfg = dict(task="statistics", dump_path=str(tmp_path / "d"), rank=(), step=(), api_list=(),
               data_mode=("all",), summary_mode="statistics")
    cfg.update(kw)
    return types.SimpleNamespace(**cfg)


def test_kernel_file_name():
    short = "MatMul.Default_MatMul-op0.0.0.1.input.0.DefaultFormat.Float32.npy"
    assert kernel_file_name(short) == short
    long = "ReLU." + "a" * 300 + ".0.0.1.output.0.DefaultFormat.Float32.npy"
    new = kernel_file_name(long)
    assert re.fullmatch(r"\d{32}\.npy", new) and kernel_file_name(long) == new


@pytest.mark.parametrize("mode", [("forward",), ("input", "output"), ("all", "input")])
def test_data_mode_rejected(tmp_path, mode):
    with pytest.raises(ValueError) as err:
        KernelDump(make_cfg(tmp_path, data_mode=mode))
    text = str(err.value)
    assert "data_mode" in text and repr(mode[0]) in text and "'all', 'input', 'output'" in text


def test_native_config_mapping(tmp_path):
    kd = KernelDump(make_cfg(tmp_path, step=(1, 3), rank=(0,), api_list=("MatMul", "name-regex(.*ReLU.*)"),
                             data_mode=("output",), task="tensor"))
    common = kd.native_config()["common_dump_settings"]
    assert common["iteration"] == "1|3" and common["dump_mode"] == 1
    assert common["kernels"] == ["MatMul", "name-regex(.*ReLU.*)"]
    assert common["input_output"] == 2 and common["support_device"] == [0]
    assert common["saved_data"] == "tensor" and common["file_format"] == "npy"
    assert common["path"].startswith(str(tmp_path / "d"))
    plain = KernelDump(make_cfg(tmp_path)).native_config()["common_dump_settings"]
    assert plain["iteration"] == "all" and plain["dump_mode"] == 0 and plain["input_output"] == 0


def test_install_sets_and_restores_env(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "/previous.json")
    monkeypatch.delenv("RANK_ID", raising=False)
    kd = KernelDump(make_cfg(tmp_path))
    handle = kd.install()
    assert os.environ[ENV_VAR] == kd.json_path
    with open(kd.json_path) as fh:
        assert json.load(fh)["common_dump_settings"]["path"] == kd.raw_dir
    handle.remove()
    assert os.environ[ENV_VAR] == "/previous.json"
    assert kd.collect() == []


def test_excluded_rank_sets_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("RANK_ID", "1")
    handle = KernelDump(make_cfg(tmp_path, rank=(0,))).install()
    assert ENV_VAR not in os.environ
    handle.remove()


def test_dotted_dump_path_uses_valid_raw_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    kd = KernelDump(make_cfg(tmp_path, dump_path=str(tmp_path / "out.v1")))
    handle = kd.install()
    try:
        assert re.fullmatch(r"[A-Za-z0-9_/-]+", kd.raw_dir) and os.path.isdir(kd.raw_dir)
        assert kd.json_path.startswith(str(tmp_path / "out.v1"))
    finally:
        handle.remove()
        os.rmdir(kd.raw_dir)


def _write_bf16_npy(path, values):
    bits = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2")
    header = "{'descr': '<E2', 'fortran_order': False, 'shape': %r, }" % (bits.shape,)
    header = header.ljust(117) + "\n"  # 10-byte preamble + 118 = 128, a multiple of 64
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1"))
        fh.write(bits.tobytes())


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_collect_crafted_raw_tree(tmp_path, task):
    """bf16 '<E2' files, MindSpore's own mapping.csv for long names, partial files, idempotence."""
    kd = KernelDump(make_cfg(tmp_path, task=task))
    it_dir = os.path.join(kd.raw_dir, "rank_0", "Net", "0", "3")
    os.makedirs(it_dir)
    bf16_name = "Cast.Default_Cast-op0.0.0.17.output.0.DefaultFormat.BFloat16.npy"
    _write_bf16_npy(os.path.join(it_dir, bf16_name), [1.5, -2.0, 0.25])
    long_name = "Add.Default_" + "b" * 260 + "_Add-op0.0.0.18.input.1.DefaultFormat.Float32.npy"
    np.save(os.path.join(it_dir, "123456.npy"), np.arange(6, dtype=np.float32).reshape(2, 3))
    with open(os.path.join(it_dir, "mapping.csv"), "w") as fh:
        fh.write(f"123456.npy,{long_name}\n")
    partial = "Mul.Default_Mul-op0.0.0.19.output.0.DefaultFormat.Float32.npy"
    np.save(os.path.join(it_dir, partial), np.ones(100, np.float32))
    full_bytes = open(os.path.join(it_dir, partial), "rb").read()
    with open(os.path.join(it_dir, partial), "wb") as fh:
        fh.write(full_bytes[:-40])  # still being written
    dirs = kd.collect()
    assert [os.path.basename(d) for d in dirs] == ["step_3"]
    out = dirs[0]
    if task == "statistics":
        _, rows = read_stats(os.path.join(out, "statistic.csv"))
        by_op = {r[0]: r for r in rows}
        assert set(by_op) == {"Cast", "Add"}
        cast = by_op["Cast"]
        assert cast[7:10] == ["6", "bfloat16", "(3)"]  # MindSpore joins dims: "(2,3)", "(3)", "()"
        assert [float(v) for v in cast[10:14]] == [1.5, -2.0, -0.25 / 3, np.sqrt(1.5**2 + 4 + 0.0625)]
        assert by_op["Add"][1] == long_name.split(".")[1]
    else:
        assert os.path.exists(os.path.join(out, bf16_name))
        with open(os.path.join(out, "mapping.csv")) as fh:
            new, original = fh.read().strip().split(",")
        assert original == long_name and re.fullmatch(r"\d{32}\.npy", new)
        assert np.load(os.path.join(out, new)).shape == (2, 3)
    # the partial file is finished later: the next collect picks it up, nothing is repeated
    with open(os.path.join(it_dir, partial), "wb") as fh:
        fh.write(full_bytes)
    assert kd.collect() == [out]
    assert kd.collect() == []
    if task == "statistics":
        _, rows = read_stats(os.path.join(out, "statistic.csv"))
        assert sorted(r[0] for r in rows) == ["Add", "Cast", "Mul"]


def test_statistic_columns_of_every_summary_item(tmp_path):
    """Every summary item on float (NaN, ±Inf, ±0), int, bool, 0-d and empty kernel outputs: the
    values of a float64 numpy recomputation, the counts of the elements, md5 of the payload bytes."""
    items = ["max", "min", "mean", "l2norm", "nan count", "negative inf count", "positive inf count",
             "zero count", "negative zero count", "positive zero count", "md5"]
    kd = KernelDump(make_cfg(tmp_path, summary_mode=items))
    it_dir = os.path.join(kd.raw_dir, "rank_0", "Net", "0", "1")
    os.makedirs(it_dir)
    arrays = {
        "Floats": np.array([1.5, -0.0, 0.0, -np.inf, np.inf, 2.0], np.float32),
        "Nans": np.array([1.0, np.nan], np.float16),
        "Ints": np.array([[-3, 0], [7, 5]], np.int32),
        "Bools": np.array([True, False, True]),
        "Scalar": np.array(-4, np.int64),
        "Empty": np.zeros((0, 3), np.float32),
    }
    for ts, (op, arr) in enumerate(arrays.items()):
        np.save(os.path.join(it_dir, f"{op}.Default_{op}-op0.0.0.{ts}.output.0.DefaultFormat.X.npy"), arr)
    payload = {}  # the bytes after each file's header
    for f in glob.glob(os.path.join(it_dir, "*.npy")):
        op = os.path.basename(f).split(".")[0]
        payload[op] = open(f, "rb").read()[-arrays[op].nbytes:] if arrays[op].nbytes else b""
    [out] = kd.collect()
    header, rows = read_stats(os.path.join(out, "statistic.csv"))
    assert header[len(STATISTIC_HEADER):] == ["Max Value", "Min Value", "Avg Value", "Negative Zero Count",
                                              "Positive Zero Count", "Zero Count", "NaN Count",
                                              "Negative Inf Count", "Positive Inf Count", "L2Norm Value",
                                              "MD5"]
    got = {r[0]: dict(zip(header, r)) for r in rows}
    assert set(got) == set(arrays)
    for op, arr in arrays.items():
        row = got[op]
        f64 = arr.astype(np.float64).ravel()
        assert row["MD5"] == hashlib.md5(payload[op]).hexdigest(), op
        if arr.size == 0:
            assert [row[c] for c in ("Max Value", "Min Value", "Avg Value", "L2Norm Value")] == [""] * 4
            continue
        with np.errstate(invalid="ignore"):  # inf - inf in the mean: NaN, as the tool writes
            expect = [f64.max(), f64.min(), f64.mean(), np.sqrt((f64 * f64).sum())]
        np.testing.assert_array_equal(  # NaN equals NaN here, any other value exactly
            [float(row[c]) for c in ("Max Value", "Min Value", "Avg Value", "L2Norm Value")], expect, op)
        assert int(row["NaN Count"]) == int(np.isnan(f64).sum()), op
        assert int(row["Positive Inf Count"]) == int(np.isposinf(f64).sum()), op
        assert int(row["Negative Inf Count"]) == int(np.isneginf(f64).sum()), op
        assert int(row["Zero Count"]) == int((f64 == 0).sum()), op
        floats = arr.dtype.kind == "f"  # MindSpore's csv: no signed zeros for other dtypes
        negative, positive = (f64 == 0) & np.signbit(f64), (f64 == 0) & ~np.signbit(f64)
        assert int(row["Negative Zero Count"]) == (int(negative.sum()) if floats else 0)
        assert int(row["Positive Zero Count"]) == (int(positive.sum()) if floats else 0)
    assert got["Ints"]["Max Value"] == "7" and got["Bools"]["Max Value"] == "1"  # integers stay integers
    assert got["Scalar"]["Avg Value"] == "-4.0" and got["Scalar"]["L2Norm Value"] == "4.0"
