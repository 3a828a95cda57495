"""``msprobe report``: one self-contained HTML file (Jinja2 template ``templates/report.html.j2``).

No server and nothing fetched: styles and the small navigation script are inline. One step/rank is
shown: the Cell tree of ``construct.json`` (entries outside any Cell at the top level, execution
order), each node with its records' statistics and, with a golden dump, coloured by its compare
result; links to the first difference and the first NaN/Inf producer open the tree down to them.
"""
from __future__ import annotations

import math
import os
import re
from typing import Optional

import jinja2

from msprobe.compare import divergence
from msprobe.compare.inputs import InputError, anomaly_first, rank_number, resolve, unpaired_steps
from msprobe.compare.records import Side
from msprobe.dump import ANOMALIES, load_construct, load_stacks
from msprobe.format import naming
from msprobe.format.frames import frame_lines

_FRAME = re.compile(r"^File (?P<file>.*?), line (?P<line>\d+), in (?P<func>.*?),\s*\n?\s*(?P<code>.*)$", re.S)
_LIBRARY_MARKERS = (f"{os.sep}site-packages{os.sep}mindspore{os.sep}",
                    f"{os.sep}dist-packages{os.sep}mindspore{os.sep}")


def source_line(frames: list) -> Optional[str]:
    """The innermost frame outside MindSpore's own package: ``file:line in func: code``."""
    for frame in frames:
        m = _FRAME.match(frame)
        if m and not any(mark in m.group("file") for mark in _LIBRARY_MARKERS):
            return f"{m.group('file')}:{m.group('line')} in {m.group('func')}: {m.group('code').strip()}"
    return None


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Inf" if value > 0 else "-Inf"
        return f"{value:.6g}"
    return str(value)


def _gain_text(gain: float) -> str:
    """An entry's error gain as the CSV, xlsx and JSON outputs write it (``inf``, not ``Inf``)."""
    return "inf" if math.isinf(gain) else _fmt(gain)


def _anomaly_step(dump, options) -> Optional[int]:
    """Without ``--step``: the step of the first step/rank directory (of the ``--rank`` asked for)
    holding ``anomalies.json``, or ``None`` when none does (the report then shows the first step)."""
    if options.get("step") is not None:
        return None
    rank = options.get("rank")
    for item in anomaly_first([i for i in resolve(dump) if rank is None or rank_number(i.rank) in rank]):
        return item.step if os.path.isfile(os.path.join(item.path, ANOMALIES)) else None
    return None


def _pick(dump, golden, options):
    """The comparison (or None) and the target step/rank directory shown."""
    step, rank = options.get("step"), options.get("rank")
    if golden is not None:
        from msprobe.compare import comparisons

        for c in comparisons(dump, golden, **options):
            return c, c.target.directory, c.step, c.rank
        raise InputError("nothing to compare")
    for item in resolve(dump):
        if step is not None and item.step not in step:
            continue
        if rank is not None and rank_number(item.rank) not in rank:
            continue
        return None, item.path, item.step, item.rank
    raise InputError(f"{dump}: no step/rank directory matches --step/--rank")


def _other_differences(dump: str, golden: str, options: dict, shown: tuple) -> list:
    """The paired step/rank directories other than ``shown`` (``(step, rank)``) in which the two dumps
    differ, each as ``"step 3 rank0 (first difference: ENTRY)"`` (the label and entry first-diff
    names; ``--rank`` and the judging options of ``options`` apply, every step is compared)."""
    from msprobe.compare import first_divergence

    return [f"{f'step {f.step} ' if f.step is not None else ''}{f.rank} ({f.label()}: {f.entry})"
            for f in first_divergence(dump, golden, **options) if (f.step, f.rank) != shown]


