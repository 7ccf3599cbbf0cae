"""Every bf16 bit pattern over every ordered pair, bit for bit and zero-copy."""

import warnings

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, IMMUTABLE, PAIRS, bits, dtype_name, make, ptr, type_framework


@pytest.mark.parametrize("src,dst", PAIRS)
def test_all_bf16_patterns_cross_unchanged_and_zero_copy(src, dst, all_bf16):
    x = make(src, all_bf16.view(BF16))
    p = bb.plan(x, to=dst)
    # a writable torch tensor over an immutable jax/tf buffer is said, not left silent
    assert (p.alias is not None) == (dst == "torch" and src in IMMUTABLE)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        y = bb.convert(x, dst)
    assert [w.category for w in said] == ([bb.Bf16BridgeWarning] if p.alias else [])
    assert type_framework(y) == dst
    assert dtype_name(y) == "bfloat16"
    np.testing.assert_array_equal(bits(y), all_bf16)  # NaN payloads and -0 included
    assert p.zero_copy and p.shares_memory
    assert ptr(y) == ptr(x), "a zero-copy route must hand over the same memory"
    assert p.dtype_out == "bfloat16"


@pytest.mark.parametrize("src,dst", PAIRS)
def test_bf16_2d_shape_kept(src, dst, all_bf16):
    x = make(src, all_bf16.view(BF16).reshape(256, 256))
    y = bb.convert(x, dst, on_alias="allow")
    assert tuple(y.shape) == (256, 256)
    np.testing.assert_array_equal(bits(y).reshape(-1), all_bf16)


OTHER_DTYPES = ["bool", "int8", "int16", "int32", "uint8", "uint16", "uint32",
                "float16", "float32", "complex64"]


def _random(dtype, n=4099):
    rng = np.random.default_rng(7)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    raw = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype)  # every bit pattern kind: NaNs, infs, subnormals


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
@pytest.mark.parametrize("src,dst", PAIRS)
def test_other_dtypes_cross_bit_for_bit(src, dst, dtype):
    a = _random(dtype)
    x = make(src, a)
    y = bb.convert(x, dst, on_alias="allow")
    assert dtype_name(y) == dtype
    np.testing.assert_array_equal(bits(y), bits(a))
    assert ptr(y) == ptr(x)


@pytest.mark.parametrize("dtype", ["int64", "uint64", "float64", "complex128"])
@pytest.mark.parametrize("src,dst", [p for p in PAIRS if "jax" not in p])
def test_64_bit_dtypes_cross_bit_for_bit(src, dst, dtype):
    a = _random(dtype)
    y = bb.convert(make(src, a), dst, on_alias="allow")
    assert dtype_name(y) == dtype
    np.testing.assert_array_equal(bits(y), bits(a))


@pytest.mark.parametrize("src", ["numpy", "torch", "tensorflow"])
def test_jax_without_x64_refuses_64_bit_instead_of_narrowing(src):
    import jax

    assert not jax.config.jax_enable_x64
    x = make(src, np.arange(5, dtype=np.float64) + 0.1)
    with pytest.raises(bb.UnsupportedDtypeError, match="jax_enable_x64"):
        bb.convert(x, "jax")
