"""msprobe compare / first-diff on real MindSpore dumps (CPU, PyNative, one training step each).

Scenarios (tests/compare_dumps.py): two seeds, fp16 vs fp32 of the same net, one op changed (gelu's
``approximate``; the factor of a ``mint.mul`` inside a Cell), one extra call, a NaN injected at a
known op, and an API swapped for another (name mapping)."""
from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from compare_dumps import make_dump
from msprobe.compare import compare, first_divergence, nan_producer
from msprobe.dump import load_stacks
from msprobe.format.naming import direction_of
from msprobe.compare.engine import columns
from msprobe.compare.html import build_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    return {
        "base": make_dump(root, "base"),
        "again": make_dump(root, "again"),
        "seed1": make_dump(root, "seed1", seed=1),
        "fp16": make_dump(root, "fp16", dtype=ms.float16),
        "extra": make_dump(root, "extra", extra_relu=True),
        "inner": make_dump(root, "inner", inner_relu=True),
        "tanh": make_dump(root, "tanh", approximate="tanh"),
        "factor": make_dump(root, "factor", factor=2.5),
        "nan": make_dump(root, "nan", nan=True),
        "mint": make_dump(root, "mint", mint_relu=True),
        "root": str(root),
    }


def cli(*args, check_code=None):
    """Run ``python -m msprobe.cli`` (what the ``msprobe`` console script calls)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)
    if check_code is not None:
        assert proc.returncode == check_code, proc.stdout + proc.stderr
    return proc


def by_name(rows):
    return {r["NPU Name"]: r for r in rows if r["NPU Name"]}


def test_statistics_rows_two_seeds(dumps, tmp_path):
    rows = compare(dumps["seed1"], dumps["base"])
    assert list(rows[0]) == columns("statistics") + ["Step", "Rank"]
    assert columns("statistics")[:24] == [
        "NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
        "Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
        "MeanRelativeErr", "NormRelativeErr", "NPU max", "NPU min", "NPU mean", "NPU l2norm",
        "Bench max", "Bench min", "Bench mean", "Bench l2norm", "Result", "Err_message"]
    named = by_name(rows)
    x = named["Cell.fc1.Dense.forward.0.input.0"]           # same data batch in both runs
    assert x["Result"] == "pass" and x["Max diff"] == 0.0
    w = named["Cell.fc1.Dense.forward.0.parameters.weight"]  # different initial weights
    assert w["Result"] == "error"
    assert w["Max diff"] == pytest.approx(w["NPU max"] - w["Bench max"])
    assert w["MaxRelativeErr"] == pytest.approx(abs(w["Max diff"]) / abs(w["Bench max"]))
    assert {r["Match"] for r in rows} == {"name"}
    # the weights differ from the start: at mix the first call taking one of them is named (the
    # MatMul inside fc1), with the Cell whose Parameter it is
    (found,) = first_divergence(dumps["seed1"], dumps["base"])
    assert (found.kind, found.entry) == ("input", "Primitive.matmul.MatMul.0.forward")
    assert (found.parameters_of, found.cell_path) == ("Cell.fc1.Dense.forward.0", ["Cell.fc1.Dense.forward.0"])
    # first-diff names the differing parameter, which is in the dump
    out = cli("first-diff", dumps["seed1"], dumps["base"], check_code=1).stdout
    # ... with how much it differs (the number the thresholds judge)
    assert re.search(r"its parameters already differ \(input\.1 = parameters\.weight of Cell\.fc1\.Dense"
                     r"\.forward\.0: largest scaled statistic error [0-9.e+-]+\)", out), out
    assert "outside the dump" not in out
    # compare's summary line and the report say the same
    out = cli("compare", "-tp", dumps["seed1"], "-gp", dumps["base"], "-o", str(tmp_path / "c"), check_code=0).stdout
    assert ("(forward; its parameters already differ: input.1 = parameters.weight of "
            "Cell.fc1.Dense.forward.0)") in out, out
    report = tmp_path / "r.html"
    cli("report", dumps["seed1"], "--golden", dumps["base"], "-o", str(report), check_code=0)
    assert ("its parameters already differ (input.1 = parameters.weight of Cell.fc1.Dense.forward.0: "
            "largest") in report.read_text(), out
    # at L0 the Cell is the deepest entry
    l0 = make_dump(tmp_path, "seed1_l0", level="L0", seed=1)
    (found,) = first_divergence(l0, make_dump(tmp_path, "base_l0", level="L0"))
    assert (found.kind, found.entry) == ("input", "Cell.fc1.Dense.forward.0")
    assert found.differing_parameters() == ["parameters.weight", "parameters.bias"]


_SCALED = re.compile(r"largest scaled statistic error ([0-9.e+-]+) \((Max|Min|Mean|Norm): \|diff\| ([0-9.e+-]+) / "
                     r"(\|golden \w+\||golden RMS|float\w* atol) ([0-9.e+-]+)\)")


def test_err_message_says_which_statistic_its_figure_is_of(dumps):
    """A failing row's Err_message names the statistic of its largest scaled error, its difference (the
    row's ``… diff`` column) and what it was divided by; divided by the golden value it is the row's
    ``…RelativeErr``, otherwise the golden RMS (Bench l2norm / sqrt(size)) or the dtype's atol (the
    numpy batch path says the same as the per-record one: tests/test_compare_batch.py)."""
    rows = [r for r in compare(dumps["seed1"], dumps["base"], mode="statistics")
            if r["Result"] in ("warning", "error") and "largest scaled" in r["Err_message"]]
    assert rows
    column = {"Max": "Max", "Min": "Min", "Mean": "Mean", "Norm": "L2norm"}
    relative = {"Max": "MaxRelativeErr", "Min": "MinRelativeErr", "Mean": "MeanRelativeErr", "Norm": "NormRelativeErr"}
    kinds = set()
    for r in rows:
        m = _SCALED.search(r["Err_message"])
        assert m, r["Err_message"]
        error, stat, diff, over, scale = m.groups()
        kinds.add(over.split()[-1])
        assert float(diff) == pytest.approx(abs(r[f"{column[stat]} diff"]), rel=1e-2)
        assert float(error) == pytest.approx(float(diff) / float(scale), rel=2e-2)
        if over.startswith("|golden"):
            assert float(error) == pytest.approx(r[relative[stat]], rel=1e-2), r
        elif over == "golden RMS":
            size = math.prod(json.loads(r["Bench Tensor Shape"]))
            assert float(scale) == pytest.approx(r["Bench l2norm"] / math.sqrt(size), rel=1e-2)
    assert "RMS" in kinds, kinds


def test_identical_runs_agree_and_exit_zero(dumps):
    rows = compare(dumps["again"], dumps["base"])
    assert rows and {r["Result"] for r in rows} == {"pass"}
    assert first_divergence(dumps["again"], dumps["base"], exact=True) == []
    proc = cli("first-diff", dumps["again"], dumps["base"], "--exact", check_code=0)
    assert "the runs agree" in proc.stdout
    # identical dumps are said to be identical, not only to agree within tolerance
    same = "the runs agree bitwise (every statistic recorded is equal)"
    assert cli("first-diff", dumps["again"], dumps["base"], check_code=0).stdout.splitlines()[0] == same
    as_json = cli("first-diff", dumps["again"], dumps["base"], "--json", check_code=0).stdout
    (agreed,) = json.loads(as_json)["agreements"]
    assert (agreed["step"], agreed["text"], agreed["note"]) == (0, same, None)
    out = cli("compare", "-tp", dumps["again"], "-gp", dumps["base"], "-o", os.path.join(dumps["root"], "same"),
              check_code=0).stdout
    assert f"first difference (as msprobe first-diff): none: {same}" in out, out


def test_fp16_vs_fp32_dtype_aware_thresholds(dumps, tmp_path):
    rows = compare(dumps["fp16"], dumps["base"])
    fc1 = by_name(rows)["Cell.fc1.Dense.forward.0.output.0"]
    assert (fc1["NPU Dtype"], fc1["Bench Dtype"]) == ("Float16", "Float32")
    assert fc1["Max diff"] != 0.0                            # fp16 rounding is visible ...
    assert Counter(r["Result"] for r in rows) == {"pass": len(rows)}  # ... and within fp16 tolerance
    assert cli("first-diff", dumps["fp16"], dumps["base"]).returncode == 0
    assert cli("first-diff", dumps["fp16"], dumps["base"], "--exact").returncode == 1
    # judged with float32's thresholds instead, the same numbers are errors: the file is read
    strict = tmp_path / "strict.yaml"
    strict.write_text("groups:\n  float16: {warning: 1.0e-7, error: 1.0e-6}\n")
    strict_rows = compare(dumps["fp16"], dumps["base"], thresholds=str(strict))
    assert by_name(strict_rows)["Cell.fc1.Dense.forward.0.output.0"]["Result"] == "error"


def test_float16_to_float32_cast_is_not_blamed(tmp_path):
    """A Float16 run with a float32 loss against a Float32 run: the final cast carries the Float16
    rounding into a Float32 tensor, judged with Float32 tolerance; it adds no error, so it is not the
    source, and first-diff says the runs differ in precision there (not a divergence: exit 0)."""
    target = make_dump(tmp_path, "fp16cast", dtype=ms.float16, cast_out=True)
    golden = make_dump(tmp_path, "cast", cast_out=True)
    rows = compare(target, golden)
    cast = [r for r in rows if r["NPU Name"].startswith("Functional.cast.0.forward")]
    dtypes = {r["NPU Name"].split(".forward.")[1]: (r["NPU Dtype"], r["Bench Dtype"]) for r in cast}
    assert dtypes["input.0"] == ("Float16", "Float32") and dtypes["output.0"] == ("Float32", "Float32")
    out = [r for r in cast if ".output." in r["NPU Name"]]
    assert out and all(r["Result"] != "pass" for r in out)          # Float32 tolerance is exceeded
    assert {r["Gain Verdict"] for r in cast} == {"carried"}
    assert all(r["Gain Verdict"] != "grows" for r in rows)
    (found,) = first_divergence(target, golden)
    assert (found.kind, found.entry) == ("precision", "Functional.cast.0.forward")
    # not a divergence: first-diff names it and exits 0 (the runs agree within the lower precision)
    printed = cli("first-diff", target, golden, check_code=0).stdout
    assert "first difference of precision" in printed and "Functional.cast.0.forward" in printed


def test_exact_first_difference_of_fp16_and_fp32_names_the_dtypes(dumps):
    """--exact between a Float16 and a Float32 dump: the first differing entry's inputs differ in
    dtype, which is said (not "from outside the dump")."""
    (found,) = first_divergence(dumps["fp16"], dumps["base"], exact=True)
    reason = found.reason(True)
    assert found.kind == "input" and "in dtype (target Float16, golden Float32): the runs compute in " \
        "different precisions before this entry" in reason and "outside the dump" not in reason, reason


def test_setup_notes_say_what_is_true_for_the_dumps_at_hand():
    """An empty Cell path is explained for the entry at hand; a debug dump against a mix dump is
    said to share no entry (an --ignore pattern cannot help)."""
    from types import SimpleNamespace

    from msprobe.cli import _no_cell_path
    from msprobe.compare.divergence import _setup_difference

    assert _no_cell_path("Cell.emb.Dense.forward.0") == "(none: a top-level Cell)"
    assert _no_cell_path("Functional.relu.0.forward") == "(none: no recorded Cell encloses it)"
    sides = [SimpleNamespace(header={"task": "statistics", "level": level}) for level in ("mix", "debug")]
    note = _setup_difference(SimpleNamespace(target=sides[0], golden=sides[1], partial_note=None))
    assert "no entry can match (--ignore cannot help)" in note and "--ignore 'Cell.*'" not in note, note


def test_one_extra_call_does_not_shift_later_names(dumps):
    rows = compare(dumps["extra"], dumps["base"])
    named = by_name(rows)
    unmatched = {r["NPU Name"] for r in rows if r["Match"] == "unmatched"}
    assert unmatched == {"Functional.relu.1.forward.input.0", "Functional.relu.1.forward.output.0",
                         "Functional.relu.1.backward.input.0", "Functional.relu.1.backward.output.0"}
    # the target's third relu call is the golden's second: paired by order, not by name
    third = named["Functional.relu.2.forward.output.0"]
    assert (third["Bench Name"], third["Match"], third["Result"]) == (
        "Functional.relu.1.forward.output.0", "order", "pass")
    assert named["Functional.relu.2.backward.output.0"]["Bench Name"] == "Functional.relu.1.backward.output.0"
    # every later entry is paired by name and agrees (relu is idempotent)
    assert named["Cell.fc2.Dense.forward.0.output.0"]["Result"] == "pass"
    assert named["Functional.gelu.0.forward.output.0"]["Match"] == "name"
    # unmatched rows are never pass
    assert {r["Result"] for r in rows if r["Match"] == "unmatched"} == {"unmatched"}
    (found,) = first_divergence(dumps["extra"], dumps["base"])
    assert (found.kind, found.entry) == ("unmatched", "Functional.relu.1.forward")

def test_an_unmatched_entry_has_its_cell_path_on_either_side(dumps):
    """An extra call inside a Cell: its Cell path comes from the dump it is in, whether that dump is
    the target or the golden."""
    (found,) = first_divergence(dumps["inner"], dumps["base"])
    (other,) = first_divergence(dumps["base"], dumps["inner"])
    assert (found.kind, other.kind) == ("unmatched", "unmatched")
    assert found.entry == other.entry and found.entry.startswith("Functional.relu."), (found, other)
    assert found.cell_path == other.cell_path == ["Cell.scale.Scale.forward.0"]


def test_first_divergence_names_the_changed_op(dumps):
    (found,) = first_divergence(dumps["tanh"], dumps["base"])
    assert (found.kind, found.entry, found.direction) == ("divergence", "Functional.gelu.0.forward", "forward")
    assert found.target_stack and found.golden_stack
    assert any("compare_dumps.py" in frame for frame in found.target_stack)
    recs = {r["record"]: r for r in found.records}
    assert recs["input.0"]["result"] == "pass" and recs["output.0"]["result"] != "pass"
    assert "approximate" in " ".join(recs)                    # the argument that changed is shown
    rows = compare(dumps["tanh"], dumps["base"])
    verdicts = {r["NPU Name"].rsplit(".", 2)[0]: r["Gain Verdict"] for r in rows}
    assert verdicts["Functional.gelu.0.forward"] == "grows"
    assert verdicts["Cell.fc2.Dense.forward.0"] == "carried"  # carries gelu's error, not blamed


class _CastNet(nn.Cell):
    """Dense(4, 3), then ``ops.cast`` of its Float32 output to ``dtype``: the cast's tensor input is
    the same Float32 tensor in a Float16 run and a Float32 one, its output is rounded in the first."""

    def __init__(self, dtype):
        super().__init__()
        self.fc = nn.Dense(4, 3)
        self.dtype = dtype

    def construct(self, x):
        return ops.cast(self.fc(x), self.dtype)


def _cast_dump(root, name, dtype) -> str:
    from msprobe.mindspore import PrecisionDebugger

    ms.set_seed(0)
    net = _CastNet(dtype)
    dump_path = str(root / name)
    debugger = PrecisionDebugger(dump_path=dump_path, level="mix")
    debugger.start(net)
    net(Tensor(np.random.RandomState(1).randn(2, 4).astype(np.float32)))
    debugger.stop()
    debugger.step()
    return dump_path


def _report_nodes(nodes):
    for node in nodes:
        yield node
        yield from _report_nodes(node["children"])


def test_error_gain_is_shown_only_where_it_means_something(dumps, tmp_path):
    """``Error Gain`` of an entry that passes while its inputs carry no error (a cast to Float16 of
    the same Float32 tensor: rounded within tolerance) is N/A in the CSV and xlsx, null in the API
    rows, absent from the HTML report; ``inf`` stays where an output fails over inputs that carry
    no error (the changed ``mint.mul`` factor), written alike in CSV, xlsx, HTML and JSON."""
    from openpyxl import load_workbook

    half, full = _cast_dump(tmp_path, "half", ms.float16), _cast_dump(tmp_path, "full", ms.float32)
    cases = {"cast": (half, full, "Functional.cast.0.forward", "N/A", ""),
             "factor": (dumps["factor"], dumps["base"], "Mint.mul.0.forward", "inf", "inf")}
    for name, (target, golden, entry, written, in_html) in cases.items():
        out = tmp_path / name
        cli("compare", "-tp", target, "-gp", golden, "-o", str(out), "--xlsx", check_code=0)
        (csv_path,) = glob.glob(str(out / "compare_result_*.csv"))
        with open(csv_path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["NPU Name"].startswith(entry + ".")]
        sheet = load_workbook(csv_path[:-4] + ".xlsx", read_only=True).active
        head = [c.value for c in next(sheet.iter_rows(max_row=1))]
        cells = [dict(zip(head, (c.value for c in row))) for row in sheet.iter_rows(min_row=2)]
        cells = [c for c in cells if str(c["NPU Name"]).startswith(entry + ".")]
        api = [r for r in compare(target, golden) if r["NPU Name"].startswith(entry + ".")]
        assert rows and len(cells) == len(rows) == len(api)
        assert {r["Error Gain"] for r in rows} == {c["Error Gain"] for c in cells} == {written}
        assert {r["Error Gain"] for r in api} == ({None} if written == "N/A" else {math.inf})
        output = next(r for r in rows if r["NPU Name"] == entry + ".output.0")
        assert float(output["Max diff"]) != 0.0  # the output does differ: the gain is of a real error
        verdict = {"cast": "pass", "factor": "grows"}[name]
        assert {r["Gain Verdict"] for r in rows} == {verdict} and output["Result"] == (
            "pass" if verdict == "pass" else "error")
        nodes = {n["name"]: n for n in _report_nodes(build_context(target, golden)["roots"])}
        assert nodes[entry]["gain"] == in_html and nodes[entry]["verdict"] == verdict
    data = json.loads(cli("first-diff", dumps["factor"], dumps["base"], "--json", check_code=1).stdout)
    assert data["divergences"][0]["entry"] == "Mint.mul.0.forward" and data["divergences"][0]["gain"] == "inf"


def test_first_divergence_inside_a_cell_names_the_innermost_call(dumps):
    (found,) = first_divergence(dumps["factor"], dumps["base"])
    assert found.entry == "Mint.mul.0.forward"
    assert found.cell_path == ["Cell.scale.Scale.forward.0"]
    proc = cli("first-diff", dumps["factor"], dumps["base"], check_code=1)
    assert proc.stdout.splitlines()[0].startswith("first difference (step ") and "Mint.mul.0.forward" in proc.stdout
    assert proc.stdout.splitlines()[1] == ("  tensor inputs agree, a scalar argument differs (input.1: value 2.5 "
                                           "vs 2.0), outputs do not (forward)"), proc.stdout  # why
    assert "Cell path: Cell.scale.Scale.forward.0" in proc.stdout
    # the stack printed shows the user's frames: the Cell-call machinery between them is folded
    target_stack = proc.stdout.split("target stack")[1].split("golden stack")[0].splitlines()[1:]
    assert "compare_dumps.py" in target_stack[0] and "mint.mul(h, self.factor)" in target_stack[0]
    assert re.fullmatch(r"\s*\.\.\. \d+ MindSpore frames?", target_stack[1])
    assert "h = self.scale(h)" in target_stack[2]
    assert not any("site-packages" in line and "mindspore" in line for line in target_stack[1:])
    data = json.loads(cli("first-diff", dumps["factor"], dumps["base"], "--json", check_code=1).stdout)
    assert data["divergences"][0]["entry"] == "Mint.mul.0.forward"
    # one form of frames on screen and in --json: show --all-frames's lines, in stack.json's order
    # (innermost first), each the stack.json frame without its line break
    shown = cli("show", dumps["factor"], "Mint.mul.0.forward", "--all-frames", check_code=0).stdout
    shown = [line[2:] for line in shown.split("innermost first, all ")[1].splitlines()[1:] if line.startswith("  F")]
    (step_dir,) = glob.glob(os.path.join(dumps["factor"], "step0", "*"))
    frames = load_stacks(step_dir)["Mint.mul.0.forward"]
    assert "\n" in frames[0]                                   # the file keeps the seed's two-line frames
    assert data["divergences"][0]["target_stack"] == shown == [f.replace("\n", "") for f in frames]
    assert data["nan_producers"]["target"] == []


def test_nan_producer_and_one_sided_nan(dumps):
    (found,) = nan_producer(dumps["nan"])
    assert (found.entry, found.direction) == ("Functional.sqrt.0.forward", "forward")
    assert nan_producer(dumps["base"]) == []
    proc = cli("first-diff", dumps["nan"], check_code=1)
    assert "first NaN/Inf producer" in proc.stdout and "Functional.sqrt.0.forward" in proc.stdout
    cli("first-diff", dumps["base"], check_code=0)
    rows = compare(dumps["nan"], dumps["base"])
    fc2_in = by_name(rows)["Cell.fc2.Dense.forward.0.input.0"]
    assert fc2_in["Result"] == "error" and "NaN/Inf on one side only" in fc2_in["Err_message"]
    # the extra calls (Tensor.__sub__, sqrt) are unmatched, never pass
    assert by_name(rows)["Functional.sqrt.0.forward.output.0"]["Result"] == "unmatched"


def test_first_diff_shows_the_golden_nan_producer_as_golden(dumps):
    """The NaN/Inf producer of the golden dump is printed and given in JSON with the golden run's
    statistics and stack, never under the target's."""
    proc = cli("first-diff", dumps["base"], dumps["nan"], check_code=1)
    block = proc.stdout[proc.stdout.index("golden: first NaN/Inf producer"):]
    assert "Functional.sqrt.0.forward" in block.splitlines()[0]
    assert "golden Max=" in block and "target Max=" not in block, block
    assert "golden stack" in block and "target stack" not in block, block
    data = json.loads(cli("first-diff", dumps["base"], dumps["nan"], "--json").stdout)
    (found,) = data["nan_producers"]["golden"]
    assert found["entry"] == found["golden_entry"] == "Functional.sqrt.0.forward"
    assert found["target_stack"] == [] and any("sqrt" in line for line in found["golden_stack"])
    assert all("golden" in rec and "target" not in rec for rec in found["records"]), found["records"]
    assert data["nan_producers"]["target"] == []


