"""Tests for msprobe.tensors.stats: every expected value is recomputed here
independently (Python ints, math.fsum over float64, zlib on tobytes())."""

import math
import os
import struct
import tracemalloc
import warnings
import zlib

import mindspore as ms
import numpy as np
import pytest

from msprobe.tensors import scan as stats_scan
from msprobe.tensors import stats
from msprobe.tensors.stats import (
    MS_DTYPE_NAMES,
    compute_stats,
    crc32_hex,
    dtype_name,
    load_npy,
    save_npy,
    to_host,
)

ms.set_device("CPU")

RTOL = 1e-12


def exact_mean_norm(values):
    """Reference Mean/Norm from a float64 copy with correctly rounded sums."""
    flat = np.asarray(values, dtype=np.float64).ravel().tolist()
    return math.fsum(flat) / len(flat), math.sqrt(math.fsum(v * v for v in flat))


def assert_close(actual, expected):
    assert isinstance(actual, float)
    assert actual == pytest.approx(expected, rel=RTOL, abs=0.0)


# ---------------------------------------------------------------- floats


@pytest.mark.parametrize("n", [1, 7, 1000, (1 << 16) + 3, 300_001])
def test_float32_random_exact(n):
    arr = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 10
    result = compute_stats(arr)
    assert result["Max"] == float(np.max(arr)) and isinstance(result["Max"], float)
    assert result["Min"] == float(np.min(arr)) and isinstance(result["Min"], float)
    mean, norm = exact_mean_norm(arr)
    assert_close(result["Mean"], mean)
    assert_close(result["Norm"], norm)


def test_float32_non_contiguous_and_fortran():
    base = np.random.default_rng(1).standard_normal((300, 400)).astype(np.float32)
    for arr in (base[::3, 1::2], np.asfortranarray(base), base.T):
        result = compute_stats(arr)
        mean, norm = exact_mean_norm(arr)
        assert result["Max"] == float(arr.max()) and result["Min"] == float(arr.min())
        assert_close(result["Mean"], mean)
        assert_close(result["Norm"], norm)


def test_float64_random():
    arr = np.random.default_rng(2).standard_normal(123_457) * 1e3
    result = compute_stats(arr)
    mean, norm = exact_mean_norm(arr)
    assert result["Max"] == float(arr.max()) and result["Min"] == float(arr.min())
    assert_close(result["Mean"], mean)
    assert_close(result["Norm"], norm)


def test_fp16_ones_70000_accumulates_wide():
    result = compute_stats(np.ones(70000, dtype=np.float16))
    assert result == {"Max": 1.0, "Min": 1.0, "Mean": 1.0, "Norm": pytest.approx(math.sqrt(70000), rel=RTOL)}
    assert result["Norm"] == pytest.approx(264.575, abs=1e-3)


def test_fp16_full_300_norm_does_not_overflow():
    result = compute_stats(np.full(1000, 300, dtype=np.float16))
    assert result["Max"] == 300.0 and result["Min"] == 300.0 and result["Mean"] == 300.0
    assert_close(result["Norm"], 300 * math.sqrt(1000))


def test_fp16_random_values_exact_extremes():
    arr = (np.random.default_rng(3).standard_normal(100_000) * 100).astype(np.float16)
    result = compute_stats(arr)
    assert result["Max"] == float(arr.astype(np.float64).max())
    assert result["Min"] == float(arr.astype(np.float64).min())
    mean, norm = exact_mean_norm(arr)
    assert_close(result["Mean"], mean)
    assert_close(result["Norm"], norm)


def test_float64_extreme_magnitudes_are_rescaled():
    big = compute_stats(np.array([1.5e308, 1.5e308, 1.5e308]))
    assert big["Max"] == 1.5e308 and big["Mean"] == pytest.approx(1.5e308, rel=RTOL)
    assert math.isinf(big["Norm"])  # the true norm 2.6e308 exceeds float64
    large = compute_stats(np.array([1e200, -1e200]))
    assert large["Mean"] == 0.0
    assert_close(large["Norm"], 1e200 * math.sqrt(2))
    tiny = compute_stats(np.full(3, 1e-200))
    assert_close(tiny["Mean"], 1e-200)
    assert_close(tiny["Norm"], 1e-200 * math.sqrt(3))


def test_big_float32_array_has_no_full_float64_copy():
    arr = np.random.default_rng(4).standard_normal(2_000_000).astype(np.float32)
    tracemalloc.start()
    try:
        compute_stats(arr)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < arr.size * 8 // 8  # a float64 copy would be 16 MB


# ---------------------------------------------------------------- NaN / Inf


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_nan_rule_any_nan_gives_all_nan(dtype):
    arr = (np.arange(200_000) % 1000).astype(dtype)
    arr[150_001] = np.nan  # in a later chunk
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = compute_stats(arr)
    assert all(isinstance(v, float) and math.isnan(v) for v in result.values())


def test_inf_propagates():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pos = compute_stats(np.array([1.0, np.inf, 2.0], dtype=np.float32))
        both = compute_stats(np.array([np.inf, -np.inf, 0.0], dtype=np.float32))
    assert pos == {"Max": math.inf, "Min": 1.0, "Mean": math.inf, "Norm": math.inf}
    assert both["Max"] == math.inf and both["Min"] == -math.inf
    assert math.isnan(both["Mean"]) and both["Norm"] == math.inf


def test_nan_scalar():
    result = compute_stats(np.array(np.nan, dtype=np.float32))
    assert all(math.isnan(v) for v in result.values())


