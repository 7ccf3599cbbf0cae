"""float32 <-> bf16 and every narrow dtype (fp8, fp6, fp4, int4/int2): widening and rounding,
chunked, bit-exact with ml_dtypes; and the nibble packing of two 4-bit values a byte.

The narrow dtypes (``to_dtype``, ``to_float32(dtype=...)``, ``pack_nibbles``) are described in
docs/kernels.md: rounding, saturation and NaN per dtype, the nibble order, measured speed. The
rest of this docstring is about bf16.

``to_float32`` is exact (the 16 bf16 bits become the top half of the float32,
NaN payloads included). ``to_bf16`` rounds to nearest, ties to even, keeps
subnormals (no flush to zero), overflows to infinity, and turns every NaN into
the quiet NaN with its sign (0x7FC0 / 0xFFC0), as ml_dtypes (Eigen) does; an
exhaustive check over all 2**32 float32 inputs is
``python -m benchmarks.exhaustive_kernels``.

Both work chunk by chunk, so the extra memory is bounded by a chunk per thread,
whatever the size (``out=`` may be a memory-mapped file); the ml_dtypes and
numpy backends spread the chunks over threads (their loops release the GIL). Backends, fastest first as
measured here (``make bench``): ml_dtypes' own casts (the reference itself),
then integer kernels that an adapter offers (``Adapter.offers_kernels``: torch's;
"auto" picks one only when its framework is already imported, and never imports
one for this), then numpy's integer kernels, for a NumPy without a usable
ml_dtypes. An adapter's backend is named after the adapter (``backend="torch"``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.errors import (Bf16BridgeError, CopyRequiredError, InvalidArgumentError, UnknownFrameworkError,
                     UnsupportedDtypeError)

#: elements per chunk: 4 Mi elements keeps each temporary at 16 MiB
CHUNK = 1 << 22
#: the smallest piece worth a thread of its own
MIN_PIECE = 1 << 18
#: show a progress bar when a conversion is still running after this many seconds
PROGRESS_AFTER_S = 1.0
#: the backends built on the core dependencies; adapters that offer kernels add theirs
BUILTIN = ("ml_dtypes", "numpy")


def _imported(name: str) -> bool:
    """Whether the framework behind a registered adapter is already imported."""
    s = registry.spec(name)
    return s.instance is not None or (s.requires or name) in sys.modules


def _kernel_adapter(name: str, imported_only: bool):
    """The registered adapter ``name`` if it offers kernels and its framework is imported
    (or, imported_only=False, importable)."""
    if imported_only and not _imported(name):
        return None
    try:
        hooks = registry.hooks(name, KernelHooks)
    except Bf16BridgeError:
        return None
    return hooks if hooks.offers_kernels else None


def backends(*, importing: bool = False) -> list[str]:
    """The backend names ``backend=`` takes here: "auto", the built-in ones, and every
    registered adapter offering kernels whose framework is already imported (``importing=True``:
    or installed, importing it)."""
    return ["auto", *BUILTIN, *(n for n in registry.names() if _kernel_adapter(n, imported_only=not importing))]


def pick_backend(name: str = "auto") -> str:
    """The backend ``name`` stands for here ("auto": the fastest usable one)."""
    if name == "auto":
        if dtypes.bfloat16 is not None:
            return "ml_dtypes"
        return next((n for n in registry.names() if _kernel_adapter(n, imported_only=True)), "numpy")
    if name == "ml_dtypes" and dtypes.bfloat16 is None:
        raise UnsupportedDtypeError(f"backend 'ml_dtypes' is unusable here: {dtypes.ML_DTYPES_ERROR}; "
                                    f"use backend='auto'")
    if name in BUILTIN:
        return name
    try:
        key = registry.resolve(name)
    except UnknownFrameworkError:
        key = None
    # a backend asked for by name may import its framework (FrameworkNotInstalledError says how to install it)
    if key is None or not registry.hooks(key, KernelHooks).offers_kernels:
        raise InvalidArgumentError(f"backend must be one of {', '.join(backends())} (or another adapter "
                                    f"offering kernels); got {name!r}")
    return key


def _kernels(name: str, widen: bool):
    """(the kernel, whether it spreads over threads itself) for a picked backend."""
    if name in BUILTIN:
        return (_WIDEN if widen else _ROUND)[name], False
    hooks = registry.hooks(name, KernelHooks)
    return (hooks.widen_bits if widen else hooks.round_bits), hooks.kernels_threaded


_U16, _U32, _F32, _F64 = np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.float32), np.dtype(np.float64)
#: what _flat_bits takes for each width (dtypes compared whole: a byte-swapped float32 is not float32)
_FLAT: dict[int, tuple[tuple[str, str], tuple[np.dtype, ...], np.dtype]] = {
    16: (("bfloat16", "uint16"), tuple(d for d in (dtypes.bfloat16, _U16) if d is not None), _U16),
    32: (("float32", "uint32"), (_F32, _U32), _U32)}


def _flat_bits(a: np.ndarray, width: int, what: str) -> np.ndarray:
    # dtype objects compared, not dtype.name: that is a Python property in numpy, about a
    # microsecond a call, a tenth of a 1 KiB conversion
    names, takes, bits = _FLAT[width]
    d = a.dtype
    # another package's own bfloat16 type (not ml_dtypes'), in this machine's byte order, holds the same bits
    if d not in takes and not (d.name in names and d.itemsize == width // 8 and d.isnative):
        # a byte-swapped array has the same name ('>f4' is "float32"): its bytes read as ours are wrong values
        swapped = not d.isnative and d.newbyteorder("=") in takes
        # (a byte-swapped bfloat16 prints as ">V2": named by its native twin)
        shown = f"{d.newbyteorder('=').name} in the other byte order ({d.str})" if swapped else str(d)
        raise UnsupportedDtypeError(f"{what} takes a {names[0]} array (or its {names[1]} bits); got dtype {shown}"
                                    + (" (byte-swapped: pass x.astype(x.dtype.newbyteorder('=')), a copy in "
                                       "this machine's byte order)" if swapped else ""))
    if not a.flags.c_contiguous:
        raise CopyRequiredError(f"{what} takes a C-contiguous array; pass np.ascontiguousarray(x) (a copy)")
    return a.reshape(-1).view(bits)


def _out(out, shape, dtype, what: str, src: np.ndarray) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.shape != tuple(shape) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgumentError(f"{what}: out must be a writable C-contiguous {dtype} array of shape {tuple(shape)}")
    if np.may_share_memory(out, src):  # chunks (and threads) write results over inputs not yet read
        raise InvalidArgumentError(f"{what}: out overlaps the input's memory, which the conversion would overwrite "
                                   "before reading it; pass a separate array, or leave out= out")
    return out


class _Progress:
    """A plain progress bar on stderr, shown only once a conversion has taken a while."""

    def __init__(self, total: int, label, enabled: bool | None):
        # label: a str, or a call giving one, made only when the bar shows (a dtype's name costs
        # about a microsecond, a tenth of a 1 KiB conversion that shows no bar)
        self.total, self.label, self.enabled = total, label, enabled
        self.start = time.perf_counter()
        self.shown = False

    def update(self, done: int) -> None:
        if self.enabled is False:
            return
        if not self.shown:
            if self.enabled is None and (time.perf_counter() - self.start < PROGRESS_AFTER_S or not sys.stderr.isatty()):
                return
            self.shown = True
            if callable(self.label):
                self.label = self.label()
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:6.1%}")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def to_float32(x, *, dtype=None, out=None, chunk: int = CHUNK, backend: str = "auto",
               threads: int | None = None, progress: bool | None = None) -> np.ndarray:
    """Widen a narrow array to float32, exactly: bf16 (ml_dtypes.bfloat16, or its uint16 bits),
    or any dtype in NARROW (its ml_dtypes array, or its uint8 bits with ``dtype=`` naming it).
    NaN patterns become the quiet NaN with their sign; bf16 keeps its NaN payloads."""
    name = _narrow_name(dtype) if dtype is not None else None
    a = np.asarray(x)
    if name not in (None, "bfloat16") or _NARROW_DTYPES.get(a.dtype, "bfloat16") != "bfloat16":
        return _widen_narrow(a, name, out, chunk, backend, threads, progress)
    src = _flat_bits(a, 16, "to_float32")
    result = _out(out, a.shape, _F32, "to_float32", src)
    dst = result.reshape(-1).view(np.uint32)
    _run(True, backend, src, dst, chunk, threads, _Progress(src.size, "bf16 -> float32", progress))
    return result


def to_bf16(x, *, out=None, chunk: int = CHUNK, backend: str = "auto", threads: int | None = None,
            progress: bool | None = None) -> np.ndarray:
    """Round a float32 array to bf16 (nearest, ties to even), bit-identical to ml_dtypes.

    Returns an ml_dtypes.bfloat16 array, or uint16 bits where ml_dtypes is unusable
    (then ``out`` must be uint16 too).
    """
    a = np.asarray(x)
    src = _flat_bits(a, 32, "to_bf16")
    bf16 = dtypes.bfloat16 if dtypes.bfloat16 is not None else _U16
    result = _out(out, a.shape, bf16, "to_bf16", src)
    dst = result.reshape(-1).view(np.uint16)
    _run(False, backend, src, dst, chunk, threads, _Progress(src.size, "float32 -> bf16", progress))
    return result


_POOLS: dict = {}
# The cores this process may run on, read once: os.cpu_count() costs 12 to 60 us a call here, more
# than a 1 KiB conversion (the harness's kernels part measured it on every call before).
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_POOL_LOCK = threading.Lock()


def _run(widen: bool, backend: str, src, dst, chunk: int, threads: int | None, bar: _Progress) -> None:
    kernel, threaded = _kernels(pick_backend(backend), widen)
    _spread(kernel, threaded, src, dst, chunk, threads, bar)


def _spread(kernel, threaded: bool, src, dst, chunk: int, threads: int | None, bar: _Progress) -> None:
    """Run ``kernel(src piece, dst piece)`` over the flat arrays chunk by chunk, on threads."""
    n = src.size
    # a threaded backend parallelises inside each call; the others get a thread per piece
    workers = 1 if threaded else max(1, min(threads or _CORES, 8))
    if chunk < 1:
        raise InvalidArgumentError(f"chunk must be a positive number of elements; got {chunk}")
    if n <= chunk and (workers == 1 or n <= MIN_PIECE):  # one piece (the spans below would be one)
        if n:
            kernel(src, dst)
            bar.update(n)
        return
    if workers > 1:
        chunk = min(chunk, max(MIN_PIECE, -(-n // workers)))
    spans = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
    if workers == 1 or len(spans) == 1:
        for lo, hi in spans:
            kernel(src[lo:hi], dst[lo:hi])
            bar.update(hi)
        return
    with _POOL_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="bf16bridge-kernel")
    # at most `workers` pieces in flight, so extra memory stays bounded by a chunk per thread
    pending = []  # (future, end of its span), oldest first
    for lo, hi in spans:
        pending.append((pool.submit(kernel, src[lo:hi], dst[lo:hi]), hi))
        if len(pending) >= workers:
            future, end = pending.pop(0)
            future.result()
            bar.update(end)
    for future, end in pending:
        future.result()
        bar.update(end)


# -- the kernels: bits in, bits out -------------------------------------------------


def _widen_ml_dtypes(src: np.ndarray, dst: np.ndarray) -> None:
    np.copyto(dst.view(np.float32), src.view(dtypes.bfloat16))


def _round_ml_dtypes(src: np.ndarray, dst: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):  # NaN inputs are expected; they become quiet NaNs
        np.copyto(dst.view(dtypes.bfloat16), src.view(np.float32), casting="unsafe")


def _widen_numpy(src: np.ndarray, dst: np.ndarray) -> None:
    np.left_shift(src, 16, out=dst, dtype=np.uint32)


def _round_numpy(src: np.ndarray, dst: np.ndarray) -> None:
    # r = (u + 0x7FFF + lsb) >> 16 rounds to nearest even, carrying into the
    # exponent (so the largest finite values overflow to inf, as they should).
    t = src >> 16  # the truncated result, as uint32
    lsb = t & 1
    t = src + lsb  # reuse: u + lsb (cannot overflow for non-NaN inputs)
    t += 0x7FFF
    t >>= 16
    nan = (src & 0x7FFFFFFF) > 0x7F800000
    dst[...] = t
    if nan.any():
        dst[nan] = ((src[nan] >> 16) & 0x8000) | 0x7FC0


_WIDEN = {"ml_dtypes": _widen_ml_dtypes, "numpy": _widen_numpy}
_ROUND = {"ml_dtypes": _round_ml_dtypes, "numpy": _round_numpy}


# -- every narrow dtype: to_dtype / to_float32 ------------------------------------------
#
# The float formats, as ml_dtypes (and the OCP / MLIR names) define them: exponent and
# mantissa bits, the bias, and which specials the format has. ``nan`` is how NaN is spelled:
# "ieee" (exponent all ones, mantissa not 0: inf is the exponent all ones, mantissa 0), "fn"
# (exponent and mantissa all ones; no inf), "fnuz" (the pattern of -0: no inf, no -0),
# "ones" (float8_e8m0fnu: all ones; no sign, no zero), "none" (fp6/fp4: every pattern finite).


@dataclass(frozen=True)
class Format:
    """How one narrow dtype spells its values in ``bits`` bits (the low bits of one byte)."""

    name: str
    bits: int
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    nan: str = "none"
    signed: bool = True
    integer: bool = False

    @property
    def mask(self) -> int:
        return (1 << self.bits) - 1


_FLOAT_FORMATS = (
    Format("float8_e4m3fn", 8, 4, 3, 7, "fn"),
    Format("float8_e5m2", 8, 5, 2, 15, "ieee"),
    Format("float8_e4m3fnuz", 8, 4, 3, 8, "fnuz"),
    Format("float8_e5m2fnuz", 8, 5, 2, 16, "fnuz"),
    Format("float8_e8m0fnu", 8, 8, 0, 127, "ones", signed=False),
    Format("float8_e4m3", 8, 4, 3, 7, "ieee"),
    Format("float8_e3m4", 8, 3, 4, 3, "ieee"),
    Format("float8_e4m3b11fnuz", 8, 4, 3, 11, "fnuz"),
    Format("float6_e2m3fn", 6, 2, 3, 1),
    Format("float6_e3m2fn", 6, 3, 2, 3),
    Format("float4_e2m1fn", 4, 2, 1, 1),
)
_INT_FORMATS = (
    Format("int4", 4, integer=True),
    Format("uint4", 4, signed=False, integer=True),
    Format("int2", 2, integer=True),
    Format("uint2", 2, signed=False, integer=True),
)
#: every narrow dtype to_dtype / to_float32 take besides bfloat16, by its ml_dtypes name
FORMATS: dict[str, Format] = {f.name: f for f in _FLOAT_FORMATS + _INT_FORMATS}
#: every dtype to_dtype rounds to
NARROW = ("bfloat16", *FORMATS)
_NARROW_NAMES = frozenset(NARROW)


def format_of(dtype) -> Format:
    """The Format of a narrow dtype (its name, or its ml_dtypes / NumPy dtype)."""
    name = dtype if isinstance(dtype, str) else getattr(np.dtype(dtype), "name", str(dtype))
    try:
        return FORMATS[name]
    except KeyError:
        raise UnsupportedDtypeError(f"no narrow format named {name!r}; the kernels take "
                                    f"{', '.join(NARROW)}") from None


def numpy_dtype_of(name: str) -> np.dtype | None:
    """ml_dtypes' dtype for a narrow dtype name, or None where this ml_dtypes lacks it (0.3 has
    no float8_e4m3, e3m4, e8m0fnu, float6, float4 nor int2/uint2): then the kernels give its
    bits, one value a byte (uint8)."""
    if dtypes._ml_dtypes is None:
        return None
    t = getattr(dtypes._ml_dtypes, name, None)
    return None if t is None else np.dtype(t)


#: {ml_dtypes' dtype: its name} for the narrow dtypes this ml_dtypes has (bf16 too): a dtype's
#: ``.name`` is a Python property in numpy, about a microsecond a call; a lookup is not
_NARROW_DTYPES = {d: n for n in NARROW
                  if (d := dtypes.bfloat16 if n == "bfloat16" else numpy_dtype_of(n)) is not None}
_U8 = np.dtype(np.uint8)


def decoded(fmt: Format) -> np.ndarray:
    """Every one of the ``2**bits`` patterns' values as float64 (NaN where the pattern is NaN),
    from the format's fields alone (no ml_dtypes)."""
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