def test_report_header_names_the_steps_that_differ(tmp_path):
    """A report with --golden and no --step shows the first step; when that step agrees and a later
    one differs (another learning rate: step 0 of an L0 dump is computed before the first update),
    the header names the step that differs."""
    same = make_dump(tmp_path, "lr1", level="L0", steps=2)
    other = make_dump(tmp_path, "lr2", level="L0", steps=2, lr=0.3)
    context = build_context(other, same)
    assert context["step"] == 0 and context["divergence"] is None
    (differing,) = context["differing"]
    assert differing.startswith("step 1 ") and "first difference" in differing, differing
    assert build_context(other, same, step=[1])["differing"] == []   # --step given: that step is shown
    out = cli("report", other, "--golden", same, "-o", str(tmp_path / "r.html"), check_code=0)
    html = (tmp_path / "r.html").read_text()
    assert 'id="differing-steps"' in html and differing.split(" (")[0] in html, out.stdout


def test_mapping_pairs_renamed_api(dumps, tmp_path):
    rows = compare(dumps["mint"], dumps["base"])
    assert by_name(rows)["MintFunctional.relu.0.forward.output.0"]["Match"] == "unmatched"
    mapping = tmp_path / "map.yaml"
    mapping.write_text("MintFunctional.relu.0: Functional.relu.1\n")
    rows = compare(dumps["mint"], dumps["base"], mapping=str(mapping))
    for way in ("forward", "backward"):
        row = by_name(rows)[f"MintFunctional.relu.0.{way}.output.0"]
        assert (row["Bench Name"], row["Match"], row["Result"]) == (
            f"Functional.relu.1.{way}.output.0", "mapping", "pass")
    assert {r["Match"] for r in rows} == {"name", "mapping"}


