"""Exact tensor statistics, CRC-32, host conversion and ``.npy`` files.

This module runs at flush time, off the per-call hot path: the engine hands it
MindSpore tensors that are already materialised, and it turns each one into a
host numpy array (:func:`to_host`), computes the four ``dump.json`` statistics
(:func:`compute_stats`), the ``md5`` field (:func:`crc32_hex`) and writes or
reads tensor files (:func:`save_npy`, :func:`load_npy`).

Statistics rules of :func:`compute_stats` (one rule per case, checked in this
order):

1. **Empty** array (``size == 0``): ``Max``, ``Min``, ``Mean``, ``Norm`` are all
   ``None``.
2. **bool**: ``Max`` = any element true, ``Min`` = all elements true (Python
   ``bool``); ``Mean`` and ``Norm`` are ``None``. This also holds for 0-d bools.
3. **0-d** (scalar) array: ``Max``, ``Min`` and ``Mean`` are the scalar itself
   as a Python number in its own kind (an integer stays ``int``, a float is a
   ``float``); ``Norm`` is its magnitude ``abs(x)`` (a norm is never negative:
   ``-0.0747`` gives ``Norm`` ``0.0747``, ``-7`` gives ``7``, ``-0.0`` gives
   ``0.0``), as for a one-element array. A complex scalar gives its magnitude
   ``abs(x)`` (a ``float``) for all four, following rule 6.
4. **Integers** (int8 ... uint64): ``Max``/``Min`` are the exact extremes as
   Python ``int``. ``Mean`` is the *exact* integer sum divided by the element
   count (correctly rounded Python ``float``; no overflow at any size).
   ``Norm`` = ``sqrt(sum(x*x))`` with each element converted to float64 and the
   sum accumulated in float64 (never in the integer type, so it cannot wrap).
5. **Floats** (float16, float32, float64, bfloat16; :func:`to_host` gives
   bfloat16 as float32, the same values): ``Max``/``Min`` are element values, exact, as Python
   ``float``. ``Mean`` = sum / n and ``Norm`` = sqrt(sum of squares), both
   accumulated in float64 whatever the input precision (float16/float32
   squares are exact in float64, so e.g. ``full(1000, 300, float16)`` gives
   ``300*sqrt(1000)`` instead of an fp16 overflow). When float64 data are
   finite but the float64 sum or sum of squares overflows or underflows
   (magnitudes near 1e±154 and beyond), they are recomputed scaled by the
   largest magnitude, so the result is finite and accurate.
6. **Complex** (complex64, complex128): statistics of the magnitudes
   ``|x|``, computed in float64 (complex64 is upcast first), then rule 5.
7. **NaN / Inf rule** (numpy semantics, the same for every dtype): if any
   element is NaN, ``Max``, ``Min``, ``Mean`` and ``Norm`` are all NaN.
   Otherwise ±Inf propagate as IEEE arithmetic dictates: ``Max`` = +inf if any
   +inf, ``Min`` = -inf if any -inf, ``Mean`` = ±inf (NaN if both +inf and
   -inf are present), ``Norm`` = +inf. Values are Python ``float`` ``nan`` /
   ``inf``; no warning is emitted.

Other dtypes (strings, objects, structured) raise ``TypeError``.

Cost: one pass over the data (:func:`msprobe.tensors.scan.scan`): the compiled
kernel ``msprobe.tensors._stats_kernel`` (vectorised, GIL released, large tensors
split across threads; bfloat16 read as its uint16 bits), or NumPy in chunks
that stay in cache when the kernel is not built. Neither allocates a float64
copy of the data. How close Mean and Norm are to the correctly rounded values
(``SUM_TOLERANCE``) is stated in :mod:`msprobe.tensors.scan`; Max, Min, integer
Means and the NaN/Inf rules are exact and the same for both.

Only numpy is needed at import time; MindSpore is imported lazily, on first use
of :data:`MS_DTYPE_NAMES` (so readers of dumps do not pay for it).
"""

from __future__ import annotations

import functools
import math
import sys
import zlib
from typing import Optional, Any, Dict, Tuple

import numpy as np

from msprobe.format.npy import bf16_bits_to_float32, is_extension_dtype, load_npy, save_npy
from msprobe.tensors.scan import Scan, scan

try:  # zlib-ng: the same CRC-32 as zlib, vectorised (PCLMULQDQ), GIL released: ~5x zlib's speed here
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; zlib gives the same values
    _crc32 = zlib.crc32

