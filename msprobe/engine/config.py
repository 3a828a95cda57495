"""Typed, validated dump configuration.

``load_config`` reads a ``config.json`` (or the packaged default ``msprobe/config.json``),
applies the keyword-argument overrides of ``PrecisionDebugger(config_path, task, dump_path,
level, step)`` and returns one frozen :class:`DumpConfig`.  All validation happens there, once;
the rest of the tool only reads the resulting object.

Every invalid value raises :class:`ConfigError` whose text names the field (a dotted path such
as ``'statistics.data_mode'`` or ``'step[2]'``), the offending value (``repr``) and what is
allowed, e.g.::

    config field 'level': invalid value 'L3'; allowed: 'L0', 'L1', 'L2', 'mix', 'debug'

Deliberate differences from the reference tool:

* the ``task`` keyword argument overrides the file's task (the seed's ``PrecisionDebugger`` section
  says arguments take priority over config.json);
* a process without a rank (non-distributed) counts as rank 0 for the ``rank`` filter, so a
  single-process run with ``"rank": [0]`` is dumped instead of silently disabled;
* ``dump_path`` is only normalised here (``os.path.abspath``), never created;
* summary mode ``'xor'`` is rejected (not available in MindSpore PyNative).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple, Union

import pydantic
from pydantic import ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

__all__ = ["ConfigError", "DumpConfig", "parse_index_list", "load_config", "DEFAULT_CONFIG_PATH"]

logger = logging.getLogger("msprobe")

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent.parent / "config.json"

TASKS = ("statistics", "tensor", "structure", "exception_dump")
REFERENCE_ONLY_TASKS = ("acc_check", "diff_check", "nan_check")
LEVELS = ("L0", "L1", "L2", "mix", "debug")
STRUCTURE_LEVELS = ("L0", "mix")
DATA_MODES = ("all", "forward", "backward", "input", "output")
SUMMARY_MODES = ("statistics", "md5")
#: Every item a ``summary_mode`` list may hold, grouped by what it adds to each tensor record. The
#: README's table under "Statistics and tasks" lists the same groups (``tests/test_config.py`` checks
#: it against this), and the error for an item outside them shows this text.
SUMMARY_ITEM_GROUPS: Tuple[Tuple[Tuple[str, ...], str], ...] = (
    (("max", "min", "mean", "l2norm"), "nothing: `Max`, `Min`, `Mean`, `Norm` are always there"),
    (("nan count",), "`NanCount`"),
    (("positive inf count",), "`PosInfCount`"),
    (("negative inf count",), "`NegInfCount`"),
    (("zero count",), "`ZeroCount` (-0.0 is a zero)"),
    (("max abs",), "`MaxAbs` (largest |x| of the non-NaN elements; null for bool and empty tensors)"),
    (("md5",), "`md5`, as `\"summary_mode\": \"md5\"` does"),
    (("count", "hash", "negative zero count", "positive zero count"),
     "nothing: accepted so the reference tool's configs load"),
)
SUMMARY_ITEMS = tuple(item for items, _ in SUMMARY_ITEM_GROUPS for item in items)
#: summary_mode list items that add a statistic to each tensor record (README "Statistics and tasks")
COUNT_ITEMS = {"nan count": "NanCount", "positive inf count": "PosInfCount",
               "negative inf count": "NegInfCount", "zero count": "ZeroCount", "max abs": "MaxAbs"}
WATCH_KINDS = ("nan", "inf")
WATCH_ACTIONS = ("record", "raise")
WATCH_KEYS = ("anomaly", "history", "on_anomaly", "save_tensors", "max_abs", "norm_jump")
WATCH_LEVELS = ("L0", "L1", "mix")
INDEX_MAX = 1_000_000
MAX_DATA_MODES = 4
_REGEX_ENTRY = re.compile(r"^name-regex\((.*)\)$")


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(repr(v) for v in values)


_INDEX_FORM = f"a list of integers in [0, {INDEX_MAX}] or strings like '3' or '3-5' (A <= B)"
_BOOL_FORM = "a JSON boolean true/false"
_STR_LIST_FORM = "a list of strings"

#: What each DumpConfig field accepts, as shown in error messages.
ALLOWED: Dict[str, str] = {
    "task": _quoted(TASKS),
    "dump_path": "a non-empty path string",
    "rank": _INDEX_FORM,
    "step": _INDEX_FORM,
    "level": _quoted(LEVELS),
    "async_dump": _BOOL_FORM,
    "precision": _quoted(("low", "high")),
    "extra_info": _BOOL_FORM,
    "scope": "an empty list or a list of exactly 2 names [start, end]",
    "api_list": _STR_LIST_FORM,
    "data_mode": (f"a non-empty list of at most {MAX_DATA_MODES} of {_quoted(DATA_MODES)}"
                  " ('all' only on its own)"),
    "summary_mode": f"{_quoted(SUMMARY_MODES)}, or a list of items, each adding: " + "; ".join(
        f"{_quoted(items)}: {effect.replace('`', '')}" for items, effect in SUMMARY_ITEM_GROUPS),
    "tensor_list": _STR_LIST_FORM,
    "device": _quoted(("host", "device")),
    "stat_precision": _quoted(("high", "low")),
    "framework": _quoted(("mindspore",)),
    "tensor_budget_mb": "a number > 0 (megabytes of .npy data), or null for no limit",
    "watch": f"a JSON object with keys among {_quoted(WATCH_KEYS)}, or null",
    "watch.anomaly": f"a non-empty list of {_quoted(WATCH_KINDS)}",
    "watch.history": f"an integer in [1, {INDEX_MAX}] (entries of earlier steps kept in memory)",
    "watch.on_anomaly": _quoted(WATCH_ACTIONS),
    "watch.save_tensors": _BOOL_FORM,
    "watch.max_abs": "a number > 0 (an output whose largest |value| exceeds it is an anomaly), or null",
    "watch.norm_jump": "a number > 1 (an output Norm above this many times the same entry's running "
                       "Norm is an anomaly), or null",
}

# DumpConfig field -> key inside the task section of config.json.
_SECTION_KEYS = {"scope": "scope", "api_list": "list", "data_mode": "data_mode",
                 "summary_mode": "summary_mode"}
_STATISTICS_KEYS = {"tensor_list": "tensor_list", "device": "device", "stat_precision": "precision"}
_TENSOR_KEYS = {"tensor_budget_mb": "tensor_budget_mb"}
_TOP_LEVEL_KEYS = frozenset(
    ("task", "dump_path", "rank", "step", "level", "async_dump", "precision", "extra_info", "watch")
) | frozenset(TASKS)

# Set by load_config while it builds a DumpConfig: which task section was read and which fields
# came from keyword arguments (so errors name 'statistics.list' or "argument 'step'").
# A ContextVar rather than pydantic's validation context because DumpConfig.__init__ is
# overridden (to translate errors), and pydantic does not forward the context through it.
_LOAD_CONTEXT: ContextVar[Dict[str, Any]] = ContextVar("msprobe_config_load_context", default={})


class ConfigError(ValueError):
    """An invalid configuration value.

    Attributes:
        field: where the value came from: a dotted config path (``'statistics.data_mode'``),
            an element (``'step[2]'``) or a keyword argument / parameter name (``'config_path'``).
        value: the offending value.
        allowed: human-readable description of the accepted values.
        reason: optional detail on why the value is rejected.
    """

    def __init__(self, field: str, value: object, allowed: str, reason: Optional[str] = None,
                 *, kind: str = "config field") -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        self.reason = reason
        self.kind = kind
        detail = f" ({reason})" if reason else ""
        shown = repr(value) if kind == "argument" else _as_json(value)  # arguments are Python's
        super().__init__(f"{kind} '{field}': invalid value {shown}{detail}; allowed: {allowed}")

    def __reduce__(self):  # keep picklable despite the custom signature
        return (_rebuild_config_error, (self.field, self.value, self.allowed, self.reason, self.kind))


def _as_json(value: object) -> str:
    """``value`` of a config file as JSON shows it (``true``, ``null``, ``[1, 'a']``); strings keep the
    single quotes the allowed values are shown with."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_as_json(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_as_json(k)}: {_as_json(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _rebuild_config_error(field, value, allowed, reason, kind):
    return ConfigError(field, value, allowed, reason, kind=kind)