def test_cli_compare_files_and_reference_flags(dumps, tmp_path):
    out = tmp_path / "out"
    dump_json = glob.glob(os.path.join(dumps["tanh"], "step0", "*", "dump.json"))[0]
    proc = cli("compare", "-tp", dump_json, "-gp", dumps["base"], "-o", str(out), "--xlsx", "-s",
               check_code=0)
    (csv_path,) = glob.glob(str(out / "compare_result_*_*.csv"))
    rank = os.path.basename(os.path.dirname(dump_json))
    assert os.path.basename(csv_path).startswith(f"compare_result_{rank}_")
    with open(csv_path, newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == columns("statistics", stack=True)
    assert len(table) - 1 == len(compare(dumps["tanh"], dumps["base"]))
    from openpyxl import load_workbook

    sheet = load_workbook(csv_path[:-4] + ".xlsx", read_only=True).active
    assert [c.value for c in next(sheet.iter_rows(max_row=1))] == table[0]
    (summary_path,) = glob.glob(str(out / "compare_summary_*.json"))
    summary = json.load(open(summary_path))
    assert "first difference (as msprobe first-diff): Functional.gelu.0.forward (forward)" in proc.stdout
    assert summary["results"][0]["first_difference"]["entry"] == "Functional.gelu.0.forward"


def test_steps_are_paired_and_filtered(tmp_path):
    a = make_dump(tmp_path, "a", steps=2)
    b = make_dump(tmp_path, "b", steps=2, approximate="tanh")
    out = tmp_path / "out"
    cli("compare", "-tp", b, "-gp", a, "-o", str(out), check_code=0)
    names = sorted(os.path.basename(p) for p in glob.glob(str(out / "*.csv")))
    assert len(names) == 2 and "_step0_" in names[0] and "_step1_" in names[1]
    rows = compare(b, a, step=[1])
    assert {r["Step"] for r in rows} == {1}
    found = first_divergence(b, a)
    assert [(f.step, f.entry) for f in found] == [(0, "Functional.gelu.0.forward"),
                                                  (1, "Functional.gelu.0.forward")]


def test_steps_on_one_side_only_are_named(tmp_path):
    """Steps present in one dump only are not compared, and first-diff (console and --json) and the
    report say which ones, also when the compared steps agree."""
    import shutil

    a, b = make_dump(tmp_path, "a", steps=2), make_dump(tmp_path, "b", steps=3, approximate="tanh")
    out = cli("first-diff", a, b, "--json")
    assert json.loads(out.stdout)["unpaired_steps"] == {"target_only": [], "golden_only": [2]}
    shutil.copytree(os.path.join(a, "step1"), str(tmp_path / "a1" / "step1"))
    out = cli("first-diff", str(tmp_path / "a1"), a, check_code=0).stdout.splitlines()
    assert out[:2] == ["the runs agree bitwise (every statistic recorded is equal)",
                       "  note: only step 1 is compared: step 0 is in the golden dump only"], out
    assert json.loads(cli("first-diff", a, a, "--json").stdout)["unpaired_steps"] == {
        "target_only": [], "golden_only": []}
    html = tmp_path / "r.html"
    cli("report", b, "--golden", a, "-o", str(html), check_code=0)
    assert "step 2 is in the target dump only" in html.read_text(encoding="utf-8")


def test_result_files_are_named_by_rank_first(tmp_path):
    """``compare_result_{rank}[_{tree}][_step{N}]_{timestamp}.csv`` (README): the target's rank
    directory comes first, as in the reference tool's per-rank names, also for the pynative/ and
    graph/ subtrees of a dump_path; the summary lists the steps left out per side and per subtree."""
    import shutil

    a, b = make_dump(tmp_path, "a", steps=2), make_dump(tmp_path, "b", steps=3)
    for side, src in (("target", b), ("golden", a)):
        for tree in ("pynative", "graph"):
            shutil.copytree(src, str(tmp_path / side / tree))
    (rank,) = os.listdir(os.path.join(b, "step0"))
    out = tmp_path / "out"
    cli("compare", "-tp", str(tmp_path / "target"), "-gp", str(tmp_path / "golden"), "-o", str(out),
        check_code=0)
    names = sorted(os.path.basename(p) for p in glob.glob(str(out / "*.csv")))
    found = [re.fullmatch(rf"compare_result_{rank}_(pynative|graph)_step([01])_\d{{14}}\.csv", n) for n in names]
    assert all(found) and sorted(m.groups() for m in found) == [
        ("graph", "0"), ("graph", "1"), ("pynative", "0"), ("pynative", "1")], names
    (summary_path,) = glob.glob(str(out / "compare_summary_*.json"))
    per_side = {"target_only": [2], "golden_only": []}
    assert json.load(open(summary_path))["unpaired_steps"] == {
        **per_side, "by_tree": {"graph": per_side, "pynative": per_side}}
    one = tmp_path / "one"   # one step: no step in the name
    cli("compare", "-tp", str(tmp_path / "target"), "-gp", str(tmp_path / "golden"), "-o", str(one),
        "--step", "0", check_code=0)
    names = sorted(os.path.basename(p) for p in glob.glob(str(one / "*.csv")))
    assert [re.sub(r"\d{14}", "T", n) for n in names] == [f"compare_result_{rank}_graph_T.csv",
                                                          f"compare_result_{rank}_pynative_T.csv"], names


def test_compare_names_the_steps_it_leaves_out(tmp_path):
    """``msprobe compare`` of two dump_paths whose step sets differ says which steps it did not
    compare, on the console and in its summary file, in first-diff's words."""
    a, b = make_dump(tmp_path, "a", steps=2), make_dump(tmp_path, "b", steps=3)
    note = "only steps 0, 1 are compared: step 2 is in the target dump only"
    out = tmp_path / "out"
    proc = cli("compare", "-tp", b, "-gp", a, "-o", str(out), check_code=0)
    assert f"note: {note}" in proc.stdout.splitlines(), proc.stdout
    (summary_path,) = glob.glob(str(out / "compare_summary_*.json"))
    steps = {"target_only": [2], "golden_only": []}   # step numbers per side, for scripts
    assert json.load(open(summary_path))["unpaired_steps"] == steps
    assert json.loads(cli("first-diff", b, a, "--json").stdout)["unpaired_steps"] == steps
    same = tmp_path / "same"
    proc = cli("compare", "-tp", a, "-gp", a, "-o", str(same), check_code=0)
    assert "note:" not in proc.stdout
    (summary_path,) = glob.glob(str(same / "compare_summary_*.json"))
    assert json.load(open(summary_path))["unpaired_steps"] == {"target_only": [], "golden_only": []}


def test_ignored_records_are_left_out_on_both_sides(dumps):
    pattern = "Functional.gelu.*.forward.output.*"
    rows = compare(dumps["tanh"], dumps["base"], ignore=[pattern])
    names = {r["NPU Name"] for r in rows} | {r["Bench Name"] for r in rows}
    assert "Functional.gelu.0.forward.output.0" not in names
    assert "Functional.gelu.0.forward.input.0" in names                # the rest of the entry stays
    assert len(rows) == len(compare(dumps["tanh"], dumps["base"])) - 1
    (found,) = first_divergence(dumps["tanh"], dumps["base"], ignore=[pattern])
    # its differing output is not seen: only its differing argument ('tanh' vs 'none') is left
    assert (found.kind, found.entry) == ("input", "Functional.gelu.0.forward")
    assert [r["record"] for r in found.records if r["result"] != "pass"] == ["kwargs.approximate"]
    out = cli("first-diff", dumps["tanh"], dumps["base"], "--ignore", pattern, "--json", check_code=1).stdout
    assert json.loads(out)["divergences"][0]["entry"] == found.entry
    assert not compare(dumps["again"], dumps["base"], ignore=["*"])    # everything left out: no rows


def test_tensor_mode(tmp_path):
    a = make_dump(tmp_path, "a", task="tensor")
    b = make_dump(tmp_path, "b", task="tensor", approximate="tanh")
    rows = compare(b, a)
    assert list(rows[0])[:12] == ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
                                  "Bench Tensor Shape", "Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr",
                                  "One Thousandth Err Ratio", "Five Thousandths Err Ratio"]
    named = by_name(rows)
    same = named["Cell.fc1.Dense.forward.0.output.0"]
    assert same["Cosine"] == 1.0 and same["EucDist"] == 0.0 and same["Result"] == "pass"  # exactly 1 when equal
    assert all(-1.0 <= r["Cosine"] <= 1.0 for r in rows if r["Cosine"] is not None)
    changed = named["Functional.gelu.0.forward.output.0"]
    assert changed["EucDist"] > 0 and changed["MaxAbsErr"] > 0 and changed["Result"] != "pass"
    assert 0.0 <= changed["One Thousandth Err Ratio"] <= changed["Five Thousandths Err Ratio"] <= 1.0
    (found,) = first_divergence(b, a)
    assert found.entry == "Functional.gelu.0.forward"
    assert compare(b, a, mode="statistics")[0]["Max diff"] is not None
    # first-diff shows, under each record's statistics, the values it computed from the two tensors
    out = cli("first-diff", b, a, check_code=1).stdout
    gelu_out = out.split("output.0", 1)[1].split("\n")[2]
    metrics = changed
    assert gelu_out.strip() == (f"tensors: relative L2 error={found.records[-1]['error']:.6g} "
                                f"Cosine={metrics['Cosine']:.9g} EucDist={metrics['EucDist']:.6g} "
                                f"MaxAbsErr={metrics['MaxAbsErr']:.6g} "
                                f"MaxRelativeErr={metrics['MaxRelativeErr']:.6g}"), out
    assert "tensors:" not in cli("first-diff", b, a, "--mode", "statistics", check_code=1).stdout