__all__ = [
    "MS_DTYPE_NAMES",
    "dtype_name",
    "to_host",
    "compute_stats",
    "crc32_hex",
    "save_npy",
    "load_npy",
]

_TINY = float(np.finfo(np.float64).tiny)

#: How :func:`to_host` stored a tensor whose values numpy can hold as they are.
NATIVE = "native"

#: ``.npy`` descriptors MindSpore writes for bfloat16 data (numpy rejects them).

_STAT_KEYS = ("Max", "Min", "Mean", "Norm")

_MS_NAMES = (
    ("float16", "Float16"),
    ("float32", "Float32"),
    ("float64", "Float64"),
    ("bfloat16", "BFloat16"),
    ("int8", "Int8"),
    ("int16", "Int16"),
    ("int32", "Int32"),
    ("int64", "Int64"),
    ("uint8", "UInt8"),
    ("uint16", "UInt16"),
    ("uint32", "UInt32"),
    ("uint64", "UInt64"),
    ("bool_", "Bool"),
    ("complex64", "Complex64"),
    ("complex128", "Complex128"),
)


@functools.lru_cache(maxsize=1)
def _ms_dtype_names() -> Dict[Any, str]:
    import mindspore as ms  # lazy: 1.7 s import, not needed to read dumps

    return {getattr(ms, attr): name for attr, name in _MS_NAMES}


def __getattr__(name: str) -> Any:
    """Module attribute hook (PEP 562) that builds ``MS_DTYPE_NAMES`` lazily.

    ``MS_DTYPE_NAMES``: ``dict`` mapping each MindSpore dtype object
    (``mindspore.float32``, ``mindspore.bfloat16``, ...) to its ``dump.json``
    name (``'Float32'``, ``'BFloat16'``, ...). On MindSpore 2.10 every name
    equals ``str(dtype)``.
    """
    if name == "MS_DTYPE_NAMES":
        return _ms_dtype_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------
# dtype names and host conversion
# --------------------------------------------------------------------------


def dtype_name(tensor: Any) -> str:
    """Return the ``dump.json`` dtype string of the *original* value.

    Args:
        tensor: a ``mindspore.Tensor`` (also ``Parameter``/StubTensor) or a
            ``numpy.ndarray``.

    Returns:
        For MindSpore tensors the MindSpore name, e.g. ``'Float32'``,
        ``'BFloat16'``, ``'Bool'`` (``str(dtype)`` for dtypes outside
        :data:`MS_DTYPE_NAMES`, e.g. ``'Float8E4M3FN'``). For numpy arrays
        ``str(arr.dtype)``, e.g. ``'float32'``, as the reference tool records.

    Raises:
        AttributeError: ``tensor`` has no ``dtype``.
    """
    dtype = tensor.dtype
    if isinstance(tensor, np.ndarray):
        return str(dtype)
    return _ms_dtype_names().get(dtype) or str(dtype)


@functools.lru_cache(maxsize=1)
def _ms_typestrs() -> Dict[Any, Tuple[str, int]]:
    """MindSpore dtype -> (numpy array-interface typestr, item size) for the dtypes numpy holds."""
    import mindspore as ms

    if sys.byteorder != "little":
        return {}
    pairs = (("float16", "<f2"), ("float32", "<f4"), ("float64", "<f8"), ("int8", "|i1"),
             ("int16", "<i2"), ("int32", "<i4"), ("int64", "<i8"), ("uint8", "|u1"), ("uint16", "<u2"),
             ("uint32", "<u4"), ("uint64", "<u8"), ("bool_", "|b1"))
    return {getattr(ms, attr): (typestr, int(typestr[2])) for attr, typestr in pairs}


class _HostMemory:
    """Array-interface owner: numpy views the tensor's memory and keeps the tensor alive."""

    __slots__ = ("tensor", "__array_interface__")


def pynative_executor():
    """MindSpore's PyNative executor (``sync()``, ``requires_grad()``), from where this MindSpore
    keeps it (``mindspore.graph.api`` since 2.9; ``mindspore.common.api`` warns as deprecated)."""
    try:
        from mindspore.graph.api import _pynative_executor
    except ImportError:  # older MindSpore layouts
        from mindspore.common.api import _pynative_executor
    return _pynative_executor


def host_memory_readable() -> bool:
    """True when tensor memory is host memory (CPU device target); then waits once for every queued
    operation, so :func:`to_host` with ``zero_copy=True`` may read tensors directly."""
    if device_target() != "CPU":
        return False
    pynative_executor().sync()
    return True


