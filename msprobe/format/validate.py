"""Validation of dump files against the format's JSON Schemas (``msprobe/format/schemas``, draft 2020-12).

The schemas are the machine-readable form of ``docs/FORMAT.md``. :func:`validate_file` checks one
file, :func:`validate_dump_tree` every dump file under a directory; both raise :class:`FormatError`
naming the file (and journal line), the JSON pointer of the offending value and what is wrong.

Beyond the schemas, a file must be strict JSON (``NaN``/``Infinity``/``-Infinity`` tokens are allowed
only where statistics or arguments can be non-finite: ``dump.json``, ``debug.json``, ``dump.journal``),
must not repeat a key in an object, and every ``data_name`` of a finished step must name a file in
its ``dump_tensor_data/``.

Command line: ``python -m msprobe.format DIR_OR_FILE...`` (exit status 1 on the first error).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from importlib import resources

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from msprobe.format.journal import JOURNAL, SCHEMA, TENSOR_DIR, line_kind

try:  # optional: the same schemas checked ~300x faster; jsonschema still reports every error
    import jsonschema_rs
except ImportError:
    jsonschema_rs = None

#: the dump format version written (``"schema"`` field of dump.json/debug.json); the schemas accept
#: the earlier versions still read too (:data:`msprobe.format.journal.OLDER_SCHEMAS`)
SCHEMA_VERSION = SCHEMA

_URN = "urn:msprobe-mindspore:format:1:"

#: file name -> schema name (``schemas/{name}.json``)
FILE_SCHEMAS = {
    "dump.json": "dump",
    "debug.json": "debug",
    "stack.json": "stack",
    "construct.json": "construct",
    "anomalies.json": "anomalies",
    "coverage.json": "coverage",
}
_NON_FINITE_ALLOWED = {"dump.json", "debug.json", JOURNAL}
_STEP_DIR = re.compile(r"^step[0-9]+$")
#: ``rank{R}`` / ``proc{pid}``, or an earlier run's directory moved aside (``….previous-{stamp}[-k]``)
_RANK_DIR = re.compile(r"^(rank[0-9]*|proc[0-9]+)(\.previous-[0-9]{8}-[0-9]{6}(-[0-9]+)?)?$")


class FormatError(ValueError):
    """A dump file breaks the format.

    Attributes:
        path: the file. line: 1-based journal line number, or ``None``.
        pointer: JSON pointer (RFC 6901) of the offending value, ``""`` for the whole document.
        reason: what is wrong.
    """

    def __init__(self, path: str, pointer: str, reason: str, line: int | None = None):
        self.path, self.pointer, self.reason, self.line = path, pointer, reason, line
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: at {pointer or '/'}: {reason}")


def _schema_texts() -> dict:
    folder = resources.files("msprobe.format") / "schemas"
    return {entry.name[:-5]: json.loads(entry.read_text(encoding="utf-8"))
            for entry in folder.iterdir() if entry.name.endswith(".json")}


@functools.lru_cache(maxsize=1)
def _registry() -> Registry:
    resources_ = [(s["$id"], Resource.from_contents(s, default_specification=DRAFT202012))
                  for s in _schema_texts().values()]
    return Registry().with_resources(resources_)


def schema(name: str) -> dict:
    """The JSON Schema ``name`` (``dump``, ``debug``, ``stack``, ``construct``, ``anomalies``,
    ``coverage``, ``journal``, ``common``) as a dict.

    Raises:
        KeyError: no schema of that name.
    """
    return _registry().contents(_URN + name)


@functools.lru_cache(maxsize=None)
def _validator(ref: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": ref}, registry=_registry())


@functools.lru_cache(maxsize=None)
def _fast_validator(ref: str):
    """A ``jsonschema_rs`` validator of ``ref`` (same schemas, same registry), or None when that
    package is missing or cannot build it."""
    if jsonschema_rs is None:
        return None
    try:
        registry = jsonschema_rs.Registry([(s["$id"], s) for s in _schema_texts().values()])
        return jsonschema_rs.validator_for({"$schema": "https://json-schema.org/draft/2020-12/schema",
                                            "$ref": ref}, registry=registry)
    except Exception:  # another version's API: the jsonschema path alone
        return None


def _pointer(parts) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def validate_document(document, name: str, path: str = "<document>", line: int | None = None) -> None:
    """Validate a parsed document against schema ``name`` (see :func:`schema`; ``journal`` = one line).

    Raises:
        FormatError: the first (most relevant) violation.
    """
    ref = _URN + name
    if name == "journal":
        ref += "#/$defs/" + _journal_kind(document, path, line)
    fast = _fast_validator(ref)
    if fast is not None:
        try:
            if fast.is_valid(document):
                return
        except Exception:  # a value it cannot convert (an integer beyond 64 bits): jsonschema decides
            pass
    # not valid for jsonschema_rs (or not checked by it): jsonschema decides, and names the error
    error = best_match(_validator(ref).iter_errors(document))
    if error is not None:
        raise FormatError(path, _pointer(error.absolute_path), error.message, line)


def _journal_kind(rec, path: str, line: int | None) -> str:
    """Which kind of journal line ``rec`` is (:func:`msprobe.format.journal.line_kind`: the name of its
    schema in ``journal.json`` ``$defs``)."""
    if not isinstance(rec, dict):
        raise FormatError(path, "", f"a journal line must be a JSON object, got {type(rec).__name__}", line)
    kind = line_kind(rec)
    if kind is not None:
        return kind
    raise FormatError(path, "", f"not a journal line kind (keys {sorted(rec)}); expected one of "
                                "h; e+k+v; e+k+i+n+v; e+v; e+p+v; e+stack(+v); s+f; c+p", line)


def _strict_object(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _reject_constant(token):
    raise ValueError(f"{token} is not allowed in this file")


def _parse(text: str, path: str, allow_non_finite: bool, line: int | None = None):
    hooks = {"object_pairs_hook": _strict_object}
    if not allow_non_finite:
        hooks["parse_constant"] = _reject_constant
    try:
        return json.loads(text, **hooks)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise FormatError(path, "", f"not valid JSON: {exc}", line) from None


def validate_file(path: str) -> None:
    """Validate one dump file, chosen by its name: ``dump.json``, ``debug.json``, ``stack.json``,
    ``construct.json``, ``anomalies.json``, ``coverage.json`` or ``dump.journal`` (every line; a last
    line without its newline, cut by a kill, is ignored as the reader ignores it).

    Raises:
        FormatError: the file breaks the format. ValueError: not a dump file name.
        OSError: the file cannot be read.
    """
    base = os.path.basename(path)
    if base == JOURNAL:
        _validate_journal(path)
        return
    name = FILE_SCHEMAS.get(base)
    if name is None:
        raise ValueError(f"{path}: not a dump file (expected one of {', '.join([*FILE_SCHEMAS, JOURNAL])})")
    with open(path, encoding="utf-8") as f:
        document = _parse(f.read(), path, base in _NON_FINITE_ALLOWED)
    validate_document(document, name, path)


def _validate_journal(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.endswith("\n"):
                return  # torn last line of a killed process: the reader skips it too
            rec = _parse(text, path, True, number)
            if number == 1 and not (isinstance(rec, dict) and "h" in rec):
                raise FormatError(path, "", "the first journal line must be the header {\"h\": {...}}", 1)
            validate_document(rec, "journal", path, number)


def _data_names(value):
    if isinstance(value, dict):
        name = value.get("data_name")
        if isinstance(name, str) and value.get("type") in ("mindspore.Tensor", "numpy.ndarray"):
            yield name
        else:
            for v in value.values():
                yield from _data_names(v)
    elif isinstance(value, list):
        for v in value:
            yield from _data_names(v)


def check_tensor_files(step_dir: str) -> None:
    """Every ``data_name`` in the finished ``dump.json``/``debug.json`` of ``step_dir`` names a file
    in ``step_dir/dump_tensor_data/`` (and ``dump_data_dir`` is not null).

    Raises:
        FormatError: a ``data_name`` without its file, or with ``dump_data_dir`` null.
    """
    for base in ("dump.json", "debug.json"):
        path = os.path.join(step_dir, base)
        if not os.path.exists(path) or os.path.exists(os.path.join(step_dir, JOURNAL)):
            continue  # an unfinished step: tensors of the last unflushed batch may be missing
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        for entry, body in document.get("data", {}).items():
            for name in _data_names(body):
                if document.get("dump_data_dir") is None:
                    raise FormatError(path, _pointer(["data", entry]),
                                      f"data_name {name!r} while dump_data_dir is null")
                if not os.path.isfile(os.path.join(step_dir, TENSOR_DIR, name)):
                    raise FormatError(path, _pointer(["data", entry]),
                                      f"data_name {name!r} has no file in {TENSOR_DIR}/")


def is_step_dir(directory: str) -> bool:
    """True for a ``step{N}/rank{R}`` or ``step{N}/proc{pid}`` directory (also one moved aside as
    ``….previous-{YYYYmmdd-HHMMSS}[-k]``): the only places dump files are written."""
    directory = os.path.abspath(directory)
    return bool(_RANK_DIR.match(os.path.basename(directory))
                and _STEP_DIR.match(os.path.basename(os.path.dirname(directory))))


def validate_dump_tree(root: str) -> list:
    """Validate every dump file of every step directory (:func:`is_step_dir`) under ``root``, at
    any depth (``pynative/`` and ``graph/`` subtrees included), and the tensor files their
    ``data_name`` fields name. Files elsewhere (a ``config.json``, a file that merely is called
    ``dump.json``) are not dump files and are left alone.

    Returns:
        The validated file paths, sorted.
    Raises:
        FormatError: the first file that breaks the format.
    """
    checked = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != TENSOR_DIR)
        if not is_step_dir(directory):
            continue
        found = [f for f in sorted(files) if f in FILE_SCHEMAS or f == JOURNAL]
        for base in found:
            path = os.path.join(directory, base)
            validate_file(path)
            checked.append(path)
        if "dump.json" in found or "debug.json" in found:
            check_tensor_files(directory)
    return sorted(checked)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m msprobe.format",
                                     description="Validate msprobe dump files against the format schemas.")
    parser.add_argument("paths", nargs="+", help="dump directories or single dump files")
    args = parser.parse_args(argv)
    total = 0
    try:
        for path in args.paths:
            if os.path.isdir(path):
                found = validate_dump_tree(path)
                if not found:
                    print(f"invalid: no dump files found under {path} (looked for {', '.join(sorted(FILE_SCHEMAS))} "
                          f"or {JOURNAL} in step directories step{{N}}/rank{{R}} or step{{N}}/proc{{PID}}, at any "
                          "depth)", file=sys.stderr)
                    return 1
                total += len(found)
            else:
                validate_file(path)
                total += 1
    except (FormatError, ValueError, OSError) as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    print(f"{total} files valid ({SCHEMA_VERSION})")
    return 0