def test_md5_mode(tmp_path):
    a = make_dump(tmp_path, "a", section={"summary_mode": "md5"})
    b = make_dump(tmp_path, "b", section={"summary_mode": "md5"}, approximate="tanh")
    rows = compare(b, a)
    assert list(rows[0])[:9] == ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
                                 "Bench Tensor Shape", "NPU MD5", "BENCH MD5", "Result"]
    named = by_name(rows)
    assert named["Cell.fc1.Dense.forward.0.output.0"]["Result"] == "pass"
    gelu = named["Functional.gelu.0.forward.output.0"]
    assert gelu["Result"] == "error" and gelu["NPU MD5"] != gelu["BENCH MD5"]
    (found,) = first_divergence(b, a, exact=True)
    assert found.entry == "Functional.gelu.0.forward"


@pytest.mark.no_format_check  # writes a broken dump.json on purpose (exit code 2)
def test_exit_codes_and_help(dumps, tmp_path):
    for command in ([], ["summary"], ["compare"], ["first-diff"], ["show"], ["report"]):
        proc = cli(*command, "--help", check_code=0)
        assert "Usage:" in proc.stdout
    assert "Exit codes" in cli("--help").stdout
    cli("first-diff", dumps["tanh"], dumps["base"], check_code=1)
    cli("first-diff", str(tmp_path), dumps["base"], check_code=2)          # exists, holds no dump
    cli("first-diff", str(tmp_path / "missing"), dumps["base"], check_code=2)
    cli("compare", "-tp", str(tmp_path), "-gp", dumps["base"], check_code=2)
    for command in (["summary"], ["show"], ["report", "-o", str(tmp_path / "r.html")]):
        args = [*command[:1], str(tmp_path), *(["Any.entry"] if command == ["show"] else command[1:])]
        assert "no dump found" in cli(*args, check_code=2).stderr
    cli("compare", "-tp", dumps["base"], "-gp", dumps["base"], "--step", "x", check_code=2)
    assert "first producer of a non-finite value" in cli("summary", dumps["base"], check_code=0).stdout
    proc = cli("show", dumps["factor"], "Mint.mul.0.forward", check_code=0)
    assert "Cell path: Cell.scale.Scale.forward.0" in proc.stdout
    assert "input.1" in proc.stdout and "2.5" in proc.stdout and "compare_dumps.py" in proc.stdout
    cli("show", dumps["factor"], "No.such.entry", check_code=2)
    broken = tmp_path / "broken" / "step0" / "rank0"
    broken.mkdir(parents=True)
    text = '{"task": "statistics", "data": {"Functional.relu.0.forward": {'
    (broken / "dump.json").write_text(text)
    proc = cli("compare", "-tp", str(broken), "-gp", dumps["base"], "-o", str(tmp_path / "o"), check_code=2)
    assert f"dump.json: invalid or truncated JSON at character {len(text)}" in proc.stderr


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["scripts"]["msprobe"] == "msprobe.cli:main"
    from msprobe.cli import main

    assert sorted(main.commands) == ["compare", "first-diff", "report", "show", "summary"]