# ---------------------------------------------------------------- integers


def test_int32_no_overflow():
    result = compute_stats(np.full(50000, 50000, dtype=np.int32))
    assert result["Max"] == 50000 and type(result["Max"]) is int
    assert result["Min"] == 50000 and type(result["Min"]) is int
    assert result["Mean"] == 50000.0
    assert_close(result["Norm"], 50000 * math.sqrt(50000))
    assert result["Norm"] == pytest.approx(1.118e7, rel=1e-3)


def test_int64_big_values_exact():
    values = [2**62, 2**62 - 1, 2**63 - 1, -(2**63), 12345]
    result = compute_stats(np.array(values, dtype=np.int64))
    assert result["Max"] == 2**63 - 1 and result["Min"] == -(2**63)
    assert result["Mean"] == sum(values) / len(values)  # Python exact int division
    assert_close(result["Norm"], math.sqrt(math.fsum(float(v) ** 2 for v in values)))


def test_uint64_and_multi_chunk_int64_exact_mean():
    u = np.array([2**64 - 1, 2**64 - 2, 0], dtype=np.uint64)
    r = compute_stats(u)
    assert r["Max"] == 2**64 - 1 and r["Min"] == 0
    assert r["Mean"] == (2 * 2**64 - 3) / 3
    big = np.random.default_rng(5).integers(-(2**62), 2**62, size=200_003, dtype=np.int64)
    assert compute_stats(big)["Mean"] == sum(int(v) for v in big.tolist()) / big.size


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.uint32])
def test_small_integer_types(dtype):
    info = np.iinfo(dtype)
    arr = np.array([info.max] * 1000 + [info.min], dtype=dtype)
    r = compute_stats(arr)
    assert (r["Max"], r["Min"]) == (int(info.max), int(info.min))
    assert r["Mean"] == (1000 * int(info.max) + int(info.min)) / 1001
    assert_close(r["Norm"], math.sqrt(1000 * float(info.max) ** 2 + float(info.min) ** 2))


# ---------------------------------------------------------------- bool, empty, 0-d, complex


def test_bool_any_all():
    assert compute_stats(np.array([True, False, True])) == {"Max": True, "Min": False, "Mean": None, "Norm": None}
    assert compute_stats(np.ones((4, 5), dtype=bool)) == {"Max": True, "Min": True, "Mean": None, "Norm": None}
    assert compute_stats(np.zeros(9, dtype=bool)) == {"Max": False, "Min": False, "Mean": None, "Norm": None}
    scalar = compute_stats(np.array(True))
    assert scalar == {"Max": True, "Min": True, "Mean": None, "Norm": None}
    assert type(scalar["Max"]) is bool


@pytest.mark.parametrize("arr", [np.zeros(0, np.float32), np.zeros((3, 0), np.int64), np.zeros(0, bool),
                                 np.zeros((0, 2), np.complex64)])
def test_empty_all_none(arr):
    assert compute_stats(arr) == {"Max": None, "Min": None, "Mean": None, "Norm": None}


def test_zero_dim_scalars_keep_kind_and_norm_is_magnitude():
    ints = compute_stats(np.array(-7, dtype=np.int32))
    assert ints == {"Max": -7, "Min": -7, "Mean": -7, "Norm": 7}
    assert all(type(v) is int for v in ints.values())
    floats = compute_stats(np.array(-2.5, dtype=np.float16))
    assert floats == {"Max": -2.5, "Min": -2.5, "Mean": -2.5, "Norm": 2.5}
    assert all(type(v) is float for v in floats.values())
    grad = compute_stats(np.array(-0.0747, dtype=np.float32))  # a scalar gradient
    assert grad["Norm"] == float(np.float32(0.0747)) == -grad["Mean"]
    zero = compute_stats(np.array(-0.0, dtype=np.float64))
    assert math.copysign(1.0, zero["Norm"]) == 1.0 and math.copysign(1.0, zero["Max"]) == -1.0
    cplx = compute_stats(np.array(3 + 4j, dtype=np.complex64))
    assert cplx == {"Max": 5.0, "Min": 5.0, "Mean": 5.0, "Norm": 5.0}


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_magnitudes(dtype):
    rng = np.random.default_rng(6)
    arr = (rng.standard_normal(70_001) + 1j * rng.standard_normal(70_001)).astype(dtype)
    mags = [abs(complex(v)) for v in arr.tolist()]  # C hypot; numpy's abs may differ by 1 ulp
    numpy_mags = np.abs(arr.astype(np.complex128))
    r = compute_stats(arr)
    assert r["Max"] == float(numpy_mags.max()) and r["Min"] == float(numpy_mags.min())
    assert r["Max"] == pytest.approx(max(mags), rel=1e-15) and r["Min"] == pytest.approx(min(mags), rel=1e-15)
    assert_close(r["Mean"], math.fsum(mags) / len(mags))
    assert_close(r["Norm"], math.sqrt(math.fsum(m * m for m in mags)))


def test_unsupported_dtype_raises():
    with pytest.raises(TypeError):
        compute_stats(np.array(["a", "b"]))


# ---------------------------------------------------------------- MindSpore tensors


def test_dtype_names_match_str():
    assert len(MS_DTYPE_NAMES) == 15
    for dtype, name in MS_DTYPE_NAMES.items():
        assert str(dtype) == name
    assert MS_DTYPE_NAMES[ms.bfloat16] == "BFloat16" and MS_DTYPE_NAMES[ms.bool_] == "Bool"
    assert dtype_name(ms.Tensor(np.zeros(2, np.uint8))) == "UInt8"
    assert dtype_name(np.zeros(2, np.float32)) == "float32"


