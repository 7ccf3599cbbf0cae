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

from bf16bridge.core import dtypes
from bf16bridge import kernels
from bf16bridge.errors import UnsupportedDtypeError
from bf16bridge.parity.policies import Policy


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

#: every dtype parity compares, by name: the standard floats, then the narrow dtypes
KINDS = tuple(dict.fromkeys([*_LAYOUT, *kernels.KERNEL_DTYPES]))


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
    """Per byte of a narrow dtype (the pattern ml_dtypes reads in it: kernels.byte_codes): its place
    in value order and its class masks, from the format's own decoding (kernels.decoded)."""
    t = _NARROW_TABLES.get(kind)
    if t is None:
        fmt = kernels.FORMATS[kind]
        code = kernels.byte_codes(fmt)
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
    if a.dtype.name in kernels.KERNEL_DTYPES:  # exact
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
    """``x`` (any dtype parity compares) rounded to nearest-even in the dtype ``name``, once:
    float64 goes to a narrow dtype through float32 rounded to odd, not rounded twice; to a narrow
    integer, the nearest integer it holds (saturated: 100 is int4's 7; NaN 0)."""
    if x.dtype.name == name:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        if name not in kernels.KERNEL_DTYPES:  # float16/32/64: numpy rounds from float64 directly
            return to_float64(x).astype(name)
        fmt = kernels.FORMATS.get(name)
        if fmt is not None and fmt.integer:  # the nearest integer it holds (ties to even; NaN: 0), not astype's
            values = kernels.decoded(fmt)  # truncation, which wraps 100 around to int4's 4
            near = np.clip(np.nan_to_num(np.rint(to_float64(x))), values.min(), values.max())
            return kernels.to_dtype(near.astype(np.float32), name)
        wide = _float32_odd(x) if x.dtype.name == "float64" else to_float64(x).astype(np.float32)  # exact
        return kernels.to_dtype(np.ascontiguousarray(wide), name)


#: the dtypes same_dtype rounds a float32 side to (bf16, the fp8/fp6/fp4 family, the sub-byte ints)
KERNEL_KINDS = frozenset(kernels.KERNEL_DTYPES)


def held_exactly(orig: np.ndarray, rounded: np.ndarray) -> np.ndarray:
    """Per element: whether ``rounded`` (``orig`` rounded to a narrower dtype) widens back to
    ``orig``'s bits exactly (NaN payloads and -0 included)."""
    back = to_float64(rounded).astype(orig.dtype)
    return bits(np.ascontiguousarray(back)) == bits(orig)


def hexbits(a: np.ndarray, i) -> str:
    b = bits(a).reshape(-1)[i]
    return f"0x{int(b):0{b.dtype.itemsize * 2}X}"


_IEEE_MIN_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126, "float64": -1022}


def _min_exponent(kind: str) -> int:
    """The exponent of ``kind``'s smallest normal number (its spacing is the subnormals')."""
    fmt = kernels.FORMATS.get(kind)
    if fmt is not None:
        # a format with no mantissa bits (e8m0) has no subnormals: its exponent field 0 is a number
        return 1 - fmt.bias if fmt.mbits else -fmt.bias
    # IEEE formats from a table (bf16 has float32's exponent; no ml_dtypes needed, as the pytest plugin
    # must import this without it): numpy 1.x's finfo warns on a thread that flushes subnormals (a jax callback)
    known = _IEEE_MIN_EXPONENT.get(kind)
    return known if known is not None else int(np.finfo(kind).minexp)


def limits(kind: str) -> tuple[float, float, float, bool]:
    """A format's (u, tiny, largest, integer): its unit roundoff (half its spacing at 1: 2**-8 for bf16;
    0.5 for the narrow integers, whose steps are absolute), its smallest normal number (the floor a
    flush to zero loses; 0 for the integers), its largest finite value, and whether it holds integers."""
    fmt = kernels.FORMATS.get(kind)
    if fmt is not None:
        values = kernels.decoded(fmt)
        largest = float(np.max(np.abs(values[np.isfinite(values)])))
        if fmt.integer:
            return 0.5, 0.0, largest, True
        return 2.0 ** -(fmt.mbits + 1), 2.0 ** _min_exponent(kind), largest, False
    m, emin = mantissa_bits(kind), _min_exponent(kind)
    return 2.0 ** -(m + 1), 2.0 ** emin, (2 - 2.0 ** -m) * 2.0 ** (1 - emin), False  # IEEE: emax = 1 - emin