def test_streamed_reader_matches_load_at_any_chunk_size(dumps, monkeypatch):
    from msprobe.read import reader

    (path,) = glob.glob(os.path.join(dumps["nan"], "step0", "*"))
    whole = reader.load(path)
    monkeypatch.setattr(reader._ObjectStream, "_CHUNK", 7)   # values split across many reads
    items = list(reader.iter_bodies(path))
    assert items[0] == (None, whole.header)
    assert [k for k, _ in items[1:]] == list(whole.data)
    assert json.dumps(dict(items[1:])) == json.dumps(whole.data)   # NaN tokens included


def test_pynative_and_graph_subtrees_are_paired(dumps, tmp_path):
    import shutil

    for side, src in (("t", dumps["tanh"]), ("g", dumps["base"])):
        for tree in ("pynative", "graph"):
            shutil.copytree(os.path.join(src, "step0"), str(tmp_path / side / tree / "step0"))
    found = first_divergence(str(tmp_path / "t"), str(tmp_path / "g"))
    assert sorted(f.rank.split("_")[0] for f in found) == ["graph", "pynative"]
    assert {f.entry for f in found} == {"Functional.gelu.0.forward"}


def test_a_dump_path_with_subtrees_against_one_without(dumps, tmp_path):
    """A dump_path holding pynative/ and graph/ against one holding steps at its top: the error names
    the subtrees to pass; with one subtree only, that subtree is compared."""
    import shutil

    from msprobe.compare.inputs import InputError

    for tree in ("pynative", "graph"):
        shutil.copytree(os.path.join(dumps["tanh"], "step0"), str(tmp_path / "both" / tree / "step0"))
    with pytest.raises(InputError) as raised:
        first_divergence(str(tmp_path / "both"), dumps["base"])
    assert str(raised.value) == (
        f"{tmp_path / 'both'} holds the subtrees graph/ and pynative/ (a PyNative run with mindspore.jit "
        f"functions), {dumps['base']} holds step directories at its top: pass one subtree instead: "
        f"{tmp_path / 'both' / 'graph'} or {tmp_path / 'both' / 'pynative'}")
    shutil.copytree(os.path.join(dumps["tanh"], "step0"), str(tmp_path / "one" / "pynative" / "step0"))
    for target, golden in ((str(tmp_path / "one"), dumps["base"]), (dumps["base"], str(tmp_path / "one"))):
        (found,) = first_divergence(target, golden)
        assert found.entry == "Functional.gelu.0.forward"


