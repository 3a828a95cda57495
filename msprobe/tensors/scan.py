"""One pass over a tensor's elements: extremes, float64 sums and NaN/Inf/zero counts.

:func:`scan` is what :func:`msprobe.tensors.stats.compute_stats` reduces every non-empty tensor to.
It runs the compiled kernel ``msprobe.tensors._stats_kernel`` (``_stats_kernel.c``, built by
``pip install``) when it is importable, and the NumPy implementation of this module otherwise;
both follow the same definitions:

* ``max``/``min``: the exact extreme element values, NaN ignored (``-inf``/``+inf`` when every
  element is NaN); Python ``float`` for floats, exact ``int`` for integers and bools (0/1).
* ``total``: float64 sum of the elements (each converted to float64 exactly); the *exact* sum as a
  Python ``int`` for integers and bools.
* ``squares``: float64 sum of the squares of the float64 values (also for integers).
* ``nan``/``posinf``/``neginf``/``zero``: element counts (``zero`` counts ``-0.0`` too).

Accuracy of ``total`` and ``squares`` (the one place it is stated; the tests check it):
``|total - Σx| <= SUM_TOLERANCE * Σ|x|`` and ``|squares - Σx²| <= SUM_TOLERANCE * Σx²``, Σ exact,
for finite sums; hence ``compute_stats`` gives ``|Mean - exact| <= SUM_TOLERANCE * mean(|x|)`` and
``|Norm - exact| <= SUM_TOLERANCE * Norm`` (plus the rounding of the division and square root).
The kernel sums blocks of 4096 elements in 32 float64 lanes (128 terms each) and adds the block
partials with compensated summation: its error is at most about 134 · 2**-53 · Σ|x|
(< 2**-45 · Σ|x|) whatever the size; squares of 8- and 16-bit integers are summed exactly. NumPy sums each chunk of 65536 elements
with its pairwise ``sum`` and the BLAS ``dot`` (whose bound depends on the BLAS build) and adds the
chunk partials with ``math.fsum``; the tests hold both to the tolerance. So the two give the same
``max``, ``min``, counts and integer sums, and ``total``/``squares`` that agree within the tolerance,
not always to the last bit. The kernel's bits depend neither on the thread count nor on the CPU's
vector extensions (AVX-512 or portable loops).
"""

from __future__ import annotations

import math
import os
from typing import Any, List, NamedTuple, Optional

import numpy as np

try:
    from msprobe.tensors import _stats_kernel
except ImportError:  # not compiled (no C compiler at install time): NumPy only
    _stats_kernel = None

__all__ = ["Scan", "scan", "free_cpus", "KERNEL_AVAILABLE", "SUM_TOLERANCE", "THREADS"]

#: Whether the compiled kernel is importable (``scan`` then uses it by default).
KERNEL_AVAILABLE = _stats_kernel is not None

#: Bound on the relative error of the float64 sums of :func:`scan` (see the module docstring).
SUM_TOLERANCE = 1e-12

#: Elements per NumPy chunk: a float64 chunk (512 KiB) stays in L2 cache.
CHUNK = 1 << 16

_KERNEL_KINDS = {np.dtype(name): code for name, code in (
    ("float16", "f2"), ("float32", "f4"), ("float64", "f8"), ("int8", "i1"), ("int16", "i2"),
    ("int32", "i4"), ("int64", "i8"), ("uint8", "u1"), ("uint16", "u2"), ("uint32", "u4"),
    ("uint64", "u8"), ("bool", "b1"))}


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: Most threads the kernel uses for one large tensor (the CPUs this process may run on).
THREADS = _threads()

#: Smallest tensor (elements) the kernel gives two threads (2 * MIN_PER_THREAD): below it
#: :func:`free_cpus` is not consulted.
_SPLIT = 2 * (_stats_kernel.MIN_PER_THREAD if _stats_kernel is not None else 1 << 20)


