"""Watch mode: every step is watched, nothing but a heartbeat is written while values stay finite, and
the first producer of a NaN/Inf is written with its history as normal step directories."""
from __future__ import annotations

import glob
import json
import logging
import math
import os
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import msprobe
import msprobe.dump
from msprobe.engine.config import ConfigError, load_config
from msprobe.engine.watch import WatchAnomaly
from msprobe.format import journal
from msprobe.mindspore import PrecisionDebugger


def _debugger(tmp_path, level, watch, name="dump"):
    dump_path = os.path.join(str(tmp_path), name)
    cfg = {"task": "statistics", "dump_path": dump_path, "level": level}
    if watch is not None:  # None: a plain dump of every step
        cfg["watch"] = watch
    path = os.path.join(str(tmp_path), f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return PrecisionDebugger(config_path=path), dump_path


class Poison(nn.Cell):
    """``log(h - shift)``: finite while ``shift`` is 0 and h > 0, NaN once ``shift`` is large."""

    def __init__(self):
        super().__init__()
        self.shift = 0.0

    def construct(self, h):
        return ops.log(h - self.shift)


class Sqrt(nn.Cell):
    """``sqrt(relu(h) * 0)``: finite forward (0), infinite gradient (0.5 / sqrt(0)) in the backward."""

    def __init__(self):
        super().__init__()
        self.on = False

    def construct(self, h):
        return ops.sqrt(ops.relu(h) * 0.0) if self.on else h


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4, weight_init="ones", bias_init="ones")
        self.poison = Poison()
        self.sq = Sqrt()
        self.head = nn.Dense(4, 1, weight_init="ones")

    def construct(self, x):
        return self.head(self.sq(self.poison(ops.relu(self.fc(x)) + 1.0))).sum()


def _train(net, debugger, steps, at=None, poison=None):
    opt = nn.SGD(net.trainable_params(), 0.001)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    x = Tensor(np.full((2, 4), 0.5, np.float32))
    for step in range(steps):
        if poison is not None:
            poison(net, step == at)
        debugger.start(net)
        _, grads = grad_fn(x)
        opt(grads)
        debugger.stop()
        debugger.step()


def _forward_nan(net, on):
    net.poison.shift = 100.0 if on else 0.0


def _backward_inf(net, on):
    net.sq.on = on


def _anomaly(dump_path, step):
    (d,) = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
    with open(os.path.join(d, "anomalies.json")) as f:
        return d, json.load(f)


@pytest.mark.parametrize("level, producer, cell", [
    ("L1", "Functional.log.0.forward", None),
    ("mix", "Functional.log.0.forward", "Cell.poison.Poison.forward.0"),
    ("L0", "Cell.poison.Poison.forward.0", None),
])
def test_forward_nan_producer_named_with_step_and_cell(tmp_path, caplog, level, producer, cell):
    debugger, dump_path = _debugger(tmp_path, level, {"history": 200})
    ms.set_seed(0)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _train(Net(), debugger, 5, at=3, poison=_forward_nan)
    d, found = _anomaly(dump_path, 3)
    (message,) = [r.getMessage() for r in caplog.records if "watch found" in r.getMessage()]
    assert f"first produced by {producer}{f' (in {cell})' if cell else ''} at step 3;" in message, message
    assert found["first_producer"] == producer
    assert (found["producer"], found["step"], found["kind"], found["cell"]) == (producer, 3, "nan", cell)
    assert "trigger" in found and "rank" in found
    dump = msprobe.dump.load(d)
    assert dump.complete and producer in dump.data
    # statistics of the producer: inputs finite, output NaN
    body = dump.data[producer]
    assert np.isfinite(body["input_args"][0]["Max"]) and np.isnan(body["output"][0]["Max"])
    # the history: earlier clean steps' calls are there too (200 entries cover all)
    assert os.path.isdir(os.path.join(dump_path, "step2"))
    assert not os.path.exists(os.path.join(dump_path, "step4"))   # after the anomaly: memory only


@pytest.mark.parametrize("level, producer, kind", [
    ("L1", "Functional.sqrt.0.backward", "inf"),      # 0.5 / sqrt(0)
    ("L0", "Cell.sq.Sqrt.backward.0", "nan"),         # the Cell's input gradient: inf * 0 (relu(h) * 0)
])
def test_backward_overflow_producer(tmp_path, level, producer, kind):
    debugger, dump_path = _debugger(tmp_path, level, {"history": 64})
    ms.set_seed(0)
    _train(Net(), debugger, 3, at=1, poison=_backward_inf)
    _, found = _anomaly(dump_path, 1)
    assert (found["producer"], found["kind"]) == (producer, kind)


def test_clean_steps_write_only_the_heartbeat(tmp_path):
    debugger, dump_path = _debugger(tmp_path, "mix", {})
    ms.set_seed(0)
    _train(Net(), debugger, 3)
    (name,) = os.listdir(dump_path)
    assert name.startswith("watch_heartbeat.")
    with open(os.path.join(dump_path, name)) as f:
        beat = json.load(f)
    assert beat["steps_watched"] == 3 and beat["last_step"] == 2 and beat["anomaly"] is None
    assert beat["run_id"] == journal.run_id() and beat["msprobe_version"] == msprobe.__version__


def test_a_clean_rerun_leaves_the_earlier_runs_anomaly_dump_in_place(tmp_path, caplog):
    """A watch run writes (and so moves an earlier run's directory aside) only when it finds an
    anomaly: a clean rerun into the same dump_path keeps the earlier dump readable where it was."""
    first, dump_path = _debugger(tmp_path, "L1", {"history": 200})
    ms.set_seed(0)
    _train(Net(), first, 3, at=1, poison=_forward_nan)
    first.service.close()
    d, found = _anomaly(dump_path, 1)
    again, _ = _debugger(tmp_path, "L1", {"history": 200})
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _train(Net(), again, 3)
        again.service.close()
    assert not [r for r in caplog.records if "already holds a dump" in r.getMessage()]
    assert _anomaly(dump_path, 1) == (d, found)
    assert not glob.glob(os.path.join(dump_path, "*", "*.previous-*"))