def test_steps_present_in_neither_side_are_named_as_steps(dumps, tmp_path):
    """``--step`` naming steps that the two dumps do not both hold: the error says "step 3" /
    "steps 3, 4", not a Python list."""
    import shutil

    from msprobe.compare.inputs import InputError, pair

    for side in ("a", "b"):
        for step in (0, 1):
            shutil.copytree(os.path.join(dumps["tanh"], "step0"), str(tmp_path / side / f"step{step}"))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for steps, subject in (([3], "step 3 is not"), ([4, 3], "none of steps 3, 4 is")):
        with pytest.raises(InputError) as raised:
            pair(a, b, steps)
        assert str(raised.value) == f"nothing to compare: {subject} present in both {a} and {b}"


def test_debug_level_dumps(tmp_path):
    from mindspore import Tensor
    from msprobe.mindspore import PrecisionDebugger

    from conftest import write_config

    def run(name, scale):
        dump = str(tmp_path / name)
        cfg = tmp_path / f"{name}_cfg"
        cfg.mkdir()
        debugger = PrecisionDebugger(write_config(cfg, level="debug", dump_path=dump))
        x = Tensor([1.0, -2.0, 3.0], ms.float32)

        def loss(v):
            y = v * 2.0
            debugger.save(y, "y")
            z = y * scale
            debugger.save(z, "z")
            return z.sum()

        debugger.start()
        ms.grad(loss)(x)
        debugger.stop()
        debugger.step()
        return dump

    a, b = run("a", 3.0), run("b", 3.5)
    from msprobe.dump import summarize
    (line,) = [x for x in summarize(a).splitlines() if "step0/" in x]
    assert "4 entries (2 saved values, 2 saved gradients) prefixes: y, y_grad, z, z_grad" in line, line
    named = by_name(compare(b, a))
    assert named["y.0.debug"]["Result"] == "pass"
    assert named["z.0.debug"]["Result"] == "error"
    assert named["z_grad.0.debug"]["Result"] == "pass"      # d(sum)/dz = 1 in both runs
    (found,) = first_divergence(b, a)
    assert (found.entry, found.direction) == ("z.0.debug", "forward")
    assert direction_of("y_grad.0.debug") == "backward"