def device_target() -> str:
    """MindSpore's ``device_target`` now (``"CPU"``, ``"GPU"``, ``"Ascend"``): the value
    ``mindspore.get_context("device_target")`` returns, read from the context itself (~2 µs; that
    function checks its argument against every device-specific option first, ~25 µs), so a change
    of the context is seen at the next call."""
    read = _DEVICE_TARGET
    if not read:
        try:
            from mindspore.context import _context, ms_ctx_param

            context, key = _context(), ms_ctx_param.device_target
            read.append(lambda: context.get_param(key))
        except (ImportError, AttributeError):  # another MindSpore layout: the public function
            import mindspore as ms

            read.append(lambda: ms.get_context("device_target"))
    return read[0]()


#: the reader :func:`device_target` uses (MindSpore's one context object and the parameter's key)
_DEVICE_TARGET: list = []


def graph_mode() -> bool:
    """Whether MindSpore's execution mode is GRAPH_MODE now (``mindspore.get_context("mode")``)."""
    import mindspore as ms

    return ms.get_context("mode") == ms.GRAPH_MODE


def _zero_copy_view(tensor: Any) -> Optional[np.ndarray]:
    """The tensor's data as a C-contiguous numpy array read from its own memory (``Tensor.data_ptr``,
    ``Tensor.stride``): a read-only view for contiguous tensors; for a non-contiguous view, numpy's
    copy of the strided memory (``asnumpy`` takes ~0.3 ms for a 64 KB transpose here). Contiguous
    like ``asnumpy``'s result, so the float64 sums, hence Mean and Norm, are the same bits.
    ``None`` for dtypes numpy lacks, lazy-initialised and empty tensors."""
    spec = _ms_typestrs().get(tensor.dtype)
    if spec is None or tensor.has_init:
        return None
    shape = tuple(tensor.shape)
    if 0 in shape:
        return None
    typestr, itemsize = spec
    strides = None if tensor.is_contiguous() else tuple(s * itemsize for s in tensor.stride())
    owner = _HostMemory()
    owner.tensor = tensor
    owner.__array_interface__ = {"version": 3, "data": (tensor.data_ptr(), True), "shape": shape,
                                 "typestr": typestr, "strides": strides}
    view = np.asarray(owner)
    return view if strides is None else np.ascontiguousarray(view)


def views_live_tensor(arr: np.ndarray) -> bool:
    """True when ``arr`` reads a tensor's memory in place (a zero-copy view made by :func:`to_host`)
    and keeps that tensor alive: its memory is not freed or reused while ``arr`` exists, but an
    in-place operation on the tensor changes what ``arr`` holds."""
    while isinstance(arr, np.ndarray):
        arr = arr.base
    return isinstance(arr, _HostMemory)


def synchronous_cpu() -> bool:
    """True when operations finish before they return (``mindspore.runtime.launch_blocking()``) on
    the CPU device target: a tensor's memory then holds its final value, readable at once."""
    try:
        from mindspore._c_expression import RuntimeConf

        blocking = RuntimeConf.get_instance().is_launch_blocking()
    except (ImportError, AttributeError):  # another MindSpore: assume asynchronous launch
        return False
    return bool(blocking) and device_target() == "CPU"


def host_copy(tensor: Any) -> Optional[np.ndarray]:
    """A host copy of a CPU tensor's data, or ``None`` when it cannot be made directly (dtypes
    numpy lacks, lazy-initialised or empty tensors). The caller guarantees the data are final
    (:func:`synchronous_cpu`)."""
    view = _zero_copy_view(tensor)
    return None if view is None else np.array(view)


def to_host(tensor: Any, zero_copy: bool = False) -> Tuple[np.ndarray, str]:
    """Convert a materialised tensor to a host numpy array.

    Args:
        tensor: a ``mindspore.Tensor`` (any shape, on the CPU backend) or a
            ``numpy.ndarray``. The caller guarantees it is materialised.
        zero_copy: the caller has checked :func:`host_memory_readable` (CPU, all
            queued work done): view the tensor's memory directly, strides
            included, instead of ``asnumpy()``.

    Returns:
        ``(array, how)``. For dtypes numpy holds natively ``array`` is the
        zero-copy ``tensor.asnumpy()`` (it shares memory with the tensor: do
        not modify it) and ``how`` is ``'native'``. bfloat16 is upcast bit
        exactly to float32 (``how == 'bfloat16->float32'``); other
        non-numpy floats (FP8) are cast to float32 with
        ``how == '<lower-case dtype name>->float32'``.

    Raises:
        TypeError: the value has a dtype that cannot be converted to float32.
    """
    if isinstance(tensor, np.ndarray):
        return _upcast_extension(tensor, tensor.dtype.name.lower())
    if zero_copy:
        view = _zero_copy_view(tensor)
        if view is not None:
            return view, "native"
    original = dtype_name(tensor).lower()
    if original == "bfloat16":
        return bf16_bits_to_float32(_bf16_bits(tensor)), "bfloat16->float32"
    return _upcast_extension(tensor.asnumpy(), original)


