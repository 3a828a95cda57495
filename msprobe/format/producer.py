"""The producer rule's test of one input value of a call, shared by watch mode
(:mod:`msprobe.engine.watch`), ``anomalies.json`` (:mod:`msprobe.read.report`) and ``msprobe first-diff``
(:func:`msprobe.compare.divergence.nan_producers`), so they name the same call.

A *producer* of a NaN/Inf is a call whose output holds one while its inputs do not. An input counts
only when it is a tensor (recorded with its statistics): a call receiving a NaN/Inf tensor passes it
on. A Python number passed as an argument (``x * float('nan')``, ``x + float('inf')``) is not a
value made by earlier computation: the call that first puts it into a tensor is the producer, and
what names it says that a scalar argument was non-finite (:data:`SCALAR_NOTE`).
"""
from __future__ import annotations

from typing import Optional

#: the role of a non-finite tensor input: the call passes on a value made before it (a propagator)
PASSED_ON = "passed_on"
#: the role of a non-finite Python number argument: the call may be the producer (it is noted)
SCALAR = "scalar"

#: what a producer fed a non-finite Python number says about it
SCALAR_NOTE = ("a scalar argument was non-finite: this call is the first to put a NaN/Inf Python number "
               "(not a tensor) into a tensor")


def input_role(is_tensor: bool, finite: bool) -> Optional[str]:
    """What one input value of a call means for the producer rule.

    Args:
        is_tensor: the value is a tensor (recorded with Max/Min/Mean/Norm), not a Python number or
            other argument.
        finite: its statistics (a tensor) or its value (a number) are all finite.

    Returns:
        None for a finite value; :data:`PASSED_ON` for a non-finite tensor (the call is no
        producer); :data:`SCALAR` for a non-finite Python number (the call can be the producer, and
        is named with :data:`SCALAR_NOTE`).
    """
    if finite:
        return None
    return PASSED_ON if is_tensor else SCALAR


_INF = float("inf")


def element_kinds(leaf: dict) -> tuple:
    """Which non-finite elements a tensor record's statistics show its tensor holds.

    Args:
        leaf: one tensor record (``Max``, ``Min``, ``Mean``, ``Norm``; ``NanCount``,
            ``PosInfCount``, ``NegInfCount`` when ``summary_mode`` counts them).

    Returns:
        ``("nan",)``, ``("inf",)``, ``("nan", "inf")`` or ``()``. The counts decide when recorded;
        otherwise Max/Min do: a NaN element makes Max and Min NaN, an Inf element shows as Max
        +Inf or Min -Inf. Mean or Norm alone non-finite is no NaN/Inf element (+Inf beside -Inf
        makes Mean NaN; a float64 sum of squares can overflow), so it gives ``()``.
    """
    top, low = leaf.get("Max"), leaf.get("Min")
    nan = leaf.get("NanCount")
    if type(nan) is int:
        has_nan = nan > 0
    else:
        has_nan = (type(top) is float and top != top) or (type(low) is float and low != low)
    pos, neg = leaf.get("PosInfCount"), leaf.get("NegInfCount")
    if type(pos) is int and type(neg) is int:
        has_inf = pos + neg > 0
    else:
        has_inf = top == _INF or low == -_INF
    return ("nan", "inf") if has_nan and has_inf else ("nan",) if has_nan else ("inf",) if has_inf else ()
