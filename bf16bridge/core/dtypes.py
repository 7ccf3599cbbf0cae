"""The dtypes the bridge carries: one table, a row per dtype, and views derived from it.

Dtypes are named by their NumPy / ml_dtypes names ("bfloat16", "float8_e4m3fn",
"int4", ...); each adapter maps its own dtype objects to these names and says
which rows it holds. A row says what the planner needs: bits a value, bytes a
value, kind, packing (values a byte), the unsigned integer of the same width
that carries its bits through a bit-view, the exact widenings in order
(checked against ml_dtypes by tests/core/test_dtypes.py), and the DLPack
(code, bits, lanes) where DLPack defines one; for a float, how its bits spell a value
(exponent and mantissa bits, bias, how NaN and infinity are spelled: what the codecs of
``core.formats`` and the kernels decode and round by). A new dtype is a new row.

ml_dtypes is optional at import time so that ``import bf16bridge`` works on a
NumPy without it; then ``bfloat16`` is None and NumPy holds none of its rows
(``numpy_dtype`` says why). An ml_dtypes too old for a row (0.3.1 has no
float6/float4/int2) leaves the row in the table: NumPy then cannot hold it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

try:  # ml_dtypes is a hard dependency, but a broken one must not break import
    import ml_dtypes as _ml_dtypes

    bfloat16 = np.dtype(_ml_dtypes.bfloat16)
    ML_DTYPES_ERROR: str | None = None
except Exception as err:  # noqa: BLE001 - record why, whatever it was
    _ml_dtypes = None
    bfloat16 = None
    ML_DTYPES_ERROR = f"{type(err).__name__}: {err}"

Kind = Literal["float", "int", "uint", "bool", "complex"]
#: "standard": numpy's own; "bfloat16"; "narrow": the low-precision rows (LOW_PRECISION: the
#: fp8/fp6/fp4 family and the sub-byte ints)
Family = Literal["standard", "bfloat16", "narrow"]
#: how a float spells NaN and infinity, as ml_dtypes (and the OCP / MLIR names) define them:
#: "ieee" (exponent all ones: mantissa 0 is inf, any other NaN), "fn" (exponent and mantissa all
#: ones is NaN; no inf), "fnuz" (the pattern of -0 is NaN; no inf, no -0), "ones" (float8_e8m0fnu:
#: all ones is NaN; no sign, no zero), "none" (fp6/fp4, and integers: every pattern finite)
Specials = Literal["ieee", "fn", "fnuz", "ones", "none"]

# DLPack 1.1 type codes (dlpack.h DLDataTypeCode)
_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6


@dataclass(frozen=True)
class Dtype:
    """One row of the table."""

    name: str
    #: bits of one value (4 for float4_e2m1fn, padded or packed)
    bits: int
    #: bytes of one element as the framework stores it (a packed element holds ``packing`` values)
    itemsize: int
    kind: Kind
    family: Family
    #: the unsigned integer of the element's width that carries its bits through a bit-view
    #: (uint16 for bf16, uint8 for the 8-bit, padded and packed types); None: none needed
    carrier: str | None = None
    #: exact widenings, narrowest first: every value of this dtype is a value of each
    widenings: tuple[str, ...] = ()
    #: DLPack (code, bits, lanes), where DLPack defines one
    dlpack: tuple[int, int, int] | None = None
    #: values a byte: 2 for a packed 4-bit layout (torch's float4_e2m1fn_x2), else 1
    packing: int = 1
    #: for a packed row: the row of the same values one a byte (float4_e2m1fn for float4_e2m1fn_x2)
    unpacked: str | None = None
    #: the ml_dtypes version that first has it (None: numpy's own, or no numpy dtype at all)
    ml_dtypes: str | None = None
    #: a float's exponent bits, mantissa bits and exponent bias (0 for the others)
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    #: how a float spells NaN and infinity (Specials)
    nan: Specials = "none"
    #: has a sign: False for the unsigned integers, bool and float8_e8m0fnu
    signed: bool = True

    @property
    def patterns(self) -> int:
        """How many distinct bit patterns an element has (256 for a packed byte of two fp4)."""
        return 1 << (self.bits * self.packing)

    @property
    def integer(self) -> bool:
        """A signed or unsigned integer row."""
        return self.kind in ("int", "uint")

    @property
    def mask(self) -> int:
        """The value bits of one value (0x0F for a 4-bit row, padded one a byte)."""
        return (1 << self.bits) - 1

    @property
    def largest(self) -> float:
        """The largest finite value: of a float, from its layout and specials; of an integer, its top."""
        if self.kind != "float":
            return self.value_range[1]
        emax, mmax = (1 << self.ebits) - 1, (1 << self.mbits) - 1
        # the top exponent and mantissa that spell a finite value
        top_e, top_m = {"ieee": (emax - 1, mmax), "fn": (emax, mmax - 1), "ones": (emax - 1, 0)}.get(
            self.nan, (emax, mmax))
        return math.ldexp((1 << self.mbits) + top_m, top_e - self.bias - self.mbits)

    @property
    def value_range(self) -> tuple:
        """What saturating rounding clamps to: +-largest for a float, an integer's whole range."""
        if self.kind == "float":
            big = self.largest
            return -big, big
        if self.signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, self.mask