def test_a_rerun_moves_the_earlier_runs_heartbeats_aside(tmp_path, caplog):
    """A rerun into the same dump_path leaves one heartbeat of a live process there, its own: the
    earlier run's heartbeat of the same name (a rerun in this process) and the heartbeat of an
    earlier process without a rank that no longer runs are moved aside as the first watched step
    opens, said in the run's one WARNING about moves and counted in its closing line."""
    import subprocess
    import sys

    first, dump_path = _debugger(tmp_path, "L1", {})
    ms.set_seed(0)
    _train(Net(), first, 2)
    first.service.close()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_beat = os.path.join(dump_path, f"watch_heartbeat.proc{int(dead.stdout)}.json")
    with open(dead_beat, "w") as f:
        f.write('{"steps_watched": 99}')
    again, _ = _debugger(tmp_path, "L1", {})
    ours = os.path.join(dump_path, f"watch_heartbeat.proc{os.getpid()}.json")
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        again.start(Net())  # the first watched step opens: nothing of the earlier runs is left beside it
        assert not os.path.exists(ours) and not os.path.exists(dead_beat)
        again.stop()
        again.step()
        _train(Net(), again, 2)
        again.service.close()
    assert glob.glob(os.path.join(dump_path, "watch_heartbeat.*.json")) == [ours]
    with open(ours) as f:
        assert json.load(f)["steps_watched"] == 3
    aside = sorted(n for n in os.listdir(dump_path) if ".previous-" in n)
    assert len(aside) == 2, aside
    old = [n for n in aside if n.startswith(os.path.basename(ours))]
    with open(os.path.join(dump_path, old[0])) as f:
        assert json.load(f)["steps_watched"] == 2        # the first run's, kept
    said = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
    assert len(said) == 2, said
    assert said[0] == (f"msprobe: {ours} is the watch heartbeat of an earlier run; it was moved to "
                       f"{os.path.join(dump_path, old[0])} and this run writes {ours}")
    assert said[1].startswith("msprobe: this run moved 2 files an earlier run left aside, each to "
                              "{name}.previous-{time} beside it"), said[1]


def test_raise_stops_training_after_the_files_are_complete(tmp_path):
    debugger, dump_path = _debugger(tmp_path, "L1", {"on_anomaly": "raise"})
    ms.set_seed(0)
    with pytest.raises(WatchAnomaly) as info:
        _train(Net(), debugger, 5, at=2, poison=_forward_nan)
    assert "Functional.log.0.forward" in str(info.value) and "step 2" in str(info.value)
    d, found = _anomaly(dump_path, 2)        # written before the exception reached the loop
    assert found["producer"] == "Functional.log.0.forward"
    assert "Functional.log.0.forward" in msprobe.dump.load(d).data
    debugger.step()


def test_save_tensors_writes_the_producers_tensors(tmp_path):
    debugger, dump_path = _debugger(tmp_path, "L1", {"save_tensors": True})
    ms.set_seed(0)
    _train(Net(), debugger, 3, at=1, poison=_forward_nan)
    d, _ = _anomaly(dump_path, 1)
    dump = msprobe.dump.load(d)
    body = dump.data["Functional.log.0.forward"]
    out = dump.load_tensor(body["output"][0])
    assert np.isnan(out).all()
    arg = dump.load_tensor(body["input_args"][0])
    assert arg.shape == (2, 4) and np.isfinite(arg).all()
    assert sorted(os.listdir(os.path.join(d, "dump_tensor_data"))) == [
        "Functional.log.0.forward.input.0.npy", "Functional.log.0.forward.output.0.npy"]


def test_history_bounded_over_a_long_run(tmp_path):
    import psutil

    debugger, dump_path = _debugger(tmp_path, "L1", {"history": 32})
    ms.set_seed(0)
    net = Net()
    rss = []
    for chunk in range(4):
        _train(net, debugger, 60)
        rss.append(psutil.Process().memory_info().rss)
    watch = debugger.service.runtime.watch
    assert len(watch.ring) <= 32
    assert watch.steps == 240 and watch.records > 240 * 5
    assert rss[-1] - rss[1] < 16 << 20, [r >> 20 for r in rss]   # flat after warm-up
    assert os.listdir(dump_path) == [n for n in os.listdir(dump_path) if n.startswith("watch_heartbeat.")]


def _end_a_step_abnormally(net, debugger):
    """A step whose forward ran, ended by an exception (``step()`` called without ``stop()``)."""
    debugger.start(net)
    net(Tensor(np.ones((2, 4), np.float32)))
    try:
        raise KeyError("data loader failed")
    except KeyError:
        debugger.step()


def test_abnormal_end_writes_the_history(tmp_path):
    """An exception in the step (step() called without stop()) writes the flight record."""
    debugger, dump_path = _debugger(tmp_path, "L1", {})
    ms.set_seed(0)
    net = Net()
    _train(net, debugger, 2)
    _end_a_step_abnormally(net, debugger)
    (d,) = glob.glob(os.path.join(dump_path, "step2", "*"))
    assert "Functional.log.0.forward" in msprobe.dump.load(d).data
    with open(os.path.join(d, "dump.json")) as f:
        assert "without stop()" in json.load(f)["abnormal"]
    assert not os.path.exists(os.path.join(d, "anomalies.json"))   # no NaN: no anomaly report


@pytest.mark.parametrize("watch, field", [
    ({"history": 0}, "watch.history"), ({"anomaly": ["nan", "huge"]}, "watch.anomaly[1]"),
    ({"on_anomaly": "stop"}, "watch.on_anomaly"), ({"save_tensors": "yes"}, "watch.save_tensors"),
    ({"max_abs": -1}, "watch.max_abs"), ([], "watch"),
])
def test_invalid_watch_settings_name_the_field(tmp_path, watch, field):
    path = os.path.join(str(tmp_path), "c.json")
    with open(path, "w") as f:
        json.dump({"task": "statistics", "dump_path": str(tmp_path), "level": "L1", "watch": watch}, f)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == field


def test_a_bound_given_inside_anomaly_is_said_to_belong_to_watch(tmp_path):
    path = os.path.join(str(tmp_path), "c.json")
    with open(path, "w") as f:
        json.dump({"task": "statistics", "dump_path": str(tmp_path), "level": "L1",
                   "watch": {"anomaly": {"nan": True, "inf": True, "max_abs": 50}}}, f)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == "watch.anomaly"
    assert "('max_abs' is a key of 'watch' itself, not of 'anomaly', e.g. \"watch\": {\"anomaly\": " \
           "[\"nan\", \"inf\"], \"max_abs\": ...}); allowed: a non-empty list of 'nan', 'inf'" in str(info.value)


def test_watch_needs_statistics_at_a_hooked_level(tmp_path):
    path = os.path.join(str(tmp_path), "c.json")
    for extra in ({"task": "tensor", "level": "L1"}, {"task": "statistics", "level": "L2"}):
        with open(path, "w") as f:
            json.dump({"dump_path": str(tmp_path), "watch": {}, **extra}, f)
        with pytest.raises(ConfigError, match="watch"):
            load_config(path)


