"""The ``.npy`` files of a dump: atomic writes, and reads that also decode MindSpore's bfloat16 kernel
dumps (header ``descr`` ``'<E2'``, which numpy rejects). NumPy only; no MindSpore."""
from __future__ import annotations

import ast
import contextlib
import io
import itertools
import math
import os
import threading
from typing import Any, Dict, NamedTuple, Tuple

import numpy as np

_BF16_DESCR_SUFFIX = "E2"


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Bit-exact bfloat16 -> float32: the bf16 bits are the float32 high half."""
    out = np.empty_like(bits, dtype=np.uint32)  # keeps shape and memory order
    np.left_shift(bits, 16, out=out, dtype=np.uint32)
    return out.view(np.float32)


def is_extension_dtype(dtype: np.dtype) -> bool:
    """True for dtypes registered by extensions (bfloat16, FP8), not numpy's own."""
    return dtype.isbuiltin == 2


_tmp_counter = itertools.count()

try:  # compiled helper (optional, built by pip install): batch writes with the GIL released
    from msprobe.format import _npy_files
except ImportError:  # pragma: no cover - the Python path writes the same bytes
    _npy_files = None
if _npy_files is not None and not hasattr(_npy_files, "write_batch"):  # pragma: no cover
    _npy_files = None  # a helper built from an older source: the Python path


