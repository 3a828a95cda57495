"""Comparing one pair of step/rank directories entry by entry, and the output columns.

Column names follow the reference compare tool (``NPU`` = target, ``Bench`` = golden); this tool adds
``Match`` (how the two entries were paired, see :mod:`msprobe.compare.matching`), ``Error Gain`` and
``Gain Verdict`` (see ``thresholds.yaml``: ``grows``, the error grows in this entry by more than
``entry.gain`` times what its inputs carry; ``carried``, its inputs already carried the error). This
verdict is per entry: where the runs part is the entry ``first-diff`` names
(:mod:`msprobe.compare.divergence`). Inputs are the tensor inputs (positional, keyword, parameters);
a scalar or string argument that differs is part of what the call computes, so a call whose
tensor inputs agree and whose ``approximate="tanh"`` became ``"none"`` is ``grows``.
"""
from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from msprobe.compare import judge as J
from msprobe.compare.batch import judge_many
from msprobe.compare.matching import UNMATCHED, match
from msprobe.compare.partial import overlap
from msprobe.compare.records import Side, load_sides
from msprobe.compare.thresholds import Group, Thresholds
from msprobe.dump import load_construct
from msprobe.format import naming
from msprobe.format.naming import upstream_names

HEAD = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape"]
STAT_SIDES = ["NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean",
              "Bench l2norm"]
MODE_COLUMNS = {
    J.STATISTICS: ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr",
                   "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr"],
    J.TENSOR: ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
               "Five Thousandths Err Ratio"],
    J.MD5: ["NPU MD5", "BENCH MD5"],
}
TAIL = ["Result", "Err_message", "Match", "Error Gain", "Gain Verdict"]
STACK = "NPU_Stack_Info"
#: :attr:`EntryResult.verdict` (``Gain Verdict``) of an entry whose outputs fail: the error grows in it
#: by more than ``entry.gain`` (or a scalar/string argument differs), or it is carried in by its inputs
GROWS, CARRIED = "grows", "carried"
_CHUNK = 2048   # entry pairs judged together


def columns(mode: str, stack: bool = False) -> List[str]:
    """The CSV columns of ``mode`` (``statistics``, ``tensor``, ``md5``)."""
    sides = [] if mode == J.MD5 else STAT_SIDES
    return HEAD + MODE_COLUMNS[mode] + sides + TAIL + ([STACK] if stack else [])


@dataclass
class EntryResult:
    """One paired (or unmatched) entry with its judged records."""

    target: Optional[str]
    golden: Optional[str]
    match: str
    records: List[J.Judged]
    #: largest output error / largest input error; ``inf`` when an output fails and the inputs carry
    #: no error (the difference starts here); ``None`` when the outputs carry no error, or when they
    #: pass and the inputs carry none (``Error Gain`` is then ``N/A``)
    gain: Optional[float]
    result: str                   # pass, warning, error, unmatched: worst record
    verdict: str                  # pass, grows, carried, unmatched (the Gain Verdict column)
    inputs_agree: bool = True     # every tensor input passes (backward: and its forward's inputs)
    inputs_exact: bool = True     # every input record is bitwise equal (likewise)
    #: the inputs pass only at their own, looser precision: judged with the tolerance of the failing
    #: outputs' dtype (a Float16 -> Float32 cast), an input would not pass; or, when the two runs
    #: differ in precision (:attr:`StepComparison.lower_precision`), the inputs differ by at most that
    #: lower precision's tolerance (Float32 Parameters updated from Float16 gradients) and the entry
    #: does not amplify it (not ``grows``)
    precision_limited: bool = False
    #: when the two runs differ in precision (:attr:`StepComparison.lower_precision`): ``(target dtype,
    #: golden dtype)`` of a tensor input whose two sides' dtypes differ (its own inputs first, then
    #: those of :func:`upstream_names`, then its outputs), or ``None``
    dtypes: Optional[Tuple[str, str]] = None

    def side(self, flow: str) -> List[J.Judged]:
        return [r for r in self.records if r.flow == flow]

    @property
    def name(self) -> str:
        return self.target or self.golden


