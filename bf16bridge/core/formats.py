"""What the bits of a low-precision row mean, from its table row alone (no ml_dtypes needed):
every pattern's value, the pattern ml_dtypes reads in each byte, widening bits to float32 by
table, and the refusal of bytes that packing would change.

Pure numpy over ``core.dtypes``: the adapters decode and check bits through here, and the
kernels (``bf16bridge.kernels``) build their tables from it.
"""

from __future__ import annotations

import functools

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core.dtypes import Dtype
from bf16bridge.errors import InvalidArgumentError, UnsupportedDtypeError

def format_of(dtype) -> Dtype:
    """The row of a low-precision dtype one value a byte (its name, or its ml_dtypes / NumPy dtype)."""
    name = dtype if isinstance(dtype, str) else getattr(np.dtype(dtype), "name", str(dtype))
    try:
        return dtypes.FORMATS[name]
    except KeyError:
        raise UnsupportedDtypeError(f"no narrow format named {name!r}; the kernels take "
                                    f"bfloat16, {', '.join(dtypes.FORMATS)}") from None


def decoded(fmt: Dtype) -> np.ndarray:
    """Every one of the ``2**bits`` patterns' values as float64 (NaN where the pattern is NaN),
    from the row's fields alone (no ml_dtypes)."""
    code = np.arange(1 << fmt.bits, dtype=np.int64)
    if fmt.integer:
        if fmt.signed:
            code = np.where(code >= 1 << (fmt.bits - 1), code - (1 << fmt.bits), code)
        return code.astype(np.float64)
    top = 1 << (fmt.ebits + fmt.mbits)
    neg = (code & top) != 0 if fmt.signed else np.zeros(code.shape, bool)
    mag = code & (top - 1)
    e, m = mag >> fmt.mbits, mag & ((1 << fmt.mbits) - 1)
    if fmt.nan == "ones":  # no subnormals: every exponent is 2**(e - bias)
        val = np.ldexp(1.0, e - fmt.bias)
    else:
        frac = np.where(e == 0, m, m + (1 << fmt.mbits)).astype(np.float64)
        val = np.ldexp(frac, np.maximum(e, 1) - fmt.bias - fmt.mbits)
    val = np.where(neg, -val, val)
    emax, mmax = (1 << fmt.ebits) - 1, (1 << fmt.mbits) - 1
    if fmt.nan == "ieee":
        val = np.where(e == emax, np.where(m == 0, np.where(neg, -np.inf, np.inf), np.nan), val)
    elif fmt.nan == "fn":
        val = np.where((e == emax) & (m == mmax), np.nan, val)
    elif fmt.nan == "fnuz":
        val = np.where(code == top, np.nan, val)
    elif fmt.nan == "ones":
        val = np.where(code == fmt.mask, np.nan, val)
    return val


def byte_codes(fmt: Dtype) -> np.ndarray:
    """For each of the 256 bytes, the ``fmt`` pattern ml_dtypes reads in it (a byte holds one value
    of a sub-byte format in its low bits; ml_dtypes writes no other bits, but a view of other bytes
    holds them): an integer format's low bits; a signed float's magnitude bits, negative where any
    bit from the sign bit up is set (ml_dtypes reads float4_e2m1fn 0x11 as -0.5, 0x10 as -0.0)."""
    byte = np.arange(256)
    if fmt.integer or not fmt.signed:
        return byte & fmt.mask
    sign = 1 << (fmt.bits - 1)
    return np.where(byte >= sign, sign, 0) | (byte & (sign - 1))


@functools.lru_cache(maxsize=None)
def widen_table(name: str) -> np.ndarray:
    """float32 bits for every byte of row ``name``: the pattern ml_dtypes reads in it decoded
    (``byte_codes``); NaN as the quiet NaN with the pattern's sign (fnuz's NaN is the -0 pattern:
    0xFFC00000), as ml_dtypes gives. Read-only: it is shared."""
    fmt = format_of(name)
    val = decoded(fmt)
    with np.errstate(invalid="ignore"):
        b = val.astype(np.float32).view(np.uint32)
    code = np.arange(val.size)
    neg = (code >> (fmt.bits - 1)) & 1 if fmt.signed else np.zeros_like(code)
    b = np.where(np.isnan(val), np.where(neg == 1, 0xFFC00000, 0x7FC00000), b).astype(np.uint32)
    table = b[byte_codes(fmt)]
    table.flags.writeable = False
    return table


def widen(bits: np.ndarray, name: str) -> np.ndarray:
    """The float32 values of ``bits`` (the carrier bits of bfloat16 or of a format one value a
    byte), exactly, without ml_dtypes: bf16 moves to the top half; a format's bytes are looked up."""
    bits = np.asarray(bits)
    if name == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return widen_table(format_of(name).name)[bits].view(np.float32)


@functools.lru_cache(maxsize=None)
def _changed_by_padding(name: str) -> tuple[np.ndarray | None, int]:
    """Which of the 256 bytes hold another ``name`` value than their low bits alone: what packing
    (which keeps the low bits) would change (``byte_codes``), None where no byte is (the integer
    formats; for float4_e2m1fn the bytes from 0x10 whose sign the low bits do not carry); and the
    format's mask (a byte above it has high bits set)."""
    fmt = dtypes.FORMATS[name]
    codes = byte_codes(fmt)
    changed = codes != codes[np.arange(256) & fmt.mask]
    return (changed if changed.any() else None), fmt.mask


def refuse_changed_padding(bits: np.ndarray, name: str, what: str) -> None:
    """Raise where ``bits`` (the uint8 view of a sub-byte ``name`` array, one value a byte) hold a
    byte whose value packing would change: packing keeps a value's low bits only (``pack_nibbles``,
    bb.save's F4, jax's device_put of a sub-byte type)."""
    changed, mask = _changed_by_padding(name)
    if changed is None or not bits.size or int(bits.max()) <= mask:
        return  # a format packing never changes, or every byte one ml_dtypes makes: one pass at most
    flat = bits.reshape(-1)
    if not changed[flat[flat > mask]].any():  # only the bytes with high bits are looked up
        return
    at = int(np.argmax(changed[flat]))
    byte = int(flat[at])
    value = np.array([byte], np.uint8).view(dtypes.numpy_dtype(name)).astype(np.float32)[0]
    raise InvalidArgumentError(
        f"{what}: this {name} array holds byte 0x{byte:02X} at flat index {at}, which ml_dtypes reads as "
        f"{value:g}, but it is not a byte ml_dtypes makes (its high bits are set) and packing keeps only "
        f"the low {dtypes.FORMATS[name].bits} bits, which would change the value. Was it a view of other bytes? "
        f"Canonicalise it, keeping ml_dtypes' values: a.astype(np.float32).astype(a.dtype)")