def ulp_of(x: np.ndarray, kind: str) -> np.ndarray:
    """The spacing of ``kind``'s numbers at |x| (x float64): the ULP an error against a float64
    reference is counted in (1 for the narrow integers). Exact: the exponent comes from frexp."""
    fmt = kernels.FORMATS.get(kind)
    if fmt is not None and fmt.integer:
        return np.ones_like(x, dtype=np.float64)
    emin = _min_exponent(kind)
    ax = np.abs(np.asarray(x, dtype=np.float64))
    _, e = np.frexp(np.where(np.isfinite(ax), ax, 0.0))  # ax = m * 2**e, m in [0.5, 1); 0: e = 0
    e = np.where((ax > 0) & np.isfinite(ax), e - 1, emin)  # zero, NaN, inf: the smallest spacing
    return np.ldexp(1.0, np.maximum(e, emin) - mantissa_bits(kind))


def ensure_numpy(x):
    """Any framework's tensor as a numpy array, bits kept (through the bridge). A comparison reads
    values: a tensor that requires grad crosses detached, and one over memory numpy sees read-only
    crosses as it is, without a warning (as compare_outputs takes them)."""
    if isinstance(x, np.ndarray):
        return x
    from bf16bridge.core.convert import convert

    return convert(x, "numpy", on_grad="drop", on_alias="allow")


def same_dtype(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, str | None, np.ndarray | None]:
    """Bring two results to one dtype for ULP comparison, saying what was done.

    Two float dtypes: the finer (more mantissa bits) is rounded to the coarser, nearest-even, and
    both are measured in the coarser's ULPs: a correctly rounded bf16 result against a float32 or
    float64 one is 0 ULPs away, as it would be against that result rounded by its own framework.
    A float32 result against a narrow integer one is rounded to the nearest integer (ties to even,
    as quantisers round: 2.9999 is 3); where it is NaN, infinite or beyond the integer's range it
    cannot be held, and the fourth value, a mask of such elements (else None), says where: they
    are NaN/inf mismatches, as a float beyond a coarser float's range is. Other mixes (two dtypes
    of as many mantissa bits, say e4m3fn and e4m3fnuz) are compared in float32 or float64."""
    if a.dtype == b.dtype:
        return a, b, None, None
    ka, kb = kind_of(a), kind_of(b)
    ia, ib = (k in kernels.FORMATS and kernels.FORMATS[k].integer for k in (ka, kb))
    if not ia and not ib and mantissa_bits(ka) != mantissa_bits(kb):
        coarse = ka if mantissa_bits(ka) < mantissa_bits(kb) else kb
    elif ia != ib and {ka, kb} - set(kernels.KERNEL_DTYPES) == {"float32"}:
        coarse = ka if ia else kb
    else:
        wide = np.dtype(np.float64) if "float64" in (ka, kb) else np.dtype(np.float32)
        return to_float64(a).astype(wide), to_float64(b).astype(wide), f"compared as {wide.name}", None
    fine, fine_kind = (b, kb) if coarse == ka else (a, ka)
    label = "bf16" if coarse == "bfloat16" else coarse
    fine_label = "bf16" if fine_kind == "bfloat16" else fine_kind
    lost = None
    if ia or ib:
        values = kernels.decoded(kernels.FORMATS[coarse])
        near = np.rint(to_float64(fine))
        with np.errstate(invalid="ignore"):
            lost = ~((near >= values.min()) & (near <= values.max()))  # NaN too
        held = rounded(fine, coarse)
        note = f"{fine_label} side rounded to {label} (nearest, ties to even) to compare in {label} steps"
        if lost.any():
            note += (f"; {int(np.count_nonzero(lost))} of its element(s) are NaN, infinite or beyond {label}'s range "
                     f"[{values.min():g}, {values.max():g}]: counted as NaN/inf mismatches")
    else:
        held = rounded(fine, coarse)
        note = f"{fine_label} side rounded to {label} (nearest-even) to compare in {label} ULPs"
        over = int(np.count_nonzero(classify(fine)["finite"] & ~classify(held)["finite"]))
        if over:  # a finite value past the coarser's range is infinite (or NaN) there: say so
            note += (f"; {over} of its finite element(s) lie beyond {label}'s range and became infinite (or NaN) "
                     "there: they agree only with the same infinity (NaN) on the other side")
    return (held, b, note, lost) if coarse == kb else (a, held, note, lost)