def free_cpus(loadavg: str = "/proc/loadavg") -> int:
    """CPUs free for the kernel's threads now: :data:`THREADS` minus the other threads the OS has
    ready to run at this moment (the running count of ``loadavg``, Linux's ``/proc/loadavg``), at
    least 1; :data:`THREADS` when that file cannot be read.

    On a machine whose cores are busy (other processes, MindSpore's own pool), a second thread only
    waits for a core, and the call waits for it: measured on 2 busy cores, 2 threads took up to twice
    the wall time of 1; with a core free they raised float16 from 10.6 to 16.6 GB/s.
    """
    try:
        with open(loadavg, "rb") as fh:
            running = int(fh.read().split()[3].split(b"/")[0])  # includes this thread
    except (OSError, ValueError, IndexError):
        return THREADS
    return max(1, min(THREADS, THREADS - (running - 1)))


class Scan(NamedTuple):
    """Result of :func:`scan` (definitions in the module docstring)."""

    max: Any
    min: Any
    total: Any
    squares: float
    nan: int
    posinf: int
    neginf: int
    zero: int


def scan(arr: np.ndarray, *, bfloat16: bool = False, backend: str = "auto",
         threads: Optional[int] = None, scale: float = 1.0) -> Scan:
    """Extremes, float64 sums and counts of all elements of a non-empty array, in one pass.

    Args:
        arr: ``numpy.ndarray`` of any shape and layout with ``size > 0``: bool, int8..uint64,
            float16/32/64, or complex64/128 (then the statistics of the magnitudes ``|x|``, NumPy
            only). With ``bfloat16=True``: uint16 bfloat16 bit patterns.
        bfloat16: read ``arr`` (uint16) as bfloat16 values.
        backend: ``'auto'`` (the kernel when compiled, else NumPy), ``'kernel'`` (the same, but
            raises if it is not compiled) or ``'numpy'``. Complex data and ``scale`` always use NumPy.
        threads: most threads the kernel may use; default :func:`free_cpus` for tensors of
            2**21 elements or more, else 1. One thread per 2**20 elements at most
            (``_stats_kernel.MIN_PER_THREAD``).
        scale: floats only, NumPy only: sum ``x / scale`` and ``(x / scale)**2`` instead (the
            float64 overflow/underflow guard of ``compute_stats``); extremes and counts unscaled.

    Returns:
        :class:`Scan`.

    Raises:
        ValueError: empty array, unknown ``backend``, or ``bfloat16=True`` with a non-uint16 array.
        RuntimeError: ``backend='kernel'`` but the kernel is not compiled.
        TypeError: a dtype other than those above.
    """
    if backend not in ("auto", "kernel", "numpy"):
        raise ValueError(f"backend must be 'auto', 'kernel' or 'numpy', not {backend!r}")
    code = "bf2" if bfloat16 else _KERNEL_KINDS.get(arr.dtype)  # None for big-endian data too
    if code is not None and backend != "numpy" and _stats_kernel is not None and scale == 1.0 and arr.size \
            and (not bfloat16 or arr.dtype == np.uint16):
        flags = arr.flags
        data = arr if flags.c_contiguous and flags.aligned else np.array(arr, order="C")  # strided: a copy
        if not threads:
            threads = free_cpus() if arr.size >= _SPLIT else 1
        return Scan._make(_stats_kernel.scan(data, code, threads))
    if arr.size == 0:
        raise ValueError("scan() needs a non-empty array")
    if bfloat16 and arr.dtype != np.uint16:
        raise ValueError(f"bfloat16=True needs uint16 bit patterns, not {arr.dtype}")
    if backend == "kernel" and _stats_kernel is None:
        raise RuntimeError("the compiled statistics kernel msprobe.tensors._stats_kernel is not built")
    if arr.dtype.byteorder == ">":
        return scan(arr.astype(arr.dtype.newbyteorder("=")), bfloat16=bfloat16, backend=backend,
                    threads=threads, scale=scale)  # big-endian data: a native copy
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"no statistics for dtype {arr.dtype}")
    flat = arr.reshape(-1)  # a view for contiguous data; one copy otherwise
    if bfloat16:
        flat = np.left_shift(flat, 16, dtype=np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        return _numpy_scan(flat, scale)


# --------------------------------------------------------------------------- NumPy implementation


def _numpy_scan(flat: np.ndarray, scale: float) -> Scan:
    kind = flat.dtype.kind
    if kind == "b":
        nonzero = int(np.count_nonzero(flat))
        return Scan(int(nonzero > 0), int(nonzero == flat.size), nonzero, float(nonzero), 0, 0, 0,
                    flat.size - nonzero)
    integer = kind in "iu"
    buf = np.empty(min(flat.size, CHUNK), dtype=np.float64)
    highs: List[Any] = []
    lows: List[Any] = []
    sums: List[Any] = []
    squares: List[float] = []
    counts = [0, 0, 0, 0]  # nan, +inf, -inf, zero
    for start in range(0, flat.size, CHUNK):
        chunk = flat[start:start + CHUNK]
        values = _float64_values(chunk, buf)
        source = chunk if kind in "iu" or chunk.dtype in (np.float32, np.float64) else values
        highs.append(source.max())  # float16 max/min are not vectorised in NumPy: on the copy
        lows.append(source.min())
        counts[3] += int(np.count_nonzero(source == 0))  # a comparison: count_nonzero of floats is slow
        summed = values if scale == 1.0 else np.divide(values, scale, out=buf[:chunk.size])
        part = summed.sum()
        square = float(np.dot(summed, summed))
        if not (math.isfinite(part) and math.isfinite(square)):  # only then can NaN/Inf be present
            _count_nonfinite(chunk, values, counts, highs, lows)
        sums.append(_exact_int_sum(chunk) if integer else part)
        squares.append(square)
    if integer:
        return Scan(int(max(highs)), int(min(lows)), sum(sums), _accurate_sum(squares), 0, 0, 0, counts[3])
    return Scan(float(max(highs)), float(min(lows)), _accurate_sum(sums), _accurate_sum(squares), *counts)


def _count_nonfinite(chunk, values, counts, highs, lows) -> None:
    """Add a chunk's NaN/+Inf/-Inf counts; its extremes ignore NaN (as the kernel's)."""
    if chunk.dtype.kind in "iu":
        return
    nan = np.isnan(values)
    counts[0] += int(np.count_nonzero(nan))
    counts[1] += int(np.count_nonzero(values == np.inf))
    counts[2] += int(np.count_nonzero(values == -np.inf))
    if counts[0]:
        rest = values[~nan]
        highs[-1], lows[-1] = (rest.max(), rest.min()) if rest.size else (-math.inf, math.inf)


def _float64_values(chunk: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """float64 values of a chunk: float64 in place, complex as magnitudes, others copied into buf."""
    if chunk.dtype == np.float64:
        return chunk
    out = buf[:chunk.size]
    if chunk.dtype.kind == "c":
        return np.absolute(chunk, out=out, dtype=np.float64)
    np.copyto(out, chunk, casting="unsafe")
    return out


def _exact_int_sum(chunk: np.ndarray) -> int:
    """Exact sum of an integer chunk (at most ``CHUNK`` elements) as Python int.

    Types up to 32 bits are summed in 64-bit integers (cannot wrap for 2**16 elements). 64-bit
    values are split into high and low 32-bit halves whose sums also fit.
    """
    if chunk.dtype.itemsize < 8:
        wide = np.int64 if chunk.dtype.kind == "i" else np.uint64
        return int(np.add.reduce(chunk, dtype=wide))
    high = int(np.add.reduce(chunk >> 32))
    low = int(np.add.reduce(chunk & 0xFFFFFFFF))
    return (high << 32) + low


def _accurate_sum(parts: List[Any]) -> float:
    """Correctly rounded sum of float partials; IEEE result when non-finite."""
    try:
        return math.fsum(parts)
    except (OverflowError, ValueError):  # inf - inf, or intermediate overflow
        return float(np.sum(np.asarray(parts, dtype=np.float64)))