def save_npy(path: str, arr: np.ndarray) -> None:
    """Write ``arr`` to ``path`` in ``.npy`` format, atomically.

    The data go to a hidden temporary file in the same directory which is
    then renamed over ``path`` (``os.replace``), so a crash never leaves a
    truncated ``.npy`` under the final name. No ``fsync``: the guarantee is
    against process crashes, not power loss. ``path`` is used as given (no
    ``.npy`` is appended). Many files at once: :func:`save_npy_batch`.

    Args:
        path: destination file; its directory must exist.
        arr: ``numpy.ndarray`` with a numpy-native dtype (convert bfloat16
            with :func:`to_host` first).

    Raises:
        TypeError: object dtype or an extension dtype (``numpy.load`` with
            ``allow_pickle=False`` could not read it back).
        OSError: the file cannot be written (``filename`` is ``path``).
    """
    arr = np.asanyarray(arr)
    check_saveable(arr)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(
        directory, f".npy-{os.getpid()}-{threading.get_ident()}-{next(_tmp_counter)}.tmp"
    )
    try:
        with open(tmp, "xb") as fh:
            np.save(fh, arr, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno is not None:  # named by the file it was writing
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise


class NpyHeader(NamedTuple):
    """The header of a ``.npy`` file (:func:`read_npy_header`)."""

    shape: Tuple[int, ...]
    descr: str
    fortran_order: bool
    #: byte offset of the payload from the start of the file
    offset: int

    @property
    def bfloat16(self) -> bool:
        """MindSpore's bfloat16 (``descr`` ``'<E2'``), which numpy rejects; :func:`load_npy` reads it."""
        return isinstance(self.descr, str) and self.descr.endswith(_BF16_DESCR_SUFFIX)

    @property
    def payload_bytes(self) -> int:
        """Size of the payload in bytes (2 per bfloat16 element)."""
        itemsize = 2 if self.bfloat16 else np.dtype(self.descr).itemsize
        return math.prod(self.shape) * itemsize


def read_npy_header(path: str) -> NpyHeader:
    """The header of the ``.npy`` file ``path``, bfloat16 (``'<E2'``) included.

    Raises:
        ValueError: not a ``.npy`` file, or a malformed header.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        header = _read_npy_header(fh)
        return NpyHeader(tuple(header["shape"]), header["descr"], bool(header["fortran_order"]),
                         fh.tell())


def npy_complete(path: str) -> bool:
    """True when ``path`` is a ``.npy`` file holding its whole payload (False while another process
    is still writing it, or when it is not a readable ``.npy`` file)."""
    try:
        header = read_npy_header(path)
        return os.path.getsize(path) >= header.offset + header.payload_bytes
    except (OSError, ValueError, TypeError):
        return False


def save_npy_batch(items) -> None:
    """:func:`save_npy` for each ``(path, arr)`` of ``items``, in order, with the GIL released once
    for the whole batch when the compiled helper ``msprobe.format._npy_files`` is built (a thread
    writing files then does not compete with the training thread for the interpreter per file): the
    bytes ``numpy.save`` writes, a C-contiguous array straight from its memory (header and data in
    one ``writev``), the format 1.0 header built once per dtype and shape; every path is a file of its
    own, also when several items name one array.

    Raises:
        TypeError: as :func:`save_npy` (checked for every item before any file is written).
        OSError: the first file that could not be written (``filename`` is its path); the files
            before it are written, none after it, and no temporary file is left.
    """
    items = [(path, np.asanyarray(arr)) for path, arr in items]
    for _, arr in items:
        check_saveable(arr)
    if _npy_files is None:
        for path, arr in items:
            save_npy(path, arr)
        return
    tag = f"{os.getpid()}-{threading.get_ident()}-{next(_tmp_counter)}".encode()
    start = 0
    while start < len(items):
        plan = []
        for path, arr in itertools.islice(items, start, None):
            header = _header(arr) if arr.flags.c_contiguous and type(arr) is np.ndarray else None
            if header is None:  # written by numpy.save, in order with the rest
                break
            plan.append((os.fsencode(path), header, arr.reshape(-1).view(np.uint8)))
        if plan:
            failed = _npy_files.write_batch(plan, tag + b"-%d" % start)
            if failed is not None:
                index, errno = failed
                raise OSError(errno, os.strerror(errno), items[start + index][0])
            start += len(plan)
        if start < len(items) and not plan:  # the next item numpy.save writes
            save_npy(*items[start])
            start += 1


def write_unnamed(items) -> bool:
    """Write each ``(path, data)`` of ``items`` (``data``: bytes) in order, each atomically, through the
    compiled helper (:func:`save_npy_batch`'s: an unnamed file linked under its name, or linked over
    an existing one through a temporary name then renamed; one directory descriptor for consecutive
    paths of one directory; the GIL released once). Returns False, writing nothing, when the helper is
    not built (the caller writes the files its own way).

    Raises:
        OSError: the first file that could not be written (``filename`` is its path); the files
            before it are written, none after it, and no temporary file is left.
    """
    if _npy_files is None:
        return False
    failed = _npy_files.write_batch([(os.fsencode(path), b"", data) for path, data in items],
                                    f"{os.getpid()}-{threading.get_ident()}-{next(_tmp_counter)}".encode())
    if failed is not None:
        index, errno = failed
        raise OSError(errno, os.strerror(errno), items[index][0])
    return True


def check_saveable(arr: np.ndarray) -> None:
    """Raise ``TypeError`` when :func:`save_npy` cannot write ``arr`` pickle-free (object or
    extension dtype: ``numpy.load(allow_pickle=False)`` could not read it back)."""
    if arr.dtype.hasobject or is_extension_dtype(arr.dtype):
        raise TypeError(f"cannot save dtype {arr.dtype} as a pickle-free .npy")


_HEADERS: Dict[Any, bytes] = {}
_MAX_HEADERS = 4096
_HEADER_SIZES: Dict[Tuple[int, ...], int] = {}


def header_size(shape) -> int:
    """Bytes of the ``.npy`` header (format 1.0) written before the data of an array of ``shape``
    (a sequence of ints); every dtype a dump saves has a 3-character ``descr``, so the size depends
    on the shape only. Cached by shape."""
    key = tuple(shape)
    size = _HEADER_SIZES.get(key)
    if size is None:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": key})
        size = len(buf.getvalue())
        if len(_HEADER_SIZES) >= _MAX_HEADERS:
            _HEADER_SIZES.clear()
        _HEADER_SIZES[key] = size
    return size


def _header(arr: np.ndarray):
    """The ``.npy`` header ``numpy.save`` writes for a C-contiguous ``arr`` (format 1.0), cached by
    dtype and shape; ``None`` when it needs another format version (very many dimensions)."""
    key = (arr.dtype, arr.shape)
    header = _HEADERS.get(key)
    if header is None:
        buf = io.BytesIO()
        try:
            np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(arr))
        except ValueError:  # header longer than format 1.0 allows: numpy.save picks the version
            return None
        header = buf.getvalue()
        if len(_HEADERS) >= _MAX_HEADERS:
            _HEADERS.clear()
        _HEADERS[key] = header
    return header


def load_npy(path: str) -> np.ndarray:
    """Load a ``.npy`` file, including MindSpore's bfloat16 kernel dumps.

    Args:
        path: ``.npy`` file. Standard files are read with
            ``numpy.load(allow_pickle=False)``. Files whose header ``descr``
            is ``'<E2'`` (how MindSpore's native dump writes bfloat16, which
            numpy rejects) are decoded from their uint16 payload.

    Returns:
        The array; bfloat16 files come back as float32 (bit-exact upcast),
        same shape and memory order.

    Raises:
        ValueError: malformed header or truncated payload.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        header = _read_npy_header(fh)
        descr = header["descr"]
        if isinstance(descr, str) and descr.endswith(_BF16_DESCR_SUFFIX):
            return _read_bf16_payload(fh, header, path)
    return np.load(path, allow_pickle=False)


def _read_npy_header(fh) -> Dict[str, Any]:
    """Parse the header dict of an open ``.npy`` file, leaving fh at the data."""
    major, _minor = np.lib.format.read_magic(fh)
    if major not in (1, 2, 3):
        raise ValueError(f"unsupported .npy format version {major}")
    size_bytes = 2 if major == 1 else 4
    length = int.from_bytes(fh.read(size_bytes), "little")
    text = fh.read(length).decode("utf-8" if major == 3 else "latin1")
    try:
        header = ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"malformed .npy header {text!r}") from exc
    if not isinstance(header, dict) or not {"descr", "fortran_order", "shape"} <= header.keys():
        raise ValueError(f"malformed .npy header {text!r}")
    return header


def _read_bf16_payload(fh, header: Dict[str, Any], path: str) -> np.ndarray:
    shape = tuple(header["shape"])
    count = math.prod(shape)
    byteorder = ">" if header["descr"].startswith(">") else "<"
    bits = np.fromfile(fh, dtype=np.dtype(byteorder + "u2"), count=count)
    if bits.size != count:
        raise ValueError(f"{path}: truncated bfloat16 payload ({bits.size} of {count} values)")
    order = "F" if header["fortran_order"] else "C"
    bits = bits.astype(np.uint16, copy=False).reshape(shape, order=order)
    return bf16_bits_to_float32(bits)