class InputState(NamedTuple):
    """What an entry's tensor inputs carry into the entries they also feed (:func:`upstream_names`)."""

    error: float                   #: largest :func:`carried_error` (with the nested Parameters' errors)
    agree: bool                    #: every one passes
    exact: bool                    #: every one is bitwise equal
    dtypes: Optional[Tuple[str, str]]  #: :attr:`EntryResult.dtypes` of them
    within_precision: bool         #: every one differs by at most the runs' lower precision's tolerance


def levels_compared_in_part(target_header: dict, golden_header: dict) -> bool:
    """Whether one dump is ``mix`` and the other ``L0`` or ``L1``: then what the lower level records
    (Cells at L0, APIs at L1) is compared, and the entries only ``mix`` records are left out of the
    first difference (:meth:`StepComparison.recorded_at_one_level_only`). L0 against L1 have no
    entry kind in common and are not compared in part."""
    levels = {target_header.get("level"), golden_header.get("level")}
    return levels in ({"mix", "L0"}, {"mix", "L1"})


def detect_mode(target: Side, golden: Side) -> str:
    """``tensor`` when both dumps are task tensor with tensor files, else ``md5`` when both carry
    CRC-32 values, else ``statistics``."""
    tasks = (target.header.get("task"), golden.header.get("task"))
    if tasks == ("tensor", "tensor") and target.has_tensor_files() and golden.has_tensor_files():
        return J.TENSOR
    if target.has_md5() and golden.has_md5():
        return J.MD5
    return J.STATISTICS