#: IEEE 754 binary formats by width: exponent bits, mantissa bits, bias
_IEEE = {16: (5, 10, 15), 32: (8, 23, 127), 64: (11, 52, 1023)}


def _std(name: str, kind: Kind, bits: int, widenings: tuple[str, ...] = ()) -> Dtype:
    code = {"int": _INT, "uint": _UINT, "float": _FLOAT, "complex": _COMPLEX, "bool": _BOOL}[kind]
    ebits, mbits, bias = _IEEE[bits] if kind == "float" else (0, 0, 0)
    return Dtype(name, bits, max(bits // 8, 1), kind, "standard", None, widenings, (code, bits, 1),
                 ebits=ebits, mbits=mbits, bias=bias, nan="ieee" if kind == "float" else "none",
                 signed=kind in ("int", "float", "complex"))


_F = ("bfloat16", "float16", "float32")  # the float widenings, narrowest first
_NO_F16 = ("bfloat16", "float32")  # more exponent range than float16 has


def _f8(name: str, code: int, layout: tuple[int, int, int], nan: Specials, widenings=_F, since="0.3.1",
        signed=True) -> Dtype:
    ebits, mbits, bias = layout
    return Dtype(name, 8, 1, "float", "narrow", "uint8", widenings, (code, 8, 1), ml_dtypes=since,
                 ebits=ebits, mbits=mbits, bias=bias, nan=nan, signed=signed)


def _sub(name: str, bits: int, kind: Kind, since: str, dlpack=None, layout=(0, 0, 0)) -> Dtype:
    widenings = {"float": _F, "int": ("int8", "int16", "int32"), "uint": ("uint8", "uint16", "uint32")}[kind]
    ebits, mbits, bias = layout
    return Dtype(name, bits, 1, kind, "narrow", "uint8", widenings, dlpack, ml_dtypes=since,
                 ebits=ebits, mbits=mbits, bias=bias, signed=kind != "uint")


#: Every dtype the bridge carries. Widenings were found with ml_dtypes over every bit pattern
#: (tests/core/test_dtypes.py checks them): float8_e8m0fnu's 2**-127 is a bf16 subnormal, and its
#: 2**127 overflows float16, so it widens to bf16 and float32 only; bf16 fits float32 only.
TABLE: tuple[Dtype, ...] = (
    _std("bool", "bool", 8),
    _std("int8", "int", 8), _std("int16", "int", 16), _std("int32", "int", 32), _std("int64", "int", 64),
    _std("uint8", "uint", 8), _std("uint16", "uint", 16), _std("uint32", "uint", 32), _std("uint64", "uint", 64),
    _std("float16", "float", 16, ("float32",)), _std("float32", "float", 32), _std("float64", "float", 64),
    _std("complex64", "complex", 64), _std("complex128", "complex", 128),
    Dtype("bfloat16", 16, 2, "float", "bfloat16", "uint16", ("float32",), (_BFLOAT, 16, 1), ml_dtypes="0.1",
          ebits=8, mbits=7, bias=127, nan="ieee"),
    # the fp8 family, DLPack 1.1 codes 7..14; (exponent bits, mantissa bits, bias)
    _f8("float8_e4m3fn", 10, (4, 3, 7), "fn"),
    _f8("float8_e5m2", 12, (5, 2, 15), "ieee"),
    _f8("float8_e4m3fnuz", 11, (4, 3, 8), "fnuz"),
    _f8("float8_e5m2fnuz", 13, (5, 2, 16), "fnuz"),
    _f8("float8_e4m3b11fnuz", 9, (4, 3, 11), "fnuz"),
    _f8("float8_e8m0fnu", 14, (8, 0, 127), "ones", _NO_F16, since="0.5.0", signed=False),
    _f8("float8_e4m3", 8, (4, 3, 7), "ieee", since="0.5.0"),
    _f8("float8_e3m4", 7, (3, 4, 3), "ieee", since="0.5.0"),
    # fp6 and fp4, one value a byte (low bits) as ml_dtypes stores them; every pattern finite
    _sub("float6_e2m3fn", 6, "float", "0.5.0", (15, 6, 1), (2, 3, 1)),
    _sub("float6_e3m2fn", 6, "float", "0.5.0", (16, 6, 1), (3, 2, 3)),
    _sub("float4_e2m1fn", 4, "float", "0.5.0", (17, 4, 1), (2, 1, 1)),
    # torch's packed fp4: two values a byte (DLPack lanes=2); no numpy dtype
    Dtype("float4_e2m1fn_x2", 4, 1, "float", "narrow", "uint8", (), (17, 4, 2), packing=2,
          unpacked="float4_e2m1fn", ebits=2, mbits=1, bias=1),
    # sub-byte integers, one a byte (low bits); DLPack defines none that a framework speaks
    _sub("int4", 4, "int", "0.3.1"), _sub("uint4", 4, "uint", "0.3.1"),
    _sub("int2", 2, "int", "0.5.0"), _sub("uint2", 2, "uint", "0.5.0"),
)

ROWS: dict[str, Dtype] = {d.name: d for d in TABLE}

# -- views derived from the table (names older modules use) -----------------------

#: every row's name
NAMES: tuple[str, ...] = tuple(ROWS)
#: numpy's own dtypes: cross bit for bit wherever both sides hold them
STANDARD: tuple[str, ...] = tuple(d.name for d in TABLE if d.family == "standard")
#: the dtypes every framework here holds (numpy with ml_dtypes): the standard ones and bf16
ALL: tuple[str, ...] = tuple(d.name for d in TABLE if d.family != "narrow")
#: the low-precision rows: fp8/fp6/fp4 and the sub-byte ints (not every framework holds each)
LOW_PRECISION: tuple[str, ...] = tuple(d.name for d in TABLE if d.family == "narrow")
#: the low-precision rows one value a byte, by name: what the codecs (core.formats) decode and the
#: kernels round to and widen from, besides bfloat16 (the packed row is its unpacked row's values)
FORMATS: dict[str, Dtype] = {d.name: d for d in TABLE if d.family == "narrow" and d.packing == 1}
#: rows that need a bit-view on the way somewhere, with the unsigned integer carrying their bits
BITS_OF: dict[str, str] = {d.name: d.carrier for d in TABLE if d.carrier is not None}
#: rows whose fallback='auto' the capability probe decides (it knows bf16 storage and compute)
PROBED: frozenset[str] = frozenset(d.name for d in TABLE if d.family == "bfloat16")
#: packed rows and the row of the same values one a byte, both ways
PACKED: dict[str, str] = {d.name: d.unpacked for d in TABLE if d.unpacked is not None}
UNPACKED: dict[str, str] = {v: k for k, v in PACKED.items()}

#: 64-bit integers and the 32-bit ones fallback="auto" converts them to, for a target that
#: cannot hold them (jax without x64), when every value fits (checked on the data: Adapter.fit_int)
INT32_OF = {"int64": "int32", "uint64": "uint32"}


def row(name: str) -> Dtype:
    """The table's row for ``name``; our UnsupportedDtypeError listing the rows for any other."""
    try:
        return ROWS[name]
    except KeyError:
        from bf16bridge.errors import UnsupportedDtypeError

        raise UnsupportedDtypeError(f"{name!r} is not a dtype bf16bridge carries; it carries {', '.join(NAMES)}") \
            from None


def in_values(shape: tuple, name: str) -> tuple[tuple, str]:
    """A tensor's shape and dtype said in values: for a packed dtype (torch's float4_e2m1fn_x2, two
    values a byte along the last dimension) that dimension times the packing and the unpacked dtype;
    any other (and a 0-d one) as it is."""
    unpacked = PACKED.get(name)
    if unpacked is None or not shape:
        return tuple(shape), name
    return (*shape[:-1], shape[-1] * ROWS[name].packing), unpacked


def values_missing(name: str) -> str | None:
    """Why numpy cannot hold the values of row ``name`` here (a packed row's: its row of one value
    a byte, which numpy holds them in), or None: whether a tensor of it can be made from numpy."""
    return numpy_missing(PACKED.get(name, name))


def numpy_missing(name: str) -> str | None:
    """Why NumPy cannot hold row ``name`` here (the way out included), or None when it can."""
    d = ROWS.get(name)
    if d is None:
        return f"{name!r} is not a dtype bf16bridge carries"
    if d.family == "standard":
        return None
    if d.packing > 1:
        # an ml_dtypes without the row of its values holds neither
        inner = numpy_missing(d.unpacked) if d.unpacked else None
        return (f"numpy has no packed {name} dtype ({d.packing} values a byte); "
                + (f"it holds {d.unpacked}, one value a byte: the route unpacks" if inner is None
                   else f"nor {d.unpacked}, one value a byte: {inner}"))
    if _ml_dtypes is None:
        return f"ml_dtypes is unusable ({ML_DTYPES_ERROR}): install a working ml_dtypes"
    if not hasattr(_ml_dtypes, name):
        return (f"ml_dtypes {getattr(_ml_dtypes, '__version__', '?')} has no {name} "
                f"(ml_dtypes >= {d.ml_dtypes} does): upgrade ml_dtypes")
    return None


def _numpy_dtypes() -> dict[str, np.dtype]:
    out = {}
    for d in TABLE:
        if numpy_missing(d.name) is None:
            out[d.name] = np.dtype(d.name) if d.family == "standard" else np.dtype(getattr(_ml_dtypes, d.name))
    return out


_NUMPY: dict[str, np.dtype] = _numpy_dtypes()
#: numpy dtype name -> row name, for the rows numpy holds here
_BY_NUMPY_NAME: dict[str, str] = {dt.name: n for n, dt in _NUMPY.items()}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a row name; UnsupportedDtypeError saying why NumPy cannot hold it here."""
    dt = _NUMPY.get(name)
    if dt is not None:
        return dt
    if name not in ROWS:
        return np.dtype(name)  # not a row: numpy's own answer (and its own error)
    from bf16bridge.errors import UnsupportedDtypeError

    raise UnsupportedDtypeError(
        f"NumPy cannot hold {name} here: {numpy_missing(name)}"
        + ("; or pass fallback='float32' or 'bits'" if name == "bfloat16" else ""))


def numpy_dtype_or_none(name: str) -> np.dtype | None:
    """The NumPy dtype for a row name, or None where NumPy cannot hold it here (an ml_dtypes
    without the row: 0.3 has no float8_e4m3, e3m4, e8m0fnu, float6, float4 nor int2/uint2)."""
    return _NUMPY.get(name)


def itemsize(name: str) -> int:
    """Bytes per element of a row (or of any numpy dtype name)."""
    d = ROWS.get(name)
    return d.itemsize if d is not None else np.dtype(name).itemsize


#: name_of_numpy's answers by dtype object (numpy's ``dtype.name`` is computed in Python each time;
#: a dtype compares and hashes by its kind, size and byte order, all that the name depends on)
_BY_DTYPE: dict = {}


def name_of_numpy(dtype: np.dtype) -> str | None:
    """The row name of a NumPy dtype, or None if we do not carry it."""
    if isinstance(dtype, np.dtype):  # (not a type or a string, which hash differently)
        try:
            return _BY_DTYPE[dtype]
        except KeyError:
            name = _BY_DTYPE[dtype] = _BY_NUMPY_NAME.get(dtype.name)
            return name
    return _BY_NUMPY_NAME.get(np.dtype(dtype).name)


def all_patterns(name: str) -> np.ndarray:
    """Every bit pattern of row ``name`` as a numpy array of its carrier (uint8 / uint16):
    65,536 for bf16, 256 for the 8-bit types and a packed byte, 64 / 16 / 4 for the 6/4/2-bit
    types, in the low bits of a byte as ml_dtypes stores them."""
    d = row(name)
    carrier = np.dtype(d.carrier or f"u{d.itemsize}")
    return np.arange(d.patterns, dtype=carrier)


def all_bf16_patterns() -> np.ndarray:
    """Every one of the 65,536 bf16 bit patterns as a bf16 array (NaN payloads and -0 included)."""
    return np.arange(1 << 16, dtype=np.uint16).view(numpy_dtype("bfloat16"))
