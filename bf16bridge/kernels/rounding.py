"""Rounding float32 to a low-precision format and widening it back, as kernels over bits: the
rule in plain float64 arithmetic (``round_reference``), the numpy backend's lookup tables built
from it, and ml_dtypes' own casts; each kernel made once per format, backend and saturation."""

from __future__ import annotations

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core.dtypes import Dtype
from bf16bridge.core.formats import decoded, format_of, widen_table
from bf16bridge.errors import InvalidArgumentError, UnsupportedDtypeError
from bf16bridge.kernels.bits import BUILTIN
from bf16bridge.core.chunks import blocked

_F64 = np.dtype(np.float64)


def _nan_code(fmt: Dtype, neg):
    """The pattern a NaN input becomes (ml_dtypes' choice, sign kept where the format has one)."""
    sign = np.where(neg, 1 << (fmt.bits - 1), 0) if fmt.signed else 0
    emax_field = ((1 << fmt.ebits) - 1) << fmt.mbits
    if fmt.nan == "ieee":  # the quiet NaN: top mantissa bit set
        return sign | emax_field | (1 << (fmt.mbits - 1))
    if fmt.nan == "fn":
        return sign | emax_field | ((1 << fmt.mbits) - 1)
    if fmt.nan == "fnuz":
        return np.full(np.shape(neg), 1 << (fmt.bits - 1))
    if fmt.nan == "ones":
        return np.full(np.shape(neg), fmt.mask)
    # no NaN pattern at all (fp6, fp4): ml_dtypes gives a zero of the opposite sign
    return np.where(neg, 0, 1 << (fmt.bits - 1))


def _over_code(fmt: Dtype, neg, largest_code: int):
    """The pattern an overflow becomes without saturation: inf, NaN, or (no specials) the largest."""
    top = 1 << (fmt.ebits + fmt.mbits)
    if fmt.nan == "ieee":
        return np.where(neg, top, 0) | (((1 << fmt.ebits) - 1) << fmt.mbits)
    if fmt.nan == "none":  # no inf, no NaN: overflow saturates even without saturate=True
        return np.where(neg, top, 0) | largest_code
    return _nan_code(fmt, neg)


def round_reference(x, dtype, *, saturate: bool = False) -> np.ndarray:
    """The rounding rule in plain float64 arithmetic, element by element: the numpy backend's
    lookup tables are built from it, and the tests hold it and them to ml_dtypes. Takes float32
    or float64 values; returns the patterns as uint8."""
    fmt = format_of(dtype)
    x = np.asarray(x)
    if fmt.integer:  # from float64 directly, as ml_dtypes does
        with np.errstate(invalid="ignore"):
            return _round_int(x.astype(np.float64), fmt, saturate)
    with np.errstate(invalid="ignore", over="ignore"):  # float64 rounds to float32 first, as in ml_dtypes;
        x = x.astype(np.float32).astype(np.float64)  # signalling NaNs are quieted: their sign is all that counts
    val = decoded(fmt)
    ok = np.isfinite(val) & ~np.signbit(val)
    ok[0] |= fmt.nan != "fnuz" and not np.signbit(val[0])
    mags, codes = val[ok], np.flatnonzero(ok)
    order = np.argsort(mags, kind="stable")
    mags, codes = mags[order], codes[order]
    big = mags[-1]
    neg, ax, nan = np.signbit(x), np.abs(x), np.isnan(x)
    if saturate:
        ax = np.minimum(ax, big)  # NaN stays NaN
    with np.errstate(invalid="ignore", over="ignore"):
        _, k = np.frexp(np.where(np.isfinite(ax), ax, 0.0))
        e = np.maximum(k - 1, 1 - fmt.bias if fmt.nan != "ones" else -fmt.bias)
        q = np.ldexp(1.0, e - fmt.mbits)
        r = np.rint(ax / q) * q  # ties to even, in the value's own spacing: exact in float64
        over = ~nan & (r > big)  # infinity too
    r = np.where(over | nan, 0.0, r)
    if fmt.nan == "ones":  # no zero: everything positive below the smallest value becomes it;
        # and between it and the next (float32 subnormals) ml_dtypes rounds up, not to nearest
        r = np.where((ax > mags[0]) & (ax < mags[1]), mags[1], np.maximum(r, mags[0]))
    code = codes[np.minimum(np.searchsorted(mags, r), mags.size - 1)].astype(np.int64)
    if fmt.signed:
        keep_sign = neg & ((r != 0) | (fmt.nan != "fnuz"))
        code |= np.where(keep_sign, 1 << (fmt.bits - 1), 0)
    code = np.where(over, _over_code(fmt, neg, codes[-1]), code)
    code = np.where(nan, _nan_code(fmt, neg), code)
    if fmt.nan == "ones":  # no sign: a negative number (or any zero) is NaN, as in ml_dtypes
        code = np.where(neg | (x == 0), fmt.mask, code)
    return code.astype(np.uint8)


