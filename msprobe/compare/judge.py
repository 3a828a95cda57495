"""Judging one pair of records: metrics, pass / warning / error, and the error used for the gain.

Every rule and default threshold is documented in ``thresholds.yaml``; this module applies them.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np

from msprobe.compare.records import STATS, Record, flow_of
from msprobe.compare.thresholds import Group, Thresholds

PASS, WARNING, ERROR, UNMATCHED = "pass", "warning", "error", "unmatched"
_RANK = {PASS: 0, WARNING: 1, ERROR: 2, UNMATCHED: 3}
STATISTICS, TENSOR, MD5 = "statistics", "tensor", "md5"
MODES = (STATISTICS, TENSOR, MD5)


def worst(results) -> str:
    """The most severe of some results (pass < warning < error < unmatched); pass when empty."""
    return max(results, key=_RANK.__getitem__, default=PASS)


class Judged:
    """The outcome for one record pair (either side may be None: unmatched).

    Attributes:
        target, golden: the two :class:`Record` (None: no counterpart). result: pass, warning,
        error or unmatched. error: the number the thresholds were applied to (inf: one-sided
        NaN/Inf). exact: bitwise equal (statistics and CRC, or the arrays). messages: why.
        metrics: the mode's columns. flow: ``in`` or ``out`` (see :attr:`Record.flow`).
        is_tensor: the record is a tensor. tolerance: the ``warning`` threshold of the dtype group
        the record was judged with (``None``: unmatched).
    """

    __slots__ = ("target", "golden", "result", "error", "exact", "messages", "metrics", "flow",
                 "is_tensor", "tolerance")

    def __init__(self, target: Optional[Record], golden: Optional[Record], result: str,
                 error: float = 0.0, exact: bool = False, messages: Optional[list] = None,
                 metrics: Optional[dict] = None, tolerance: Optional[float] = None):
        self.target, self.golden, self.result = target, golden, result
        self.error, self.exact, self.tolerance = error, exact, tolerance
        self.messages = [] if messages is None else messages
        self.metrics = {} if metrics is None else metrics
        rec = target if target is not None else golden
        self.flow = flow_of(rec.key) if rec is not None else "out"
        self.is_tensor = rec is not None and rec.is_tensor


def _rate(err: float, group: Group) -> str:
    if err > group.error:
        return ERROR
    if err > group.warning:
        return WARNING
    return PASS


def _same_non_finite(a: float, b: float) -> Optional[bool]:
    """None when both finite; True when both are the same NaN/Inf; False otherwise."""
    fa, fb = math.isfinite(a), math.isfinite(b)
    if fa and fb:
        return None
    if fa != fb:
        return False
    return (math.isnan(a) and math.isnan(b)) or a == b


def _both_nan(a, b) -> bool:
    """Two scalar arguments that are both NaN (the same value for a record, though ``nan != nan``)."""
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def _rel(diff: float, base: float) -> float:
    if diff == 0:
        return 0.0
    return abs(diff) / abs(base) if base else math.inf


def judge(t: Optional[Record], g: Optional[Record], mode: str, thresholds: Thresholds,
          t_dir: str = "", g_dir: str = "") -> Judged:
    """Judge one record pair in ``mode`` (``statistics``, ``tensor`` or ``md5``); ``t_dir`` and
    ``g_dir`` are the step/rank directories (tensor files are read from their ``dump_tensor_data``)."""
    if t is None or g is None:
        return Judged(t, g, UNMATCHED, math.inf, messages=["no counterpart on the other side"])
    group = thresholds.group(t.dtype, g.dtype)
    out = Judged(t, g, PASS, tolerance=group.warning)
    if t.dtype != g.dtype:
        out.messages.append(f"dtype differs ({t.dtype} vs {g.dtype}): judged as {group.name}")
    if t.is_tensor != g.is_tensor or (t.is_tensor and t.shape != g.shape
                                      and tuple(d for d in t.shape if d != 1)
                                      != tuple(d for d in g.shape if d != 1)):
        out.result, out.error = ERROR, math.inf
        out.messages.append(f"shape differs ({list(t.shape)} vs {list(g.shape)})")
        _stat_metrics(t, g, group, out)
        return out
    if not t.is_tensor:
        _stat_metrics(t, g, group, out)
        equal = (t.value == g.value or _both_nan(t.value, g.value)) and t.kind == g.kind
        out.exact = equal
        if not equal:
            out.result, out.error = ERROR, math.inf
            out.messages.append(f"value differs ({t.value!r} vs {g.value!r})")
        return out
    why = _stat_metrics(t, g, group, out)
    if mode == MD5:
        out.metrics = {}
        out.exact = t.md5 == g.md5
        out.error = 0.0 if out.exact else 1.0
        out.result = PASS if out.exact else ERROR
        if not out.exact:
            out.messages.append("CRC-32 differs")
        return out
    if mode == TENSOR:
        arrays = _load_pair(t, g, t_dir, g_dir, out)
        if arrays is not None:
            _tensor_metrics(*arrays, group, out)
            return out
        out.messages.append("judged on statistics")
    out.result = _stat_result(out, group, why)
    return out


def stat_scale(stat: str, golden: float, rms: float, group: Group) -> float:
    """What a statistic's difference is divided by to give its scaled error: the larger of the golden
    value's magnitude, the golden tensor's RMS (``rms``, for Max/Min/Mean only) and the group's
    ``atol``."""
    return max(abs(golden), group.atol) if stat == "Norm" else max(abs(golden), rms, group.atol)


def scale_text(stat: str, diff: float, golden: float, rms: float, group: Group) -> str:
    """Which statistic the largest scaled statistic error is of, and what its difference was divided by
    (the larger of its golden value's magnitude, the golden tensor's RMS for Max/Min/Mean, and the
    dtype group's ``atol``): ``"Min: |diff| 0.000833 / golden RMS 0.667"``. The relative-error columns
    divide by the golden value alone, so this says where a figure they do not show comes from.

    Args:
        stat (str): ``Max``, ``Min``, ``Mean`` or ``Norm``. diff (float): target minus golden.
        golden (float): the golden statistic. rms (float): golden Norm / sqrt(element count) (0.0
            when unknown). group (Group): the thresholds group the record is judged with.
    """
    scale = stat_scale(stat, golden, rms, group)
    if scale == abs(golden):
        over = f"|golden {stat}| {scale:.3g}"
    elif stat != "Norm" and scale == rms:
        over = f"golden RMS {scale:.3g}"
    else:
        over = f"{group.name} atol {scale:g}"
    return f"{stat}: |diff| {abs(diff):.3g} / {over}"


def scaled_error_message(error: float, result: str, group: Group, why: Optional[str]) -> str:
    """``largest scaled statistic error E (WHY) > GROUP RESULT threshold T`` for a record that does not
    pass (``why``: :func:`scale_text` of the statistic it is of; None for a one-sided NaN/Inf, which
    its own message explains)."""
    limit = group.error if result == ERROR else group.warning
    return (f"largest scaled statistic error {error:.3g}{f' ({why})' if why else ''} > {group.name} "
            f"{result} threshold {limit:g}")


def _stat_metrics(t: Record, g: Record, group: Group, out: Judged) -> Optional[str]:
    """Differences and relative errors of the four statistics; sets ``out.error`` (scaled) and
    ``out.exact``; one-sided NaN/Inf is recorded as an error message. Returns :func:`scale_text` of
    the statistic the (finite) error is of, or None."""
    diffs, rels, scaled = [], [], []
    largest, why = -1.0, None
    numel = math.prod(g.shape) if g.shape else 1
    g_norm = g.stats[3]
    rms = abs(g_norm) / math.sqrt(numel) if g_norm is not None and numel and math.isfinite(g_norm) else 0.0
    one_sided = []
    for k, name in enumerate(STATS):
        a, b = t.stats[k], g.stats[k]
        if a is None or b is None:
            diffs.append(None)
            rels.append(None)
            continue
        same = _same_non_finite(a, b)
        if same is not None:
            diffs.append(0.0 if same else a - b)
            rels.append(0.0 if same else math.inf)
            if not same:
                one_sided.append(f"{name} {a} vs {b}")
                scaled.append(math.inf)
            continue
        diff = a - b
        diffs.append(diff)
        rels.append(_rel(diff, b))
        scaled.append(abs(diff) / stat_scale(name, b, rms, group))
        if scaled[-1] > largest:
            largest, why = scaled[-1], (name, diff, b)
    out.metrics.update({"Max diff": diffs[0], "Min diff": diffs[1], "Mean diff": diffs[2],
                        "L2norm diff": diffs[3], "MaxRelativeErr": rels[0], "MinRelativeErr": rels[1],
                        "MeanRelativeErr": rels[2], "NormRelativeErr": rels[3]})
    out.error = max(scaled, default=0.0)
    out.exact = all(d in (0.0, None) for d in diffs) and t.md5 == g.md5
    if one_sided:
        out.messages.append("NaN/Inf on one side only: " + ", ".join(one_sided))
    if any(v is not None and not math.isfinite(v) for v in t.stats) and not one_sided:
        out.messages.append("NaN/Inf on both sides")
    return None if why is None or one_sided else scale_text(*why, rms, group)


def _stat_result(out: Judged, group: Group, why: Optional[str]) -> str:
    result = _rate(out.error, group)
    if result != PASS:
        out.messages.append(scaled_error_message(out.error, result, group, why))
    return result


def _load_pair(t: Record, g: Record, t_dir: str, g_dir: str, out: Judged):
    from msprobe.dump import load_npy

    if not t.data_name or not g.data_name:
        out.messages.append("no tensor file (data_name) on " + ("both sides" if not t.data_name
                            and not g.data_name else "one side"))
        return None
    paths = (os.path.join(t_dir, "dump_tensor_data", t.data_name),
             os.path.join(g_dir, "dump_tensor_data", g.data_name))
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        out.messages.append(f"tensor file missing: {missing[0]}")
        return None
    a, b = (np.asarray(load_npy(p)) for p in paths)
    if a.dtype.kind == "c" or b.dtype.kind == "c":
        a, b = np.abs(a), np.abs(b)
    return np.squeeze(a).astype(np.float64), np.squeeze(b).astype(np.float64)


def _tensor_metrics(a: np.ndarray, b: np.ndarray, group: Group, out: Judged) -> None:
    """Cosine, EucDist, MaxAbsErr, MaxRelativeErr and the error ratios of two arrays (float64)."""
    if a.shape != b.shape:
        out.result, out.error = ERROR, math.inf
        out.messages.append(f"tensor file shapes differ ({list(a.shape)} vs {list(b.shape)})")
        return
    out.exact = bool(np.array_equal(a, b, equal_nan=True))
    fa, fb = np.isfinite(a), np.isfinite(b)
    same_bad = (~fa & ~fb) & ((np.isnan(a) & np.isnan(b)) | (a == b))
    one_sided = int(np.count_nonzero(~(fa & fb) & ~same_bad))
    both = fa & fb
    x, y = a[both], b[both]
    diff = np.abs(x - y)
    nx, ny, nd = (float(np.linalg.norm(v)) for v in (x, y, x - y))
    if nd == 0.0 or not (nx and ny):  # equal arrays (also all-zero ones) are exactly similar
        cosine = 1.0 if nd == 0.0 else 0.0
    else:  # rounding can put dot / (|x| |y|) a last bit outside [-1, 1]
        cosine = min(1.0, max(-1.0, float(np.dot(x, y) / (nx * ny))))
    rel = diff / np.maximum(np.abs(y), np.finfo(np.float64).tiny)
    rel[diff == 0] = 0.0
    n = max(x.size, 1)
    out.metrics.update({
        "Cosine": cosine, "EucDist": nd,
        "MaxAbsErr": float(diff.max()) if diff.size else 0.0,
        "MaxRelativeErr": float(rel.max()) if rel.size else 0.0,
        "One Thousandth Err Ratio": float(np.count_nonzero(rel <= 1e-3) / n),
        "Five Thousandths Err Ratio": float(np.count_nonzero(rel <= 5e-3) / n)})
    out.error = nd / max(ny, group.atol) if nd else 0.0
    if one_sided:
        out.error = math.inf
        out.messages.append(f"NaN/Inf on one side only at {one_sided} element(s)")
        out.result = ERROR
        return
    if group.error == 0.0:  # integers, booleans: must be equal
        out.result = PASS if out.exact else ERROR
        if not out.exact:
            out.messages.append("values differ (exact dtype)")
        return
    result = _rate(out.error, group)
    if cosine < group.cosine_error:
        result = ERROR
    elif cosine < group.cosine_warning and result == PASS:
        result = WARNING
    if result != PASS:
        out.messages.append(f"relative L2 error {out.error:.3g}, cosine {cosine:.6f} "
                            f"({group.name} {result} thresholds)")
    out.result = result


def _floating(record: Judged, thresholds: Thresholds) -> bool:
    """Whether both sides of ``record`` are floating-point tensors (a dtype of a group other than
    ``exact`` in ``thresholds``; integers, booleans and unknown dtypes are not)."""
    return all(thresholds.dtypes.get(side.dtype, "exact") != "exact" for side in (record.target, record.golden))


def judge_near_zero(records: list, lower: Optional[Group], thresholds: Thresholds) -> None:
    """Re-judge, in place, the failing tensor records of one entry whose magnitude is negligible
    against the entry's scale: when the two runs differ in precision (any entry), or for a
    parameter-gradient entry (``lower`` None: each record with its own dtypes' group).

    A statistic of a tensor that is mathematically (near) zero, e.g. the gradient of a bias that a
    softmax makes irrelevant, is rounding noise of what produced it: its relative error against itself
    is meaningless. Such a record (both sides' Norm at most the group's ``error`` threshold times the
    scale) is judged with the absolute tolerance the group allows at that scale: its largest statistic
    difference divided by the scale, rated with the group's thresholds. The scale is the largest Norm
    of the entry's tensor records on either side (its inputs, or for a parameter-gradient entry the
    other gradients of the same Cell, which a different summation order in the two runs, e.g.
    GRAPH_MODE and PyNative, rounds at their scale). Only floating-point records set the scale: an
    integer or boolean input (the token ids of a Gather, a mask) is no magnitude the floating-point
    values are computed at, so it never sets their tolerance. Statistics mode only; a record is never
    judged worse.

    Args:
        records: the :class:`Judged` records of one entry (inputs and outputs; non-tensors are skipped).
        lower: the thresholds group of the lower precision the two runs differ in, or None: each
            record is judged with ``thresholds.group`` of its two dtypes.
        thresholds: the :class:`~msprobe.compare.thresholds.Thresholds`: its ``dtypes`` tell the
            floating-point records (those of a group other than ``exact``); the groups when ``lower``
            is None.
    """
    scale = max((abs(v) for r in records if r.is_tensor and r.target is not None and r.golden is not None
                 and _floating(r, thresholds)
                 for v in (r.target.stats[3], r.golden.stats[3]) if v is not None and math.isfinite(v)),
                default=0.0)
    if not scale:
        return
    for r in records:
        if (r.result not in (WARNING, ERROR) or not r.is_tensor or not math.isfinite(r.error)
                or "Max diff" not in r.metrics or "Cosine" in r.metrics):  # statistics mode only
            continue
        group = lower if lower is not None else thresholds.group(r.target.dtype, r.golden.dtype)
        if group.error == 0.0:
            continue
        norms = (r.target.stats[3], r.golden.stats[3])
        if any(n is None or not math.isfinite(n) or abs(n) > group.error * scale for n in norms):
            continue
        diffs = [abs(a - b) for a, b in zip(r.target.stats, r.golden.stats) if a is not None and b is not None]
        error = max(diffs, default=0.0) / scale
        result = _rate(error, group)
        if _RANK[result] < _RANK[r.result]:
            r.result, r.error = result, error
            r.messages = [m for m in r.messages if not m.startswith("largest scaled statistic error")]
            r.messages.append(f"near zero against the entry's scale {scale:.3g}: judged with {group.name}'s "
                              f"absolute tolerance there (largest statistic difference / scale = {error:.3g})")