def _nan_code(fmt: Format, neg):
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
    top = 1 << (fmt.ebits + fmt.mbits)
    emax_field = ((1 << fmt.ebits) - 1) << fmt.mbits
    if fmt.nan == "ieee":
        over_code = np.where(neg, top, 0) | emax_field
    elif fmt.nan == "none":  # no inf, no NaN: overflow saturates even without saturate=True
        over_code = np.where(neg, top, 0) | codes[-1]
    else:
        over_code = _nan_code(fmt, neg)
    code = np.where(over, over_code, code)
    code = np.where(nan, _nan_code(fmt, neg), code)
    if fmt.nan == "ones":  # no sign: a negative number (or any zero) is NaN, as in ml_dtypes
        code = np.where(neg | (x == 0), fmt.mask, code)
    return code.astype(np.uint8)


def _round_int(x: np.ndarray, fmt: Format, saturate: bool) -> np.ndarray:
    """float -> a narrow integer as numpy's and ml_dtypes' astype: truncate toward zero, keep
    the low ``bits`` (wrap) of values within int32; NaN, inf and |x| >= 2**31 give 0 (what
    ml_dtypes gives on x86, where C++ leaves it undefined). saturate=True clamps instead; NaN is 0."""
    lo, hi = _range(fmt)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x)
        if saturate:
            v = np.where(np.isnan(t), 0, np.clip(t, lo, hi))
        else:
            v = np.where(np.abs(t) < 2.0 ** 31, t, 0)
    return (v.astype(np.int64) & fmt.mask).astype(np.uint8)