def test_a_nan_scalar_argument_on_both_sides_is_the_same_value(tmp_path):
    """``x * float("nan")`` in two identical runs: the scalar argument is NaN on both sides, which is
    the same argument (not "value differs (nan vs nan)"), so the runs agree."""
    from mindspore import Tensor
    from msprobe.mindspore import PrecisionDebugger

    from conftest import write_config

    def run(name):
        dump = str(tmp_path / name)
        cfg = tmp_path / f"{name}_cfg"
        cfg.mkdir()
        debugger = PrecisionDebugger(write_config(cfg, level="L1", dump_path=dump))
        debugger.start()
        _ = Tensor([1.0, 2.0], ms.float32) * float("nan")
        debugger.stop()
        debugger.step()
        return dump

    a, b = run("a"), run("b")
    (row,) = [r for r in compare(b, a) if r["NPU Name"] == "Tensor.__mul__.0.forward.input.1"]
    assert row["Result"] == "pass" and "value differs" not in row["Err_message"], row
    assert first_divergence(b, a) == []


def test_tensor_mode_loads_one_pair_at_a_time(tmp_path, monkeypatch):
    import gc
    import weakref

    from msprobe.format import npy

    a = make_dump(tmp_path, "a", task="tensor")
    b = make_dump(tmp_path, "b", task="tensor", approximate="tanh")
    original, alive, most = npy.load_npy, [], [0]

    def tracked(path):
        alive[:] = [r for r in alive if r() is not None]
        if len(alive) > 1:  # what only a reference cycle keeps is not alive (a full collection
            gc.collect()    # costs ~0.1 s with MindSpore loaded: only when it can change the count)
            alive[:] = [r for r in alive if r() is not None]
        most[0] = max(most[0], len(alive))
        arr = original(path)
        alive.append(weakref.ref(arr))
        return arr

    monkeypatch.setattr(npy, "load_npy", tracked)
    rows = compare(b, a)
    assert most[0] <= 1               # when a file is loaded, no earlier pair's array is alive
    assert sum(1 for r in rows if r["Cosine"] is not None) > 50      # and every tensor was compared


def test_report_takes_one_step_and_says_so(dumps, tmp_path):
    """A report is one step and rank: several values for --step are refused with a message naming the
    option and the values (no report that silently shows only the first)."""
    out = tmp_path / "r.html"
    proc = cli("report", dumps["seed1"], "--golden", dumps["base"], "--step", "0,1", "-o", str(out),
               check_code=2)
    assert "--step" in proc.stderr + proc.stdout and "0, 1" in proc.stderr + proc.stdout
    assert not out.exists()
    cli("report", dumps["seed1"], "--golden", dumps["base"], "--step", "0", "-o", str(out), check_code=0)
    assert out.exists()


def test_report_of_a_dump_with_several_steps_names_the_step_it_shows(tmp_path):
    """Without --step a report shows the first step; its headline names that step and the report
    lists the other steps present, so "the runs agree" is never read as a claim about all of them."""
    target = make_dump(tmp_path, "two", steps=2)
    golden = make_dump(tmp_path, "two_again", steps=2)
    out = tmp_path / "r.html"
    cli("report", target, "--golden", golden, "-o", str(out), check_code=0)
    html = out.read_text(encoding="utf-8")
    assert "step 0" in html and "the runs agree" in html
    assert re.search(r"step 0 \S+: the runs agree", html)
    other = re.search(r'id="other-steps">(.*?)</div>', html, re.S).group(1)
    assert "step 0" in other and "step 1" in other and "--step N" in other


def test_dumps_of_different_levels_say_so_instead_of_different_calls(dumps, tmp_path):
    """An L1 dump against a mix dump: the Cell entries only mix records are left out of the first
    divergence and the API entries both record are compared (the same run agrees, and says on what);
    L0 against L1 share no entry kind: the first unmatched entry is named, with the levels as the
    reason rather than "the runs executed different calls"."""
    l1 = make_dump(tmp_path, "l1", level="L1")
    assert first_divergence(l1, dumps["base"]) == []
    out = cli("first-diff", l1, dumps["base"], check_code=0).stdout
    assert "the runs agree" in out, out
    assert ("note: the dumps were taken at different levels (L1 vs mix): the API entries both record "
            "are compared, those only mix records are left out") in out, out
    # a real difference is still found across levels, and its note says what was compared
    (tanh,) = first_divergence(dumps["tanh"], l1)
    assert tanh.kind == "divergence" and "(mix vs L1)" in tanh.note
    # an L1 dump has no Cells: the Cell path of a divergence inside a Cell comes from the mix dump
    l1_factor = make_dump(tmp_path, "l1_factor", level="L1", factor=2.5)
    (inside,) = first_divergence(l1_factor, dumps["base"])
    assert (inside.kind, inside.cell_path) == ("divergence", ["Cell.scale.Scale.forward.0"]), inside
    l0 = make_dump(tmp_path, "l0", level="L0")
    (found,) = first_divergence(l0, l1)
    assert found.kind == "unmatched" and "different levels (L0 vs L1)" in found.note
    assert "no entry in common" in found.note and "--ignore" not in found.note
    out = cli("first-diff", l0, l1, check_code=1).stdout
    assert "different levels (L0 vs L1)" in out and "executed different calls" not in out
    # the --ignore patterns still leave entries out by hand
    out = cli("first-diff", l1, dumps["base"], "--ignore", "Cell.*", check_code=0).stdout
    assert "the runs agree" in out, out
    (same,) = first_divergence(dumps["extra"], dumps["base"])
    assert same.kind == "unmatched" and same.note is None


@pytest.mark.parametrize("command", [["first-diff", "{tanh}", "{base}"], ["summary", "{base}"],
                                     ["show", "{factor}", "Mint.mul.0.forward"],
                                     ["compare", "-tp", "{tanh}", "-gp", "{base}", "-o", "{out}"]])