def test_bf16_ones_real_tensor():
    tensor = ms.Tensor(np.ones(768), ms.bfloat16)
    host, how = to_host(tensor)
    assert host.dtype == np.float32 and host.shape == (768,) and how == "bfloat16->float32"
    assert dtype_name(tensor) == "BFloat16"
    r = compute_stats(host)
    assert r["Max"] == 1.0 and r["Min"] == 1.0 and r["Mean"] == 1.0
    assert_close(r["Norm"], math.sqrt(768))


def test_bf16_random_bit_exact_upcast():
    values = np.random.default_rng(7).standard_normal((33, 17)).astype(np.float32)
    tensor = ms.Tensor(values).astype(ms.bfloat16)
    expected = tensor.astype(ms.float32).asnumpy()
    host, _ = to_host(tensor)
    assert host.shape == (33, 17)
    assert np.array_equal(host.view(np.uint32), expected.view(np.uint32))
    assert crc32_hex(host) == f"{zlib.crc32(expected.tobytes()):08x}"


def test_bf16_fallback_when_asnumpy_fails():
    real = ms.Tensor(np.array([1.0, -2.5, 3.0], np.float32)).astype(ms.bfloat16)

    class Wrapped:
        dtype = real.dtype

        def asnumpy(self):
            raise TypeError("bf16 asnumpy unsupported")

        def view(self, dtype):
            return real.view(dtype)

    host, how = to_host(Wrapped())
    assert how == "bfloat16->float32"
    assert host.tolist() == [1.0, -2.5, 3.0]


def test_float32_tensor_native_zero_copy():
    tensor = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    host, how = to_host(tensor)
    assert how == "native" and host.dtype == np.float32 and host.shape == (2, 3)
    assert np.shares_memory(host, tensor.asnumpy())
    assert dtype_name(tensor) == "Float32"


def test_to_host_numpy_passthrough():
    arr = np.arange(4, dtype=np.int16)
    host, how = to_host(arr)
    assert host is arr and how == "native"


# ---------------------------------------------------------------- CRC-32


def test_crc32_known_vector():
    assert crc32_hex(np.frombuffer(b"123456789", dtype=np.uint8)) == "cbf43926"
    assert crc32_hex(np.zeros(0, np.float32)) == "00000000"


@pytest.mark.parametrize("arr", [
    np.arange(1000, dtype=np.float32).reshape(10, 100),
    np.arange(1000, dtype=np.float16)[::3],
    np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
    np.array(3.5),
    np.array([True, False]),
    np.array([1 + 2j], dtype=np.complex64),
])
def test_crc32_matches_tobytes(arr):
    assert crc32_hex(arr) == "%08x" % (zlib.crc32(arr.tobytes()) & 0xFFFFFFFF)


def test_crc32_big_endian_hashes_little_endian_bytes():
    little = np.arange(10, dtype="<f4")
    assert crc32_hex(little.astype(">f4")) == crc32_hex(little)


# ---------------------------------------------------------------- .npy files


@pytest.mark.parametrize("arr", [
    np.random.default_rng(8).standard_normal((5, 7)).astype(np.float32),
    np.array([1, 2, 3], dtype=np.float16),
    np.array(7, dtype=np.int64),
    np.array([True, False]),
    np.array([1 + 2j, 3 - 4j], dtype=np.complex128),
    np.asfortranarray(np.arange(6, dtype=np.uint8).reshape(2, 3)),
    np.zeros((0, 3), np.float32),
])
def test_save_load_round_trip(tmp_path, arr):
    path = str(tmp_path / "Functional.relu.0.forward.output.0.npy")
    save_npy(path, arr)
    for loaded in (load_npy(path), np.load(path, allow_pickle=False)):
        assert loaded.dtype == arr.dtype and loaded.shape == arr.shape
        assert np.array_equal(loaded, arr)
    assert os.listdir(tmp_path) == ["Functional.relu.0.forward.output.0.npy"]


def test_save_overwrites_and_crash_leaves_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "x.npy")
    save_npy(path, np.arange(3))
    save_npy(path, np.arange(5))
    assert np.load(path).tolist() == [0, 1, 2, 3, 4]

    def crash(fh, arr, allow_pickle=True):
        fh.write(b"\x93NUMPY partial")
        raise RuntimeError("disk died")

    monkeypatch.setattr(stats.np, "save", crash)
    with pytest.raises(RuntimeError):
        save_npy(path, np.arange(100))
    monkeypatch.undo()
    assert np.load(path).tolist() == [0, 1, 2, 3, 4]
    assert os.listdir(tmp_path) == ["x.npy"]


def test_save_rejects_object_arrays(tmp_path):
    with pytest.raises(TypeError):
        save_npy(str(tmp_path / "o.npy"), np.array([{}, None], dtype=object))
    assert os.listdir(tmp_path) == []


def bf16_bits(values):
    """bfloat16 bit patterns of float32 values that bf16 represents exactly."""
    raw = struct.pack(f"<{len(values)}f", *values)
    words = struct.unpack(f"<{len(values)}I", raw)
    assert all(w & 0xFFFF == 0 for w in words)
    return [w >> 16 for w in words]


