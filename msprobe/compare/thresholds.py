"""Judgement thresholds: the defaults are ``thresholds.yaml`` next to this module (which documents
every rule); a user file of the same layout overrides any subset."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Optional, Union

import yaml

DEFAULT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "thresholds.yaml")
_GROUP_KEYS = ("warning", "error", "atol", "cosine_warning", "cosine_error")


@dataclass(frozen=True)
class Group:
    """Thresholds of one precision group (see ``thresholds.yaml``)."""

    name: str
    warning: float
    error: float
    atol: float
    cosine_warning: float
    cosine_error: float
    #: unit roundoff of the group's dtype (relative; 0 for exact dtypes): the least error a tensor
    #: rounded to this dtype on one side only carries, which its statistics can hide
    rounding: float = 0.0


class Thresholds:
    """Loaded thresholds.

    Args:
        override: None, a path to a YAML/JSON file, or a dict with the layout of ``thresholds.yaml``
            (any subset: ``{"groups": {"float16": {"error": 0.05}}}``).

    Raises:
        ValueError: an unknown group, key or a non-numeric threshold (the message names it).
    """

    def __init__(self, override: Union[None, str, dict] = None):
        with open(DEFAULT_FILE, encoding="utf-8") as f:
            config = yaml.safe_load(f)
        if isinstance(override, str):
            with open(override, encoding="utf-8") as f:
                override = yaml.safe_load(f) or {}
        if override:
            config = _merge(config, override)
        self.groups = {}
        for name, values in config["groups"].items():
            unknown = set(values) - set(_GROUP_KEYS) - {"rounding"}
            if unknown:
                raise ValueError(f"thresholds: group {name!r} has unknown keys {sorted(unknown)}; "
                                 f"valid: {list(_GROUP_KEYS) + ['rounding']}")
            try:
                self.groups[name] = Group(name, **{k: float(values[k]) for k in _GROUP_KEYS},
                                          rounding=float(values.get("rounding", 0.0)))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"thresholds: group {name!r}: {exc} (each of {list(_GROUP_KEYS)} "
                                 f"must be a number)") from None
        self.dtypes = dict(config["dtypes"])
        for dtype, group in self.dtypes.items():
            if group not in self.groups:
                raise ValueError(f"thresholds: dtype {dtype!r} maps to unknown group {group!r}; "
                                 f"groups: {sorted(self.groups)}")
        self.order = list(config["precision_order"])
        self.gain = float(config["entry"]["gain"])

    def group(self, dtype_a: Optional[str], dtype_b: Optional[str]) -> Group:
        """The group of the less precise of two dtypes (None: that side has no dtype)."""
        names = [self.dtypes.get(d, "exact") for d in (dtype_a, dtype_b) if d is not None]
        if not names:
            return self.groups["exact"]
        return self.groups[min(names, key=lambda n: self.order.index(n) if n in self.order else 0)]


    def lower_of(self, dtypes) -> Optional[Group]:
        """The group of the least precise floating dtype among ``dtypes`` (names as in ``dtypes:``),
        or None when none of them is a floating dtype (integers, booleans, non-tensors)."""
        names = {self.dtypes.get(d, "exact") for d in dtypes if d is not None} - {"exact"}
        if not names:
            return None
        return self.groups[min(names, key=lambda n: self.order.index(n) if n in self.order else 0)]


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key not in out:
            raise ValueError(f"thresholds: unknown key {key!r}; valid: {sorted(base)}")
        if isinstance(value, dict) and isinstance(out[key], dict):
            for k, v in value.items():
                if isinstance(v, dict) and isinstance(out[key].get(k), dict):
                    out[key][k] = {**out[key][k], **v}
                else:
                    out[key][k] = v
        else:
            out[key] = value
    return out
