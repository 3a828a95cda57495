"""The per-call path in C: ``msprobe.tensors._hotpath`` (``_hotpath.c``, built by ``pip install``).

Three steps of every recorded call run there when the extension is built, and in the Python code
they stand for otherwise; both give the same records (``tests/test_hotpath.py`` runs both):

* ``describe`` — :meth:`msprobe.tensors.records.Describer.describe`: ``None``, exact
  ``bool``/``int``/``float``/``str``, Tensors, exact lists, tuples and dicts are walked in C; anything
  else (namedtuples, numpy values, slices, dtypes, subclasses) goes to the Python describer
  (MindSpore dtype objects are described in C too). Without a prefix no tensor gets a ``.npy`` file;
  with one (the value's item name, :func:`msprobe.format.naming.file_prefix`) each tensor is named as
  :func:`msprobe.format.naming.data_file_name` names it (the tensor task's general path,
  ``Runtime._describe_and_queue``).
* ``fill`` — the common case of :func:`msprobe.engine.flush.materialize`: a CPU tensor of a
  dtype numpy holds, or the C-contiguous host snapshot of a Parameter, at least one element, no file,
  no counts, read in place (a non-contiguous tensor copied in C order, as the Python flush does) and
  reduced by the statistics kernel with the rules of :func:`msprobe.tensors.stats.compute_stats`
  (from ``2**21`` elements on over the CPUs free now, as :func:`msprobe.tensors.scan.scan` decides),
  with CRC-32 (``md5``) of the same bytes by :func:`msprobe.tensors.stats.crc32_hex`'s function.
  Finite data whose float64 sums overflow or underflow, 0-d and empty tensors, and bfloat16 stay
  with Python. Memory shown by several tensor objects (same address, element count and dtype) is
  read once per batch.
* ``resolve``/``encode_lines`` — :func:`msprobe.engine.writer.resolve_slots` over journal records,
  then their lines encoded with orjson (a record holding a non-finite float, or one orjson refuses,
  by :func:`msprobe.format.journal.encode_json`).
* ``replay_lines`` — :meth:`msprobe.format.journal.Replay.apply_all` of a batch's resolved lines on the
  writer's live state (:func:`msprobe.engine.flush.replay_batch`): stack uses, keys, items, construct
  edges and stack frames in C, the other kinds (and any line not of the common shape) by
  ``Replay.apply``.
* ``stack_key`` — the ``(id(code), f_lasti, ...)`` key of the calling frames of
  :meth:`msprobe.engine.stacks.StackTable.current`.
* ``grad_node``/``grad_targets`` — :func:`msprobe.capture.backward._node_of` and ``_targets`` (which
  arguments of a call take part in the gradient, with their autograd nodes); ``slots_nbytes`` — the
  batch-size estimate of :meth:`msprobe.engine.runtime.Runtime.record_items` and friends.
* ``observe_plain`` — :meth:`msprobe.capture.backward.BackwardProbe.observe` for a Tensor output made by
  one autograd node from positional Tensor arguments, or an argument returned itself: the same hooks,
  as compiled ``GradHook`` objects that hand ``Runtime.record_items`` the items the Python closures
  hand it; any other call is left to the Python code. ``item_lines`` — the journal item lines of one
  node's gradients (:func:`msprobe.format.journal.item_line` of each described value) in one call,
  for the tensor task (no ``tensor_budget_mb``) with their ``.npy`` files named as
  ``Runtime.record_item`` names them.
* The compiled recorder (``Recorder``), while the runtime reads Parameters at once (synchronous CPU
  launch, ``Runtime._parameters_now``), takes the statistics of a call's Parameters when it describes
  them, as ``fill_parameters`` does for a Cell's, instead of host-copying them for the flush (the same
  numbers: the same bytes, the same kernel).

:data:`ext` is the extension, or ``None`` when it is not built or ``MSPROBE_PURE_PYTHON=1`` is set
(then only the Python code runs). Callers read ``hotpath.ext`` at each use, so tests can switch it.
"""
from __future__ import annotations

import os
import sys

import numpy as np

try:
    from msprobe.tensors import _hotpath
except ImportError:  # not compiled (no C compiler at install time): Python only
    _hotpath = None

from msprobe.tensors import scan as _scan

__all__ = ["ext", "AVAILABLE", "configure", "float_dtypes"]