# --------------------------------------------------------------------------- list syntax

def _check_index(number: int, field: str, kind: str, element: object) -> int:
    if not 0 <= number <= INDEX_MAX:
        raise ConfigError(field, element, _INDEX_FORM, f"out of range [0, {INDEX_MAX}]", kind=kind)
    return number


def _parse_index_element(element: object, field: str, kind: str) -> range:
    if isinstance(element, int) and not isinstance(element, bool):
        number = _check_index(element, field, kind, element)
        return range(number, number + 1)
    if not isinstance(element, str):
        raise ConfigError(field, element, _INDEX_FORM, "must be an integer or a string", kind=kind)
    parts = element.strip().split("-")
    if len(parts) > 2 or not all(p.strip().isdecimal() for p in parts):
        raise ConfigError(field, element, _INDEX_FORM, "not of the form 'N' or 'A-B'", kind=kind)
    low, high = (_check_index(int(p), field, kind, element) for p in (parts[0], parts[-1]))
    if low > high:
        raise ConfigError(field, element, _INDEX_FORM, "range start is greater than range end",
                          kind=kind)
    return range(low, high + 1)


def _parse_index_list(value: object, field: str, kind: str) -> Tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(field, value, _INDEX_FORM, "must be a list", kind=kind)
    if len(value) > INDEX_MAX:
        raise ConfigError(field, f"<list of {len(value)} elements>", _INDEX_FORM,
                          f"more than {INDEX_MAX} elements", kind=kind)
    result = set()
    for position, element in enumerate(value):
        result.update(_parse_index_element(element, f"{field}[{position}]", kind))
    return tuple(sorted(result))


