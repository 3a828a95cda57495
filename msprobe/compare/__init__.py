"""Comparing two dumps: rows per record, the first difference, the first NaN/Inf producer.

    from msprobe.compare import compare, first_divergence, nan_producer
    rows = compare("./dump_fp16", "./dump_fp32")             # list of dicts, reference column names
    found = first_divergence("./dump_fp16", "./dump_fp32")   # list of Finding, one per step/rank
    bad = nan_producer("./dump_fp16")                        # list of Finding, one per step/rank with a NaN

``target`` and ``golden`` may each be a ``dump.json``, a step/rank directory, a step directory or a
whole ``dump_path`` (see :mod:`msprobe.compare.inputs`).
"""
from __future__ import annotations

import datetime
import logging
import os
from typing import List, NamedTuple, Optional, Sequence, Union

from msprobe.compare.divergence import DivergenceFinder, Finding, agreement, agreement_of, level_note, nan_producers
from msprobe.compare.divergence import first_divergence as _first_divergence
from msprobe.compare.engine import StepComparison, columns, entry_values, levels_compared_in_part
from msprobe.compare.inputs import InputError, find_unpaired, pair, rank_number, resolve
from msprobe.compare.judge import MODES
from msprobe.compare.matching import load_mapping
from msprobe.compare.output import ResultWriter, json_safe, result_name, write_summary
from msprobe.compare.thresholds import Thresholds
from msprobe.dump import iter_bodies, load_stacks

logger = logging.getLogger("msprobe")

__all__ = ["Agreement", "compare", "first_divergence", "level_notes", "nan_producer", "compare_to_files",
           "comparisons", "Finding", "InputError", "Thresholds", "StepComparison", "MODES"]


def comparisons(target: str, golden: str, *, mode: Optional[str] = None,
                step: Optional[Sequence[int]] = None, rank: Optional[Sequence[int]] = None,
                mapping: Union[None, str, dict] = None,
                thresholds: Union[None, str, dict, Thresholds] = None, ignore: Sequence[str] = ()):
    """Yield one :class:`StepComparison` per paired step/rank (streamed: one pair in memory at a time).

    Args:
        mode: ``statistics``, ``tensor``, ``md5`` or None (chosen from the dumps).
        step, rank: only these step / rank numbers. mapping: a name-map file or dict
            (:func:`msprobe.compare.matching.load_mapping`). thresholds: file, dict or
            :class:`Thresholds` overriding ``thresholds.yaml``. ignore: patterns of record names
            left out of the comparison (:class:`StepComparison`); each pattern that matches no record
            of any pair compared is named in a WARNING (logger ``msprobe``) once the iteration ends.

    Raises:
        InputError: inputs that are not dumps or cannot be paired. ValueError: bad mode, mapping or
        thresholds.
    """
    names = mapping if isinstance(mapping, dict) else load_mapping(mapping)
    limits = thresholds if isinstance(thresholds, Thresholds) else Thresholds(thresholds)
    unused, compared = list(ignore), 0
    try:
        for p in pair(target, golden, step, rank):
            c = StepComparison(p.target, p.golden, mode, names, limits, p.step, p.label, tuple(ignore))
            unused, compared = [u for u in unused if u in c.unused_ignore], compared + 1
            yield c
    finally:  # also when the caller stops early (a report reads the first pair only)
        for pattern in unused if compared else ():
            logger.warning("ignore pattern %r matches no record of the %s compared (record names are "
                           "{entry}.{key}, e.g. 'Functional.relu.0.forward.output.0'): it leaves "
                           "nothing out", pattern,
                           "step/rank pair" if compared == 1 else f"{compared} step/rank pairs")


def compare(target: str, golden: str, **options) -> List[dict]:
    """All rows of all paired step/rank directories (keys: :func:`msprobe.compare.engine.columns`
    plus ``Step`` and ``Rank``). Options as for :func:`comparisons`."""
    rows = []
    for c in comparisons(target, golden, **options):
        for row in c.rows():
            row.update(Step=c.step, Rank=c.rank)
            rows.append(row)
    return rows


class Agreement(NamedTuple):
    """A compared step/rank in which no entry differs: ``text`` as :func:`msprobe.compare.divergence.agreement`
    says it; ``note``: :attr:`StepComparison.partial_note` (None: both sides hold the whole step)."""
    step: Optional[int]
    rank: str
    text: str
    note: Optional[str]
    #: entries or records on one side only by the nature of the dumps' modes (GRAPH_MODE against
    #: PyNative), not compared: :func:`msprobe.compare.divergence.one_sided_note`, or None
    one_sided: Optional[str] = None


def first_divergence(target: str, golden: str, exact: bool = False, bitwise: Optional[list] = None,
                     agreed: Optional[list] = None, **options) -> List[Finding]:
    """Per paired step/rank, the first difference (:mod:`msprobe.compare.divergence`); pairs that
    agree are left out, so ``[]`` means the runs agree. ``bitwise``: a list that receives the
    :class:`StepComparison` of each pair that agrees within tolerance but differs bitwise
    (``exact=False`` only). ``agreed``: a list that receives an :class:`Agreement` for each pair
    that agrees. Options as for :func:`comparisons`."""
    found = []
    for c in comparisons(target, golden, **options):
        differing = []
        f, one_sided = agreement_of(_first_divergence(c, exact, differing))
        if f is not None:
            found.append(f)
        elif agreed is not None:
            agreed.append(Agreement(c.step, c.rank, agreement(c.mode, bool(differing)), c.partial_note,
                                    one_sided))
        if bitwise is not None:
            bitwise.extend(differing)
    return found