_TABLES: dict = {}


def _round_table(fmt: Format, saturate: bool) -> np.ndarray:
    """The pattern for every float32 as a 2**17-entry table: with at most 6 mantissa bits kept
    (4 here), the rounding bit is bit 16 or above, so a float32's result depends only on its top
    16 bits and whether any of the low 16 is set (index: top 16 bits, then that one)."""
    key = ("round", fmt.name, saturate)
    table = _TABLES.get(key)
    if table is None:  # two threads may build it at once; both get the same table
        i = np.arange(1 << 17, dtype=np.uint32)
        table = _TABLES[key] = round_reference(((i >> 1) << 16 | (i & 1)).view(np.float32), fmt.name,
                                               saturate=saturate)
    return table


def _widen_table(fmt: Format) -> np.ndarray:
    """float32 bits for every byte: the pattern ml_dtypes reads in it decoded (``byte_codes``: bytes
    with higher bits set, which no conversion writes, read as ml_dtypes reads them); NaN as the quiet NaN with the pattern's
    sign (fnuz's NaN is the -0 pattern: 0xFFC00000), as ml_dtypes gives."""
    key = ("widen", fmt.name)
    table = _TABLES.get(key)
    if table is None:
        val = decoded(fmt)
        with np.errstate(invalid="ignore"):
            b = val.astype(np.float32).view(np.uint32)
        code = np.arange(val.size)
        neg = (code >> (fmt.bits - 1)) & 1 if fmt.signed else np.zeros_like(code)
        b = np.where(np.isnan(val), np.where(neg == 1, 0xFFC00000, 0x7FC00000), b).astype(np.uint32)
        table = _TABLES[key] = b[byte_codes(fmt)]
    return table