def parse_index_list(value: object, field: str) -> Tuple[int, ...]:
    """Parse the ``step``/``rank`` list syntax.

    Args:
        value: ``None`` (-> ``()``) or a list whose elements are ints (not bools) in
            ``[0, 1_000_000]`` or strings ``"N"`` / ``"A-B"`` (inclusive range, ``A <= B``).
        field: name used in error messages, e.g. ``'step'``; elements are named ``'step[2]'``.

    Returns:
        The sorted, de-duplicated indices: ``[0, "2", "4-6", 1, 1]`` -> ``(0, 1, 2, 4, 5, 6)``.

    Raises:
        ConfigError: ``value`` is not a list, or an element is of the wrong type, malformed,
            out of range or a reversed range (the error names the element, e.g. ``'step[2]'``).
    """
    return _parse_index_list(value, field, "config field")


# --------------------------------------------------------------------------- field checks

def _choice(value: object, choices: Tuple[str, ...], where: Tuple[str, str], allowed: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(where[0], value, allowed, _spelling_hint(value, choices), kind=where[1])
    return value


def _spelling_hint(value: object, choices: Tuple[str, ...]) -> Optional[str]:
    """``"did you mean 'L1'?"`` when ``value`` differs from one choice only in letter case, or is a
    close misspelling of one; else ``None``."""
    if not isinstance(value, str):
        return None
    same_case = [c for c in choices if c.lower() == value.lower()]
    close = same_case or difflib.get_close_matches(value, choices, n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}?" if close else None


def _strict_bool(value: object, where: Tuple[str, str]) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where[0], value, _BOOL_FORM, kind=where[1])
    return value


def _str_list(value: object, where: Tuple[str, str], allowed: str = _STR_LIST_FORM,
              accept_bare_str: bool = False) -> Tuple[str, ...]:
    if value is None:
        return ()
    if accept_bare_str and isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(where[0], value, allowed, "must be a list", kind=where[1])
    for position, element in enumerate(value):
        if not isinstance(element, str):
            raise ConfigError(f"{where[0]}[{position}]", element, allowed, "must be a string",
                              kind=where[1])
    return tuple(value)


def _locate(info: ValidationInfo) -> Tuple[str, str]:
    """(path, kind) of the field being validated, for error messages."""
    name = info.field_name
    context = _LOAD_CONTEXT.get()
    if name in context.get("arguments", ()):
        return name, "argument"
    if name in _STATISTICS_KEYS:
        return f"statistics.{_STATISTICS_KEYS[name]}", "config field"
    if name in _TENSOR_KEYS:
        return f"tensor.{_TENSOR_KEYS[name]}", "config field"
    if name in _SECTION_KEYS:
        section = context.get("section") or info.data.get("task", "statistics")
        return f"{section}.{_SECTION_KEYS[name]}", "config field"
    return name, "config field"


def _is_md5(summary_mode: Union[str, Tuple[str, ...]]) -> bool:
    if isinstance(summary_mode, str):
        return summary_mode == "md5"
    return "md5" in summary_mode


# --------------------------------------------------------------------------- the model

@dataclasses.dataclass(frozen=True)
class WatchSettings:
    """The ``watch`` section of config.json (README "Watch mode"): statistics of every call are kept
    in memory (the open step and the last ``history`` entries before it) and written out when an
    anomaly is found.

    Attributes:
        anomaly: which non-finite values count: ``("nan", "inf")`` or one of them.
        history: entries of earlier steps kept in memory (the open step is kept whole).
        on_anomaly: ``"record"`` (write and go on) or ``"raise"`` (write, then raise
            :class:`msprobe.engine.watch.WatchAnomaly` in the training thread).
        save_tensors: also save the producing call's tensors (``.npy`` beside its dump.json).
        max_abs: an output whose largest absolute value exceeds this is an anomaly too, when no input
            of its call already exceeds it (``None``: off).
        norm_jump: an output whose Norm exceeds this many times the same entry's running Norm (mean of
            earlier steps) is an anomaly too (``None``: off).
    """

    anomaly: Tuple[str, ...] = WATCH_KINDS
    history: int = 1024
    on_anomaly: str = "record"
    save_tensors: bool = False
    max_abs: Optional[float] = None
    norm_jump: Optional[float] = None


