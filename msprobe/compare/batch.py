"""Statistics-mode judgement of many record pairs at once (numpy), for large dumps.

Applies exactly the rules of :func:`msprobe.compare.judge.judge` for two tensor records of equal
shape in ``statistics`` mode (other pairs go through ``judge``); ``tests/test_compare_batch.py``
checks that both give the same results."""
from __future__ import annotations

import math

import numpy as np

from msprobe.compare import judge as J
from msprobe.compare.records import STATS

_RESULTS = (J.PASS, J.WARNING, J.ERROR)
_DIFF_COLS = ("Max diff", "Min diff", "Mean diff", "L2norm diff")
_REL_COLS = ("MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")
_COLS = _DIFF_COLS + _REL_COLS


def judge_many(pairs, t_side, g_side, thresholds) -> list:
    """``pairs``: list of ``(t_record, g_record, t_index, g_index)`` (record objects and their
    indices in the sides' arrays), both tensors of equal shape. Returns one :class:`Judged` each."""
    if not pairs:
        return []
    t_idx = np.fromiter((p[2] for p in pairs), np.int64, len(pairs))
    g_idx = np.fromiter((p[3] for p in pairs), np.int64, len(pairs))
    T, Tp = t_side.stat_arrays()
    G, Gp = g_side.stat_arrays()
    T, G = T[t_idx], G[g_idx]
    bits = np.arange(4)
    present = ((Tp[t_idx, None] >> bits) & 1).astype(bool) & ((Gp[g_idx, None] >> bits) & 1).astype(bool)
    groups, sizes = {}, {}
    rows, numels, names = [], [], []
    for t, g, _, _ in pairs:
        key = (t.dtype, g.dtype)
        entry = groups.get(key)
        if entry is None:
            group = thresholds.group(t.dtype, g.dtype)
            entry = groups[key] = (group, (group.warning, group.error, group.atol))
        names.append(entry[0])
        rows.append(entry[1])
        size = sizes.get(g.shape)
        if size is None:
            size = sizes[g.shape] = math.prod(g.shape) if g.shape else 1
        numels.append(size)
    params = np.array(rows, dtype=np.float64)
    numel = np.array(numels, dtype=np.float64)
    with np.errstate(all="ignore"):
        ft, fg = np.isfinite(T), np.isfinite(G)
        both = ft & fg & present
        same_bad = ~ft & ~fg & ((np.isnan(T) & np.isnan(G)) | (T == G)) & present
        one_sided = present & ~both & ~same_bad
        diff = np.where(both, T - G, np.where(same_bad, 0.0, T - G))
        absdiff = np.abs(diff)
        rel = np.where(both, np.where(diff == 0, 0.0, absdiff / np.abs(G)), np.where(same_bad, 0.0, np.inf))
        norm = G[:, 3]
        rms = np.where(present[:, 3] & np.isfinite(norm) & (numel > 0),
                       np.abs(norm) / np.sqrt(np.maximum(numel, 1)), 0.0)
        atol = params[:, 2]
        base = np.maximum(np.abs(G), atol[:, None])
        base[:, :3] = np.maximum(base[:, :3], rms[:, None])
        scaled = np.where(both, absdiff / base, np.where(one_sided, np.inf, 0.0))
        err = scaled.max(axis=1)
        code = np.where(err > params[:, 1], 2, np.where(err > params[:, 0], 1, 0))
        exact = np.all((diff == 0) | ~present, axis=1)
    present8 = np.concatenate([present, present], axis=1)
    values_l = np.where(present8, np.concatenate([diff, rel], axis=1), np.nan).tolist()
    pres_l = present8.tolist()
    full_l = present.all(axis=1).tolist()
    err_l, code_l, exact_l = err.tolist(), code.tolist(), exact.tolist()
    bad_rows = set(np.nonzero(one_sided.any(axis=1) | ~(ft & fg).all(axis=1))[0].tolist())
    out = []
    append, Judged, cols, results = out.append, J.Judged, _COLS, _RESULTS
    for k, (t, g, _, _) in enumerate(pairs):
        values = values_l[k]
        if not full_l[k]:
            values = [v if p else None for v, p in zip(values, pres_l[k])]
        code_k = code_l[k]
        if code_k == 0 and t.dtype == g.dtype and k not in bad_rows:   # the common case
            append(Judged(t, g, J.PASS, err_l[k], exact_l[k] and t.md5 == g.md5, [],
                          dict(zip(cols, values)), names[k].warning))
            continue
        messages = []
        if t.dtype != g.dtype:
            messages.append(f"dtype differs ({t.dtype} vs {g.dtype}): judged as {names[k].name}")
        if k in bad_rows:
            _non_finite_messages(t, g, messages)
        result = results[code_k]
        if result != J.PASS:
            messages.append(J.scaled_error_message(err_l[k], result, names[k],
                                                   _largest(k, scaled, diff, G, rms, names[k], one_sided)))
        append(Judged(t, g, result, err_l[k], exact_l[k] and t.md5 == g.md5, messages,
                      dict(zip(cols, values)), names[k].warning))
    return out


def _largest(k: int, scaled, diff, golden, rms, group, one_sided):
    """:func:`msprobe.compare.judge.scale_text` of row ``k``'s largest scaled statistic (None: a
    one-sided NaN/Inf, which its own message explains)."""
    if one_sided[k].any():
        return None
    i = int(np.argmax(scaled[k]))
    return J.scale_text(STATS[i], float(diff[k, i]), float(golden[k, i]), float(rms[k]), group)


def _non_finite_messages(t, g, messages) -> None:
    one_sided = []
    for name, a, b in zip(STATS, t.stats, g.stats):
        if a is None or b is None:
            continue
        same = J._same_non_finite(a, b)
        if same is False:
            one_sided.append(f"{name} {a} vs {b}")
    if one_sided:
        messages.append("NaN/Inf on one side only: " + ", ".join(one_sided))
    elif any(v is not None and not math.isfinite(v) for v in t.stats):
        messages.append("NaN/Inf on both sides")