def byte_codes(fmt: Format) -> np.ndarray:
    """For each of the 256 bytes, the ``fmt`` pattern ml_dtypes reads in it (a byte holds one value
    of a sub-byte format in its low bits; ml_dtypes writes no other bits, but a view of other bytes
    holds them): an integer format's low bits; a signed float's magnitude bits, negative where any
    bit from the sign bit up is set (ml_dtypes reads float4_e2m1fn 0x11 as -0.5, 0x10 as -0.0)."""
    byte = np.arange(256)
    if fmt.integer or not fmt.signed:
        return byte & fmt.mask
    sign = 1 << (fmt.bits - 1)
    return np.where(byte >= sign, sign, 0) | (byte & (sign - 1))


#: elements a table kernel handles at a time: its temporaries (np.take's intp indices among them)
#: stay in cache; measured here, 2**16 to 2**18 is about twice as fast as 2**22
BLOCK = 1 << 16


def _blocked(step):
    """A kernel that runs ``step`` over pieces of BLOCK elements."""
    def kernel(src: np.ndarray, dst: np.ndarray) -> None:
        if src.size <= BLOCK:
            step(src, dst)
            return
        for lo in range(0, src.size, BLOCK):
            step(src[lo:lo + BLOCK], dst[lo:lo + BLOCK])
    return kernel