def _bf16_bits(tensor: Any) -> np.ndarray:
    """Raw uint16 bits of a MindSpore bfloat16 tensor (zero-copy when possible)."""
    try:
        return tensor.asnumpy().view(np.uint16)
    except (TypeError, ValueError, RuntimeError, SystemError):
        import mindspore as ms

        return tensor.view(ms.uint16).asnumpy()


def _upcast_extension(arr: np.ndarray, name: str) -> Tuple[np.ndarray, str]:
    """Return ``arr`` unchanged, or as float32 if its dtype is an extension float."""
    if not is_extension_dtype(arr.dtype):
        return arr, NATIVE
    if arr.dtype.itemsize == 2 and "bfloat16" in arr.dtype.name.lower():
        return bf16_bits_to_float32(arr.view(np.uint16)), "bfloat16->float32"
    try:
        return arr.astype(np.float32), f"{name}->float32"
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot convert dtype {arr.dtype} ({name}) to float32") from exc


# --------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------


def compute_stats(arr: np.ndarray, backend: str = "auto", counts: tuple = ()) -> Dict[str, Any]:
    """:func:`base_stats` plus the optional statistics named in ``counts`` (values of
    :data:`msprobe.engine.config.COUNT_ITEMS`: ``NanCount``, ``PosInfCount``, ``NegInfCount``, ``ZeroCount`` — element
    counts, ``-0.0`` is a zero — and ``MaxAbs``, the largest ``|x|`` of the non-NaN elements, ``None``
    when there is none or for bool), all from the same pass over the data."""
    if not counts:
        return base_stats(arr, backend)
    holder: list = []
    out = base_stats(arr, backend, holder)
    arr = np.asarray(arr)
    if holder:
        result = holder[0]
        nan, posinf, neginf, zero = result.nan, result.posinf, result.neginf, result.zero
        mx, mn = result.max, result.min
    else:  # empty or 0-d: counted directly
        flat = None
        if arr.size and arr.dtype.kind in "iuf":
            flat = arr.astype(np.float64).reshape(-1)
        elif arr.size and arr.dtype.kind == "c":
            flat = np.abs(arr).astype(np.float64).reshape(-1)
        if flat is None and arr.size and is_extension_dtype(arr.dtype):
            flat = _upcast_extension(arr, "")[0].astype(np.float64).reshape(-1)
        if flat is None:
            nan = posinf = neginf = 0
            zero = int(arr.size - np.count_nonzero(arr)) if arr.size else 0
            mx = mn = None
        else:
            nan, posinf = int(np.isnan(flat).sum()), int(np.isposinf(flat).sum())
            neginf, zero = int(np.isneginf(flat).sum()), int((flat == 0).sum())
            finite = flat[~np.isnan(flat)]
            mx, mn = (float(finite.max()), float(finite.min())) if finite.size else (None, None)
    values = {"NanCount": nan, "PosInfCount": posinf, "NegInfCount": neginf, "ZeroCount": zero}
    bool_kind = arr.dtype.kind == "b"
    if mx is None or bool_kind or (isinstance(mx, float) and mx == -math.inf and mn == math.inf):
        values["MaxAbs"] = None
    else:
        values["MaxAbs"] = max(abs(mx), abs(mn))
    out.update((key, values[key]) for key in counts)
    return out


