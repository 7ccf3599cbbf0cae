"""Exact comparisons of two result arrays, element by element (numpy only).

Results are compared as their bits: the ULP distance is exact, through the
monotonic mapping of bit patterns to integers (+0 and -0 both map to 0), in the
result's own format: bf16, float16/32/64, and every narrow dtype the kernels
know (the fp8 family, fp6, fp4: one step is one representable value, fnuz's
NaN is not a zero, e8m0 has no sign; int4/int2: one step is one integer).
NaN, infinity, signed-zero and subnormal disagreements are counted apart from
the finite ones, since a ULP distance means nothing for them.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..errors import UnsupportedDtypeError


#: ULP histogram bins: 0, 1, 2, 3, 4-7, 8-15, ... 64-127, >=128
BIN_EDGES = (0, 1, 2, 3, 4, 8, 16, 32, 64, 128)
BIN_LABELS = ("0", "1", "2", "3", "4-7", "8-15", "16-31", "32-63", "64-127", ">=128")

# per float kind: (bits dtype, sign bit, exponent mask, mantissa mask)
_LAYOUT = {
    "bfloat16": (np.uint16, 0x8000, 0x7F80, 0x007F),
    "float16": (np.uint16, 0x8000, 0x7C00, 0x03FF),
    "float32": (np.uint32, 0x80000000, 0x7F800000, 0x007FFFFF),
    "float64": (np.uint64, 0x8000000000000000, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF),
}


def kind_of(a: np.ndarray) -> str:
    name = a.dtype.name
    if name not in _LAYOUT and name not in kernels.FORMATS:
        raise UnsupportedDtypeError(
            f"parity compares floating results (bfloat16, float16, float32, float64) and the narrow dtypes "
            f"({', '.join(kernels.FORMATS)}); got {a.dtype}: compare integer or boolean results for equality "
            "(numpy.array_equal), or pass floating ones")
    return name


def mantissa_bits(kind: str) -> int:
    """Mantissa bits of a format parity compares in: the narrow dtypes' from their kernel format
    (0 for the integers and e8m0, whose every value is its own group), the standard floats' from
    their layout's mantissa mask."""
    fmt = kernels.FORMATS.get(kind)
    return fmt.mbits if fmt is not None else int(_LAYOUT[kind][3]).bit_length()


def bits(a: np.ndarray) -> np.ndarray:
    kind = kind_of(a)
    return np.ascontiguousarray(a).view(_LAYOUT[kind][0] if kind in _LAYOUT else np.uint8)


_NARROW_TABLES: dict = {}


def _narrow_tables(kind: str) -> dict:
    """Per byte of a narrow dtype (its low ``bits`` bits): its place in value order and its
    class masks, from the format's own decoding (kernels.decoded)."""
    t = _NARROW_TABLES.get(kind)
    if t is None:
        fmt = kernels.FORMATS[kind]
        code = np.arange(256) & fmt.mask
        val = kernels.decoded(fmt)[code]
        if fmt.integer:
            order = val.astype(np.int64)
        elif not fmt.signed:  # e8m0: the pattern is the exponent
            order = code.astype(np.int64)
        else:  # sign and magnitude: the magnitude's pattern grows with its value
            top = 1 << (fmt.bits - 1)
            mag = code & (top - 1)
            order = np.where(code & top, -mag, mag).astype(np.int64)
        exp_zero = (code & ((1 << (fmt.ebits + fmt.mbits)) - 1)) >> fmt.mbits == 0
        zero = val == 0
        t = _NARROW_TABLES[kind] = {
            "ordered": order,
            "nan": np.isnan(val), "inf": np.isinf(val), "zero": zero, "negzero": zero & np.signbit(val),
            "subnormal": (not fmt.integer and fmt.nan != "ones") & exp_zero & ~zero & ~np.isnan(val),
            "finite": np.isfinite(val),
        }
    return t