def _round_by_table(table: np.ndarray):
    def step(src: np.ndarray, dst: np.ndarray) -> None:
        u = _float32_bits(src)
        idx = u >> 15  # the top 16 bits and bit 15; bit 15 joins the sticky bit below
        low = u & 0x7FFF
        low += 0x7FFF
        low >>= 15  # 1 where any of bits 0-14 is set
        idx |= low
        table.take(idx, out=dst)
    return _blocked(step)


def _float32_bits(src: np.ndarray) -> np.ndarray:
    if src.dtype == _F64:  # rounded to float32 first, as ml_dtypes does
        with np.errstate(over="ignore", invalid="ignore"):
            return src.astype(np.float32).view(np.uint32)
    return src.view(np.uint32)


def _range(fmt: Format) -> tuple[float, float]:
    """The smallest and largest finite values (for clamping)."""
    if fmt.integer:
        return (-(1 << (fmt.bits - 1)), (1 << (fmt.bits - 1)) - 1) if fmt.signed else (0, fmt.mask)
    big = _largest(fmt.name)
    return -big, big


def _round_int_kernel(fmt: Format, saturate: bool):
    """_round_int's rule, in the input's own width: int32 holds every truncated value kept."""
    lo, hi = _range(fmt)

    def step(src: np.ndarray, dst: np.ndarray) -> None:
        if saturate:
            v = np.clip(src, lo, hi)
            np.copyto(v, 0, where=np.isnan(v))
        else:
            v = np.where(np.abs(src) < 2.0 ** 31, src, 0)  # NaN and inf too
        i = v.astype(np.int32)  # truncates toward zero
        i &= fmt.mask
        np.copyto(dst, i, casting="unsafe")
    return _blocked(step)