def test_magnitude_bound_triggers(tmp_path):
    debugger, dump_path = _debugger(tmp_path, "L1", {"max_abs": 1e3})
    ms.set_seed(0)
    net = Net()

    def scale(n, on):
        n.poison.shift = -1e4 if on else 0.0      # log(h + 1e4): finite, but h + 1e4 > max_abs

    _train(net, debugger, 3, at=1, poison=scale)
    _, found = _anomaly(dump_path, 1)
    assert (found["kind"], found["producer"]) == ("max_abs", "Tensor.__sub__.0.forward")
    # the texts speak of the kind found, and the reading tools name the producer
    assert "NaN" not in found["rule"] and "inputs finite" not in found["trigger"]
    from msprobe.compare import nan_producer
    from msprobe.read.reader import summarize
    assert "Tensor.__sub__.0.forward (a value beyond max_abs, watch mode)" in summarize(dump_path)
    first = nan_producer(dump_path)
    assert [(f.kind, f.entry, f.step) for f in first] == [("anomaly", "Tensor.__sub__.0.forward", 1)]
    assert "max_abs" in first[0].reason()
    from msprobe.compare.html import write_report
    with open(write_report(dump_path, str(tmp_path / "report.html")), encoding="utf-8") as f:
        html = f.read()
    assert "First anomaly producer (watch mode)" in html and "First NaN/Inf producer" not in html


