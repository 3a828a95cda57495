"""Records: plain data describing the values an API or Cell saw.

:func:`describe` walks an argument structure and returns a JSON-shaped structure in which every
tensor is a :class:`TensorSlot`: a reference to the tensor plus what is already known without touching
its data (dtype, shape, file name). Slots are filled with statistics later, at flush time, by
:mod:`msprobe.engine.flush`; hooks never read tensor data themselves.

Leaf formats (``dump.json``):

* tensor: ``{"type": "mindspore.Tensor", "dtype", "shape", "Max", "Min", "Mean", "Norm"[, "data_name"][, "md5"]}``
* ``bool``/``int``/``float``/``str``: ``{"type": <name>, "value": v}``
* ``slice``: ``{"type": "slice", "value": [start, stop, step]}``; ``...``: ``{"type": "ellipsis", "value": "..."}``
* numpy scalar: ``{"type": <numpy type name>, "value": v.item()}``; ``numpy.ndarray``: statistics like a tensor
* MindSpore dtype: ``{"type": "mindspore.dtype", "value": "Float16"}``
* ``None`` and unsupported objects: ``null``
* list/tuple: JSON array; dict: object; namedtuple: object keyed by field name (stable paths such as
  ``output.logits``).
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor
from mindspore.common import dtype as mstype

from msprobe.format.naming import item_name, shorten_file_name
from msprobe.tensors import hotpath
from msprobe.tensors.stats import dtype_name

#: deepest nesting walked; deeper values are recorded as null with a note
MAX_DEPTH = 64

_DTYPE_TYPES = (mstype.Type,)


class TensorSlot:
    """A tensor waiting for its statistics.

    Attributes:
        tensor: the MindSpore tensor (or a snapshot of it), or a numpy array.
        data_name: ``.npy`` file name when the tensor is to be saved, else ``None``.
        dtype: dump.json dtype string of the original tensor.
        shape: list of ints.
    """

    __slots__ = ("tensor", "data_name", "dtype", "shape", "type_name", "leaf")

    def __init__(self, tensor, data_name, dtype: str, shape: list, type_name: str):
        self.tensor = tensor
        self.data_name = data_name
        self.dtype = dtype
        self.shape = shape
        self.type_name = type_name
        self.leaf = None

    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * 4


#: the compiled slot type when the extension runs (same attributes and constructor), so the C and
#: Python paths make and read the same objects
PyTensorSlot = TensorSlot
if hotpath.ext is not None:
    TensorSlot = hotpath.ext.TensorSlot  # noqa: F811


class Describer:
    """Turns values into record structures for one entry.

    Args:
        name_for: ``callable(index_path) -> str | None`` giving the ``.npy`` name of the tensor at
            ``index_path`` when it must be saved, else ``None``.
        snapshot: ``callable(tensor) -> tensor`` applied to tensors that may change before the flush
            (Parameters); identity for others.
    """

    def __init__(self, name_for, snapshot):
        self.name_for = name_for
        self.snapshot = snapshot
        self.slots: list[TensorSlot] = []

    def describe(self, value, path: tuple = (), depth: int = 0):
        if isinstance(value, Tensor):
            return self._tensor(value, path)
        if value is None:
            return None
        if isinstance(value, (bool, int, float, str)):
            return {"type": type(value).__name__, "value": value}
        if depth >= MAX_DEPTH:
            return None
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return {f: self.describe(v, path + (f,), depth + 1) for f, v in zip(value._fields, value)}
        if isinstance(value, (list, tuple)):
            return [self.describe(v, path + (i,), depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): self.describe(v, path + (k,), depth + 1) for k, v in value.items()}
        return self._other(value, path)

    def _tensor(self, t: Tensor, path: tuple) -> TensorSlot:
        slot = TensorSlot(self.snapshot(t), self.name_for(path), dtype_name(t), list(t.shape),
                          "mindspore.Tensor")
        self.slots.append(slot)
        return slot

    def _other(self, value, path: tuple):
        if isinstance(value, slice):
            return {"type": "slice", "value": [_int_or_none(value.start), _int_or_none(value.stop),
                                               _int_or_none(value.step)]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        if isinstance(value, np.generic):
            item = value.item()
            if not isinstance(item, (bool, int, float, str)) and item is not None:
                item = str(value)  # complex, datetime64, bytes_: JSON has no such value, its text is kept
            return {"type": type(value).__name__, "value": item}
        if isinstance(value, np.ndarray):
            slot = TensorSlot(value.copy(), self.name_for(path), str(value.dtype), list(value.shape),
                              "numpy.ndarray")
            self.slots.append(slot)
            return slot
        if isinstance(value, _DTYPE_TYPES):
            return {"type": "mindspore.dtype", "value": str(value)}
        return None


def describe_other(value, depth: int, slots: list, snapshot, prefix: str | None = None):
    """What the compiled describer (:mod:`msprobe.tensors.hotpath`) hands back: ``value`` at nesting
    ``depth`` described by :class:`Describer`, its tensors appended to ``slots``; with ``prefix``
    (``str``, the item name of ``value``) each tensor at ``path`` inside it is named
    ``shorten_file_name(item_name(prefix, *path) + ".npy")``, without it no tensor gets a file."""
    describer = Describer(_no_name if prefix is None else _Names(prefix), snapshot)
    describer.slots = slots
    return describer.describe(value, (), depth)


class _Names:
    """``name_for`` of :class:`Describer` for the tensors inside the value whose item name is
    ``prefix`` (the rule of :func:`msprobe.format.naming.data_file_name`)."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, path: tuple) -> str:
        return shorten_file_name(item_name(self.prefix, *path) + ".npy")


def _no_name(path):
    return None


def _int_or_none(v):
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