def _round_astype(nd: np.dtype, fmt: Format, saturate: bool):
    """ml_dtypes' own cast; saturate=True clamps to the finite range first (NaN kept; ints: 0)."""
    lo, hi = _range(fmt)

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
    return _blocked(lambda src, dst: table.take(src, out=dst))


def _narrow_name(dtype) -> str:
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            d = np.dtype(dtype)
            name = _NARROW_DTYPES.get(d) or d.name
        except TypeError:
            name = str(dtype)
    if name not in _NARROW_NAMES:
        raise UnsupportedDtypeError(f"to_dtype / to_float32 take the narrow dtypes {', '.join(NARROW)}; "
                                    f"got {dtype!r}")
    return name


def _largest(name: str) -> float:
    """The largest finite value of a narrow dtype, from its own fields."""
    if name == "bfloat16":
        return float(np.array(0x7F7F0000, dtype=np.uint32).view(np.float32))
    val = decoded(FORMATS[name])
    return float(np.nanmax(val[np.isfinite(val)]))


def _narrow_backend(backend: str, name: str, nd: np.dtype | None, widen: bool = False) -> str:
    if backend == "auto":  # the faster, as measured (docs/kernels.md); both give the same bits
        return "ml_dtypes" if widen and nd is not None and FORMATS[name].integer else "numpy"
    if backend == "ml_dtypes" and nd is None:
        raise UnsupportedDtypeError(f"backend 'ml_dtypes' has no {name} here: {dtypes.numpy_missing(name)}; "
                                    "or use backend='numpy'")
    if backend not in BUILTIN:
        raise InvalidArgumentError(f"backend for {name} must be one of auto, {', '.join(BUILTIN)}; got {backend!r}")
    return backend


