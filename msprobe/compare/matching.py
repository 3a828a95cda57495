"""Pairing the entries of two dumps, in the target's execution order.

1. Exact names (after ``mapping``, see :func:`load_mapping`): a name present on both sides. Only the
   longest run of such pairs that keeps both sides' order is kept (an extra call of an API shifts that
   API's later call counters, so ``relu.1`` of one run may be ``relu.2`` of the other: the name pair
   that would cross the order of the other pairs is dropped).
2. Between two consecutive name pairs, what is left on both sides is aligned in order
   (:class:`difflib.SequenceMatcher`): first by API (or Cell class) and direction with every record's
   place, dtype and shape equal (``order``), then by API and direction alone (``order-api``).
3. Dropped name pairs whose two entries are both still unmatched are paired by name after all.
4. The rest is ``unmatched``.
"""
from __future__ import annotations

import bisect
import difflib
from typing import Dict, List, Optional, Tuple

import yaml

from msprobe.compare.records import Side, api_key

NAME, MAPPING, ORDER, ORDER_API, UNMATCHED = "name", "mapping", "order", "order-api", "unmatched"
#: gaps longer than this (both sides) are aligned greedily per API instead of by SequenceMatcher
_MAX_GAP = 4000

Pair = Tuple[Optional[int], Optional[int], str]


def load_mapping(path: Optional[str]) -> Dict[str, str]:
    """Read a name map (YAML or JSON): ``{target name: golden name}``. A key is a whole entry name
    (``Functional.gelu.0.forward``) or a prefix of whole dot-separated parts, which is replaced
    (``Functional.gelu: Functional.fast_gelu`` maps every call; ``Mint.relu.0: Functional.relu.1``
    one call, forward and backward). The longest matching key wins.

    Raises:
        ValueError: the file is not a mapping of strings to strings.
    """
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in data.items()):
        raise ValueError(f"{path}: a mapping file must map target names to golden names (strings)")
    return data


def _mapped(name: str, mapping: Dict[str, str]) -> Optional[str]:
    """``name`` with its longest mapped prefix (whole dot-separated parts) replaced."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        head = ".".join(parts[:end])
        if head in mapping:
            return ".".join([mapping[head], *parts[end:]])
    return None


def match(target: Side, golden: Side, mapping: Optional[Dict[str, str]] = None) -> List[Pair]:
    """Pair the entries of two sides; returns ``(target index, golden index, how)`` items in
    target execution order, golden-only entries placed after the last pair before them. ``how`` is
    one of ``name``, ``mapping``, ``order``, ``order-api``, ``unmatched``."""
    mapping = mapping or {}
    named = []
    for ti, name in enumerate(target.names):
        other = _mapped(name, mapping) if mapping else None
        gi = golden.index.get(other) if other is not None else None
        if gi is not None:
            named.append((ti, gi, MAPPING))
            continue
        gi = golden.index.get(name)
        if gi is not None:
            named.append((ti, gi, NAME))
    anchors = _longest_ordered(named)
    out: List[Pair] = []
    t_prev = g_prev = -1
    for ti, gi, how in anchors + [(len(target), len(golden), None)]:
        out.extend(_align_gap(target, golden, range(t_prev + 1, ti), range(g_prev + 1, gi)))
        if how is not None:
            out.append((ti, gi, how))
        t_prev, g_prev = ti, gi
    return _pair_crossing(out, named)


def _pair_crossing(out: List[Pair], named: list) -> List[Pair]:
    """Name pairs dropped for crossing the order whose two entries are both still unmatched are
    paired after all (backward entries of independent branches may run in either order)."""
    left_g = {g for t, g, how in out if t is None}
    by_t = {t: (g, how) for t, g, how in named if g in left_g}
    taken = set()
    result = []
    for t, g, how in out:
        if g is None and t in by_t and by_t[t][0] not in taken:
            g, how = by_t[t]
            taken.add(g)
        result.append((t, g, how))
    return [p for p in result if not (p[0] is None and p[1] in taken)]


def _longest_ordered(pairs: list) -> list:
    """Longest subsequence of ``pairs`` (sorted by target index) with increasing golden index."""
    tails, tails_idx, prev = [], [], [-1] * len(pairs)
    for i, (_, gi, _) in enumerate(pairs):
        k = bisect.bisect_left(tails, gi)
        if k == len(tails):
            tails.append(gi)
            tails_idx.append(i)
        else:
            tails[k], tails_idx[k] = gi, i
        prev[i] = tails_idx[k - 1] if k else -1
    keep, i = [], tails_idx[-1] if tails_idx else -1
    while i >= 0:
        keep.append(pairs[i])
        i = prev[i]
    return keep[::-1]


def _align_gap(target: Side, golden: Side, t_range: range, g_range: range) -> List[Pair]:
    ts, gs = list(t_range), list(g_range)
    if not ts or not gs:
        return [(t, None, UNMATCHED) for t in ts] + [(None, g, UNMATCHED) for g in gs]
    matched: Dict[int, Tuple[int, str]] = {}
    if len(ts) > _MAX_GAP and len(gs) > _MAX_GAP:
        _greedy(target, golden, ts, gs, matched)
    else:
        _by_sequence(ts, gs, [target.signature(t) for t in ts], [golden.signature(g) for g in gs],
                     matched, ORDER)
        _by_sequence(ts, gs, [api_key(target.names[t]) for t in ts],
                     [api_key(golden.names[g]) for g in gs], matched, ORDER_API)
    return _interleave(ts, gs, matched)


def _by_sequence(ts, gs, t_keys, g_keys, matched, how) -> None:
    """Order-preserving alignment of the still unmatched items of a gap, segment by segment
    between the pairs already found (so later passes never cross earlier pairs)."""
    used_g = {g for g, _ in matched.values()}
    for seg_t, seg_g in zip(_segments(ts, matched), _segments(gs, used_g)):
        if seg_t and seg_g:
            sm = difflib.SequenceMatcher(None, [t_keys[i] for i in seg_t], [g_keys[j] for j in seg_g],
                                         autojunk=False)
            for a, b, size in sm.get_matching_blocks():
                for k in range(size):
                    matched[ts[seg_t[a + k]]] = (gs[seg_g[b + k]], how)


def _segments(items: list, cuts) -> list:
    """Positions of ``items`` split at the items in ``cuts`` (which are left out)."""
    segments = [[]]
    for j, item in enumerate(items):
        if item in cuts:
            segments.append([])
        else:
            segments[-1].append(j)
    return segments


def _greedy(target, golden, ts, gs, matched) -> None:
    queues: Dict[str, list] = {}
    for g in reversed(gs):
        queues.setdefault(api_key(golden.names[g]), []).append(g)
    last_g = -1
    for t in ts:
        queue = queues.get(api_key(target.names[t]))
        while queue and queue[-1] < last_g:
            queue.pop()
        if queue:
            last_g = queue.pop()
            matched[t] = (last_g, ORDER_API)


def _interleave(ts, gs, matched) -> List[Pair]:
    out: List[Pair] = []
    used_g = {g: True for g, _ in matched.values()}
    g_iter = iter(gs)
    pending_g = next(g_iter, None)
    for t in ts:
        if t in matched:
            g, how = matched[t]
            while pending_g is not None and pending_g <= g:
                if pending_g not in used_g:
                    out.append((None, pending_g, UNMATCHED))
                pending_g = next(g_iter, None)
            out.append((t, g, how))
        else:
            out.append((t, None, UNMATCHED))
    while pending_g is not None:
        if pending_g not in used_g:
            out.append((None, pending_g, UNMATCHED))
        pending_g = next(g_iter, None)
    return out
