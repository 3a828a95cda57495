"""The one grammar for entry names and tensor file names (seed: "dump结果文件说明").

Entry names (keys of ``dump.json["data"]``):

* API / Primitive / Jit: ``{prefix}.{api}.{n}.{forward|backward}`` e.g. ``Functional.relu.0.forward``,
  ``Primitive.conv1.Conv2D.0.forward``; ``n`` counts calls of that API within the step.
* Cell: ``Cell.{path}.{Class}.{forward|backward}.{k}`` e.g. ``Cell.conv2.Conv2d.forward.0``.
* Parameter gradients: ``Cell.{path}.{Class}.parameters_grad.{g}``.
* Debug level: ``{name}.{count}.debug``; the gradient of a saved value ``{name}_grad.{count}.debug``.

Call counters (:meth:`msprobe.engine.runtime.Runtime.next_count`) are keyed by names of the same
grammar: the API name for API calls, :func:`cell_counter`, :func:`param_grad_counter`,
:func:`debug_counter`.

Tensor files (``dump_tensor_data/``): ``{entry}.{category}.{index path}.npy`` where category is
``input`` (positional args, and backward ``input``), ``kwargs``, ``output`` or ``parameters``, e.g.
``Functional.split.0.forward.input.0.npy``, ``Cell.conv1.Conv2d.forward.0.parameters.weight.npy``;
parameter gradients ``{prefix}.parameters_grad.{g}.{param}.npy``. L2 kernel files keep MindSpore's
names (:func:`kernel_file_name`).
"""
from __future__ import annotations

import hashlib
import re

FORWARD = "forward"
BACKWARD = "backward"
#: the prefix of a compiled region's API name (``Jit.{function}``): a ``mindspore.jit`` call
JIT_PREFIX = "Jit."

#: longest file name most file systems accept, in bytes
MAX_FILE_NAME_BYTES = 255

_COUNT = re.compile(r"^\d+$")


def api_entry(api: str, count: int, direction: str) -> str:
    """Entry name of an API call, ``api`` being ``"{prefix}.{name}"`` (e.g. ``"Tensor.__add__"``)."""
    return f"{api}.{count}.{direction}"


def cell_entry(cell_prefix: str, direction: str, count: int) -> str:
    """Entry name of a Cell call, ``cell_prefix`` being ``"Cell.{path}.{Class}"``."""
    return f"{cell_prefix}.{direction}.{count}"


def backward_of(entry: str | None) -> str | None:
    """The backward entry of a forward one (``X.3.forward`` -> ``X.3.backward``,
    ``Cell.a.B.forward.2`` -> ``Cell.a.B.backward.2``); ``None`` for ``None`` or another name."""
    return _other_direction(entry, FORWARD, BACKWARD)


def forward_of(entry: str | None) -> str | None:
    """The forward entry a backward entry pairs with (``X.3.backward`` -> ``X.3.forward``,
    ``Cell.a.B.backward.2`` -> ``Cell.a.B.forward.2``); ``None`` for any other name."""
    return _other_direction(entry, BACKWARD, FORWARD)


def _other_direction(entry, have: str, want: str):
    if entry is None:
        return None
    head, _, last = entry.rpartition(".")
    if last == have:  # API: {prefix}.{api}.{n}.{direction}
        return f"{head}.{want}"
    head2, _, direction = head.rpartition(".")
    if direction == have and last.isdigit():  # Cell: Cell.{path}.{Class}.{direction}.{k}
        return f"{head2}.{want}.{last}"
    return None


PARAMETERS_GRAD = "parameters_grad"
DEBUG = "debug"


def param_grad_entry(cell_prefix: str, count: int) -> str:
    """Entry name holding the parameter gradients of one Cell."""
    return f"{cell_prefix}.{PARAMETERS_GRAD}.{count}"


def param_grad_calls(entry: str) -> tuple | None:
    """The forward and backward Cell entries a parameter-gradient entry belongs to
    (``Cell.a.B.parameters_grad.2`` -> ``("Cell.a.B.forward.2", "Cell.a.B.backward.2")``);
    ``None`` for any other name."""
    head, _, count = entry.rpartition(".")
    prefix, _, kind = head.rpartition(".")
    if kind != PARAMETERS_GRAD or not count.isdigit():
        return None
    return f"{prefix}.{FORWARD}.{count}", f"{prefix}.{BACKWARD}.{count}"


def upstream_names(entry: str) -> list:
    """Entries whose tensor inputs also feed ``entry``: a backward entry's forward call (the
    gradient is computed from the forward's inputs too); a Cell's parameter gradients' forward call
    and backward call. Empty for any other name."""
    calls = param_grad_calls(entry)
    if calls is not None:
        return list(calls)
    fwd = forward_of(entry)
    return [fwd] if fwd else []


def cell_counter(cell_prefix: str) -> str:
    """Counter key numbering a Cell's forward calls (``k`` of :func:`cell_entry`)."""
    return f"{cell_prefix}.{FORWARD}"


def param_grad_counter(cell_prefix: str) -> str:
    """Counter key numbering a Cell's parameter-gradient entries (``count`` of
    :func:`param_grad_entry`)."""
    return f"{cell_prefix}.{PARAMETERS_GRAD}"