def _float_source(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype not in (_F32, _F64):
        raise UnsupportedDtypeError(f"{what} takes a float32 or float64 array; got dtype {a.dtype} "
                                    f"(pass x.astype(np.float32) first)")
    if not a.flags.c_contiguous:
        raise CopyRequiredError(f"{what} takes a C-contiguous array; pass np.ascontiguousarray(x) (a copy)")
    return a


def to_dtype(x, dtype, *, saturate: bool = False, out=None, chunk: int = CHUNK, backend: str = "auto",
             threads: int | None = None, progress: bool | None = None) -> np.ndarray:
    """Round a float32 (or float64) array to a narrow dtype, bit-identical to ml_dtypes' astype.

    Floats round to nearest, ties to even; float64 rounds to float32 first (as ml_dtypes does:
    two roundings). ``saturate=True`` clamps to +-the largest finite value before rounding
    (inf too; NaN stays NaN where the format has one). Integers truncate toward zero, as astype
    does. docs/kernels.md has the table per dtype. Returns an array of ml_dtypes' dtype, or its
    uint8 bits (one value a byte) where this ml_dtypes lacks the dtype (then ``out`` must be uint8).
    """
    name = _narrow_name(dtype)
    src = _float_source(x, "to_dtype")
    if not isinstance(saturate, bool):
        raise InvalidArgumentError(f"saturate must be True or False; got {saturate!r}")
    if name == "bfloat16":
        return _to_bf16_from(src, saturate, out, chunk, backend, threads, progress)
    nd = numpy_dtype_of(name)
    result = _out(out, src.shape, nd if nd is not None else _U8, "to_dtype", src)
    kernel = _narrow_kernel(name, _narrow_backend(backend, name, nd), saturate, nd)
    _spread(kernel, False, src.reshape(-1), result.reshape(-1).view(_U8), chunk, threads,
            _Progress(src.size, lambda: f"{src.dtype.name} -> {name}", progress))
    return result


_KERNELS: dict = {}


def _narrow_kernel(name: str, picked: str, saturate: bool | None, nd: np.dtype | None):
    """The kernel for one narrow dtype and backend (saturate=None: widening), made once: its
    closures and tables are the same every call."""
    key = (name, picked, saturate)
    kernel = _KERNELS.get(key)
    if kernel is None:  # two threads may make it at once; both get an equal kernel
        fmt = FORMATS[name]
        if saturate is None:
            kernel = (_widen_astype(nd) if picked == "ml_dtypes" and nd is not None
                      else _widen_by_table(_widen_table(fmt)))
        elif picked == "ml_dtypes" and nd is not None:
            kernel = _round_astype(nd, fmt, saturate)
        elif fmt.integer:
            kernel = _round_int_kernel(fmt, saturate)
        else:
            kernel = _round_by_table(_round_table(fmt, saturate))
        _KERNELS[key] = kernel
    return kernel


def _widen_narrow(a: np.ndarray, name: str | None, out, chunk, backend, threads, progress) -> np.ndarray:
    held = _NARROW_DTYPES.get(a.dtype) or ("uint8" if a.dtype == _U8 else a.dtype.name)
    if name is None:
        name = held
    if held != name and held != "uint8":
        raise UnsupportedDtypeError(f"to_float32(dtype={name!r}) takes a {name} array or its uint8 bits; "
                                    f"got dtype {a.dtype}")
    if not a.flags.c_contiguous:
        raise CopyRequiredError("to_float32 takes a C-contiguous array; pass np.ascontiguousarray(x) (a copy)")
    nd = numpy_dtype_of(name)
    kernel = _narrow_kernel(name, _narrow_backend(backend, name, nd, widen=True), None, nd)
    result = _out(out, a.shape, _F32, "to_float32", a)
    _spread(kernel, False, a.reshape(-1).view(_U8), result.reshape(-1).view(_U32), chunk, threads,
            _Progress(a.size, f"{name} -> float32", progress))
    return result


def _to_bf16_from(src, saturate, out, chunk, backend, threads, progress) -> np.ndarray:
    if src.dtype == np.float32 and not saturate:
        return to_bf16(src, out=out, chunk=chunk, backend=backend, threads=threads, progress=progress)
    inner, threaded = _kernels(pick_backend(backend), False)
    big = _largest("bfloat16") if saturate else None

    def kernel(s: np.ndarray, d: np.ndarray) -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            f = np.clip(s, -big, big) if big is not None else s
            f = f.astype(np.float32, copy=False)
        inner(f.view(np.uint32), d)

    bf16 = dtypes.bfloat16 if dtypes.bfloat16 is not None else np.dtype(np.uint16)
    result = _out(out, src.shape, bf16, "to_dtype", src)
    _spread(kernel, threaded, src.reshape(-1), result.reshape(-1).view(np.uint16), chunk, threads,
            _Progress(src.size, lambda: f"{src.dtype.name} -> bfloat16", progress))
    return result


# -- two 4-bit values a byte ------------------------------------------------------------
# torch's float4_e2m1fn_x2 (and its pack_uint4) keeps element 2i in the low nibble and element
# 2i + 1 in the high one: torch.testing._internal.common_quantized.pack_uint4 and
# torch.onnx's unpack_float4x2_as_uint8; tests/test_narrow_kernels.py checks both.

#: the dtypes whose values are 4 bits: what pack_nibbles takes and unpack_nibbles gives
NIBBLE_DTYPES = tuple(n for n, f in FORMATS.items() if f.bits == 4)


#: a pair of bytes as one number, the first byte the low one, whatever this machine's byte order
_PAIR = np.dtype("<u2")


@functools.lru_cache(maxsize=None)
def _changed_by_padding(name: str) -> np.ndarray:
    """Which of the 256 bytes hold another ``name`` value than their low bits alone: what packing
    (which keeps the low bits) would change (``byte_codes``). None of them for the integer formats;
    for float4_e2m1fn the bytes from 0x10 whose sign the low bits do not carry."""
    fmt = FORMATS[name]
    codes = byte_codes(fmt)
    return codes != codes[np.arange(256) & fmt.mask]


def refuse_changed_padding(bits: np.ndarray, name: str, what: str) -> None:
    """Raise where ``bits`` (the uint8 view of a sub-byte ``name`` array, one value a byte) hold a
    byte whose value packing would change: packing keeps a value's low bits only (``pack_nibbles``,
    bb.save's F4, jax's device_put of a sub-byte type)."""
    changed = _changed_by_padding(name)
    if not changed.any() or not bits.size or int(bits.max()) <= FORMATS[name].mask:
        return  # a format packing never changes, or every byte one ml_dtypes makes: one pass at most
    flat = bits.reshape(-1)
    if not changed[flat[flat > FORMATS[name].mask]].any():  # only the bytes with high bits are looked up
        return
    at = int(np.argmax(changed[flat]))
    byte = int(flat[at])
    value = np.array([byte], np.uint8).view(dtypes.numpy_dtype(name)).astype(np.float32)[0]
    raise InvalidArgumentError(
        f"{what}: this {name} array holds byte 0x{byte:02X} at flat index {at}, which ml_dtypes reads as "
        f"{value:g}, but it is not a byte ml_dtypes makes (its high bits are set) and packing keeps only "
        f"the low {FORMATS[name].bits} bits, which would change the value. Was it a view of other bytes? "
        f"Canonicalise it, keeping ml_dtypes' values: a.astype(np.float32).astype(a.dtype)")


def _nibble_source(a: np.ndarray, what: str) -> np.ndarray:
    name = a.dtype.name
    if name == "uint8":
        if a.size and int(a.max()) > 0xF:
            raise InvalidArgumentError(f"{what} takes 4-bit values: a uint8 array must hold 0..15; this one holds "
                                       f"{int(a.max())} (mask it with a & 0xF if only the low nibble counts)")
    elif name not in NIBBLE_DTYPES:
        raise UnsupportedDtypeError(f"{what} takes a 4-bit dtype ({', '.join(NIBBLE_DTYPES)}) or its uint8 "
                                    f"nibbles; got dtype {a.dtype}")
    else:
        refuse_changed_padding(a.view(np.uint8), name, what)
    return a.view(np.uint8)


def pack_nibbles(a, *, out=None) -> np.ndarray:
    """Two 4-bit values a byte (uint8), as torch's float4_e2m1fn_x2: element 2i in the low nibble,
    2i + 1 in the high one. The last dimension halves and must be even. Takes float4_e2m1fn,
    int4 or uint4 arrays (ml_dtypes keeps one value a byte, in the low nibble) or uint8 nibbles."""
    a = np.asarray(a)
    if a.ndim == 0:
        raise InvalidArgumentError("pack_nibbles packs pairs along the last dimension; got a 0-d array "
                                   "(pass a.reshape(1) padded to two values: np.pad(a.reshape(1), [(0, 1)]))")
    if a.shape[-1] % 2:
        raise InvalidArgumentError(
            f"pack_nibbles packs pairs along the last dimension, which must be even; got shape {a.shape} "
            f"(pad it: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, 1)]), and keep the logical length)")
    bits = _nibble_source(a, "pack_nibbles")
    shape = (*a.shape[:-1], a.shape[-1] // 2)
    result = _out(out, shape, np.dtype(np.uint8), "pack_nibbles", bits)
    # each pair read as one little-endian uint16, the first value in its low byte (no strided access:
    # about twice as fast as a byte at a time); a copy only for a non-contiguous input
    pairs = np.ascontiguousarray(bits).reshape(-1).view(_PAIR)
    flat = result.reshape(-1)
    hi, low = np.empty(min(BLOCK, flat.size), np.uint16), np.empty(min(BLOCK, flat.size), np.uint16)
    for lo in range(0, flat.size, BLOCK):
        p = pairs[lo:lo + BLOCK]
        h, w = hi[:p.size], low[:p.size]
        np.right_shift(p, 4, out=h)  # the second value's nibble to bits 4..7
        np.bitwise_and(h, 0xF0, out=h)
        np.bitwise_and(p, 0xF, out=w)
        np.bitwise_or(w, h, out=flat[lo:lo + BLOCK], casting="unsafe")
    return result


def unpack_nibbles(bits, dtype, *, out=None) -> np.ndarray:
    """The inverse of pack_nibbles: each byte's low nibble, then its high one, as ``dtype``
    (float4_e2m1fn, int4, uint4, or "uint8" for plain nibbles); the last dimension doubles.
    Where this ml_dtypes lacks the dtype, the nibbles come back as uint8."""
    b = np.asarray(bits)
    if b.dtype != np.uint8:
        raise UnsupportedDtypeError(f"unpack_nibbles takes packed bytes (uint8, as a float4_e2m1fn_x2 tensor "
                                    f"viewed as uint8 gives them); got dtype {b.dtype}")
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name != "uint8" and name not in NIBBLE_DTYPES:
        raise UnsupportedDtypeError(f"unpack_nibbles gives a 4-bit dtype ({', '.join(NIBBLE_DTYPES)}) or "
                                    f"'uint8'; got {dtype!r}")
    if b.ndim == 0:
        raise InvalidArgumentError("unpack_nibbles needs an array with a last dimension; got a 0-d array")
    nd = np.dtype(np.uint8) if name == "uint8" else numpy_dtype_of(name)
    result = _out(out, (*b.shape[:-1], b.shape[-1] * 2), nd if nd is not None else np.dtype(np.uint8),
                  "unpack_nibbles", b)
    src = np.ascontiguousarray(b).reshape(-1)
    pairs = result.reshape(-1).view(np.uint8).view(_PAIR)  # as pack_nibbles reads them
    hi = np.empty(min(BLOCK, src.size), np.uint16)
    for lo in range(0, src.size, BLOCK):
        s, p = src[lo:lo + BLOCK], pairs[lo:lo + BLOCK]
        h = hi[:s.size]
        np.left_shift(s, 4, out=h, dtype=np.uint16)  # the high nibble to bits 8..11: the second byte
        np.bitwise_and(h, 0xF00, out=h)
        np.bitwise_and(s, 0xF, out=p, dtype=np.uint16)
        np.bitwise_or(p, h, out=p)
    return result