class ShiftedLog(nn.Cell):
    """``log(fc(x) - shift)`` with ``shift`` a tensor argument: beyond ``max_abs`` in the anomaly's
    step, so ``Tensor.__sub__`` passes a value beyond the bound on and ``log`` makes the NaN."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 1, weight_init="ones", bias_init="ones")

    def construct(self, x, shift):
        return ops.log(self.fc(x) - shift).sum()


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_nan_made_from_an_input_beyond_max_abs_names_its_recorded_producer(tmp_path, caplog, level):
    debugger, dump_path = _debugger(tmp_path, level, {"max_abs": 50})
    net = ShiftedLog()
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    x = Tensor(np.ones((2, 4), np.float32))
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        for step in range(4):
            debugger.start(net)
            grad_fn(x, Tensor(100.0 if step == 2 else 0.0, ms.float32))
            debugger.stop()
            debugger.step()
    _, found = _anomaly(dump_path, 2)
    producer = "Functional.log.0.forward"
    assert (found["producer"], found["kind"], found["first_producer"]) == (producer, "nan", producer)
    assert "not recorded" not in found["trigger"]
    (message,) = [r.getMessage() for r in caplog.records if "watch found" in r.getMessage()]
    assert f"NaN first produced by {producer}" in message and "unrecorded" not in message


def test_sigterm_writes_the_history(tmp_path):
    """The flight recorder writes the open step's history when the process receives SIGTERM."""
    import signal
    import subprocess
    import sys

    dump_path = str(tmp_path / "dump")
    script = os.path.join(os.path.dirname(__file__), "scripts", "watch_sigterm_worker.py")
    proc = subprocess.Popen([sys.executable, script, dump_path], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("READY"):
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        proc.kill()
    (d,) = glob.glob(os.path.join(dump_path, "step2", "*"))
    with open(os.path.join(d, "dump.json")) as f:
        dump = json.load(f)
    assert "Functional.tanh.0.forward" in dump["data"] and "SIGTERM" in dump["abnormal"]


def test_heartbeat_names_the_anomaly_after_raise_and_exit(tmp_path):
    """``raise`` caught by the loop, then the process ends: the heartbeat written at exit names the
    anomaly (the write at interpreter exit used to meet an already closed descriptor)."""
    import subprocess
    import sys

    dump_path = str(tmp_path / "dump")
    script = os.path.join(os.path.dirname(__file__), "scripts", "watch_raise_exit_worker.py")
    proc = subprocess.run([sys.executable, script, dump_path], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "CAUGHT 2" in proc.stdout, proc.stdout + proc.stderr
    assert "heartbeat not written" not in proc.stderr + proc.stdout, proc.stderr
    (beat,) = glob.glob(os.path.join(dump_path, "watch_heartbeat.*.json"))
    with open(beat) as f:
        body = json.load(f)
    assert body["last_step"] == 2 and body["anomaly"]["producer"] == "Functional.log.0.forward", body
    assert body["anomaly"]["step"] == 2


def test_backward_first_producer_has_its_forward_calls_stack(tmp_path):
    """anomalies.json ``stack`` of a backward first producer: the frames of its forward call."""
    debugger, dump_path = _debugger(tmp_path, "L1", {})
    ms.set_seed(0)
    _train(Net(), debugger, 2, at=1, poison=_backward_inf)
    _, found = _anomaly(dump_path, 1)
    assert found["first_producer"] == "Functional.sqrt.0.backward"
    assert found["stack"] and any("ops.sqrt" in frame for frame in found["stack"])


def test_history_keeps_execution_order_at_mix(tmp_path):
    """The written history is in execution order, as a normal dump of the same step: same entries in
    the same order, same anomalies.json (backward entries come after the forwards before them, although
    their construct.json lines were made with their forward calls)."""
    debugger, dump_path = _debugger(tmp_path, "mix", {})
    ms.set_seed(0)
    _train(Net(), debugger, 2, at=1, poison=_forward_nan)
    d, found = _anomaly(dump_path, 1)
    normal_path = os.path.join(str(tmp_path), "normal")
    cfg = os.path.join(str(tmp_path), "normal.json")
    with open(cfg, "w") as f:
        json.dump({"task": "statistics", "dump_path": normal_path, "level": "mix", "step": [1]}, f)
    ms.set_seed(0)
    _train(Net(), PrecisionDebugger(config_path=cfg), 2, at=1, poison=_forward_nan)
    normal_dir, normal = _anomaly(normal_path, 1)
    assert list(msprobe.dump.load(d).data) == list(msprobe.dump.load(normal_dir).data)
    for key in ("first_producer", "producers", "first_non_finite"):
        assert found[key] == normal[key], key


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_raise_comes_before_the_optimizer_writes_the_weights(tmp_path, level):
    """The producer is found when the records are read, at the latest before a call that writes
    tensors (the optimizer's compiled update reads everything pending first); ``raise`` is raised
    there, before the update, so the Parameters are still the finite values of the step before."""
    debugger, _ = _debugger(tmp_path, level, {"on_anomaly": "raise"})
    ms.set_seed(0)
    net = Net()
    opt = nn.Momentum(net.trainable_params(), 0.001, 0.9)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    x = Tensor(np.full((2, 4), 0.5, np.float32))
    with pytest.raises(WatchAnomaly, match="Functional.log.0.forward"):
        for step in range(3):
            _forward_nan(net, step == 1)
            debugger.start(net)
            _, grads = grad_fn(x)
            before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
            opt(grads)
            debugger.stop()
            debugger.step()
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    assert all(np.array_equal(p.asnumpy(), before[p.name]) for p in net.trainable_params())
    debugger.stop()
    debugger.step()


def test_raise_at_l0_comes_at_stop_and_says_so(tmp_path):
    """At L0 no hooked API call comes before the optimizer's update: ``raise`` is raised at
    ``stop()``, and the message says the update of that iteration may already have run."""
    debugger, _ = _debugger(tmp_path, "L0", {"on_anomaly": "raise"})
    ms.set_seed(0)
    net = Net()
    opt = nn.Momentum(net.trainable_params(), 0.001, 0.9)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    x = Tensor(np.full((2, 4), 0.5, np.float32))
    reached = []
    with pytest.raises(WatchAnomaly, match="may already have applied") as info:
        for step in range(3):
            _forward_nan(net, step == 1)
            debugger.start(net)
            _, grads = grad_fn(x)
            opt(grads)
            reached.append(step)
            debugger.stop()
            debugger.step()
    assert reached == [0, 1] and "as late as stop() or step()" in str(info.value)
    debugger.step()


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_whole_call_lines_give_the_general_paths_anomalies_and_history(tmp_path, monkeypatch, level):
    """A recorded call's inputs and output in one journal line (the common case's path) are checked
    piece by piece: the same producer, propagators, first non-finite entry and written history as
    with one line per record (reading only a line's first piece would miss every output)."""
    from msprobe.engine.runtime import Runtime

    results = {}
    for whole in (True, False):
        with monkeypatch.context() as mp:
            if not whole:
                mp.setattr(Runtime, "takes_whole_calls", lambda self: False)
            debugger, dump_path = _debugger(tmp_path, level, {"history": 200}, name=f"whole{whole}")
            assert debugger.service.recorder.has_fast_path("Functional.relu", False) == whole
            ms.set_seed(0)
            _train(Net(), debugger, 5, at=3, poison=_forward_nan)
            debugger.service.close()
            d, found = _anomaly(dump_path, 3)
            dump = msprobe.dump.load(d)
            results[whole] = ({k: found[k] for k in ("first_producer", "producers", "first_non_finite",
                                                     "producer", "kind", "cell", "step")},
                              json.dumps(dump.data, sort_keys=True), dump.construct)
    assert results[True][0]["first_producer"] == "Functional.log.0.forward"
    assert len(results[True][0]["producers"]) >= 1
    assert results[True] == results[False]


@pytest.mark.parametrize("compiled", [True, False])
def test_history_files_equal_a_plain_dump_of_the_same_steps(tmp_path, monkeypatch, compiled):
    """The history is kept as encoded journal lines and decoded only when it is written: every step
    it holds (clean steps, and the anomaly's step with its NaN statistics and NaN/Inf arguments)
    is written with the dump.json data, stack.json and construct.json of a plain L1 dump of the same
    run, with and without the compiled per-call path."""
    from msprobe.tensors import hotpath

    if compiled and hotpath.ext is None:
        pytest.skip("the compiled per-call path is not built")
    monkeypatch.setattr(hotpath, "ext", hotpath.ext if compiled else None)

    class Scaled(Net):
        def construct(self, x):   # a non-finite Python float argument in every step (not an anomaly)
            return ops.clip_by_value(super().construct(x), float("-inf"), float("inf"))

    paths = []
    for name, watch in (("watched", {"history": 100000}), ("plain", None)):   # one call site: same stacks
        debugger, path = _debugger(tmp_path, "L1", watch, name=name)
        ms.set_seed(0)
        _train(Scaled(), debugger, 3, at=2, poison=_forward_nan)
        debugger.service.close()
        paths.append(path)
    dump_path, plain_path = paths
    assert _anomaly(dump_path, 2)[1]["first_producer"] == "Functional.log.0.forward"
    for step in range(3):
        watched, dumped = _files(dump_path, step), _files(plain_path, step)
        assert watched["dump.json"] and watched == dumped, step
    clip = [v for k, v in _files(dump_path, 1)["dump.json"].items() if k.startswith("Functional.clip_by_value")]
    assert clip and clip[0]["input_args"][1]["value"] == -math.inf


def test_a_batch_not_encoded_one_line_per_record_is_refused():
    """The history finds each kept line by the newlines of its batch's text: a text with another
    number of lines than records is an error, never a misplaced line."""
    from msprobe.engine.watch_history import split_lines

    def _split(text, lines):
        return split_lines(text, len(lines))

    lines = [journal.construct_edge("a", None), journal.construct_edge("b", "a")]
    text = b"".join(journal.encode_json(line, False, line=True) for line in lines)
    assert _split(bytearray(text), lines) == (text, [0, text.index(b"\n") + 1, len(text)])
    for bad in (text[:-1], text + b"\n", text.replace(b"\n", b" ", 1)):
        with pytest.raises(ValueError, match="not one line each"):
            _split(bad, lines)


def _files(dump_path, step):
    """dump.json data, stack.json and construct.json of one step directory."""
    (d,) = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
    out = {}
    for name in ("dump.json", "stack.json", "construct.json"):
        with open(os.path.join(d, name)) as f:
            out[name] = json.load(f)
    out["dump.json"] = out["dump.json"]["data"]
    return out


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_short_history_still_writes_the_anomalys_step_whole(tmp_path, level):
    """``history`` bounds the entries kept from earlier steps; the anomaly's step is written from its
    first record up to the producer (and on to its end) whatever ``history`` is: the same files as a
    plain dump of that step."""
    paths = []
    for name, watch in (("watched", {"history": 2}), ("plain", None)):   # one call site: same stacks
        debugger, path = _debugger(tmp_path, level, watch, name=name)
        ms.set_seed(0)
        _train(Net(), debugger, 5, at=3, poison=_forward_nan)
        debugger.service.close()
        paths.append(path)
    dump_path, plain_path = paths
    d, found = _anomaly(dump_path, 3)
    assert found["producer"] == found["first_producer"] == "Functional.log.0.forward"
    watched, plain = _files(dump_path, 3), _files(plain_path, 3)
    assert len(watched["dump.json"]) > 2 and watched == plain
    earlier = [msprobe.dump.load(p).data for p in glob.glob(os.path.join(dump_path, "step[0-2]", "*"))]
    assert sum(len(data) for data in earlier) == 2       # the last 2 entries before the step
    assert not os.path.exists(os.path.join(d, "dump_error_info.log"))


def test_a_step_beyond_the_step_bound_keeps_its_latest_entries_and_says_so(tmp_path, monkeypatch):
    """The open step is kept whole up to STEP_BYTES of encoded records, so memory stays bounded in a
    run that never calls step(); beyond it its oldest entries go, the producer and its batch stay,
    and the step's dump_error_info.log says how many entries are missing."""
    from msprobe.engine import watch_history as watch_module

    monkeypatch.setattr(watch_module, "STEP_BYTES", 20000)
    debugger, dump_path = _debugger(tmp_path, "L1", {"history": 4})
    ms.set_seed(0)
    net = Net()
    opt = nn.SGD(net.trainable_params(), 0.001)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    x = Tensor(np.full((2, 4), 0.5, np.float32))
    for i in range(8):                       # start()/stop() without step(): all of it is step 0
        _forward_nan(net, i == 7)
        debugger.start(net)
        _, grads = grad_fn(x)
        opt(grads)
        debugger.stop()
        if i == 0:
            first = len(debugger.service.runtime.watch.ring.current)
    d, found = _anomaly(dump_path, 0)
    assert found["producer"] == found["first_producer"] == "Functional.log.7.forward"
    data = msprobe.dump.load(d).data
    assert "Functional.log.7.forward" in data and "Functional.log.6.forward" in data
    assert "Functional.linear.0.forward" not in data     # the step's first call: dropped
    with open(os.path.join(d, "dump_error_info.log")) as f:
        log = f.read()
    dropped = int(log.split("its first ")[1].split()[0])
    assert dropped >= first and "MiB of encoded records of the open step" in log
    debugger.step()
    partial = msprobe.dump.load(d).header["partial"]
    assert partial == (f"watch mode kept the latest {20000 / 2 ** 20:g} MiB of encoded records of this "
                       f"step before the anomaly: its first {dropped} entries are not in this dump")


class Tokens(nn.Cell):
    """Token ids beyond the bound pass through reshape/cast/sum every step (propagators: their inputs
    are beyond it already); ``exp(x * scale)`` makes a value beyond it when ``scale`` is 40."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4, weight_init="ones", bias_init="zeros")
        self.scale = 1.0

    def construct(self, x, ids):
        flat = ops.cast(ops.reshape(ids, (-1,)), ms.float32)
        return ops.exp(self.fc(x) * self.scale).sum() + flat.sum() * 0.0


@pytest.mark.parametrize("level, producer", [("L1", "Functional.exp.0.forward"),
                                             ("mix", "Functional.exp.0.forward")])
def test_max_abs_names_the_call_that_made_the_value_not_one_passing_it_on(tmp_path, level, producer):
    debugger, dump_path = _debugger(tmp_path, level, {"max_abs": 1e4})
    ms.set_seed(0)
    net = Tokens()
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    x = Tensor(np.full((2, 4), 0.1, np.float32))
    ids = Tensor(np.array([[50000, 7], [31999, 60000]], np.int32))   # beyond 1e4 in every step
    for step in range(4):
        net.scale = 40.0 if step == 2 else 1.0
        debugger.start(net)
        grad_fn(x, ids)
        debugger.stop()
        debugger.step()
    assert not glob.glob(os.path.join(dump_path, "step[01]", "*", "anomalies.json"))  # none before
    d, found = _anomaly(dump_path, 2)
    assert (found["kind"], found["producer"], found["step"]) == ("max_abs", producer, 2)
    data = msprobe.dump.load(d).data
    passing = [name for name in data if name.startswith(("Functional.reshape", "Tensor.reshape",
                                                         "Functional.cast", "Tensor.astype"))]
    assert passing and all(data[name]["input_args"][0]["Max"] > 1e4 for name in passing)


def _inputs_finite(body: dict) -> bool:
    return all(math.isfinite(v) for key, value in body.items() if key != "output"
               for leaf in msprobe.read.report.leaves(value) for k, v in leaf.items()
               if k in ("Max", "Min", "Mean", "Norm") and isinstance(v, float))


@pytest.mark.parametrize("level, case", [("mix", "forward"), ("L1", "forward"), ("L1", "backward"),
                                         ("mix", "data"), ("L0", "data")])
def test_online_and_offline_producers_agree(tmp_path, level, case):
    """The same dump, read online (watch's ``producer``, ``anomalies.json``) and offline
    (``msprobe.compare.nan_producer``): the same first producer, and no listed producer is the
    gradient of a call fed a non-finite value in its forward (a propagator)."""
    from msprobe.compare import nan_producer
    from msprobe.format import naming

    debugger, dump_path = _debugger(tmp_path, level, {"history": 200})
    ms.set_seed(0)
    net = Net()
    opt = nn.SGD(net.trainable_params(), 0.001)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    for step in range(3):
        x = np.full((2, 4), 0.5, np.float32)
        if case == "data" and step == 1:
            x[0, 0] = np.nan                        # a NaN in the step's input data: nothing made it
        _forward_nan(net, case == "forward" and step == 1)
        _backward_inf(net, case == "backward" and step == 1)
        debugger.start(net)
        _, grads = grad_fn(Tensor(x))
        opt(grads)
        debugger.stop()
        debugger.step()
        _forward_nan(net, False)
        _backward_inf(net, False)
    d, found = _anomaly(dump_path, 1)
    data = msprobe.dump.load(d).data
    offline = nan_producer(dump_path, step=[1])
    assert found["first_producer"] == (offline[0].entry if offline else None)
    assert found["producer"] == found["first_producer"]
    assert (found["producer"] is None) == (case == "data")
    for name in found["producers"]:
        forward = naming.forward_of(name)
        assert forward is None or _inputs_finite(data[forward]), name
    if case == "forward" and level == "mix":   # the NaN reaches the head's weight gradient
        assert any(name.endswith(".backward") and not _inputs_finite(data[naming.forward_of(name)])
                   for name in data if naming.forward_of(name) in data)


class ScalarArgument(nn.Cell):
    """``relu(h) * value`` or ``relu(h) + value`` with ``value`` a Python number."""

    def __init__(self, op: str, value: float):
        super().__init__()
        self.op, self.value = op, value

    def construct(self, h):
        return ops.relu(h) * self.value if self.op == "mul" else ops.relu(h) + self.value


@pytest.mark.parametrize("level, op, value, kind, producer", [
    ("mix", "mul", float("nan"), "nan", "Tensor.__mul__.0.forward"),
    ("L1", "add", float("inf"), "inf", "Tensor.__add__.0.forward"),
])
def test_a_non_finite_python_number_argument_makes_its_call_the_producer(tmp_path, caplog, level, op, value,
                                                                          kind, producer):
    """A finite tensor times (plus) a NaN (Inf) Python number: watch mode, anomalies.json and
    first-diff all name that call as the producer, and say that a scalar argument was non-finite."""
    import msprobe.compare.html
    from msprobe.compare import nan_producer
    from msprobe.format.producer import SCALAR_NOTE

    paths = {}
    for name, watch in (("watch", {}), ("plain", None)):
        debugger, paths[name] = _debugger(tmp_path, level, watch, name)
        ms.set_seed(0)
        net = nn.SequentialCell([nn.Dense(4, 3), ScalarArgument(op, value), nn.ReLU()])
        with caplog.at_level(logging.WARNING, logger="msprobe"):
            debugger.start(net)
            net(Tensor(np.ones((2, 4), np.float32)))
            debugger.stop()
            debugger.step()
        debugger.close()
    _, found = _anomaly(paths["watch"], 0)
    assert (found["producer"], found["kind"], found["first_producer"]) == (producer, kind, producer)
    assert found["trigger"].endswith(f"tensor inputs finite; {SCALAR_NOTE}"), found["trigger"]
    (message,) = [r.getMessage() for r in caplog.records if "watch found" in r.getMessage()]
    assert f"first produced by {producer}" in message and SCALAR_NOTE in message, message
    for path in paths.values():
        (offline,) = nan_producer(path)
        assert (offline.entry, offline.note) == (producer, SCALAR_NOTE), path
        assert _anomaly(path, 0)[1]["first_producer"] == producer, path
    html = tmp_path / "report.html"
    msprobe.compare.html.write_report(paths["plain"], str(html))
    assert SCALAR_NOTE in html.read_text(encoding="utf-8")


def test_steps_after_the_anomaly_stay_in_memory_while_the_nan_goes_on(tmp_path):
    """One anomaly per run: later steps that still compute NaN (the weights are NaN now) are not
    checked nor written again; the heartbeat keeps counting them and names the first anomaly."""
    debugger, dump_path = _debugger(tmp_path, "L1", {"history": 16})
    ms.set_seed(0)
    net = Net()
    _train(net, debugger, 5, at=2, poison=lambda n, on: _forward_nan(n, on or n.poison.shift > 0))
    assert net.poison.shift > 0                  # NaN in steps 2, 3 and 4
    clean, clean_path = _debugger(tmp_path, "L1", {"history": 16}, name="clean")
    ms.set_seed(0)
    _train(Net(), clean, 5)
    _, found = _anomaly(dump_path, 2)
    assert sorted(n for n in os.listdir(dump_path) if n.startswith("step")) == ["step1", "step2"]
    beats = []
    for path in (dump_path, clean_path):
        (beat,) = glob.glob(os.path.join(path, "watch_heartbeat.*"))
        with open(beat) as f:
            beats.append(json.load(f))
    assert beats[0]["steps_watched"] == 5 and beats[0]["anomaly"]["producer"] == found["producer"]
    assert beats[0]["records_seen"] == beats[1]["records_seen"]   # the same calls as a clean run's


class _JitBlock(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inner = nn.Dense(4, 4)

    @ms.jit
    def construct(self, x):
        return ops.relu(self.inner(x))


class _JitNet(nn.Cell):
    """A PyNative net with a ``mindspore.jit`` Cell: each dumped step has two trees (pynative/, graph/)."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Dense(4, 4)
        self.block = _JitBlock()

    def construct(self, x):
        return self.block(self.pre(x)).sum()


def _train_with_grad(net, debugger, steps, before=None):
    """``steps`` steps of ``ms.value_and_grad(net)`` on ones((2, 4)) between ``start(net)`` and
    ``stop()``/``step()``; ``before(step)`` runs first in each step."""
    fn = ms.value_and_grad(net, None, net.trainable_params())
    x = Tensor(np.ones((2, 4), np.float32))
    for step in range(steps):
        if before is not None:
            before(step)
        debugger.start(net)
        fn(x)
        debugger.stop()
        debugger.step()


def test_heartbeat_counts_each_step_once_with_a_graph_subtree(tmp_path):
    """With a ``jit`` Cell the step is watched in two trees (``pynative/`` and ``graph/``); the
    heartbeat counts steps, not trees: 3 steps watched, records of both trees seen."""
    debugger, dump_path = _debugger(tmp_path, "L0", {})
    ms.set_seed(0)
    try:
        _train_with_grad(_JitNet(), debugger, 3)
        assert debugger.service.runtime.watch.open_writers == {}  # ended steps' writers are let go
    finally:
        debugger.service.close()
    beats = glob.glob(os.path.join(dump_path, "**", "watch_heartbeat.*"), recursive=True)
    assert len(beats) == 1, beats
    with open(beats[0]) as f:
        beat = json.load(f)
    assert (beat["steps_watched"], beat["last_step"], beat["anomaly"]) == (3, 2, None)
    # per step: pynative/ Cell.pre and Cell.block forward+backward (4), graph/ Cell.inner forward+backward
    # and its parameters' gradients (none: no optimizer holds them) -> more than the pynative tree alone
    assert beat["records_seen"] > 3 * 4, beat


def test_the_trigger_message_says_what_was_written(tmp_path, capsys, caplog):
    """At the trigger one WARNING names each directory written and what it holds (an earlier step
    whole or its tail, the anomaly's step so far); the history's earlier steps print no
    ``dump.json is at`` line (they did not just end), the anomaly's step prints one when it ends."""
    plain, plain_path = _debugger(tmp_path, "L1", None, name="plain")
    ms.set_seed(0)
    _train(Net(), plain, 1)
    plain.service.close()
    per_step = len(msprobe.dump.load(glob.glob(os.path.join(plain_path, "step0", "*"))[0]).data)
    capsys.readouterr()
    debugger, dump_path = _debugger(tmp_path, "L1", {"history": per_step + 3})
    ms.set_seed(0)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _train(Net(), debugger, 4, at=3, poison=_forward_nan)
    debugger.service.close()
    printed = [line for line in capsys.readouterr().out.splitlines() if "dump.json is at" in line]
    anomaly_dir, _ = _anomaly(dump_path, 3)
    assert printed == [f"dump.json is at {anomaly_dir}"]
    (message,) = [r.getMessage() for r in caplog.records if "watch found" in r.getMessage()]
    who = os.path.basename(anomaly_dir)
    assert f"written now under {os.path.abspath(dump_path)}: " in message
    assert f"step1/{who} (step 1: its last 3 of {per_step} entries); " in message
    assert f"step2/{who} (step 2: all its {per_step} entries); " in message
    so_far = int(message.split(f"step3/{who} (step 3, the anomaly's step: ")[1].split(" entries so far")[0])
    assert 0 < so_far <= len(msprobe.dump.load(anomaly_dir).data)
    assert not os.path.exists(os.path.join(dump_path, "step0"))
    for step, count in ((1, 3), (2, per_step)):  # what the message says is what is on disk
        (d,) = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
        assert len(msprobe.dump.load(d).data) == count


def test_an_anomaly_found_at_stop_says_what_the_step_recorded(tmp_path, caplog):
    """Found when ``stop()`` writes the step (nothing flushed before it: no optimizer update in the
    step): the message gives the entries recorded until ``stop()``, exactly what the step's
    ``dump.json`` holds, not "so far"."""
    debugger, dump_path = _debugger(tmp_path, "mix", {"history": 10})
    ms.set_seed(0)
    net = Net()
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _train_with_grad(net, debugger, 2, before=lambda step: _forward_nan(net, step == 1))
    debugger.service.close()
    (message,) = [r.getMessage() for r in caplog.records if "watch found" in r.getMessage()]
    anomaly_dir, _ = _anomaly(dump_path, 1)
    count = len(msprobe.dump.load(anomaly_dir).data)
    assert (f"step1/{os.path.basename(anomaly_dir)} (step 1, the anomaly's step: {count} entries, recorded "
            "until stop() (its files are complete at step()))") in message
    assert "so far" not in message


def test_a_history_of_one_steps_entries_keeps_that_step_whole(tmp_path):
    """``history`` counts what ``dump.json`` holds: as many entries as a step has keep the step before
    the anomaly's whole (names with no data, such as a backward entry's construct edge made before its
    gradient arrived, do not count)."""
    plain, plain_path = _debugger(tmp_path, "mix", None, name="plain")
    ms.set_seed(0)
    _train(Net(), plain, 1)
    plain.service.close()
    per_step = len(msprobe.dump.load(glob.glob(os.path.join(plain_path, "step0", "*"))[0]).data)
    debugger, dump_path = _debugger(tmp_path, "mix", {"history": per_step})
    ms.set_seed(0)
    _train(Net(), debugger, 4, at=3, poison=_forward_nan)
    debugger.service.close()
    (d,) = glob.glob(os.path.join(dump_path, "step2", "*"))
    dump = msprobe.dump.load(d)
    assert len(dump.data) == per_step and "partial" not in dump.header
    assert not os.path.exists(os.path.join(dump_path, "step1"))


def test_a_step_partly_kept_by_the_history_says_so(tmp_path):
    """An earlier step of which the history kept only its tail has ``partial`` in its dump.json
    (what is left out, in words); whole steps have none; the files pass the schema and ``summarize``
    shows it."""
    from msprobe.format.validate import validate_dump_tree
    plain, plain_path = _debugger(tmp_path, "L1", None, name="plain")
    ms.set_seed(0)
    _train(Net(), plain, 2)
    plain.service.close()
    per_step = len(msprobe.dump.load(glob.glob(os.path.join(plain_path, "step0", "*"))[0]).data)
    debugger, dump_path = _debugger(tmp_path, "L1", {"history": per_step + 3})
    ms.set_seed(0)
    _train(Net(), debugger, 4, at=3, poison=_forward_nan)
    debugger.service.close()
    headers = {}
    for step in (1, 2, 3):
        (d,) = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
        headers[step] = msprobe.dump.load(d).header
    assert headers[1]["partial"] == (f"watch mode's history kept the last 3 of this step's {per_step} "
                                     f"entries (watch.history {per_step + 3})")
    assert "partial" not in headers[2] and "partial" not in headers[3]
    # the part kept is the step's tail in dump.json order (the same calls ran in the plain run's step 1)
    (kept_dir,) = glob.glob(os.path.join(dump_path, "step1", "*"))
    (whole_dir,) = glob.glob(os.path.join(plain_path, "step1", "*"))
    assert list(msprobe.dump.load(kept_dir).data) == list(msprobe.dump.load(whole_dir).data)[-3:]
    assert validate_dump_tree(dump_path)
    (line,) = [x for x in msprobe.dump.summarize(dump_path).splitlines() if "step1/" in x]
    assert "(PARTIAL: watch mode's history kept the last 3 of" in line
    # against a whole dump of the same step, first-diff compares the entries both hold and says
    # which side is partial and from which call, whichever side it is
    from click.testing import CliRunner
    from msprobe.cli import main
    first = list(msprobe.dump.load(kept_dir).data)[0]
    for args, side, other in (([dump_path, plain_path], "target", "golden"),
                              ([plain_path, dump_path, "--exact"], "golden", "target")):
        run = CliRunner().invoke(main, ["first-diff", *args, "--step", "1"])
        assert run.exit_code == 0, run.output
        assert "the runs agree" in run.output and "unmatched" not in run.output, run.output
        assert (f"note: the {side} dump is a partial history of step 1 (watch mode's history kept the last 3 "
                f"of this step's {per_step} entries (watch.history {per_step + 3})): it begins at {first}; "
                f"compared from there on, the {per_step - 3} {other} entries before it are left out"
                in run.output), run.output
    # compare writes rows for the entries both hold only
    from msprobe.compare import comparisons
    (c,) = comparisons(dump_path, plain_path, step=[1])
    assert {e.match for e in c.entries()} == {"name"}


class _JitThenPoison(nn.Cell):
    """``post(poison(block(pre(x))))`` with ``block`` a ``mindspore.jit`` Cell (graph/ tree)."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Dense(4, 4)
        self.block = _JitBlock()
        self.poison = Poison()
        self.post = nn.Dense(4, 1)

    def construct(self, x):
        return self.post(self.poison(self.block(self.pre(x)) + 1.0)).sum()


def test_the_anomaly_step_is_written_in_both_trees(tmp_path):
    """With a ``jit`` Cell the anomaly's step has a ``pynative/`` and a ``graph/`` directory; both
    are written, each as a plain dump of the same run writes it."""
    trees = {}
    for watch in ({}, None):
        debugger, dump_path = _debugger(tmp_path, "L0", watch, name="watch" if watch is not None else "plain")
        ms.set_seed(0)
        net = _JitThenPoison()
        try:
            _train_with_grad(net, debugger, 4,
                             before=lambda step: setattr(net.poison, "shift", 100.0 if step == 2 else 0.0))
        finally:
            debugger.service.close()
        trees[watch is not None] = {
            tree: msprobe.dump.load(glob.glob(os.path.join(dump_path, tree, "step2", "*"))[0])
            for tree in ("pynative", "graph")}
    _, found = _anomaly(os.path.join(str(tmp_path), "watch", "pynative"), 2)
    assert found["producer"] == "Cell.poison.Poison.forward.0"
    for tree in ("pynative", "graph"):
        watched, plain = trees[True][tree], trees[False][tree]
        assert watched.complete and list(watched.data) == list(plain.data), tree
        assert watched.data, tree


def test_an_abnormal_end_says_what_it_wrote(tmp_path, caplog, capsys):
    """An exception that ends a watched step writes the history; one WARNING names each directory
    with what it holds, and only the ended step prints ``dump.json is at``."""
    debugger, dump_path = _debugger(tmp_path, "L1", {})
    ms.set_seed(0)
    net = Net()
    _train(net, debugger, 2)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _end_a_step_abnormally(net, debugger)
    debugger.service.close()
    (message,) = [r.getMessage() for r in caplog.records if "ended abnormally" in r.getMessage()]
    dirs = {step: glob.glob(os.path.join(dump_path, f"step{step}", "*"))[0] for step in range(3)}
    who = os.path.basename(dirs[2])
    for step in (0, 1):
        count = len(msprobe.dump.load(dirs[step]).data)
        assert f"step{step}/{who} (step {step}: all its {count} entries)" in message
    assert f"step2/{who} (step 2, which ended abnormally: " in message
    printed = [line for line in capsys.readouterr().out.splitlines() if "dump.json is at" in line]
    assert printed == [f"dump.json is at {dirs[2]}"]


@pytest.mark.parametrize("level", ["L0", "mix", "L1"])
def test_the_trigger_message_counts_the_entries_each_written_dump_holds(tmp_path, caplog, level):
    """Each ``(step N: all its C entries)`` / ``(step N: its last K of T entries)`` of the trigger's
    WARNING counts the entries of the written ``dump.json`` (C, K) and of a plain dump of that step
    (T); names with only ``construct.json`` or stack lines are not entries of ``dump.json``."""
    plain, plain_path = _debugger(tmp_path, level, None, name="plain")
    ms.set_seed(0)
    _train(Net(), plain, 1)
    plain.service.close()
    per_step = len(msprobe.dump.load(glob.glob(os.path.join(plain_path, "step0", "*"))[0]).data)
    debugger, dump_path = _debugger(tmp_path, level, {"history": 5})
    ms.set_seed(0)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _train(Net(), debugger, 4, at=3, poison=_forward_nan)
    debugger.service.close()
    (message,) = [r.getMessage() for r in caplog.records if "watch found" in r.getMessage()]
    said = re.findall(r"step(\d+)/[^ ]+ \(step \1: (?:all its (\d+)|its last (\d+) of (\d+)) entries\)", message)
    assert said, message
    for step, whole, last, total in said:
        (d,) = glob.glob(os.path.join(dump_path, f"step{step}", "*"))
        held = len(msprobe.dump.load(d).data)
        assert held == int(whole or last), (step, message)
        assert int(whole or total) == per_step, (step, message)


def test_heartbeat_rewritten_in_place_holds_one_whole_document(tmp_path):
    """The heartbeat is written over itself: a shorter document than the one before is padded with
    JSON whitespace (the file holds exactly the new document, never a tail of the old one), the file
    keeps its inode (no rename per step), and a heartbeat removed meanwhile is written again."""
    from msprobe.engine.watch import HeartbeatFile

    path = tmp_path / "watch_heartbeat.proc1.json"
    beat = HeartbeatFile(str(path))
    long_doc = {"last_step": 123456789, "records_seen": 10 ** 12, "anomaly": None}
    short_doc = {"last_step": 7, "anomaly": None}
    beat.write(json.dumps(long_doc).encode())
    inode = os.stat(path).st_ino
    beat.write(json.dumps(short_doc).encode())
    assert json.loads(path.read_bytes()) == short_doc
    assert path.read_bytes().rstrip() == json.dumps(short_doc).encode()
    assert os.stat(path).st_ino == inode
    os.remove(path)
    beat.write(json.dumps(long_doc).encode())
    assert json.loads(path.read_bytes()) == long_doc


def test_report_and_show_open_the_anomaly_step_of_a_watch_dump(tmp_path):
    """A watch dump holds earlier clean steps too: without --step, ``msprobe report`` shows the step
    holding anomalies.json (and says so), and ``msprobe show`` finds the entry there first."""
    from click.testing import CliRunner

    from msprobe.cli import main
    from msprobe.compare.html import write_report

    debugger, dump_path = _debugger(tmp_path, "mix", {"history": 200})
    ms.set_seed(0)
    _train(Net(), debugger, 4, at=2, poison=_forward_nan)
    assert os.path.isdir(os.path.join(dump_path, "step0"))          # the history starts at step 0
    d, _ = _anomaly(dump_path, 2)
    rank = os.path.basename(d)
    html = open(write_report(dump_path, str(tmp_path / "r.html")), encoding="utf-8").read()
    picked = re.search(r'id="picked-step">(.*?)</div>', html, re.S).group(1)
    assert f"showing step 2 {rank}" in " ".join(picked.split()) and "anomalies.json" in picked
    assert 'id="goto-nan"' in html
    html = open(write_report(dump_path, str(tmp_path / "r0.html"), step=[0]), encoding="utf-8").read()
    assert 'id="picked-step"' not in html and 'id="goto-nan"' not in html      # --step is obeyed
    out = CliRunner().invoke(main, ["show", dump_path, "Functional.log.0.forward"]).output
    assert out.startswith(f"Functional.log.0.forward  (step 2, {rank}:"), out


def _overflowing_loss_setup():
    """A Dense whose logits are about ±4e38 and a loss Cell whose cross entropy overflows to inf
    (the logits themselves are finite)."""
    net = nn.Dense(4, 2, weight_init=Tensor(np.array([[0.5e38] * 4, [-0.5e38] * 4], np.float32)),
                   bias_init="zeros")
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    x, y = Tensor(np.full((2, 4), 0.5, np.float32)), Tensor(np.array([1, 1], np.int32))
    return net, loss_fn, x, y


class _NetAndLoss(nn.Cell):
    """A model of the user's own that computes its loss (neither nn.WithLossCell nor nn.TrainOneStepCell)."""

    def __init__(self, net, loss_fn):
        super().__init__()
        self.net, self.loss_fn = net, loss_fn

    def construct(self, x, y):
        return self.loss_fn(self.net(x), y)


def _watch_two_steps(tmp_path, level, name, model, grad_fn, x, y):
    debugger, dump_path = _debugger(tmp_path, level, {}, name=name)
    for _ in range(2):
        debugger.start(model)
        loss, _ = grad_fn(x, y)
        debugger.stop()
        debugger.step()
    assert math.isinf(float(loss))
    debugger.service.close()
    return dump_path


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_watch_says_once_that_a_loss_outside_the_model_is_not_watched(tmp_path, capsys, level):
    """Only what start() is given (and, at L1/mix, the wrapped APIs) is watched: a loss Cell applied
    outside the model overflows unseen, so the user is told once, after the first step, naming the
    last forward call watched (it returns logits, not a loss). Decided by what was watched, not by
    the model's class: a model of the user's own that holds its loss Cell is watched whole (as
    nn.WithLossCell is), and then nothing is said."""
    net, loss_fn, x, y = _overflowing_loss_setup()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, net.trainable_params())
    dump_path = _watch_two_steps(tmp_path, level, "outside", net, grad_fn, x, y)
    said = [line for line in capsys.readouterr().out.splitlines() if "watch mode watches" in line]
    assert len(said) == 1 and "a loss Cell outside the model" in said[0] and "nn.WithLossCell" in said[0]
    if level == "L0":  # the Dense holds no Cell: nothing of it is recorded at L0
        assert "it watched no forward call in step 0, so no loss either" in said[0], said[0]
    else:  # the last call watched returns the logits
        assert re.search(r"the last forward call it watched in step 0, Primitive\.\S+, returns no single "
                         r"value \(output \[2, 2\]\)", said[0]), said[0]
    # at L0 the model's own construct is not recorded either, and the line says so; only there is
    # another level advice (at L1/mix a loss computed by functions is watched already)
    assert ("not the operations of its own construct" in said[0]) == (level == "L0")
    assert ("use level L1/mix" in said[0]) == (level == "L0"), said[0]
    assert os.listdir(dump_path) == [n for n in os.listdir(dump_path) if n.startswith("watch_heartbeat")]

    for name, model in (("with_loss", nn.WithLossCell(net, loss_fn)), ("own", _NetAndLoss(net, loss_fn))):
        grad_fn = ms.value_and_grad(model, None, net.trainable_params())
        dump_path = _watch_two_steps(tmp_path, level, name, model, grad_fn, x, y)
        assert "watch mode watches" not in capsys.readouterr().out, name
        assert glob.glob(os.path.join(dump_path, "step0", "*", "anomalies.json")), name  # the loss is watched