def level_notes(target: str, golden: str, step: Optional[Sequence[int]] = None,
                rank: Optional[Sequence[int]] = None) -> List[str]:
    """The distinct notes of the paired step/rank directories whose dumps are compared in part (a
    ``mix`` dump against an ``L0``/``L1`` one: :func:`msprobe.compare.divergence.level_note`);
    reads each side's header only. Raises InputError as :func:`comparisons` does."""
    notes = []
    for p in pair(target, golden, step, rank):
        headers = [next(iter(iter_bodies(d)))[1] for d in (p.target, p.golden)]
        note = level_note(*headers) if levels_compared_in_part(*headers) else None
        if note is not None and note not in notes:
            notes.append(note)
    return notes


def nan_producer(dump: str, step: Optional[Sequence[int]] = None,
                 rank: Optional[Sequence[int]] = None, run: str = "target") -> List[Finding]:
    """Per step/rank of one dump (all ranks), the first NaN/Inf producer, by step then rank;
    ``run`` (``"target"`` or ``"golden"``): which run of a comparison the dump is, the side the
    findings' statistics and stack are filled on (:func:`~msprobe.compare.divergence.nan_producers`)."""
    out = []
    for item in resolve(dump):
        if step is not None and item.step not in step:
            continue
        if rank is not None and rank_number(item.rank) not in rank:
            continue
        f = nan_producers(item.path, item.step, item.rank, run=run)
        if f is not None:
            out.append(f)
    return out


def _reserve_stamp(out_dir: str) -> str:
    """The timestamp (``%Y%m%d%H%M%S``) of this compare's files, unique in ``out_dir``: its
    ``compare_summary_{stamp}.json`` is created empty here, atomically (``O_EXCL``), so a second compare
    into the same directory within the same second takes ``{stamp}_1`` (then ``_2``, ...) and neither
    overwrites the other's files. Raises ``OSError`` when ``out_dir`` cannot be written."""
    base = datetime.datetime.now().strftime("%Y%m%d%H%M%S")
    for n in range(10000):
        stamp = base if n == 0 else f"{base}_{n}"
        try:
            os.close(os.open(os.path.join(out_dir, f"compare_summary_{stamp}.json"),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return stamp
        except FileExistsError:
            continue
    raise FileExistsError(f"{out_dir}: 10000 compare summaries of {base} exist already")


def compare_to_files(target: str, golden: str, out_dir: str, *, xlsx: bool = False,
                     stack: bool = False, **options) -> dict:
    """Write ``compare_result_{rank}_{timestamp}.csv`` (``.xlsx`` with ``xlsx``; the name in full as
    :func:`msprobe.compare.output.result_name` gives it) per paired step/rank and
    ``compare_summary_{timestamp}.json`` into ``out_dir``; returns the summary.
    ``stack`` adds the target's stack per row (``NPU_Stack_Info``). The summary's ``unpaired_steps``
    lists the steps present in one input only, which are not compared: ``{"target_only": [3],
    "golden_only": []}`` (:meth:`msprobe.compare.inputs.UnpairedSteps.to_dict`; empty lists when
    every step is on both sides)."""
    os.makedirs(out_dir, exist_ok=True)
    stamp = _reserve_stamp(out_dir)
    pairs = pair(target, golden, options.get("step"), options.get("rank"))
    several = len({p.step for p in pairs}) > 1
    bases = {(p.step, p.label): os.path.join(out_dir, result_name(p.rank, stamp, p.step if several else None,
                                                                  p.tree))
             for p in pairs}
    summary = {"target": os.path.abspath(target), "golden": os.path.abspath(golden),
               "unpaired_steps": find_unpaired(target, golden, options.get("step")).to_dict(), "results": []}
    for c in comparisons(target, golden, **options):
        writer = ResultWriter(bases[c.step, c.rank], columns(c.mode, stack), xlsx)
        matches, verdicts = {}, {}
        # first-diff's rule, in this pass
        finder = DivergenceFinder.of(c)
        stacks = load_stacks(c.target.directory) if stack else None
        try:
            for entry in c.entries():
                matches[entry.match] = matches.get(entry.match, 0) + 1
                verdicts[entry.verdict] = verdicts.get(entry.verdict, 0) + 1
                finder.add(entry)
                writer.write(entry_values(entry, c.mode, stacks))
        finally:
            writer.close()
        found, one_sided = agreement_of(finder.result(c))
        summary["results"].append({
            "agreement": agreement(c.mode, finder.differs_bitwise()) if found is None else None,
            "one_sided": one_sided,
            "step": c.step, "rank": c.rank, "mode": c.mode, "target_dir": c.target.directory,
            "golden_dir": c.golden.directory, "csv": writer.csv_path, "xlsx": writer.xlsx_path,
            "records": writer.counts, "entries_by_match": matches, "entries_by_gain_verdict": verdicts,
            "first_difference": None if found is None else {
                "entry": found.entry, "label": found.label(), "kind": found.kind, "direction": found.direction,
                "parameters_differ": found.differing_parameters() if found.kind == "input" else [],
                "exceeds_at": found.exceeds_at, "dtypes": found.dtypes, "reason": found.reason()}})
    summary_path = os.path.join(out_dir, f"compare_summary_{stamp}.json")
    write_summary(summary_path, json_safe(summary))
    summary["summary"] = summary_path
    return summary
