"""kernels.to_float32 / to_bf16: bit-identical to ml_dtypes, chunked, bounded memory."""

import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from bf16bridge import kernels

BACKENDS = ["ml_dtypes", "numpy", "torch"]


def _float32_inputs() -> np.ndarray:
    """2**24 float32 bit patterns: every top half (sign, exponent, top mantissa: zeros,
    subnormals, normals, infs, NaNs with every payload) with 256 bottom halves, among
    them the rounding boundaries (ties 0x8000, just below and above) and the extremes."""
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000], dtype=np.uint32)
    rng = np.random.default_rng(1)
    lows = np.concatenate([lows, rng.integers(0, 1 << 16, 256 - lows.size, dtype=np.uint32)])
    highs = np.arange(1 << 16, dtype=np.uint32) << 16
    return (highs[:, None] | lows[None, :]).reshape(-1).view(np.float32)


@pytest.fixture(scope="module")
def f32_inputs():
    x = _float32_inputs()
    assert x.size >= 1 << 24
    with np.errstate(invalid="ignore"):
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    return x, ref


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_bf16_is_bit_identical_to_ml_dtypes(backend, f32_inputs):
    x, ref = f32_inputs
    y = kernels.to_bf16(x, backend=backend)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16) and y.shape == x.shape
    bad = np.flatnonzero(y.view(np.uint16) != ref)
    assert bad.size == 0, [(hex(x.view(np.uint32)[i]), hex(ref[i]), hex(y.view(np.uint16)[i])) for i in bad[:5]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_bf16_special_values(backend):
    cases = {  # float32 bits -> bf16 bits
        0x00000000: 0x0000, 0x80000000: 0x8000,  # zeros keep their sign
        0x00000001: 0x0000, 0x00008000: 0x0000, 0x00018000: 0x0002,  # subnormal ties to even, no flush
        0x007F8000: 0x0080,  # largest subnormals round up into the normals
        0x3F808000: 0x3F80, 0x3F818000: 0x3F82,  # ties to even
        0x7F7FFFFF: 0x7F80, 0xFF7FFFFF: 0xFF80,  # overflow to inf
        0x7F800000: 0x7F80, 0xFF800000: 0xFF80,  # infs
        0x7F800001: 0x7FC0, 0xFFC00001: 0xFFC0, 0x7FFFFFFF: 0x7FC0,  # NaNs: quiet, sign kept
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    y = kernels.to_bf16(x, backend=backend).view(np.uint16)
    assert [hex(v) for v in y] == [hex(v) for v in cases.values()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_float32_is_exact_on_every_bf16_pattern(backend, all_bf16):
    y = kernels.to_float32(all_bf16.view(ml_dtypes.bfloat16), backend=backend)
    np.testing.assert_array_equal(y.view(np.uint32), all_bf16.astype(np.uint32) << 16)
    z = kernels.to_float32(all_bf16, backend=backend)  # uint16 bits work too
    np.testing.assert_array_equal(z.view(np.uint32), all_bf16.astype(np.uint32) << 16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunking_does_not_change_results(backend):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 1001)).astype(np.float32)
    whole = kernels.to_bf16(x, backend=backend)
    pieces = kernels.to_bf16(x, backend=backend, chunk=997)
    np.testing.assert_array_equal(whole.view(np.uint16), pieces.view(np.uint16))
    assert pieces.shape == x.shape
    wide = kernels.to_float32(pieces, chunk=1000, backend=backend)
    np.testing.assert_array_equal(wide, kernels.to_float32(pieces, backend=backend))


@pytest.mark.parametrize("backend", ["ml_dtypes", "numpy"])
def test_threads_do_not_change_results(backend, f32_inputs):
    x, ref = f32_inputs
    y = kernels.to_bf16(x, backend=backend, threads=3, chunk=1 << 20)
    np.testing.assert_array_equal(y.view(np.uint16), ref)
    w = kernels.to_float32(y, backend=backend, threads=4, chunk=333_333)
    np.testing.assert_array_equal(w.view(np.uint32), ref.astype(np.uint32) << 16)
    with pytest.raises(ValueError, match="chunk"):
        kernels.to_bf16(x[:10], chunk=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_extra_memory_is_bounded_by_a_chunk(backend):
    n, chunk = 1 << 23, 1 << 16  # 32 MiB of float32, 256 KiB chunks
    x = np.ones(n, dtype=np.float32)
    out = np.empty(n, dtype=ml_dtypes.bfloat16)
    wide = np.empty(n, dtype=np.float32)
    kernels.to_bf16(x[:10], backend=backend)  # warm up (torch's first call allocates its own state)
    tracemalloc.start()
    try:
        kernels.to_bf16(x, out=out, chunk=chunk, backend=backend)
        kernels.to_float32(out, out=wide, chunk=chunk, backend=backend)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * chunk * 4, f"peak {peak} bytes for a {n * 4}-byte input"
    np.testing.assert_array_equal(wide, x)


def test_out_may_be_a_memory_map(tmp_path):
    x = np.linspace(-3, 3, 100_003, dtype=np.float32)
    out = np.lib.format.open_memmap(tmp_path / "y.npy", mode="w+", dtype=ml_dtypes.bfloat16, shape=x.shape)
    kernels.to_bf16(x, out=out, chunk=4096)
    out.flush()
    del out
    back = np.load(tmp_path / "y.npy", allow_pickle=False)  # read back from the file
    np.testing.assert_array_equal(back.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_progress_bar_when_asked(capsys):
    kernels.to_float32(np.zeros(10_000, dtype=ml_dtypes.bfloat16), chunk=1000, progress=True)
    err = capsys.readouterr().err
    assert "bf16 -> float32" in err and "100.0%" in err
    kernels.to_float32(np.zeros(10_000, dtype=ml_dtypes.bfloat16), chunk=1000)
    assert capsys.readouterr().err == ""  # quick conversions stay quiet


def test_bad_inputs_get_clear_errors():
    with pytest.raises(TypeError, match="float32"):
        kernels.to_bf16(np.zeros(3, dtype=np.float64))
    with pytest.raises(TypeError, match="bfloat16"):
        kernels.to_float32(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.to_bf16(np.zeros((4, 4), dtype=np.float32).T)
    with pytest.raises(ValueError, match="out must be"):
        kernels.to_bf16(np.zeros(3, dtype=np.float32), out=np.zeros(4, dtype=ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match="backend must be"):
        kernels.to_bf16(np.zeros(3, dtype=np.float32), backend="cuda")


def test_auto_backend_is_ml_dtypes_here():
    assert kernels.pick_backend() == "ml_dtypes"