class StepComparison:
    """The comparison of one target and one golden step/rank directory.

    Args:
        target_dir, golden_dir: step/rank directories. mode: ``statistics``, ``tensor``, ``md5`` or
            None (:func:`detect_mode`). mapping: target name -> golden name (see
            :func:`msprobe.compare.matching.load_mapping`). thresholds: :class:`Thresholds`.
        ignore: shell-style patterns (``fnmatch``) of record names ``{entry}.{key}``, e.g.
            ``"Primitive.*.BatchNorm.*.output.[12]"``: records they match are left out on both sides
            (no row, no verdict). ``unused_ignore``: those of them that match no record of either
            side.

    Raises:
        ValueError: unknown mode, or ``tensor``/``md5`` asked for dumps without tensors/CRCs.
        FileNotFoundError, msprobe.dump.DumpFormatError: from the reader.
    """

    def __init__(self, target_dir: str, golden_dir: str, mode: Optional[str] = None,
                 mapping: Optional[Dict[str, str]] = None, thresholds: Optional[Thresholds] = None,
                 step: Optional[int] = None, rank: str = "", ignore: Sequence[str] = ()):
        self.step, self.rank = step, rank
        self._ignored = re.compile("|".join(fnmatch.translate(p) for p in ignore)).match if ignore else None
        self.target, self.golden = load_sides(target_dir, golden_dir)
        self.unused_ignore = self._unused(tuple(ignore))
        self.thresholds = thresholds or Thresholds()
        self.mode = mode or detect_mode(self.target, self.golden)
        if self.mode not in J.MODES:
            raise ValueError(f"mode {self.mode!r}: valid modes are {', '.join(J.MODES)}")
        if self.mode == J.MD5 and not (self.target.has_md5() and self.golden.has_md5()):
            raise ValueError("md5 mode needs both dumps written with summary_mode \"md5\"")
        if self.mode == J.TENSOR and not (self.target.has_tensor_files() and self.golden.has_tensor_files()):
            raise ValueError("tensor mode needs both dumps written with task \"tensor\"")
        #: a note when one side holds only part of its step (:func:`msprobe.compare.partial.overlap`):
        #: the pairs then start where it begins
        self.pairs, self.partial_note = overlap(self.target, self.golden,
                                                match(self.target, self.golden, mapping), step)
        self._construct = None
        #: the thresholds group of the less precise of the float dtypes that only one of the two dumps
        #: holds (a Float16 run against a Float32 one: ``float16``), or None: the runs do not differ in
        #: precision. Differences within its tolerance are the precision's (:class:`EntryResult`).
        self.lower_precision = self.thresholds.lower_of(self.target.dtypes() ^ self.golden.dtypes())
        #: one dump ran in GRAPH_MODE and the other under PyNative (``dump.json``'s ``mode``): they
        #: capture differently, so what one side holds alone is listed, not compared
        self.modes_differ = self.target.header.get("mode") != self.golden.header.get("mode")

    @property
    def construct(self) -> dict:
        """The target's ``construct.json``: entry name -> enclosing Cell entry or None ({} when absent)."""
        if self._construct is None:
            self._construct = load_construct(self.target.directory)
        return self._construct

    def captured_differently(self, entry: EntryResult) -> bool:
        """Whether ``entry``'s entries and records present on one side only are there because the dumps
        capture differently (:attr:`modes_differ`): listed, never named as a difference."""
        return self.modes_differ

    def recorded_at_one_level_only(self, entry: EntryResult) -> bool:
        """Whether ``entry`` is present on one side only because the other dump's level does not
        record its kind: a Cell entry against an L1 dump, an API entry against an L0 dump, when
        the other dump is ``mix`` (:func:`levels_compared_in_part`)."""
        if entry.match != "unmatched" or not levels_compared_in_part(self.target.header, self.golden.header):
            return False
        other = (self.golden if entry.target is not None else self.target).header["level"]
        return other != "mix" and (other == "L0") != entry.name.startswith("Cell.")

    def entries(self) -> Iterator[EntryResult]:
        """Every entry pair in target execution order (tensor files loaded one pair at a time).

        A backward entry's outputs (input gradients) depend on its forward call's inputs too, and a
        Cell's parameter gradients on the Cell's forward inputs and backward inputs, so those count
        as its inputs for the error gain and the verdict (see :func:`upstream_names`). The Parameters
        of the Cells inside a Cell count as inputs of that Cell for its error gain (see
        :meth:`nested_parameter_errors`)."""
        inputs, nested = {}, self.nested_parameter_errors()
        for start in range(0, len(self.pairs), _CHUNK):
            chunk = self.pairs[start:start + _CHUNK]
            for (ti, gi, how), judged in zip(chunk, self._judge_chunk(chunk)):
                entry = self._entry(ti, gi, how, judged, inputs, nested)
                if entry.target is not None:
                    own = [r for r in entry.records if r.flow == "in" and r.is_tensor]
                    carried = max((carried_error(r, self.thresholds) for r in own), default=0.0)
                    agree, lower = all(r.result == J.PASS for r in own), self.lower_precision
                    inputs[entry.target] = InputState(max(carried, nested.get(entry.target, 0.0)), agree,
                                                      all(r.exact for r in own),
                                                      None if lower is None else dtype_pair(own),
                                                      agree if lower is None else _within(own, lower))
                yield entry

    def nested_parameter_errors(self) -> Dict[str, float]:
        """Target Cell entry -> the largest error (:func:`carried_error`) of the Parameters
        (``parameters.*`` records, L0/mix) of the Cells nested inside it (``construct.json``), for
        the Cells where one differs. Those Parameters are inputs of the outer Cell's computation: a
        Cell without Parameters of its own whose inputs agree, after an update that changed the
        Parameters inside it, does not make its output difference from nothing (infinite gain).
        Reads only the paired Cell entries that have an enclosing Cell; {} without ``construct.json``."""
        construct, out = self.construct, {}
        for ti, gi, _ in self.pairs if construct else ():
            name = self.target.names[ti] if ti is not None else None
            if (gi is None or name is None or not name.startswith("Cell.") or construct.get(name) is None
                    or naming.direction_of(name) != "forward"):
                continue
            err = self._parameter_error(ti, gi)
            parent, seen = construct.get(name), set()
            while err > 0.0 and parent is not None and parent not in seen:
                seen.add(parent)
                out[parent] = max(out.get(parent, 0.0), err)
                parent = construct.get(parent)
        return out

    def _parameter_error(self, ti: int, gi: int) -> float:
        """The largest :func:`carried_error` of the ``parameters.*`` tensor records of a pair (0.0: none
        differs); records the ``ignore`` patterns match are left out."""
        t_params = [r for r in self.target.records(ti) if r.key.startswith("parameters.") and r.is_tensor]
        if not t_params:
            return 0.0
        g_by_key = {r.key: r for r in self.golden.records(gi)}
        skip = self._skipped(ti, t_params, gi, list(g_by_key.values())) if self._ignored is not None else ()
        errors = [carried_error(J.judge(r, g_by_key[r.key], self.mode, self.thresholds, self.target.directory,
                                        self.golden.directory), self.thresholds)
                  for r in t_params if r.key in g_by_key and r.key not in skip]
        return max(errors, default=0.0)

    def _judge_chunk(self, chunk) -> list:
        """The judged records of each pair of ``chunk``; statistics of equal-shape tensor pairs are
        judged together (:mod:`msprobe.compare.batch`)."""
        lists, vector = [], []
        for ti, gi, how in chunk:
            t_recs = self.target.records(ti) if ti is not None else []
            g_recs = self.golden.records(gi) if gi is not None else []
            t0 = self.target.record_start(ti) if ti is not None else 0
            g0 = self.golden.record_start(gi) if gi is not None else 0
            g_pos = {r.key: k for k, r in enumerate(g_recs)}
            skip = self._skipped(ti, t_recs, gi, g_recs) if self._ignored is not None else ()
            judged = []
            for k, rec in enumerate(t_recs):
                gk = g_pos.pop(rec.key, None)
                if rec.key in skip:
                    continue
                other = g_recs[gk] if gk is not None else None
                if (self.mode == J.STATISTICS and other is not None and rec.is_tensor
                        and other.is_tensor and rec.shape == other.shape):
                    judged.append(None)
                    vector.append((rec, other, t0 + k, g0 + gk, judged, len(judged) - 1))
                else:
                    judged.append(J.judge(rec, other, self.mode, self.thresholds,
                                          self.target.directory, self.golden.directory))
            for gk in g_pos.values():
                if g_recs[gk].key in skip:
                    continue
                judged.append(J.judge(None, g_recs[gk], self.mode, self.thresholds))
            lists.append(judged)
        done = judge_many([v[:4] for v in vector], self.target, self.golden, self.thresholds)
        for (_, _, _, _, judged, slot), result in zip(vector, done):
            judged[slot] = result
        return lists

    def _unused(self, patterns: tuple) -> tuple:
        """The ``ignore`` patterns that match no record name of either side."""
        left = {p: re.compile(fnmatch.translate(p)).match for p in patterns}
        for side in (self.target, self.golden):
            for name in side.record_names() if left else ():
                if self._ignored(name):
                    for p in [p for p, matches in left.items() if matches(name)]:
                        del left[p]
                    if not left:
                        break
        return tuple(p for p in patterns if p in left)

    def _skipped(self, ti, t_recs, gi, g_recs) -> set:
        """Keys of the records of a pair the ``ignore`` patterns match (by either side's entry name)."""
        skip = set()
        for side, index, records in ((self.target, ti, t_recs), (self.golden, gi, g_recs)):
            if index is not None:
                name = side.names[index]
                skip.update(r.key for r in records if self._ignored(f"{name}.{r.key}"))
        return skip

    def entry(self, ti: Optional[int], gi: Optional[int], how: str) -> EntryResult:
        """One pair judged on its own (its backward/forward context is not taken into account)."""
        (judged,) = self._judge_chunk([(ti, gi, how)])
        return self._entry(ti, gi, how, judged, {}, {})

    def _entry(self, ti, gi, how, judged, inputs, nested) -> EntryResult:
        t_name = self.target.names[ti] if ti is not None else None
        known = [inputs.get(n) for n in upstream_names(t_name)] if t_name else []
        known = [k for k in known if k is not None]
        upstream = InputState(max(k.error for k in known), all(k.agree for k in known),
                              all(k.exact for k in known), next((k.dtypes for k in known if k.dtypes), None),
                              all(k.within_precision for k in known)) if known else None
        return _entry_result(t_name, self.golden.names[gi] if gi is not None else None, how, judged,
                             self.thresholds, upstream, nested.get(t_name, 0.0), self.lower_precision,
                             self.modes_differ)

    def rows(self, stack: Optional[dict] = None) -> Iterator[dict]:
        """One dict per record pair, keyed by :func:`columns` (``None`` for a value not available);
        ``stack``: target entry name -> frames, for the ``NPU_Stack_Info`` column."""
        for entry in self.entries():
            yield from entry_rows(entry, self.mode, stack)