def debug_counter(name: str) -> str:
    """Counter key numbering the ``save()`` calls of one variable name."""
    return f"{name}.{DEBUG}"


def debug_entry(name: str, count: int) -> str:
    """Entry name of the ``count``-th ``save(variable, name)`` of a step: ``{name}.{count}.debug``."""
    return f"{name}.{count}.{DEBUG}"


def debug_grad_entry(name: str, count: int) -> str:
    """Entry name of the gradient of that saved value: ``{name}_grad.{count}.debug``."""
    return f"{name}_grad.{count}.{DEBUG}"


def item_name(entry: str, *path) -> str:
    """The name of one item inside an entry: ``entry`` and the item's keys or indices joined by dots
    (``item_name("x_grad.0.debug", 1, 0)`` -> ``"x_grad.0.debug.1.0"``; without ``path`` the entry
    itself). Tensor file names (:func:`data_file_name`) and compare rows use this grammar."""
    return ".".join([entry, *map(str, path)])


def cell_prefix(path: str, class_name: str, index: int | None = None) -> str:
    """``Cell.{[index.]}{path}.{Class}``; ``index`` is the model's position when a list was passed."""
    head = "Cell" if index is None else f"Cell.{index}"
    return f"{head}.{path}.{class_name}"


def is_param_grad(entry: str) -> bool:
    """Whether ``entry`` holds parameter gradients (``….parameters_grad.{g}``, or the reference tool's
    ``….parameters_grad`` without a count)."""
    return f".{PARAMETERS_GRAD}." in entry or entry.endswith(f".{PARAMETERS_GRAD}")


def is_debug(entry: str) -> bool:
    """Whether ``entry`` is a debug-level entry (``{name}.{count}.debug``)."""
    return entry.endswith(f".{DEBUG}")


def direction_of(entry: str) -> str:
    """``"forward"`` or ``"backward"``: backward entries, parameter gradients and the debug level's
    gradients (``{name}_grad.{count}.debug``) are backward; every other entry is forward."""
    if f".{BACKWARD}" in entry or f".{PARAMETERS_GRAD}" in entry:
        return BACKWARD
    parts = entry.split(".")
    if parts[-1] == DEBUG and len(parts) >= 3 and parts[-3].endswith("_grad"):
        return BACKWARD
    return FORWARD


def api_key(entry: str) -> str:
    """The entry's API or Cell class and its direction, without call counter or Cell path:
    ``Functional.relu.3.forward`` -> ``Functional.relu.forward``; ``Cell.layer.0.fc.Dense.forward.2``
    -> ``Cell.Dense.forward``; ``Cell.fc.Dense.parameters_grad.0`` -> ``Cell.Dense.parameters_grad``;
    ``h.1.debug`` -> ``h.debug``; any other name is returned as it is."""
    parts = entry.split(".")
    if parts[0] == "Cell" and len(parts) >= 4 and _COUNT.match(parts[-1]):
        return f"Cell.{parts[-3]}.{parts[-2]}"
    if len(parts) >= 3 and parts[-1] in (FORWARD, BACKWARD, DEBUG) and _COUNT.match(parts[-2]):
        return ".".join(parts[:-2] + parts[-1:])
    return entry


def data_file_name(entry: str, category: str, index_path: tuple) -> str:
    """Name of the ``.npy`` file of one tensor, shortened when longer than 255 bytes.

    A name over :data:`MAX_FILE_NAME_BYTES` keeps its first 200 characters plus a SHA-1 suffix, so it
    stays unique and loadable; ``dump.json`` keeps the entry's full name next to ``data_name``.
    """
    return shorten_file_name(item_name(entry, *([category] if category else []), *index_path) + ".npy")


def file_prefix(entry: str, category: str, index_path: tuple = ()) -> str:
    """The item name that :func:`data_file_name` of ``(entry, category, index_path + path)`` extends
    with ``path``: the ``.npy`` name of a tensor at ``path`` inside a value is
    ``shorten_file_name(item_name(prefix, *path) + ".npy")``."""
    return item_name(entry, *([category] if category else []), *index_path)


def shorten_file_name(name: str) -> str:
    """``name`` (a ``.npy`` file name) itself, or, when longer than :data:`MAX_FILE_NAME_BYTES` bytes in
    UTF-8, its first 200 characters plus a SHA-1 suffix (unique and loadable)."""
    if len(name.encode()) <= MAX_FILE_NAME_BYTES:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()
    return f"{name.encode()[:200].decode(errors='ignore')}.{digest}.npy"


def kernel_file_name(name: str) -> str:
    """The name of an L2 kernel file in the seed's layout: MindSpore's file name ``name`` itself, or,
    when longer than :data:`MAX_FILE_NAME_BYTES`, a 32-digit name derived from a hash of ``name``
    (deterministic, so collecting twice agrees; ``mapping.csv`` lists the original)."""
    if len(name.encode()) <= MAX_FILE_NAME_BYTES:
        return name
    digits = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 10 ** 32
    suffix = ".npy" if name.endswith(".npy") else ""
    return f"{digits:032d}{suffix}"