def _watch_settings(value: object, kind: str) -> Optional[WatchSettings]:
    """Validate the raw ``watch`` object into :class:`WatchSettings` (``None``: watch mode off)."""
    if value is None:
        return None
    if isinstance(value, WatchSettings):
        return value
    if not isinstance(value, dict):
        raise ConfigError("watch", value, ALLOWED["watch"], kind=kind)
    out: Dict[str, Any] = {}
    if "anomaly" in value:
        kinds = value["anomaly"]
        if isinstance(kinds, str):
            kinds = [kinds]
        if not isinstance(kinds, list) or not kinds:
            raise ConfigError("watch.anomaly", value["anomaly"], ALLOWED["watch.anomaly"],
                              _misplaced_bounds(kinds), kind=kind)
        for position, item in enumerate(kinds):
            _choice(item, WATCH_KINDS, (f"watch.anomaly[{position}]", kind), ALLOWED["watch.anomaly"])
        out["anomaly"] = tuple(dict.fromkeys(kinds))
    if "history" in value:
        n = value["history"]
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= INDEX_MAX:
            raise ConfigError("watch.history", n, ALLOWED["watch.history"], kind=kind)
        out["history"] = n
    if "on_anomaly" in value:
        out["on_anomaly"] = _choice(value["on_anomaly"], WATCH_ACTIONS, ("watch.on_anomaly", kind),
                                    ALLOWED["watch.on_anomaly"])
    if "save_tensors" in value:
        out["save_tensors"] = _strict_bool(value["save_tensors"], ("watch.save_tensors", kind))
    for key, low in (("max_abs", 0.0), ("norm_jump", 1.0)):
        bound = value.get(key)
        if bound is None:
            continue
        if not isinstance(bound, (int, float)) or isinstance(bound, bool) or not low < bound < float("inf"):
            raise ConfigError(f"watch.{key}", bound, ALLOWED[f"watch.{key}"], kind=kind)
        out[key] = float(bound)
    return WatchSettings(**out)


def _misplaced_bounds(kinds) -> Optional[str]:
    """For a ``watch.anomaly`` given as an object: which of its keys (``max_abs``, ``norm_jump``)
    belong to ``watch`` itself, said in the error; ``None`` otherwise."""
    keys = [key for key in ("max_abs", "norm_jump") if isinstance(kinds, dict) and key in kinds]
    if not keys:
        return None
    named = " and ".join(f"'{key}'" for key in keys)
    return (f"{named} {'is a key' if len(keys) == 1 else 'are keys'} of 'watch' itself, not of 'anomaly', "
            f"e.g. \"watch\": {{\"anomaly\": [\"nan\", \"inf\"], \"{keys[0]}\": ...}}")


