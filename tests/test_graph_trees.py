"""The pieces the compiled-graph capture stands on, without compiling a graph: the probe functions of
every arity generated from one template, one runtime writing a second tree of the dump
(``Runtime.tree``), records made in bulk (``Runtime.bulk``) and entries without a Python stack.

Real MindSpore tensors, real files; the runtime is driven the way the graph capture drives it."""
from __future__ import annotations

import inspect
import json
import os

import numpy as np
from mindspore import Tensor

import msprobe.dump
from msprobe.capture.cells import graph_probes
from msprobe.engine.config import load_config
from msprobe.engine.runtime import Runtime
from tests.conftest import only_step_dir


def test_probe_functions_of_every_arity_have_their_parameters_and_source():
    """``ops.Custom`` counts a pyfunc's inputs from its signature and reads its source; a bprop
    names every input plus ``out`` and ``dout``; a mark's ``construct`` and ``bprop`` are parsed from
    their source: all hold for each generated arity."""
    seen = []
    for n in range(1, graph_probes.MAX_INPUTS + 1):
        forward = graph_probes._FORWARDERS[n](seen.append)
        params = [f"x{i}" for i in range(n)]
        assert list(inspect.signature(forward).parameters) == params
        assert f"def forward({', '.join(params)}):" in inspect.getsource(forward)
        forward(*range(n))
        assert seen[-1] == tuple(range(n))
        bprop = graph_probes._ZEROS_BPROPS[n]
        assert list(inspect.signature(bprop).parameters) == params + ["out", "dout"]
        assert "def zeros_bprop_" in inspect.getsource(bprop)
    assert graph_probes._FORWARDERS[0] is None and len(graph_probes._FORWARDERS) == graph_probes.MAX_INPUTS + 1
    for n in range(1, graph_probes.MAX_ARITY + 1):
        mark = graph_probes._MARKS[n]
        params = ["self", "code"] + [f"x{i}" for i in range(n)] + ["token"]
        assert list(inspect.signature(mark.construct).parameters) == params
        assert list(inspect.signature(mark.bprop).parameters) == params + ["out", "dout"]
        assert "def bprop(" in inspect.getsource(mark.bprop) and "def construct(" in inspect.getsource(mark.construct)
    assert graph_probes._MARKS[0] is None and len(graph_probes._MARKS) == graph_probes.MAX_ARITY + 1


def _tensor(value):
    return Tensor(np.full((2, 3), value, np.float32))


def test_one_runtime_writes_the_graph_tree_beside_the_main_one(dump_dir):
    """Records made inside ``Runtime.tree("graph")`` land in ``dump_path/graph/step0/…``, the others
    in the main tree (``dump_path/pynative`` when ``tree_root`` says so); each tree's stack.json
    holds the stacks its entries name, and an entry recorded as compiled has no frames."""
    rt = Runtime(load_config(dump_path=dump_dir, level="L0", task="statistics"))
    rt.tree_root = "pynative"
    rt.open_step()
    rt.record("Cell.net.Net.forward.0", "output", [_tensor(1.0)], "output")
    rt.record_stack("Cell.net.Net.forward.0")
    with rt.tree("graph") as opened:
        assert opened
        with rt.bulk():
            rt.record("Cell.net.dense.Dense.forward.0", "output", [_tensor(2.0)], "output")
            rt.record_stack("Cell.net.dense.Dense.forward.0", compiled=True)
            assert rt.has_pending  # nothing is read before the bulk ends ...
        assert not rt.has_pending  # ... then all of it
    rt.write_files()
    rt.end_step()
    main = msprobe.dump.load(only_step_dir(os.path.join(dump_dir, "pynative"), 0))
    graph = msprobe.dump.load(only_step_dir(os.path.join(dump_dir, "graph"), 0))
    assert list(main.data) == ["Cell.net.Net.forward.0"]
    assert list(graph.data) == ["Cell.net.dense.Dense.forward.0"]
    assert graph.data["Cell.net.dense.Dense.forward.0"]["output"][0]["Max"] == 2.0
    with open(os.path.join(only_step_dir(os.path.join(dump_dir, "graph"), 0), "stack.json")) as f:
        assert list(json.load(f).values()) == [[["Cell.net.dense.Dense.forward.0"], []]]
    with open(os.path.join(only_step_dir(os.path.join(dump_dir, "pynative"), 0), "stack.json")) as f:
        ((entries, frames),) = json.load(f).values()
    assert entries == ["Cell.net.Net.forward.0"] and "test_graph_trees.py" in frames[0]
    assert not os.path.exists(os.path.join(dump_dir, "step0"))


def test_a_tree_is_not_opened_without_an_open_step(dump_dir):
    rt = Runtime(load_config(dump_path=dump_dir, level="L0", task="statistics"))
    with rt.tree("graph") as opened:
        assert not opened
    assert not os.path.exists(os.path.join(dump_dir, "graph"))