def build_context(dump: str, golden: Optional[str] = None, **options) -> dict:
    """Everything the template shows, as plain data. Without ``step``, the step holding
    ``anomalies.json`` is shown when there is one (``"picked"`` then says so), else the first."""
    asked = options
    picked = _anomaly_step(dump, options)
    if picked is not None:
        options = {**options, "step": [picked]}
    comparison, directory, step, rank = _pick(dump, golden, options)
    side = comparison.target if comparison is not None else Side(directory)
    construct = load_construct(directory)
    stacks = load_stacks(directory)
    results = {}
    first_div = agreed = None
    if comparison is not None:
        for entry in comparison.entries():
            if entry.target is not None:
                results[entry.target] = entry
        differing = []
        first_div, one_sided = divergence.agreement_of(divergence.first_divergence(comparison, bitwise=differing))
        agreed = divergence.agreement(comparison.mode, bool(differing)) + (f"; {one_sided}" if one_sided else "")
    nan = divergence.nan_producers(directory, step, rank, side)
    ids = {name: f"e{i}" for i, name in enumerate(side.names)}
    nodes = {}
    for i, name in enumerate(side.names):
        entry = results.get(name)
        judged = {j.target.key: j for j in entry.records if j.target is not None} if entry else {}
        records = []
        for rec in side.records(i):
            j = judged.get(rec.key)
            records.append({
                "key": rec.key, "dtype": rec.dtype or "", "shape": list(rec.shape) if rec.is_tensor else "",
                "stats": [_fmt(v) for v in rec.stats] if rec.is_tensor else [_fmt(rec.value), "", "", ""],
                "golden": [_fmt(v) for v in j.golden.stats] if j is not None and j.golden is not None else None,
                "result": j.result if j is not None else "", "message": "; ".join(j.messages) if j else "",
                "bad": not all(v is None or math.isfinite(v) for v in rec.stats)})
        frames = stacks.get(naming.forward_of(name) or name, [])
        outs = [r for r in records if not r["key"].startswith(("input", "kwargs", "parameters"))]
        nodes[name] = {"id": ids[name], "name": name, "records": records, "children": [],
                       "brief": (outs or records or [None])[0],
                       "result": entry.result if entry else "", "verdict": entry.verdict if entry else "",
                       "match": entry.match if entry else "", "golden": entry.golden if entry else None,
                       "gain": _gain_text(entry.gain) if entry and entry.gain is not None else "",
                       "stack": frame_lines(frames), "source": source_line(frames),
                       "nonfinite": any(r["bad"] for r in records)}
    if first_div is not None and first_div.entry in nodes:
        # the entry named where the runs part is badged so, not with its gain verdict (a difference
        # traced to where it starts, or one whose inputs already differ, can be "carried" there)
        nodes[first_div.entry]["named"] = first_div.label()
    roots = []
    for name in side.names:
        # a parameter-gradient entry sits under the Cell call it belongs to
        parent, seen = (divergence.shown_cell_path(name, construct) or [None])[-1], {name}
        while parent is not None and parent not in nodes and parent not in seen:  # an undumped Cell
            seen.add(parent)
            parent = construct.get(parent)
        if parent is None or parent in seen:
            roots.append(nodes[name])
        else:
            nodes[parent]["children"].append(nodes[name])
    golden_only = []
    if comparison is not None:
        golden_only = [comparison.golden.names[g] for t, g, how in comparison.pairs if t is None]
    counts = {}
    for entry in results.values():
        counts[entry.verdict] = counts.get(entry.verdict, 0) + 1

    def finding(f):
        if f is None:
            return None
        return {"id": ids.get(f.entry), "entry": f.entry, "kind": f.kind, "label": f.label(),
                "direction": f.direction,
                "note": f.note, "reason": f.reason(),
                "cell_path": f.cell_path, "source": source_line(f.target_stack)}

    shown = (step, rank)
    differing = _other_differences(dump, golden, asked, shown) if golden is not None and asked.get("step") is None else []
    others = sorted({(item.step, item.rank) for item in resolve(dump)} - {shown},
                    key=lambda sr: (sr[0] is None, sr[0] or 0, sr[1]))
    return {"dump": os.path.abspath(dump), "golden": os.path.abspath(golden) if golden else None,
            "directory": directory, "step": step, "rank": rank, "header": side.header,
            "picked": picked is not None,
            "unpaired": unpaired_steps(dump, golden, options.get("step")) if golden else None,
            "others": [f"step {s} {r}" if s is not None else r for s, r in others],
            "differing": differing,
            "mode": comparison.mode if comparison is not None else None, "roots": roots,
            "entries": len(side.names), "counts": counts, "golden_only": golden_only,
            "divergence": finding(first_div), "nan": finding(nan), "agreement": agreed,
            "partial_note": comparison.partial_note if comparison is not None else None}


def write_report(dump: str, output: str, golden: Optional[str] = None, **options) -> str:
    """Render the report of ``dump`` (compared with ``golden`` when given) into ``output``; returns
    its absolute path. Options: ``mode``, ``step``, ``rank``, ``mapping``, ``thresholds`` as for
    :func:`msprobe.compare.comparisons`.

    Raises:
        InputError, ValueError: as :func:`msprobe.compare.comparisons`.
    """
    env = jinja2.Environment(loader=jinja2.PackageLoader("msprobe.compare", "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True)
    html = env.get_template("report.html.j2").render(**build_context(dump, golden, **options))
    out = os.path.abspath(output)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(html)
    return out