def carried_error(judged: J.Judged, thresholds: Thresholds) -> float:
    """The error an input record carries into its entry, for the error gain: its :attr:`Judged.error`,
    at least the ``rounding`` of the less precise dtype when the two sides' dtypes differ (a Float16
    tensor against a Float32 one differs per element by up to Float16 rounding, which its statistics
    can hide; see ``thresholds.yaml``)."""
    t, g = judged.target, judged.golden
    if t is None or g is None or t.dtype == g.dtype:
        return judged.error
    return max(judged.error, thresholds.group(t.dtype, g.dtype).rounding)


def _entry_result(t_name, g_name, how, judged, thresholds, upstream: Optional[InputState] = None,
                  nested=0.0, lower: Optional[Group] = None, paired_only: bool = False) -> EntryResult:
    """``upstream``: the :class:`InputState` of the inputs of :func:`upstream_names`; ``nested``: the
    largest error of the Parameters of the Cells inside this Cell, an input error for the gain only
    (whether the inputs agree is judged on the entry's own records); ``lower``: the thresholds group
    of the lower precision the two runs differ in (:attr:`StepComparison.lower_precision`), or None;
    ``paired_only``: records without a counterpart take no part in the verdict (the dumps capture
    differently, :attr:`StepComparison.modes_differ`)."""
    if how != UNMATCHED and (lower is not None or (t_name is not None and naming.is_param_grad(t_name))):
        J.judge_near_zero(judged, lower, thresholds)
    result = J.worst(r.result for r in judged) if judged else (J.UNMATCHED if how == UNMATCHED
                                                                else J.PASS)
    if how == UNMATCHED:
        return EntryResult(t_name, g_name, how, judged, None, J.UNMATCHED, J.UNMATCHED)
    # with paired_only, records of both sides only (e.g. a backward output GRAPH_MODE does not record);
    # tensor inputs only: a different scalar or string argument is part of what the call does
    paired = [r for r in judged if r.target is not None and r.golden is not None] if paired_only else judged
    ins = [r for r in paired if r.flow == "in" and r.is_tensor]
    outs = [r for r in paired if r.flow == "out"]
    in_errors = [carried_error(r, thresholds) for r in ins]
    in_err = max(in_errors, default=0.0)
    agree = all(r.result == J.PASS for r in ins)
    exact = all(r.exact for r in ins)
    # only two runs that differ in precision need them (the rest of the time: no cost per entry)
    dtypes = None if lower is None else dtype_pair(ins)
    within = agree if lower is None else _within(ins, lower)
    if upstream is not None:
        in_err, agree, exact = max(in_err, upstream.error), agree and upstream.agree, exact and upstream.exact
        dtypes, within = dtypes or upstream.dtypes, within and upstream.within_precision
    in_err = max(in_err, nested)
    out_err = max((r.error for r in outs), default=0.0)
    gain = None if out_err == 0 else (math.inf if in_err == 0 else out_err / in_err)
    limited = agree and _precision_limited(in_errors + ([upstream.error] if upstream else []), outs)
    # a changed scalar or string argument is what the call computes differently
    changed_args = agree and any(not r.exact for r in paired if r.flow == "in" and not r.is_tensor)
    if all(r.result == J.PASS for r in outs):
        verdict = J.PASS
    elif (gain is not None and gain > thresholds.gain) or changed_args:
        verdict = GROWS
    else:  # its inputs already differ (within tolerance or not) by nearly as much as its outputs
        verdict = CARRIED
    if lower is not None and within and verdict != GROWS and (verdict == CARRIED or not agree):
        # the runs differ in precision, its inputs differ by no more than the lower precision allows,
        # and it does not amplify that: a difference of precision
        limited = True
    if verdict == J.PASS and in_err == 0:  # an error within tolerance over none: no gain to show
        gain = None
    return EntryResult(t_name, g_name, how, judged, gain, result, verdict, agree, exact, limited,
                       None if lower is None else dtypes or dtype_pair(outs))