def test_a_closed_stdout_ends_quietly(dumps, tmp_path, command):
    """``msprobe ... | head``: the reader closes the pipe; the command stops with 141 (128 + SIGPIPE,
    what a shell reports for ``cat`` in the same place) and prints nothing on stderr. The read end
    is closed before the command starts, so every write it makes meets the closed pipe."""
    args = [a.format(out=tmp_path / "o", **dumps) for a in command]
    env = dict(os.environ, PYTHONPATH=ROOT)
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "msprobe.cli", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")
    if command[0] == "compare":       # the result files are written before anything is printed
        assert glob.glob(str(tmp_path / "o" / "compare_result_*.csv"))
    shell = subprocess.run(f"{sys.executable} -m msprobe.cli {' '.join(args)} | head -1",
                           shell=True, capture_output=True, text=True, env=env, timeout=300)
    assert shell.returncode == 0 and shell.stderr == "" and len(shell.stdout.splitlines()) == 1


def test_an_ignore_pattern_that_matches_nothing_is_named(dumps, tmp_path):
    """--ignore with a pattern that matches no record: a WARNING names it, and the run goes on
    (the other pattern still leaves its records out)."""
    used, unused = "Functional.gelu.*.forward.output.*", "Functional.gelu.*.forwrd.*"
    proc = cli("first-diff", dumps["tanh"], dumps["base"], "--ignore", used, "--ignore", unused,
               "--json", check_code=1)
    assert proc.stderr.splitlines() == [
        f"msprobe: WARNING: ignore pattern {unused!r} matches no record of the step/rank pair compared "
        "(record names are {entry}.{key}, e.g. 'Functional.relu.0.forward.output.0'): it leaves nothing out"]
    assert json.loads(proc.stdout)["divergences"][0]["kind"] == "input"   # the used pattern worked
    proc = cli("compare", "-tp", dumps["tanh"], "-gp", dumps["base"], "-o", str(tmp_path / "o"),
               "--ignore", unused, check_code=0)
    assert f"ignore pattern {unused!r} matches no record" in proc.stderr
    assert "first difference (as msprobe first-diff): Functional.gelu.0.forward" in proc.stdout
    proc = cli("report", dumps["tanh"], "--golden", dumps["base"], "-o", str(tmp_path / "r.html"),
               "--ignore", unused, check_code=0)
    assert f"ignore pattern {unused!r} matches no record" in proc.stderr
    assert os.path.getsize(tmp_path / "r.html") > 0
    assert cli("first-diff", dumps["tanh"], dumps["base"], "--ignore", used, check_code=1).stderr == ""


def test_show_suggests_close_entry_names(dumps):
    """An entry name that does not exist: the error offers the names that extend it or are close."""
    proc = cli("show", dumps["factor"], "Functional.relu", check_code=2)
    assert proc.stderr.strip() == (f"msprobe: error: entry 'Functional.relu' not found in {dumps['factor']}; "
                                   "did you mean: Functional.relu.0.forward, Functional.relu.1.forward, "
                                   "Functional.relu.1.backward, Functional.relu.0.backward, "  # run order
                                   "Functional.gelu.0.forward?")                             # then difflib's
    proc = cli("show", dumps["factor"], "GELU", check_code=2)  # a part of the name, any case
    assert "did you mean: Functional.gelu.0.forward" in proc.stderr, proc.stderr
    proc = cli("show", dumps["factor"], "Mint.mull.0.forward", check_code=2)
    assert "did you mean: Mint.mul.0.forward" in proc.stderr
    proc = cli("show", dumps["factor"], "No.such.entry", check_code=2)
    assert "entries searched, none with a close name" in proc.stderr
    proc = cli("show", dumps["factor"], "Functional.relu.0.forward", "--step", "99", check_code=2)
    assert "no step/rank directory" in proc.stderr and "--step 99; present: step 0" in proc.stderr, proc.stderr


def test_show_and_first_diff_fold_a_stack_by_one_rule(dumps):
    """``show`` and ``first-diff`` print the same entry's stack the same way: MindSpore's own frames
    folded into counted lines; with ``--all-frames`` both print every frame of ``stack.json``."""
    from msprobe.dump import iter_step_dirs, load_stacks

    def stack_lines(out, title):
        lines = out.split(title, 1)[1].splitlines()
        body = []
        for line in lines[1:]:
            if not line.startswith("  ") or line.strip().startswith(("golden stack", "target stack")):
                break
            body.append(line.strip())
        return lines[0], body

    entry = "Mint.mul.0.forward"
    diff = cli("first-diff", dumps["factor"], dumps["base"], check_code=1).stdout
    shown = cli("show", dumps["factor"], entry, check_code=0).stdout
    head_diff, folded_diff = stack_lines(diff, "target stack")
    head_show, folded_show = stack_lines(shown, "\nstack")
    assert folded_diff == folded_show and head_diff == head_show
    assert any(re.fullmatch(r"\.\.\. \d+ MindSpore frames?", line) for line in folded_show)
    ((_, directory),) = [(s, p) for s, _, p in iter_step_dirs(dumps["factor"])]
    frames = [f.replace("\n", "").strip() for f in load_stacks(directory)[entry]]
    assert sum(int(line.split()[1]) for line in folded_show if line.startswith("... ")) \
        + sum(1 for line in folded_show if not line.startswith("... ")) == len(frames)
    _, every_diff = stack_lines(cli("first-diff", dumps["factor"], dumps["base"], "--all-frames",
                                    check_code=1).stdout, "target stack")
    head_all, every_show = stack_lines(cli("show", dumps["factor"], entry, "--all-frames",
                                           check_code=0).stdout, "\nstack")
    assert every_diff == every_show == frames and f"all {len(frames)} frames" in head_all


def test_two_compares_into_one_directory_in_the_same_second_keep_both(tmp_path, monkeypatch):
    """The timestamp names a compare's files; a second compare into the same directory within the
    same second takes ``{timestamp}_1``: no compare overwrites another's results."""
    import datetime as real_datetime

    import msprobe.compare as compare

    a, b = make_dump(tmp_path, "a", steps=1), make_dump(tmp_path, "b", steps=1)
    fixed = real_datetime.datetime(2026, 1, 2, 3, 4, 5)

    class Frozen(real_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    monkeypatch.setattr(compare.datetime, "datetime", Frozen)
    out = str(tmp_path / "out")
    first = compare.compare_to_files(b, a, out)
    second = compare.compare_to_files(b, a, out)
    assert os.path.basename(first["summary"]) == "compare_summary_20260102030405.json"
    assert os.path.basename(second["summary"]) == "compare_summary_20260102030405_1.json"
    csvs = [r["csv"] for r in first["results"] + second["results"]]
    assert len(set(csvs)) == 2 and all(os.path.getsize(p) > 0 for p in csvs), csvs
    for s in (first, second):
        assert json.load(open(s["summary"]))["results"][0]["csv"] in csvs