class DumpConfig(pydantic.BaseModel):
    """The validated, immutable dump configuration.

    Build it with :func:`load_config`.  Direct construction (``DumpConfig(task=..., dump_path=...)``)
    applies the same validation and raises :class:`ConfigError` as well.  Fields are listed in
    validation order; later validators may look at earlier fields.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    task: str
    dump_path: str
    rank: Tuple[int, ...] = ()
    step: Tuple[int, ...] = ()
    level: str = "L1"
    async_dump: bool = False
    precision: str = "low"
    extra_info: bool = True
    scope: Tuple[str, ...] = ()
    api_list: Tuple[str, ...] = ()
    data_mode: Tuple[str, ...] = ("all",)
    summary_mode: Union[str, Tuple[str, ...]] = "statistics"
    tensor_list: Tuple[str, ...] = ()
    device: str = "host"
    stat_precision: str = "high"
    framework: str = "mindspore"
    tensor_budget_mb: Optional[float] = None
    watch: Optional[WatchSettings] = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _to_config_error(exc) from None

    # -- field validators (all 'before': they see the raw JSON value) -------------------------

    @field_validator("task", mode="before")
    @classmethod
    def _v_task(cls, value: object, info: ValidationInfo) -> str:
        path, kind = _locate(info)
        if isinstance(value, str) and value in REFERENCE_ONLY_TASKS:
            raise ConfigError(path, value, ALLOWED["task"], "task not supported for MindSpore",
                              kind=kind)
        return _choice(value, TASKS, (path, kind), ALLOWED["task"])

    @field_validator("dump_path", mode="before")
    @classmethod
    def _v_dump_path(cls, value: object, info: ValidationInfo) -> str:
        path, kind = _locate(info)
        if not isinstance(value, str) or not value:
            raise ConfigError(path, value, ALLOWED["dump_path"], "missing, empty or not a string",
                              kind=kind)
        return os.path.abspath(value)

    @field_validator("rank", "step", mode="before")
    @classmethod
    def _v_index_list(cls, value: object, info: ValidationInfo) -> Tuple[int, ...]:
        path, kind = _locate(info)
        return _parse_index_list(value, path, kind)

    @field_validator("level", mode="before")
    @classmethod
    def _v_level(cls, value: object, info: ValidationInfo) -> str:
        if value is None or value == "":
            value = "L1"
        level = _choice(value, LEVELS, _locate(info), ALLOWED["level"])
        if info.data.get("task") == "structure" and level not in STRUCTURE_LEVELS:
            logger.warning("task 'structure' supports levels %s only; level %r replaced by 'mix'.",
                           _quoted(STRUCTURE_LEVELS), level)
            return "mix"
        return level

    @field_validator("async_dump", "extra_info", mode="before")
    @classmethod
    def _v_bool(cls, value: object, info: ValidationInfo) -> bool:
        return _strict_bool(value, _locate(info))

    @field_validator("precision", mode="before")
    @classmethod
    def _v_precision(cls, value: object, info: ValidationInfo) -> str:
        return _choice(value, ("low", "high"), _locate(info), ALLOWED["precision"])

    @field_validator("scope", mode="before")
    @classmethod
    def _v_scope(cls, value: object, info: ValidationInfo) -> Tuple[str, ...]:
        where = _locate(info)
        scope = _str_list(value, where, ALLOWED["scope"], accept_bare_str=True)
        if scope and len(scope) != 2:
            raise ConfigError(where[0], value, ALLOWED["scope"],
                              f"scope needs a start and an end name, got {len(scope)}",
                              kind=where[1])
        return scope

    @field_validator("api_list", mode="before")
    @classmethod
    def _v_api_list(cls, value: object, info: ValidationInfo) -> Tuple[str, ...]:
        where = _locate(info)
        entries = _str_list(value, where)
        if info.data.get("level") == "L2":
            for position, entry in enumerate(entries):
                _check_regex_entry(entry, (f"{where[0]}[{position}]", where[1]))
        return entries

    @field_validator("data_mode", mode="before")
    @classmethod
    def _v_data_mode(cls, value: object, info: ValidationInfo) -> Tuple[str, ...]:
        where = _locate(info)
        if value is None:
            return ("all",)
        modes = _str_list(value, where, ALLOWED["data_mode"])
        for position, mode in enumerate(modes):
            _choice(mode, DATA_MODES, (f"{where[0]}[{position}]", where[1]), ALLOWED["data_mode"])
        problem = None
        if not modes:
            problem = "must not be empty"
        elif len(modes) > MAX_DATA_MODES:
            problem = f"more than {MAX_DATA_MODES} elements"
        elif "all" in modes and len(modes) > 1:
            problem = "'all' cannot be combined with other options"
        if problem:
            raise ConfigError(where[0], value, ALLOWED["data_mode"], problem, kind=where[1])
        return modes

    @field_validator("summary_mode", mode="before")
    @classmethod
    def _v_summary_mode(cls, value: object, info: ValidationInfo) -> Union[str, Tuple[str, ...]]:
        path, kind = _locate(info)
        allowed = ALLOWED["summary_mode"]
        if value is None:
            return "statistics"
        if value == "xor":
            raise ConfigError(path, value, allowed, "'xor' is not supported for MindSpore PyNative",
                              kind=kind)
        if isinstance(value, str):
            return _choice(value, SUMMARY_MODES, (path, kind), allowed)
        items = _str_list(value, (path, kind), allowed)
        for position, item in enumerate(items):
            _choice(item, SUMMARY_ITEMS, (f"{path}[{position}]", kind), allowed)
        return items

    @field_validator("tensor_list", mode="before")
    @classmethod
    def _v_tensor_list(cls, value: object, info: ValidationInfo) -> Tuple[str, ...]:
        entries = _str_list(value, _locate(info))
        if entries and info.data.get("level") == "debug":
            logger.warning("tensor_list is ignored when level is 'debug'.")
            return ()
        return entries

    @field_validator("device", mode="before")
    @classmethod
    def _v_device(cls, value: object, info: ValidationInfo) -> str:
        return _choice(value, ("host", "device"), _locate(info), ALLOWED["device"])

    @field_validator("stat_precision", mode="before")
    @classmethod
    def _v_stat_precision(cls, value: object, info: ValidationInfo) -> str:
        return _choice(value, ("high", "low"), _locate(info), ALLOWED["stat_precision"])

    @field_validator("tensor_budget_mb", mode="before")
    @classmethod
    def _v_tensor_budget_mb(cls, value: object, info: ValidationInfo) -> Optional[float]:
        if value is None:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
        if not ok:
            path, kind = _locate(info)
            raise ConfigError(path, value, ALLOWED["tensor_budget_mb"], kind=kind)
        return float(value)

    @field_validator("watch", mode="before")
    @classmethod
    def _v_watch(cls, value: object, info: ValidationInfo) -> Optional[WatchSettings]:
        settings = _watch_settings(value, _locate(info)[1])
        if settings is not None:
            task, level = info.data.get("task"), info.data.get("level")
            if task != "statistics":
                raise ConfigError("watch", value, "task 'statistics' (watch mode keeps statistics only)",
                                  f"task is {task!r}")
            if level not in WATCH_LEVELS:
                raise ConfigError("watch", value, f"level {_quoted(WATCH_LEVELS)}", f"level is {level!r}")
        return settings

    @field_validator("framework", mode="before")
    @classmethod
    def _v_framework(cls, value: object, info: ValidationInfo) -> str:
        return _choice(value, ("mindspore",), _locate(info), ALLOWED["framework"])

    # -- cross-field rules --------------------------------------------------------------------

    @model_validator(mode="after")
    def _v_async_dump(self) -> "DumpConfig":
        if not self.async_dump:
            return self
        if self.task == "tensor" and self.level != "debug" and not self.api_list:
            raise ConfigError("async_dump", True, "a non-empty 'tensor.list', or async_dump false",
                              "async_dump is true with task 'tensor': 'list' must name what to dump")
        if self.md5:
            raise ConfigError("async_dump", True, "summary_mode without 'md5', or async_dump false",
                              f"async_dump cannot be combined with summary_mode {self.summary_mode!r}")
        logger.warning("async_dump is true: dumping large tensors may run out of memory.")
        return self

    @model_validator(mode="after")
    def _v_regex_outside_l2(self) -> "DumpConfig":
        regex = [entry for entry in self.api_list if _REGEX_ENTRY.match(entry)]
        if regex and self.level != "L2":
            logger.warning("list entries %s use name-regex(...), which only level L2 reads as a regular "
                           "expression; at level %r they are matched as plain substrings", regex,
                           self.level)
        return self

    # -- queries ------------------------------------------------------------------------------

    @property
    def stat_counts(self) -> Tuple[str, ...]:
        """``dump.json`` keys of the optional statistics a ``summary_mode`` list asks for
        (``"nan count"`` -> ``NanCount``, ...; :data:`COUNT_ITEMS`), in that order."""
        if isinstance(self.summary_mode, str):
            return ()
        return tuple(COUNT_ITEMS[item] for item in self.summary_mode if item in COUNT_ITEMS)

    @property
    def md5(self) -> bool:
        """True when CRC-32 ("md5") values are requested."""
        return _is_md5(self.summary_mode)

    @property
    def last_step(self) -> Optional[int]:
        """The largest step to dump, or None when every step is dumped."""
        return max(self.step) if self.step else None

    def allows(self, direction: str, io: str) -> bool:
        """Whether data of ``direction`` ('forward'|'backward') and ``io`` ('input'|'output')
        is dumped under ``data_mode``.

        ``('all',)`` allows everything; otherwise the given set, widened to both directions when
        neither 'forward' nor 'backward' is listed and to both io kinds when neither 'input' nor
        'output' is listed.  Raises ValueError for an unknown direction or io kind.
        """
        if direction not in ("forward", "backward") or io not in ("input", "output"):
            raise ValueError(f"allows({direction!r}, {io!r}): expected direction in "
                             "'forward', 'backward' and io in 'input', 'output'")
        modes = set(self.data_mode)
        if "all" in modes:
            return True
        directions_ok = direction in modes or not modes & {"forward", "backward"}
        io_ok = io in modes or not modes & {"input", "output"}
        return directions_ok and io_ok

    def dumps_step(self, step: int) -> bool:
        """Whether ``step`` is dumped: the step list is empty or contains it."""
        return not self.step or step in self.step

    def dumps_rank(self, rank: Optional[int]) -> bool:
        """Whether the process with ``rank`` dumps: the rank list is empty or contains it.

        ``rank=None`` (a non-distributed process) is treated as rank 0.  This differs from the
        reference tool, which disables dumping for such a process whenever the list is non-empty;
        a single process is rank 0 for every practical purpose.
        """
        if not self.rank:
            return True
        return (0 if rank is None else rank) in self.rank


def _check_regex_entry(entry: str, where: Tuple[str, str]) -> None:
    """L2 ``list`` entries ``name-regex(<re>)`` must compile."""
    match = _REGEX_ENTRY.match(entry)
    if not match:
        return
    try:
        re.compile(match.group(1))
    except re.error as exc:
        raise ConfigError(where[0], entry, "'name-regex(<valid regular expression>)'",
                          f"bad regular expression: {exc}", kind=where[1]) from None


def _to_config_error(exc: ValidationError) -> ConfigError:
    """The first error of a pydantic ValidationError as a ConfigError."""
    first = exc.errors()[0]
    original = (first.get("ctx") or {}).get("error")
    if isinstance(original, ConfigError):
        return original
    field = ".".join(str(part) for part in first["loc"]) or "<config>"
    value = first.get("input")
    if first.get("type") == "missing":
        value = None
    allowed = ALLOWED.get(str(first["loc"][0]) if first["loc"] else "", 'see "Configuration" in README.md')
    return ConfigError(field, value, allowed, first.get("msg"))


# --------------------------------------------------------------------------- loading

def _resolve_path(config_path: object) -> Path:
    if config_path is None:
        return DEFAULT_CONFIG_PATH
    if not isinstance(config_path, (str, os.PathLike)) or not os.fspath(config_path):
        raise ConfigError("config_path", config_path, "a path (str or os.PathLike) to a .json file",
                          kind="argument")
    path = Path(os.fspath(config_path))
    if path.suffix.lower() != ".json":
        raise ConfigError("config_path", str(path), "a path to a .json file",
                          "the file name must end in .json", kind="argument")
    if not path.is_file():
        raise ConfigError("config_path", str(path), "a path to an existing .json file",
                          "file does not exist or is not a regular file", kind="argument")
    return path


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("config_path", str(path), "a valid JSON file",
                          f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                          kind="argument") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("config_path", str(path), "a readable UTF-8 JSON file",
                          f"cannot read: {exc}", kind="argument") from None
    if not isinstance(data, dict):
        raise ConfigError("<top level>", data, "a JSON object {...}",
                          f"in {path}: the top level must be an object")
    return data


def _section(data: Dict[str, Any], task: object) -> Tuple[str, Dict[str, Any]]:
    """(name, content) of the task section to read; missing section -> empty."""
    name = task if isinstance(task, str) and task in TASKS else "statistics"
    content = data.get(name)
    if content is None:
        return name, {}
    if not isinstance(content, dict):
        raise ConfigError(name, content, "a JSON object {...} with the task's options")
    return name, content


def _collect(data: Dict[str, Any], overrides: Dict[str, Any],
             source: str = "config.json") -> Tuple[Dict[str, Any], str]:
    """Flatten top-level fields, kwarg overrides and the task section into DumpConfig input
    (``source``: the file's name, for warnings)."""
    _warn_unknown(data.keys(), _TOP_LEVEL_KEYS, "at top level", source)
    raw = {key: data[key] for key in ("rank", "step", "level", "async_dump", "precision",
                                      "extra_info", "watch") if key in data}
    raw["task"] = data.get("task", "statistics")
    raw["dump_path"] = data.get("dump_path")
    raw.update(overrides)
    section_name, section = _section(data, raw["task"])
    if "watch" in section and "watch" not in data:
        # ignored with a warning like other misplaced keys, it would turn a watched run into a dump
        # of every step: an error
        raise ConfigError(f"{section_name}.watch", section["watch"],
                          "a 'watch' object at the top level of config.json (README \"Watch mode\")",
                          f"watch mode is read only at the top level; in section {section_name!r} it "
                          "would be ignored and every step dumped")
    keys = _section_fields(section_name)
    _warn_unknown(section.keys(), set(keys.values()) | _IGNORED_SECTION_KEYS,
                  f"in section '{section_name}'", source)
    if isinstance(data.get("watch"), dict):
        _warn_unknown(data["watch"].keys(), WATCH_KEYS, "in section 'watch'", source)
    _warn_inactive_filters(data, section_name, section, source)
    raw.update({field: section[key] for field, key in keys.items() if key in section})
    return raw, section_name


#: section keys that select what is dumped, and the values that select everything
_FILTER_KEYS = {"scope": ([],), "list": ([],), "data_mode": ([], ["all"]), "tensor_list": ([],)}


def _warn_inactive_filters(data: Dict[str, Any], active: str, section: Dict[str, Any],
                           source: str) -> None:
    """A filter in another task's section is not read: one WARNING per such section, naming its
    fields, the section and the active task, with advice that holds for each field (not an error:
    configs often carry several sections, e.g. the packaged default). Filters that select
    everything, or equal the active section's value, are not named."""
    for name in TASKS:
        other = data.get(name)
        if name == active or not isinstance(other, dict):
            continue
        ignored = [key for key, selects_all in _FILTER_KEYS.items() if key in other
                   and other[key] not in selects_all and other[key] != section.get(key)]
        if not ignored:
            continue
        by_advice: Dict[str, list] = {}
        for key in ignored:
            by_advice.setdefault(_filter_advice(key, name, active), []).append(key)
        parts = []
        for advice, keys in by_advice.items():
            fields = ", ".join(f"'{name}.{key}' ({other[key]!r})" for key in keys)
            parts.append(f"{fields} {'is' if len(keys) == 1 else 'are'} ignored: the active task is "
                         f"{active!r}, which reads section {active!r} only; "
                         + advice.format(it="it" if len(keys) == 1 else "them"))
        logger.warning("%s: %s", source, "; ".join(parts))


#: tasks that record data, so that setting ``"task"`` to one of them is advice worth giving
_DATA_TASKS = ("statistics", "tensor")


def _filter_advice(key: str, section_name: str, active: str) -> str:
    """What to do about filter ``key`` found in the inactive section ``section_name`` (``{it}``:
    placeholder for 'it'/'them'); true for the key: it names only sections that read the key."""
    readers = [name for name in TASKS if key in _section_fields(name).values()]
    use_there = (f'set "task": {json.dumps(section_name)}'
                 if section_name in readers and section_name in _DATA_TASKS else "")
    if active in readers:
        return f"move {{it}} to section {active!r}" + (f", or {use_there}" if use_there else "")
    where = " or ".join(f"section {name!r}" for name in readers)
    return f"{key!r} is read only in {where}" + (f": {use_there} to use it" if use_there else "")


def _section_fields(section_name: str) -> Dict[str, str]:
    """DumpConfig field -> key, for the keys the task section ``section_name`` is read for."""
    keys = dict(_SECTION_KEYS)
    if section_name == "statistics":
        keys.update(_STATISTICS_KEYS)
    if section_name == "tensor":
        keys.update(_TENSOR_KEYS)
    return keys


#: keys a task section may hold that are accepted and ignored (reference-tool compatibility)
_IGNORED_SECTION_KEYS = frozenset({"slice", "request_id", "bench_path", "diff_nums", "white_list",
                                   "black_list", "error_data_path"})


def _places(key: str) -> list:
    """Where ``key`` is read, as the README's "Configuration" table says: 'at the top level',
    "in section 'tensor'", ... (empty for a key read nowhere)."""
    places = ["at the top level"] if key in _TOP_LEVEL_KEYS and key not in TASKS else []
    sections = [name for name in TASKS if key in _section_fields(name).values()]
    if len(sections) == len(TASKS):
        places.append("in the task section (the object named after the task)")
    else:
        places += [f"in section {name!r}" for name in sections]
    if key in WATCH_KEYS:
        places.append("in section 'watch'")
    return places


def _warn_unknown(keys, known, where: str, source: str = "config.json") -> None:
    """A misspelled or misplaced key would silently change the dump: warn, and name where the key
    is read, or else suggest the closest known key."""
    for key in sorted(set(keys) - set(known), key=str):
        places = _places(key)
        if places:
            logger.warning("%s: key %r %s is ignored: it is read only %s (README "
                           "\"Configuration\")", source, key, where, " or ".join(places))
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        logger.warning("%s: unknown key %r %s is ignored%s", source, key, where, hint)


def load_config(config_path: Union[str, "os.PathLike[str]", None] = None, *,
                task: Optional[str] = None, dump_path: Optional[str] = None,
                level: Optional[str] = None, step: Optional[list] = None) -> DumpConfig:
    """Load, merge and validate the dump configuration.

    Args:
        config_path: path (str or os.PathLike) of a ``.json`` config file; ``None`` uses the
            packaged default ``msprobe/config.json``.
        task: overrides the file's ``task`` and selects the section read (one of
            'statistics', 'tensor', 'structure', 'exception_dump').
        dump_path: overrides the file's ``dump_path`` (made absolute, not created).
        level: overrides the file's ``level`` ('L0', 'L1', 'L2', 'mix', 'debug').
        step: overrides the file's ``step`` (list syntax: integers, "3-5" ranges).
        ``None`` means "not given" for every keyword argument.

    Returns:
        The frozen :class:`DumpConfig`.

    Raises:
        ConfigError: ``config_path`` is not a str/PathLike, does not end in ``.json``, does not
            exist, is not valid JSON (the message gives line and column) or its top level is not
            an object; or any field or keyword argument is invalid (the message names it, shows
            the value and what is allowed); or a cross-field rule is violated (``async_dump`` with
            task ``tensor`` and no ``list``, or with ``md5``; ``watch`` outside task statistics at
            L0/L1/mix).

    Logs (logger ``'msprobe'``): a warning when task 'structure' forces level 'mix', when
    ``tensor_list`` is dropped for level 'debug', when ``async_dump`` is on, and for each key
    of the top level, the task section read or ``watch`` that is not read there (naming where it
    is read, or else the closest known key), and for the filters (``scope``, ``list``,
    ``data_mode``, ``tensor_list``) of another task's section, which are not read.
    """
    path = _resolve_path(config_path)
    data = _read_json(path)
    given = {"task": task, "dump_path": dump_path, "level": level, "step": step}
    overrides = {name: value for name, value in given.items() if value is not None}
    raw, section_name = _collect(data, overrides, str(path))
    token = _LOAD_CONTEXT.set({"section": section_name, "arguments": frozenset(overrides)})
    try:
        return DumpConfig(**raw)
    finally:
        _LOAD_CONTEXT.reset(token)