def _round_int(x: np.ndarray, fmt: Dtype, saturate: bool) -> np.ndarray:
    """float -> a sub-byte integer as numpy's and ml_dtypes' astype: truncate toward zero, keep
    the low ``bits`` (wrap) of values within int32; NaN, inf and |x| >= 2**31 give 0 (what
    ml_dtypes gives on x86, where C++ leaves it undefined). saturate=True clamps instead; NaN is 0."""
    lo, hi = fmt.value_range
    with np.errstate(invalid="ignore"):
        t = np.trunc(x)
        if saturate:
            v = np.where(np.isnan(t), 0, np.clip(t, lo, hi))
        else:
            v = np.where(np.abs(t) < 2.0 ** 31, t, 0)
    return (v.astype(np.int64) & fmt.mask).astype(np.uint8)


_TABLES: dict = {}


def round_table(fmt: Dtype, saturate: bool) -> np.ndarray:
    """The pattern for every float32 as a 2**17-entry table: with at most 6 mantissa bits kept
    (4 here), the rounding bit is bit 16 or above, so a float32's result depends only on its top
    16 bits and whether any of the low 16 is set (index: top 16 bits, then that one)."""
    key = (fmt.name, saturate)
    table = _TABLES.get(key)
    if table is None:  # two threads may build it at once; both get the same table
        i = np.arange(1 << 17, dtype=np.uint32)
        table = _TABLES[key] = round_reference(((i >> 1) << 16 | (i & 1)).view(np.float32), fmt.name,
                                               saturate=saturate)
    return table


def _float32_bits(src: np.ndarray) -> np.ndarray:
    if src.dtype == _F64:  # rounded to float32 first, as ml_dtypes does
        with np.errstate(over="ignore", invalid="ignore"):
            return src.astype(np.float32).view(np.uint32)
    return src.view(np.uint32)


def _round_by_table(table: np.ndarray):
    def step(src: np.ndarray, dst: np.ndarray) -> None:
        u = _float32_bits(src)
        idx = u >> 15  # the top 16 bits and bit 15; bit 15 joins the sticky bit below
        low = u & 0x7FFF
        low += 0x7FFF
        low >>= 15  # 1 where any of bits 0-14 is set
        idx |= low
        table.take(idx, out=dst)
    return blocked(step)


def _round_int_kernel(fmt: Dtype, saturate: bool):
    """_round_int's rule, in the input's own width: int32 holds every truncated value kept."""
    lo, hi = fmt.value_range

    def step(src: np.ndarray, dst: np.ndarray) -> None:
        if saturate:
            v = np.clip(src, lo, hi)
            np.copyto(v, 0, where=np.isnan(v))
        else:
            v = np.where(np.abs(src) < 2.0 ** 31, src, 0)  # NaN and inf too
        i = v.astype(np.int32)  # truncates toward zero
        i &= fmt.mask
        np.copyto(dst, i, casting="unsafe")
    return blocked(step)


def _round_astype(nd: np.dtype, fmt: Dtype, saturate: bool):
    """ml_dtypes' own cast; saturate=True clamps to the finite range first (NaN kept; ints: 0)."""
    lo, hi = fmt.value_range

    def kernel(src: np.ndarray, dst: np.ndarray) -> None:
        if saturate:
            src = np.clip(src, lo, hi)
            if fmt.integer:
                np.copyto(src, 0, where=np.isnan(src))
        with np.errstate(invalid="ignore", over="ignore"):
            np.copyto(dst.view(nd), src, casting="unsafe")
        if fmt.bits < 8:  # ml_dtypes 0.3.1's int4/uint4 cast leaves the padding bits unset (any value)
            np.bitwise_and(dst, np.uint8(fmt.mask), out=dst)
    return kernel


def _widen_astype(nd: np.dtype):
    def kernel(src: np.ndarray, dst: np.ndarray) -> None:
        np.copyto(dst.view(np.float32), src.view(nd), casting="unsafe")
    return kernel


def _widen_by_table(table: np.ndarray):
    return blocked(lambda src, dst: table.take(src, out=dst))


def format_backend(backend: str, name: str, nd: np.dtype | None, widen: bool = False) -> str:
    """The backend a format's kernel runs on: "auto" picks the faster, as measured (docs/kernels.md);
    both give the same bits."""
    if backend == "auto":
        return "ml_dtypes" if widen and nd is not None and dtypes.FORMATS[name].integer else "numpy"
    if backend == "ml_dtypes" and nd is None:
        raise UnsupportedDtypeError(f"backend 'ml_dtypes' has no {name} here: {dtypes.numpy_missing(name)}; "
                                    "or use backend='numpy'")
    if backend not in BUILTIN:
        raise InvalidArgumentError(f"backend for {name} must be one of auto, {', '.join(BUILTIN)}; got {backend!r}")
    return backend


_KERNELS: dict = {}


def format_kernel(name: str, picked: str, saturate: bool | None, nd: np.dtype | None):
    """The kernel for one format and backend (saturate=None: widening), made once: its
    closures and tables are the same every call."""
    key = (name, picked, saturate)
    kernel = _KERNELS.get(key)
    if kernel is None:  # two threads may make it at once; both get an equal kernel
        fmt = dtypes.FORMATS[name]
        if saturate is None:
            kernel = (_widen_astype(nd) if picked == "ml_dtypes" and nd is not None
                      else _widen_by_table(widen_table(name)))
        elif picked == "ml_dtypes" and nd is not None:
            kernel = _round_astype(nd, fmt, saturate)
        elif fmt.integer:
            kernel = _round_int_kernel(fmt, saturate)
        else:
            kernel = _round_by_table(round_table(fmt, saturate))
        _KERNELS[key] = kernel
    return kernel