def base_stats(arr: np.ndarray, backend: str = "auto", holder: list | None = None) -> Dict[str, Any]:
    """Compute ``Max``, ``Min``, ``Mean``, ``Norm`` of a host array.

    The rules (empty, bool, 0-d, integer, float, complex, NaN/Inf) are listed
    in the module docstring; the accuracy of Mean and Norm in :mod:`msprobe.tensors.scan`.

    Args:
        arr: ``numpy.ndarray`` of any shape and memory layout (bool, integer,
            float16/32/64, complex64/128, a bfloat16 extension array; other
            extension floats such as FP8 are upcast to float32 first). Normally
            the array from :func:`to_host`.
        backend: ``'auto'`` (the compiled kernel when built, else NumPy),
            ``'kernel'`` or ``'numpy'``: see :func:`msprobe.tensors.scan.scan`.

    Returns:
        ``{'Max': ..., 'Min': ..., 'Mean': ..., 'Norm': ...}`` with Python
        ``bool``/``int``/``float`` values or ``None``.

    Raises:
        TypeError: unsupported dtype (string, object, structured, ...).
        RuntimeError: ``backend='kernel'`` and the kernel is not built.
    """
    arr = np.asarray(arr)
    bfloat16 = _is_bfloat16(arr.dtype)
    if bfloat16:
        arr = arr.view(np.uint16)
    elif is_extension_dtype(arr.dtype):
        arr = _upcast_extension(arr, "")[0]
    kind = "f" if bfloat16 else arr.dtype.kind
    if kind not in "biufc":
        raise TypeError(f"no statistics for dtype {arr.dtype}")
    if arr.size == 0:
        return _stats(None, None, None, None)
    if arr.ndim == 0:
        if kind == "b":
            return _stats(bool(arr), bool(arr), None, None)
        value = _scalar(bf16_bits_to_float32(arr) if bfloat16 else arr)
        return _stats(value, value, value, abs(value))
    result = scan(arr, bfloat16=bfloat16, backend=backend)
    if holder is not None:
        holder.append(result)
    if kind == "b":
        return _stats(bool(result.max), bool(result.min), None, None)
    if kind in "iu":
        return {"Max": result.max, "Min": result.min, "Mean": result.total / arr.size,
                "Norm": math.sqrt(result.squares)}
    return _float_stats(arr, bfloat16, result)


def _is_bfloat16(dtype: np.dtype) -> bool:
    return is_extension_dtype(dtype) and dtype.itemsize == 2 and "bfloat16" in dtype.name.lower()


def _stats(mx: Any, mn: Any, mean: Any, norm: Any) -> Dict[str, Any]:
    return dict(zip(_STAT_KEYS, (mx, mn, mean, norm)))


def _scalar(arr: np.ndarray) -> Any:
    """A 0-d numeric array as a Python int/float (complex: its magnitude)."""
    kind = arr.dtype.kind
    if kind in "iu":
        return int(arr)
    if kind == "c":
        return float(np.abs(arr.astype(np.complex128)))
    return float(arr)


def _float_stats(arr: np.ndarray, bfloat16: bool, result: Scan) -> Dict[str, Any]:
    """Floats and complex magnitudes: rules 5 and 7 of the module docstring."""
    mx, mn, total, squares = result.max, result.min, result.total, result.squares
    if result.nan:
        return _stats(math.nan, math.nan, math.nan, math.nan)
    if result.posinf or result.neginf:
        mean = math.nan if result.posinf and result.neginf else math.inf if result.posinf else -math.inf
        return _stats(mx, mn, mean, math.inf)
    if (squares < _TINY or not (math.isfinite(total) and math.isfinite(squares))) and (mx or mn):
        # finite data whose float64 sums overflowed or whose squares underflowed
        scale = max(abs(mx), abs(mn))
        rescaled = scan(arr, bfloat16=bfloat16, backend="numpy", scale=scale)
        return _stats(mx, mn, rescaled.total / arr.size * scale, math.sqrt(rescaled.squares) * scale)
    return {"Max": mx, "Min": mn, "Mean": total / arr.size, "Norm": math.sqrt(squares)}


# --------------------------------------------------------------------------
# CRC-32 and .npy files
# --------------------------------------------------------------------------


def crc32_hex(arr: np.ndarray) -> str:
    """CRC-32 of an array's raw bytes, as the ``md5`` field of ``dump.json``.

    Args:
        arr: ``numpy.ndarray`` of any dtype/shape. The bytes hashed are those
            of the C-contiguous, little-endian layout (what ``arr.tobytes()``
            gives on a little-endian host); already contiguous little-endian
            arrays are hashed without a copy. For bfloat16 pass the float32
            array from :func:`to_host` (the reference tool hashes float32).

    Returns:
        ``zlib.crc32`` (polynomial of zlib, initial value 0) as 8 lowercase
        hex digits, e.g. ``'1a2b3c4d'``. Computed by zlib-ng's ``crc32`` (the
        same function, vectorised, without the GIL), read straight from the
        array's memory.
    """
    arr = np.asarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    arr = np.ascontiguousarray(arr)  # no copy when already C-contiguous
    raw = arr.reshape(-1).view(np.uint8)  # buffer export of any dtype, 0-d too
    return f"{_crc32(raw) & 0xFFFFFFFF:08x}"