#: dump.json dtype name -> (kernel kind, item size): the dtypes :func:`fill` reads in place
_KINDS = {"Float16": ("f2", 2), "Float32": ("f4", 4), "Float64": ("f8", 8), "Int8": ("i1", 1),
          "Int16": ("i2", 2), "Int32": ("i4", 4), "Int64": ("i8", 8), "UInt8": ("u1", 1),
          "UInt16": ("u2", 2), "UInt32": ("u4", 4), "UInt64": ("u8", 8), "Bool": ("b1", 1)}

#: Whether the extension and the statistics kernel it calls are both built.
AVAILABLE = _hotpath is not None and _scan.KERNEL_AVAILABLE


def float_dtypes() -> frozenset:
    """The floating-point MindSpore dtypes whose tensors take gradients (``float16``, ``float32``,
    ``float64``, ``bfloat16``): what :func:`msprobe.capture.backward._node_of` and the compiled
    ``grad_node`` accept."""
    from mindspore.common import dtype as mstype

    return frozenset((mstype.float16, mstype.float32, mstype.float64, mstype.bfloat16))


def configure():
    """The configured extension (MindSpore types, dtype names, kernel), or ``None`` when it is not
    built, the statistics kernel is not built, or ``MSPROBE_PURE_PYTHON=1``."""
    if not AVAILABLE or os.environ.get("MSPROBE_PURE_PYTHON") == "1":
        return None
    import orjson
    from mindspore import Parameter, Tensor
    from mindspore._c_expression import TensorPy  # what Tensor.is_contiguous/data_ptr call
    from mindspore.common import dtype as mstype

    from msprobe.tensors.stats import MS_DTYPE_NAMES, _crc32

    _hotpath.setup(tensor=Tensor, parameter=Parameter, dtype_names=dict(MS_DTYPE_NAMES),
                   kinds=dict(_KINDS) if sys.byteorder == "little" else {},
                   scan=_scan._stats_kernel.scan, split=_scan._SPLIT,
                   is_contiguous=TensorPy.is_contiguous, data_ptr=TensorPy._data_ptr,
                   dumps=orjson.dumps, line_option=orjson.OPT_APPEND_NEWLINE, crc32=_crc32, ndarray=np.ndarray,
                   stride=TensorPy.stride, free_cpus=_scan.free_cpus,
                   scan_strided=getattr(_scan._stats_kernel, "scan_strided", None))
    _hotpath.setup_calls(dtype_type=mstype.Type, float_dtypes=float_dtypes())
    return _hotpath


#: the extension when it runs (see the module docstring), else ``None``
ext = configure()


#: numpy dtype -> the dump.json dtype name of a ``mindspore.Tensor`` wrapping an array of it, for the
#: dtypes :data:`_KINDS` reads in place (filled by :func:`host_slots` at its first use)
_HOST_NAMES: dict = {}


def _host_names() -> dict:
    from mindspore import Tensor

    for kind, size in _KINDS.values():
        dtype = np.dtype("?" if kind == "b1" else f"{kind[0]}{size}")
        probe: list = []
        ext.describe(Tensor.from_numpy(np.zeros(1, dtype)), None, probe, None)
        _HOST_NAMES[dtype] = probe[0].dtype
    return _HOST_NAMES


def host_slots(arrays) -> list | None:
    """Statistics slots of host arrays (``numpy.ndarray``, C-contiguous, the tool's own copies), one
    per array, described as :func:`describe` describes ``mindspore.Tensor.from_numpy(array)``: the
    same ``dump.json`` leaf, read by :func:`fill` from the array's memory (the same bytes) without
    making the Tensor. ``None`` when the extension does not run or an array is not of a dtype
    :func:`fill` reads, 0-d, empty or not C-contiguous (then describe the Tensor).

    Args:
        arrays: sequence of ``numpy.ndarray``.
    """
    if ext is None:
        return None
    names = _HOST_NAMES or _host_names()
    slot, ndarray = ext.TensorSlot, np.ndarray
    slots = []
    for array in arrays:
        name = names.get(array.dtype) if type(array) is ndarray else None
        if name is None or not array.size or not array.ndim or not array.flags.c_contiguous:
            return None
        slots.append(slot(array, None, name, list(array.shape), "mindspore.Tensor"))
    return slots
