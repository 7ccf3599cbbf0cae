"""The narrow rows (fp8/fp6/fp4, sub-byte ints) as inputs, in every environment CI runs, the oldest
too: every bit pattern from every framework that holds a row reaches every target (a packed row's
values in their order) or our error; torch's padded sub-byte ints under fallback='auto' arrive as
their values."""

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core.dtypes import LOW_PRECISION
from conftest import PAIRS, aligned_copy, bits, dtype_name, make


def _narrow_source(src, dtype):
    """Every bit pattern of narrow row ``dtype`` as a ``src`` tensor made by the framework's own
    calls, or None where this environment has no way to make one (numpy without the dtype)."""
    from bf16bridge.core import dtypes

    pats = dtypes.all_patterns(dtype)
    if src == "torch":
        import torch

        t = getattr(torch, dtype, None)
        return torch.from_numpy(aligned_copy(pats)).view(t) if isinstance(t, torch.dtype) else None
    if dtypes.numpy_missing(dtype) is not None:
        return None
    return make(src, pats.view(dtypes.numpy_dtype(dtype)))


def _nibbles(b):
    """Packed bytes as one value a byte, element 2i in the low nibble (torch's float4_e2m1fn_x2)."""
    out = np.empty(b.size * 2, np.uint8)
    out[0::2], out[1::2] = b & 15, b >> 4
    return out


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_narrow_rows_keep_every_bit_or_raise_ours(dtype, src, dst):
    """Every narrow row from every framework that holds it to every target: every bit pattern
    arrives (a packed row's values in their order), or the bridge refuses with its own error, and
    only where the target holds neither the row nor its packed/unpacked twin. Where a framework
    says it holds a row, a tensor of it can be made through the bridge; where it does not, the
    bridge makes none (it refuses, naming the row, or gives the twin)."""
    from bf16bridge.core import dtypes
    from bf16bridge.core import registry

    twin = dtypes.PACKED.get(dtype) or dtypes.UNPACKED.get(dtype)
    holds = registry.get(src).holds(dtype)
    if dtypes.numpy_missing(dtype) is None:
        if holds:
            y = bb.convert(_narrow_source("numpy", dtype), to=src)  # the probe's "holds" is one the bridge makes
            assert bits(y).tobytes() == dtypes.all_patterns(dtype).tobytes()
        else:
            try:
                y = bb.convert(_narrow_source("numpy", dtype), to=src)
            except bb.UnsupportedDtypeError as err:
                assert dtype in str(err) and src in str(err)
            else:
                assert twin is not None and dtype_name(y) == twin, (src, dtype, dtype_name(y))
    if not holds:
        why = registry.get(src).cannot_hold(dtype)
        assert why and dtype in why, (src, dtype, why)
        return
    x = _narrow_source(src, dtype)
    assert x is not None, f"{src} holds {dtype}, yet the test makes none"  # holds implies a way to make one
    want = bits(x).reshape(-1)
    target = registry.get(dst)
    for copy in (None, True):
        try:
            y = bb.convert(x, to=dst, copy=copy, on_alias="allow")
        except bb.Bf16BridgeError:
            if target.holds(dtype) or (twin is not None and target.holds(twin)):
                raise
            continue
        got = bits(y).reshape(-1)
        if got.size == 2 * want.size:
            np.testing.assert_array_equal(got, _nibbles(want))
        elif 2 * got.size == want.size:
            np.testing.assert_array_equal(_nibbles(got), want)
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dst", ["numpy", "jax", "tensorflow"])
@pytest.mark.parametrize("dtype", ["int2", "uint2", "int4", "uint4"])
def test_padded_sub_byte_ints_through_auto_arrive_as_their_values(dtype, dst):
    """torch's sub-byte ints with their padding bits set, fallback='auto': the row itself (every
    byte kept), or a widening holding the value the low bits mean (as ml_dtypes reads 0xF3 as uint4
    3), or a refusal where neither the target nor numpy (the hub) can read the row; never the raw
    byte as a widened value (uint8 is uint2's widening and its carrier too). A target that stores
    the row packed (XLA's int4/int2) drops the padding: the values are compared."""
    import torch

    from bf16bridge.core import dtypes
    from bf16bridge.core import registry

    row = dtypes.ROWS[dtype]
    pats = np.arange(256, dtype=np.uint8)
    low = (pats & ((1 << row.bits) - 1)).astype(np.int64)
    values = np.where(low >= 1 << (row.bits - 1), low - (1 << row.bits), low) if row.kind == "int" else low
    if dtypes.numpy_missing(dtype) is None:  # the expected values are ml_dtypes' own reading
        np.testing.assert_array_equal(pats.view(dtypes.numpy_dtype(dtype)).astype(np.int64), values)
    x = torch.from_numpy(aligned_copy(pats)).view(getattr(torch, dtype))
    try:
        p = bb.plan(x, to=dst, fallback="auto")
    except bb.UnsupportedDtypeError:
        held = [n for n in (dst, "numpy") if registry.get(n).holds(dtype)]
        assert not held, f"{held} hold {dtype} yet the bridge refused"
        return
    y = bb.convert(x, to=dst, fallback="auto")
    mask = (1 << row.bits) - 1
    if p.dtype_out == dtype:
        np.testing.assert_array_equal(bits(y).reshape(-1) & mask, pats & mask)
    else:
        assert p.dtype_out in row.widenings
        np.testing.assert_array_equal(bits(y).view(np.dtype(p.dtype_out)).astype(np.int64), values)