def write_mindspore_bf16_npy(path, values, shape, fortran=False, major=1):
    """Hand-write a .npy file as MindSpore's kernel dump does for bf16."""
    header = "{'descr': '<E2', 'fortran_order': %s, 'shape': %r, }" % (fortran, tuple(shape))
    size_bytes = 2 if major == 1 else 4
    prefix_len = 6 + 2 + size_bytes
    pad = 64 - (prefix_len + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin1")
    size = struct.pack("<H" if major == 1 else "<I", len(header))
    payload = struct.pack(f"<{len(values)}H", *bf16_bits(values))
    with open(path, "wb") as fh:
        fh.write(b"\x93NUMPY" + bytes([major, 0]) + size + header + payload)


def test_load_mindspore_bf16_npy(tmp_path):
    path = str(tmp_path / "MatMul.Default_MatMul-op0.0.0.1.output.0.DefaultFormat.bfloat16.npy")
    values = [1.0, -2.5, 3.140625, 0.0, -0.0, math.inf, 2.0 ** 127, 2.0 ** -130]
    write_mindspore_bf16_npy(path, values, (2, 4))
    with pytest.raises(Exception):
        np.load(path, allow_pickle=False)  # numpy itself rejects '<E2'
    loaded = load_npy(path)
    assert loaded.dtype == np.float32 and loaded.shape == (2, 4)
    assert loaded.ravel().tolist() == [float(np.float32(v)) for v in values]
    assert math.copysign(1.0, float(loaded[1, 0])) == -1.0


def test_load_bf16_npy_fortran_and_version2(tmp_path):
    path = str(tmp_path / "f.npy")
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # column-major data of [[1,3,5],[2,4,6]]
    write_mindspore_bf16_npy(path, values, (2, 3), fortran=True, major=2)
    assert load_npy(path).tolist() == [[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]]


def test_load_truncated_bf16_npy_raises(tmp_path):
    path = str(tmp_path / "t.npy")
    write_mindspore_bf16_npy(path, [1.0, 2.0], (4,))
    with pytest.raises(ValueError, match="truncated"):
        load_npy(path)


# ------------------------------------------------------------------ zero-copy host views (flush)
def _views(base):
    return {"whole": base, "row": base[1], "column": base[:, 2], "transpose": base.transpose(1, 0),
            "strided": base[::2, 1::3], "scalar": base[2, 3]}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8, np.bool_])
def test_zero_copy_view_equals_asnumpy(dtype):
    """to_host(zero_copy=True) reads the tensor's memory through data_ptr and strides: contiguous or
    not (slices, transposes, steps, offsets), the array equals asnumpy() exactly, as do the stats."""
    assert stats.host_memory_readable()
    rng = np.random.RandomState(3)
    base = ms.Tensor((rng.randn(4, 6) * 50).astype(dtype))
    base = base + base if dtype is not np.bool_ else base.logical_not()  # an op's output
    for name, view in _views(base).items():
        arr, how = stats.to_host(view, zero_copy=True)
        want = view.asnumpy()
        assert how == "native" and arr.dtype == want.dtype and arr.shape == want.shape, name
        assert np.array_equal(arr, want), name
        assert arr.flags.c_contiguous, name          # as asnumpy: float64 sums see the same order
        assert stats.compute_stats(arr) == stats.compute_stats(want), name
        if view.is_contiguous():
            assert not arr.flags.writeable and arr.base is not None, name  # the tensor's own memory


def test_zero_copy_falls_back_for_bfloat16_and_empty():
    bf = ms.Tensor(np.array([1.5, -2.0], np.float32)).astype(ms.bfloat16)
    arr, how = stats.to_host(bf, zero_copy=True)
    assert how == "bfloat16->float32" and arr.tolist() == [1.5, -2.0]
    empty = ms.Tensor(np.zeros((0, 3), np.float32))
    arr, how = stats.to_host(empty, zero_copy=True)
    assert arr.shape == (0, 3) and how == "native"


# ------------------------------------------------------------------ every dtype, both signs, both backends
BACKENDS = ["kernel", "numpy"]
SIGNED_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int32", "int64"]


def _array(values, dtype):
    """A host array of ``values`` in ``dtype``; bfloat16 as MindSpore's own numpy bfloat16 array."""
    if dtype == "bfloat16":
        return ms.Tensor(np.asarray(values, np.float32)).astype(ms.bfloat16).asnumpy()
    return np.asarray(values).astype(dtype)