def _promoted_arithmetic(ka: str, kb: str) -> tuple[np.dtype, type]:
    """Arithmetic "promoted": the dtype torch.promote_types gives two results (a narrow dtype,
    which torch has no arithmetic for: float32), and the type torch computes its ops in (float32
    for bf16 and float16)."""
    if ka == kb and ka in _LAYOUT:
        dt = dtypes.bfloat16 if ka == "bfloat16" else np.dtype(ka)  # (a bf16 result: ml_dtypes is here)
    else:
        dt = np.dtype(np.float64) if "float64" in (ka, kb) else np.dtype(np.float32)
    return dt, (np.float64 if dt == np.float64 else np.float32)


def isclose(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, equal_nan: bool,
            arithmetic: str = "float64", widen: tuple = ()) -> np.ndarray:
    """Per element: ``|a - b| <= atol + rtol * |b|`` (b the expected side), or equal (infinities of
    one sign), or NaN on both sides with ``equal_nan``: numpy's and torch's isclose.

    ``arithmetic``: "float64", on the values as they are, exactly widened; "promoted", as
    torch.isclose computes after torch.testing promotes the two dtypes: in the promoted dtype,
    each step (rtol * b, its sum with atol, a - b) rounded to it, in float32 for bf16 and float16
    (checked against torch itself: tests/parity/test_parity_policies.py); "numpy", numpy.isclose itself, after
    ``widen`` ((dtype, to), ...) converts those dtypes, as jax's and tensorflow's test helpers do
    before numpy.testing.assert_allclose (which passes what numpy.isclose passes, NaN and infinity
    in the same places included): numpy's promotion and rounding, rtol and atol as Python floats."""
    if arithmetic == "numpy":
        to = dict(widen)
        wa, wb = (v.astype(to[v.dtype.name]) if v.dtype.name in to else v for v in (a, b))
        with np.errstate(all="ignore"):
            try:
                return np.isclose(wa, wb, rtol=float(rtol), atol=float(atol), equal_nan=equal_nan)
            except TypeError as err:  # an older numpy cannot promote int4 with a float (DTypePromotionError)
                raise UnsupportedDtypeError(
                    f"numpy {np.__version__} cannot compare {wa.dtype} with {wb.dtype} as this policy's "
                    f"framework does (numpy.isclose raised {type(err).__name__}: {err}); its own test helper "
                    "fails the same way here: compare with policy='ulp(N)' or 'allclose(...)', or widen the "
                    "integer side to int8") from err
    ka, kb = kind_of(a), kind_of(b)
    if arithmetic == "promoted":
        dt, op = _promoted_arithmetic(ka, kb)
    else:
        dt, op = np.dtype(np.float64), np.float64
    rnd = (lambda v: v) if dt == op else (lambda v: v.astype(dt).astype(op))  # noqa: E731
    with np.errstate(over="ignore", invalid="ignore"):
        x: np.ndarray = to_float64(a).astype(op)  # exact: both are values of dt
        y: np.ndarray = to_float64(b).astype(op)
        close = x == y
        if equal_nan:
            close |= np.isnan(x) & np.isnan(y)
        if rtol == 0 and atol == 0:
            return close
        # torch multiplies by rtol as float32 (the scalar as given) but adds atol as the tensors'
        # dtype holds it (bf16's 1e-5 is 1.00136e-5): each ufunc reads its scalar its own way
        atol_held = op(rnd(np.array([atol]))[0])
        allowed = rnd(atol_held + np.abs(rnd(op(rtol) * y)))
        actual = np.abs(rnd(x - y))
        return close | (np.isfinite(actual) & (actual <= allowed))


def policy_close(pol: Policy, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element: whether ``a`` is close to ``b`` (the expected side) under the allclose policy
    ``pol``, with the tolerances it takes for their two dtypes (a framework's, per dtype)."""
    rtol, atol = pol.tolerances(kind_of(a), kind_of(b))
    return isclose(a, b, rtol, atol, pol.equal_nan, pol.arithmetic, pol.widen)