def _within(records: List[J.Judged], lower: Group) -> bool:
    """Whether every one of ``records`` passes, or differs by at most the ``warning`` threshold of
    ``lower`` (the lower precision the two runs differ in)."""
    return all(r.result == J.PASS or r.error <= lower.warning for r in records)


def dtype_pair(records: List[J.Judged]) -> Optional[Tuple[str, str]]:
    """``(target dtype, golden dtype)`` of the first of ``records`` whose two sides' dtypes differ."""
    for r in records:
        if r.target is not None and r.golden is not None and r.target.dtype != r.golden.dtype:
            return r.target.dtype, r.golden.dtype
    return None


def _precision_limited(in_errors: list, outs: list) -> bool:
    """Whether some input error (``in_errors``: of inputs that passed with the tolerance of their own
    dtype, including those counted through :func:`upstream_names`: the Float32 parameter gradients of
    a Float16 Cell depend on its Float16 inputs) exceeds the stricter tolerance of a failing output (an
    exact Float16 -> Float32 cast of a Float16 run compared with a Float32 run: the output carries the
    input's rounding, judged as Float32)."""
    strict = [r.tolerance for r in outs if r.result != J.PASS and r.tolerance is not None]
    if not strict:
        return False
    limit = min(strict)
    return any(err > limit for err in in_errors)