def classify(a: np.ndarray) -> dict:
    """Boolean masks: nan, inf, zero, negzero, subnormal, finite."""
    kind = kind_of(a)
    if kind not in _LAYOUT:
        b = bits(a)
        return {k: v[b] for k, v in _narrow_tables(kind).items() if k != "ordered"}
    udt, sign, exp, man = _LAYOUT[kind]
    b = bits(a)
    e, m, s = b & udt(exp), b & udt(man), (b & udt(sign)) != 0
    special = e == udt(exp)
    zero = (e == 0) & (m == 0)
    return {
        "nan": special & (m != 0),
        "inf": special & (m == 0),
        "zero": zero,
        "negzero": zero & s,
        "subnormal": (e == 0) & (m != 0),
        "finite": ~special,
    }


def ordered(a: np.ndarray) -> np.ndarray:
    """Map bit patterns to integers in the order of their values (+0 and -0 both 0)."""
    kind = kind_of(a)
    if kind not in _LAYOUT:
        return _narrow_tables(kind)["ordered"][bits(a)]
    udt, sign, _, _ = _LAYOUT[kind]
    b = bits(a).astype(np.int64) if kind != "float64" else bits(a).view(np.int64)
    if kind == "float64":
        mag = b & np.int64(0x7FFFFFFFFFFFFFFF)
        return np.where(b < 0, -mag, mag)
    mag = b & (sign - 1)
    return np.where(b & sign, -mag, mag)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact ULP distance between same-dtype arrays (meaningful where both are finite)."""
    if a.dtype != b.dtype:
        raise TypeError(f"ULP distance needs one dtype; got {a.dtype} and {b.dtype}")
    oa, ob = ordered(a), ordered(b)
    if a.dtype.name == "float64":
        # |oa - ob| reaches 2**64 - 2 (opposite signs), past int64, and float64 holds the ordered
        # integers of ordinary values only to within 2**10: subtract in uint64, where the difference
        # of the larger and the smaller is exact
        hi, lo = np.asarray(np.maximum(oa, ob)), np.asarray(np.minimum(oa, ob))
        return hi.view(np.uint64) - lo.view(np.uint64)
    return np.abs(oa - ob)


def histogram(d: np.ndarray) -> dict:
    """Counts of ULP distances in BIN_LABELS bins."""
    idx = np.searchsorted(np.array(BIN_EDGES), d, side="right") - 1
    counts = np.bincount(idx, minlength=len(BIN_EDGES))
    return dict(zip(BIN_LABELS, (int(c) for c in counts)))


def to_float64(a: np.ndarray) -> np.ndarray:
    if a.dtype.name in kernels.NARROW:  # exact
        return kernels.to_float32(np.ascontiguousarray(a)).astype(np.float64)
    return a.astype(np.float64)


def round_to(ref64: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float64 reference as ``dtype`` would hold it, correctly rounded (so values beyond its
    range are infinite), back in float64. Used to count NaN/inf disagreements fairly."""
    return to_float64(rounded(np.ascontiguousarray(ref64, dtype=np.float64), dtype.name))


def _float32_odd(x: np.ndarray) -> np.ndarray:
    """float64 to float32 rounded to odd (toward zero, the last bit set where inexact): rounding
    that once more to a format of 22 bits or fewer is the float64 value correctly rounded, where
    float64 -> float32 -> bf16 by nearest-even twice is not (0x3F808000 + a hair: one bf16 ULP off)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        back = f.astype(np.float64)
        inexact = (back != x) & ~np.isnan(x)
        u = f.view(np.uint32).copy()
        u[inexact & (np.abs(back) > np.abs(x))] -= np.uint32(1)  # rounded away from zero: one step back
        u[inexact] |= np.uint32(1)
    return u.view(np.float32)


def rounded(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` (any dtype parity compares) rounded to nearest-even in the float dtype ``name``, once:
    float64 goes to a narrow dtype through float32 rounded to odd, not rounded twice."""
    if x.dtype.name == name:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        if name not in kernels.NARROW:  # float16/32/64: numpy rounds from float64 directly
            return to_float64(x).astype(name)
        if kernels.FORMATS.get(name) is not None and kernels.FORMATS[name].integer:  # as astype does
            return kernels.to_dtype(np.ascontiguousarray(to_float64(x)), name)
        wide = _float32_odd(x) if x.dtype.name == "float64" else to_float64(x).astype(np.float32)  # exact
        return kernels.to_dtype(np.ascontiguousarray(wide), name)