def _float64(arr):
    """The exact float64 values of an array (bfloat16: through its bits)."""
    if arr.dtype.name == "bfloat16":
        return np.left_shift(arr.view(np.uint16), 16, dtype=np.uint32).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def assert_mean_norm(result, values):
    """Mean and Norm equal the float64 recomputation within SUM_TOLERANCE of msprobe.tensors.scan:
    |Mean - exact| <= tol * mean(|x|) and |Norm - exact| <= tol * Norm (exact: math.fsum)."""
    flat = np.asarray(values, np.float64).ravel()
    n = flat.size
    mean_abs = math.fsum(np.abs(flat).tolist()) / n
    exact_mean = math.fsum(flat.tolist()) / n
    exact_norm = math.sqrt(math.fsum((flat * flat).tolist()))
    assert isinstance(result["Mean"], float) and isinstance(result["Norm"], float)
    assert abs(result["Mean"] - exact_mean) <= stats_scan.SUM_TOLERANCE * mean_abs + math.ulp(exact_mean)
    assert abs(result["Norm"] - exact_norm) <= stats_scan.SUM_TOLERANCE * exact_norm + math.ulp(exact_norm)
    assert result["Norm"] >= 0.0
    # and numpy's own float64 recomputation agrees within the same tolerance
    assert result["Mean"] == pytest.approx(float(np.mean(flat)), rel=1e-9, abs=1e-12 * mean_abs)
    assert result["Norm"] == pytest.approx(float(np.linalg.norm(flat)), rel=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", SIGNED_DTYPES)
@pytest.mark.parametrize("sign", [1, -1])
def test_zero_dim_and_one_element_agree(backend, dtype, sign):
    """A 0-d tensor and a shape-[1] tensor of the same value: same Max/Min/Mean, Norm = |x| >= 0."""
    value = sign * (0.0747 if dtype.startswith(("float", "bfloat")) else 7)
    scalar, single = _array(value, dtype), _array([value], dtype)
    assert scalar.shape == () and single.shape == (1,)
    zero_d, one = compute_stats(scalar, backend=backend), compute_stats(single, backend=backend)
    exact = float(_float64(single)[0])
    assert zero_d["Max"] == zero_d["Min"] == zero_d["Mean"] == exact
    assert one["Max"] == one["Min"] == one["Mean"] == exact
    assert zero_d["Norm"] == one["Norm"] == abs(exact) == float(np.linalg.norm(_float64(single)))
    assert zero_d["Norm"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", SIGNED_DTYPES + ["uint8", "bool"])
def test_empty_of_every_dtype(backend, dtype):
    for shape in [(0,), (2, 0, 3)]:
        assert compute_stats(np.zeros(shape, np.float32).astype(dtype) if dtype != "bfloat16" else
                             _array(np.zeros(shape), dtype), backend=backend) == dict.fromkeys(
            ("Max", "Min", "Mean", "Norm"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", SIGNED_DTYPES + ["uint8", "uint16", "uint32", "uint64", "int16"])
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("n", [5, 4097, 70_001])
def test_every_statistic_equals_float64_recomputation(backend, dtype, sign, n):
    rng = np.random.default_rng(n)
    if dtype.startswith(("float", "bfloat")):
        values = sign * np.abs(rng.standard_normal(n)) * 3 + sign * 0.5   # all of one sign
        values[::7] = -values[::7]                                         # and some of the other
    else:
        info = np.iinfo(dtype)
        values = rng.integers(max(info.min, -1000) if sign < 0 else 0, min(info.max, 1000), size=n)
    arr = _array(values, dtype)
    exact = _float64(arr)
    result = compute_stats(arr, backend=backend)
    assert result["Max"] == float(exact.max()) and result["Min"] == float(exact.min())
    if arr.dtype.kind in "iu":
        assert type(result["Max"]) is int and type(result["Min"]) is int
        assert result["Mean"] == sum(arr.tolist()) / n   # the exact integer sum, correctly rounded
    else:
        assert type(result["Max"]) is float and type(result["Min"]) is float
    assert_mean_norm(result, exact)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(), (1,), (5,), (70_001,)])
def test_bool_of_every_size(backend, shape):
    for fill in (True, False):
        arr = np.full(shape, fill)
        assert compute_stats(arr, backend=backend) == {"Max": fill, "Min": fill, "Mean": None, "Norm": None}
    if shape and shape[0] > 1:
        mixed = np.zeros(shape, bool)
        mixed[-1] = True
        result = compute_stats(mixed, backend=backend)
        assert result == {"Max": True, "Min": False, "Mean": None, "Norm": None}
        assert type(result["Max"]) is bool


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("n", [1, 33, 4096 * 3 + 1, 70_001])
def test_nan_inf_rules_every_float_dtype(backend, dtype, n):
    """The NaN/Inf rules of the stats module docstring, at every position (first, inside, last)."""
    base = np.linspace(-2, 3, n)
    for position in {0, n // 2, n - 1}:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nan = base.copy()
            nan[position] = np.nan
            assert all(math.isnan(v) for v in compute_stats(_array(nan, dtype), backend=backend).values())
            pos = base.copy()
            pos[position] = np.inf
            r = compute_stats(_array(pos, dtype), backend=backend)
            assert r["Max"] == math.inf and r["Mean"] == math.inf and r["Norm"] == math.inf
            assert n == 1 or r["Min"] == float(_float64(_array(np.delete(base, position), dtype)).min())
            both = pos.copy()
            both[(position + 1) % n if n > 1 else 0] = -np.inf
            r = compute_stats(_array(both, dtype), backend=backend)
            if n > 1:
                assert r["Max"] == math.inf and r["Min"] == -math.inf and math.isnan(r["Mean"])
            assert r["Norm"] == math.inf


# ------------------------------------------------------------------ the compiled kernel


def test_kernel_is_built():
    """pip install (make test) compiles msprobe/tensors/_stats_kernel.c; the NumPy path is only a fallback."""
    assert stats_scan.KERNEL_AVAILABLE


def _kernel_cases():
    rng = np.random.default_rng(11)
    normal = rng.standard_normal(600_001)
    yield "f4", normal.astype(np.float32)
    yield "f8", normal * 1e3
    yield "f2", normal.astype(np.float16)
    yield "bf2", _array(normal[:200_003], "bfloat16").view(np.uint16)
    cancelling = np.repeat([1e8, -1e8], 150_000) + rng.standard_normal(300_000)  # Σx ≈ 0 << Σ|x|
    yield "f8", rng.permutation(cancelling)
    yield "b1", rng.random(100_003) > 0.3
    for dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        info = np.iinfo(dtype)
        yield dtype[0] + str(np.dtype(dtype).itemsize), rng.integers(info.min, info.max, size=100_003,
                                                                  dtype=dtype, endpoint=True)


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
@pytest.mark.parametrize("code,arr", list(_kernel_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_bits_independent_of_threads_and_vector_extension(code, arr):
    """Fixed blocks decide every addition: 1, 2 or 5 threads, AVX-512 or portable loops: same bits."""
    from msprobe.tensors import _stats_kernel

    for n in (1, 31, 32, 33, 4095, 4096, 4097, arr.size):
        part = arr[:n]
        results = {(t, p): _stats_kernel.scan(part.view(np.uint8), code, t, portable=p)
                   for t in (1, 2, 5) for p in (False, True)}
        first = results[(1, False)]
        assert all(repr(r) == repr(first) for r in results.values()), (n, results)


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int64", "uint8"])
def test_kernel_threads_split_large_tensors(dtype):
    """5 * 2**20 + 4099 elements: up to 5 threads (2**20 elements each at least) give the bits of one,
    also with NaN and Inf in the parts of different threads, and compute_stats agrees with NumPy."""
    from msprobe.tensors import _stats_kernel

    n = 5 * _stats_kernel.MIN_PER_THREAD + 4099
    arr = (np.random.default_rng(5).standard_normal(n) * 50).astype(dtype)
    one = _stats_kernel.scan(arr, _KERNEL_CODES[dtype], 1)
    for threads in (2, 3, 5, 8):
        assert repr(_stats_kernel.scan(arr, _KERNEL_CODES[dtype], threads)) == repr(one), threads
    fast, slow = compute_stats(arr, backend="kernel"), compute_stats(arr, backend="numpy")
    assert (fast["Max"], fast["Min"]) == (slow["Max"], slow["Min"])
    assert fast["Mean"] == pytest.approx(slow["Mean"], rel=0, abs=2e-12 * float(np.mean(np.abs(arr, dtype=np.float64))))
    assert fast["Norm"] == pytest.approx(slow["Norm"], rel=2e-12)
    if arr.dtype.kind == "f":
        arr[[10, n - 10]] = np.inf
        arr[3 * _stats_kernel.MIN_PER_THREAD + 1] = -np.inf
        counts = [_stats_kernel.scan(arr, _KERNEL_CODES[dtype], t)[4:7] for t in (1, 5)]
        assert counts == [(0, 2, 1), (0, 2, 1)]


_KERNEL_CODES = {"float32": "f4", "float16": "f2", "float64": "f8", "int64": "i8", "uint8": "u1"}


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
@pytest.mark.parametrize("code,arr", list(_kernel_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_and_numpy_scan_agree(code, arr):
    """Max, Min, counts and integer sums identical; float64 sums within SUM_TOLERANCE."""
    bf16 = code == "bf2"
    for n in (1, 4097, arr.size):
        part = arr[:n]
        fast = stats_scan.scan(part, bfloat16=bf16, backend="kernel", threads=2)
        slow = stats_scan.scan(part, bfloat16=bf16, backend="numpy")
        if bf16:
            values = np.left_shift(part, 16, dtype=np.uint32).view(np.float32).astype(np.float64)
        else:
            values = part.astype(np.float64)
        if code == "b1" or code[0] in "iu":
            assert fast._replace(squares=0.0) == slow._replace(squares=0.0)
            assert fast.total == sum(part.tolist())
        else:
            assert (fast.max, fast.min, fast.nan, fast.posinf, fast.neginf, fast.zero) == \
                (slow.max, slow.min, slow.nan, slow.posinf, slow.neginf, slow.zero)
            exact_total = math.fsum(values.tolist())
            abs_total = math.fsum(np.abs(values).tolist())
            for got in (fast.total, slow.total):
                assert abs(got - exact_total) <= stats_scan.SUM_TOLERANCE * abs_total
        exact_squares = math.fsum((values * values).tolist())
        for got in (fast.squares, slow.squares):
            assert abs(got - exact_squares) <= stats_scan.SUM_TOLERANCE * exact_squares


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
def test_kernel_counts_nan_inf_zero():
    arr = np.arange(-50_000, 50_000, dtype=np.float32)
    arr[[3, 9000, 99_999]] = np.nan
    arr[[5, 70_000]] = np.inf
    arr[7] = -np.inf
    arr[[11, 12]] = -0.0
    result = stats_scan.scan(arr, backend="kernel")
    assert (result.max, result.min) == (math.inf, -math.inf)          # NaN ignored, Inf kept
    assert (result.nan, result.posinf, result.neginf) == (3, 2, 1)
    assert result.zero == 3                                            # 0.0 at index 50000, -0.0 twice
    assert math.isnan(result.total) and math.isnan(result.squares)     # NaN enters both sums
    assert stats_scan.scan(arr, backend="numpy")[4:] == result[4:]
    all_nan = stats_scan.scan(np.full(40, np.nan), backend="kernel")
    assert (all_nan.max, all_nan.min, all_nan.nan) == (-math.inf, math.inf, 40)
    assert stats_scan.scan(np.full(40, np.nan), backend="numpy")[:2] == (-math.inf, math.inf)


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
def test_kernel_exact_integer_sums_at_the_limits():
    for dtype in (np.int64, np.uint64, np.int32, np.uint32):
        info = np.iinfo(dtype)
        for fill in (info.max, info.min):
            arr = np.full(70_000, fill, dtype=dtype)
            result = stats_scan.scan(arr, backend="kernel", threads=2)
            assert result.total == 70_000 * int(fill) and result.max == result.min == int(fill)


def _strided_bytes(view: np.ndarray) -> memoryview:
    """The bytes of ``view``'s memory from its first element to the end of its last (strides >= 0)."""
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    offset = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    extent = sum((d - 1) * s for d, s in zip(view.shape, view.strides)) + view.itemsize
    return memoryview(root.reshape(-1).view(np.uint8))[offset:offset + extent]


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
@pytest.mark.parametrize("code,arr", list(_kernel_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_strided_scan_gives_the_bits_of_the_contiguous_copy(code, arr):
    """scan_strided over transposed, permuted and sliced views (chunks gathered from strided memory)
    gives scan() of the C-order copy bit for bit, with 1 or 3 threads and either set of loops; signed
    zeros, NaN and Inf included."""
    from msprobe.tensors import _stats_kernel

    data = arr[:(arr.size // 60) * 60].copy()
    if data.dtype.kind == "f":
        data[[3, 5, 17]] = [0.0, -0.0, np.inf]
        data[-7] = np.nan
    views = [data.reshape(60, -1).T, data.reshape(3, 4, 5, -1).transpose(2, 0, 3, 1),
             data.reshape(6, 10, -1)[1:5, ::3, 2:], data.reshape(60, -1)[:, ::7], data.reshape(-1, 2)[:1, :1]]
    for view in views:
        contiguous = np.ascontiguousarray(view)
        for threads, portable in ((1, False), (3, False), (1, True)):
            expected = _stats_kernel.scan(contiguous.view(np.uint8), code, threads, portable)
            got = _stats_kernel.scan_strided(_strided_bytes(view), code, view.shape, view.strides, threads, portable)
            assert repr(got) == repr(expected), (view.shape, view.strides, threads, portable)


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
def test_kernel_strided_scan_of_a_large_transpose_with_threads():
    """A 4 x (2**21 + 37) float32 array transposed: the chunks are gathered by up to 3 threads, each into
    its own buffer; the bits are those of one thread over the copy."""
    from msprobe.tensors import _stats_kernel

    base = np.random.default_rng(3).standard_normal((4, (1 << 21) + 37)).astype(np.float32)
    view = base.T
    expected = _stats_kernel.scan(np.ascontiguousarray(view), "f4", 1)
    for threads in (1, 2, 3):
        assert repr(_stats_kernel.scan_strided(_strided_bytes(view), "f4", view.shape, view.strides,
                                               threads)) == repr(expected)


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
@pytest.mark.parametrize("shape,strides,message", [
    ((2,), (-4,), "need >= 0"), ((2,), (6,), "multiple of the item size"), ((100,), (4,), "do not fit"),
    ((0,), (4,), "at least one element"), ((2, 2), (4,), "same length")])
def test_kernel_strided_scan_refuses_bad_layouts(shape, strides, message):
    from msprobe.tensors import _stats_kernel

    with pytest.raises(ValueError, match=message):
        _stats_kernel.scan_strided(bytes(16), "f4", shape, strides)


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
def test_kernel_reads_strided_and_big_endian_arrays_through_copies():
    base = np.random.default_rng(2).standard_normal((300, 401)).astype(np.float32)
    for arr in (base[::3, 1::2], base.T, base.astype(">f4")):
        assert compute_stats(arr, backend="kernel") == compute_stats(np.ascontiguousarray(arr, "=f4"),
                                                                     backend="kernel")


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
def test_kernel_releases_the_gil():
    """Another Python thread runs while the kernel reduces large tensors: with a 1 s switch
    interval, calls that held the GIL would block it until all 30 (~0.1 s) are done."""
    import sys
    import threading

    arr = np.random.default_rng(0).standard_normal(4_000_000).astype(np.float32)
    state = {"inside": False, "done": False, "ticks": 0}

    def work():
        state["inside"] = True
        for _ in range(30):
            stats_scan.scan(arr, backend="kernel", threads=1)
        state["done"] = True

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        while not state["done"] and not state["ticks"]:  # ran while the worker was in a call
            if state["inside"]:
                state["ticks"] += 1
        worker.join()
    finally:
        sys.setswitchinterval(old)
    assert state["ticks"] > 0, state


def test_scan_rejects_bad_arguments():
    with pytest.raises(ValueError):
        stats_scan.scan(np.zeros(0, np.float32))
    with pytest.raises(ValueError):
        stats_scan.scan(np.zeros(3, np.float32), backend="gpu")
    with pytest.raises(ValueError):
        stats_scan.scan(np.zeros(3, np.float32), bfloat16=True)
    with pytest.raises(TypeError):
        stats_scan.scan(np.array(["a"]))


def test_kernel_absent_falls_back_to_numpy(monkeypatch):
    """Without the compiled module, compute_stats gives the NumPy results; backend='kernel' says why not."""
    arr = np.random.default_rng(3).standard_normal(10_000).astype(np.float32)
    expected = compute_stats(arr, backend="numpy")
    monkeypatch.setattr(stats_scan, "_stats_kernel", None)
    assert compute_stats(arr) == expected
    with pytest.raises(RuntimeError, match="not built"):
        compute_stats(arr, backend="kernel")


def test_negative_scalar_gradient_norm_in_dump(make_debugger, dump_dir):
    """End to end: a 0-d negative output and its 0-d negative gradient are dumped with Norm = |x|."""
    import msprobe.dump
    from conftest import only_step_dir

    debugger = make_debugger(task="statistics", level="L1")
    w = ms.Parameter(ms.Tensor(np.array(-0.5, np.float32)), name="w")

    def forward(x):
        return ms.ops.mul(x, w)

    grad_fn = ms.grad(forward, grad_position=None, weights=[w])
    debugger.start()
    y = forward(ms.Tensor(np.array(0.0747, np.float32)))
    (gw,) = grad_fn(ms.Tensor(np.array(-0.0747, np.float32)))
    debugger.stop()
    debugger.step()
    data = msprobe.dump.load(only_step_dir(dump_dir, 0)).data
    leaves = [leaf for body in data.values() for group in body.values() if isinstance(group, list)
              for leaf in group if isinstance(leaf, dict) and leaf.get("shape") == []]
    assert float(y.asnumpy()) < 0 and leaves
    for leaf in leaves:
        if leaf.get("Mean") is not None:
            assert leaf["Norm"] == abs(leaf["Mean"]) and leaf["Norm"] >= 0, leaf
    assert any(leaf["Mean"] == float(y.asnumpy()) < 0 < leaf["Norm"] for leaf in leaves)
    grads = [leaf for name, body in data.items() if name.endswith(".backward") for leaf in body["output"]
             if leaf is not None]
    assert float(gw.asnumpy()) == pytest.approx(-0.0747)
    assert [(g["Mean"], g["Norm"]) for g in grads] == [(float(gw.asnumpy()), -float(gw.asnumpy()))]


@pytest.mark.skipif(not stats_scan.KERNEL_AVAILABLE, reason="kernel not built")
def test_kernel_misaligned_data_is_copied_or_refused():
    from msprobe.tensors import _stats_kernel

    arr = np.arange(1000, dtype=np.float32)
    arr[::3] = -2.5
    raw = np.zeros(arr.nbytes + 1, np.uint8)
    raw[1:] = arr.view(np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.float32, offset=1)
    assert not misaligned.flags.aligned
    assert compute_stats(misaligned, backend="kernel") == compute_stats(arr, backend="kernel")
    with pytest.raises(ValueError, match="aligned"):
        _stats_kernel.scan(misaligned, "f4", 1)
    with pytest.raises(ValueError, match="unsupported kind"):
        _stats_kernel.scan(arr, "c8", 1)


def test_free_cpus_counts_what_the_machine_has_free(tmp_path, monkeypatch):
    """THREADS minus the other runnable threads of /proc/loadavg (which counts the caller), >= 1."""
    monkeypatch.setattr(stats_scan, "THREADS", 4)
    path = tmp_path / "loadavg"
    for running, free in ((1, 4), (2, 3), (4, 1), (40, 1)):
        path.write_text(f"3.10 2.50 1.00 {running}/812 4242\n")
        assert stats_scan.free_cpus(str(path)) == free
    path.write_text("garbage")
    assert stats_scan.free_cpus(str(path)) == 4
    assert stats_scan.free_cpus(str(tmp_path / "missing")) == 4
    monkeypatch.undo()
    assert 1 <= stats_scan.free_cpus() <= stats_scan.THREADS


def test_optional_counts_in_a_dump_equal_numpy(tmp_path):
    """summary_mode as a list adds NaN/+Inf/-Inf/zero counts and the largest |x| to every tensor
    record, equal to numpy's counts; the four standard statistics are unchanged."""
    import glob
    import json
    import os

    import msprobe.dump
    from msprobe.mindspore import PrecisionDebugger

    dump_path = str(tmp_path / "dump")
    cfg = {"task": "statistics", "dump_path": dump_path, "level": "L1",
           "statistics": {"summary_mode": ["max", "min", "mean", "l2norm", "nan count", "positive inf count",
                                           "negative inf count", "zero count", "max abs"]}}
    with open(tmp_path / "c.json", "w") as f:
        json.dump(cfg, f)
    values = np.array([0.0, -0.0, 1.5, -7.25, np.inf, -np.inf, np.nan, 3.0, 0.0], np.float32)
    debugger = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    debugger.start()
    ms.ops.abs(ms.Tensor(values))
    ms.ops.abs(ms.Tensor(np.array(-2.5, np.float32)))
    ms.ops.abs(ms.Tensor(np.zeros((0,), np.float32)))
    debugger.stop()
    debugger.step()
    (d,) = glob.glob(os.path.join(dump_path, "step0", "*"))
    data = msprobe.dump.load(d).data
    leaf = data["Functional.abs.0.forward"]["input_args"][0]
    assert (leaf["NanCount"], leaf["PosInfCount"], leaf["NegInfCount"], leaf["ZeroCount"]) == (1, 1, 1, 3)
    assert leaf["MaxAbs"] == np.inf and np.isnan(leaf["Max"])
    out = data["Functional.abs.0.forward"]["output"][0]
    assert (out["NanCount"], out["PosInfCount"], out["NegInfCount"], out["ZeroCount"]) == (1, 2, 0, 3)
    scalar = data["Functional.abs.1.forward"]["input_args"][0]
    assert (scalar["ZeroCount"], scalar["MaxAbs"], scalar["Norm"]) == (0, 2.5, 2.5)
    empty = data["Functional.abs.2.forward"]["input_args"][0]
    assert (empty["NanCount"], empty["ZeroCount"], empty["MaxAbs"]) == (0, 0, None)


def test_device_target_is_the_context_s():
    """``stats.device_target`` reads the context MindSpore's ``get_context`` reads, at each call."""
    assert stats.device_target() == ms.get_context("device_target") == "CPU"
    ms.set_context(device_target="CPU")
    assert stats.device_target() == ms.get_context("device_target")