def _fmt_shape(rec) -> Optional[str]:
    return None if rec is None else str(list(rec.shape))


_NONE4 = (None, None, None, None)


def _row_name(entry: Optional[str], rec) -> Optional[str]:
    if rec is None:
        return None
    return naming.item_name(entry, rec.key) if rec.key else entry


def entry_values(entry: EntryResult, mode: str, stack: Optional[dict] = None) -> Iterator[list]:
    """The rows of one :class:`EntryResult` as lists in :func:`columns` order (``stack``: target
    entry name -> frames, for ``NPU_Stack_Info``)."""
    frames = None
    if stack is not None and entry.target is not None:
        frames = "\n".join(stack.get(entry.target, []))
    metric_cols = MODE_COLUMNS[mode]
    tail = (entry.match, entry.gain, entry.verdict)
    for j in entry.records:
        t, g = j.target, j.golden
        values = [_row_name(entry.target, t), _row_name(entry.golden, g),
                  t.dtype if t is not None else None, g.dtype if g is not None else None,
                  _fmt_shape(t), _fmt_shape(g)]
        if mode == J.MD5:
            values += (t.md5 if t is not None else None, g.md5 if g is not None else None)
        else:
            metrics = j.metrics
            values += [metrics.get(col) for col in metric_cols]
            values += t.stats if t is not None else _NONE4
            values += g.stats if g is not None else _NONE4
        values += (j.result, "; ".join(j.messages), *tail)
        if stack is not None:
            values.append(frames)
        yield values


def entry_rows(entry: EntryResult, mode: str, stack: Optional[dict] = None) -> Iterator[dict]:
    """The rows of one :class:`EntryResult` as dicts keyed by :func:`columns`."""
    cols = columns(mode, stack is not None)
    for values in entry_values(entry, mode, stack):
        yield dict(zip(cols, values))