#: the dtypes same_dtype rounds a float32 side to (bf16, the fp8/fp6/fp4 family, the sub-byte ints)
NARROW_KINDS = frozenset(kernels.NARROW)


def held_exactly(orig: np.ndarray, rounded: np.ndarray) -> np.ndarray:
    """Per element: whether ``rounded`` (``orig`` rounded to a narrower dtype) widens back to
    ``orig``'s bits exactly (NaN payloads and -0 included)."""
    back = to_float64(rounded).astype(orig.dtype)
    return bits(np.ascontiguousarray(back)) == bits(orig)


def hexbits(a: np.ndarray, i) -> str:
    b = bits(a).reshape(-1)[i]
    return f"0x{int(b):0{b.dtype.itemsize * 2}X}"


def bf16_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of bf16 numbers at |x| (float64), for errors against a float64 reference."""
    ax = np.abs(x)
    tiny = 2.0 ** -126
    e = np.floor(np.log2(np.where(ax >= tiny, ax, tiny)))
    return np.where(np.isfinite(e), 2.0 ** (e - 7), 2.0 ** -133)


#: bf16's unit roundoff (8 significant bits: half an ULP at 1)
BF16_U = 2.0 ** -8


def ensure_numpy(x):
    """Any framework's tensor as a numpy array, bits kept (through the bridge)."""
    if isinstance(x, np.ndarray):
        return x
    from ..convert import convert

    return convert(x, "numpy")


def same_dtype(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Bring two results to one dtype for ULP comparison, saying what was done.

    Two float dtypes: the finer (more mantissa bits) is rounded to the coarser, nearest-even, and
    both are measured in the coarser's ULPs: a correctly rounded bf16 result against a float32 or
    float64 one is 0 ULPs away, as it would be against that result rounded by its own framework.
    A float32 result against a narrow integer one is cast to it (toward zero). Other mixes (two dtypes of as
    many mantissa bits, say e4m3fn and e4m3fnuz) are compared in float32 or float64."""
    if a.dtype == b.dtype:
        return a, b, None
    ka, kb = kind_of(a), kind_of(b)
    ia, ib = (k in kernels.FORMATS and kernels.FORMATS[k].integer for k in (ka, kb))
    if not ia and not ib and mantissa_bits(ka) != mantissa_bits(kb):
        coarse = ka if mantissa_bits(ka) < mantissa_bits(kb) else kb
    elif ia != ib and {ka, kb} - set(kernels.NARROW) == {"float32"}:
        coarse = ka if ia else kb
    else:
        wide = np.dtype(np.float64) if "float64" in (ka, kb) else np.dtype(np.float32)
        return to_float64(a).astype(wide), to_float64(b).astype(wide), f"compared as {wide.name}"
    fine, fine_kind = (b, kb) if coarse == ka else (a, ka)
    label = "bf16" if coarse == "bfloat16" else coarse
    fine_label = "bf16" if fine_kind == "bfloat16" else fine_kind
    held = rounded(fine, coarse)
    how = "toward zero, as astype does" if ia or ib else "nearest-even"
    note = f"{fine_label} side rounded to {label} ({how}) to compare in {label} ULPs"
    over = int(np.count_nonzero(classify(fine)["finite"] & ~classify(held)["finite"]))
    if over:  # a finite value past the coarser's range is infinite (or NaN) there: say so
        note += (f"; {over} of its finite element(s) lie beyond {label}'s range and became infinite (or NaN) "
                 "there: they agree only with the same infinity (NaN) on the other side")
    return (held, b, note) if coarse == kb else (a, held, note)
