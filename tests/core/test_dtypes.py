"""Every narrow dtype as a table row, moved bit for bit (issue 10).

Per dtype and ordered pair of frameworks holding it: every bit pattern arrives unchanged
(read back by each framework's own calls), the data pointer is kept where the plan says
zero-copy, and a copy has its reason. Fallbacks per dtype and target that cannot hold it,
values checked against ml_dtypes; errors naming the dtype, the target and the way out.
Packing (torch's float4_e2m1fn_x2) is checked against torch's own unpacking.
"""

from __future__ import annotations

import re
import warnings

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.errors import InvalidArgumentError
from conftest import EXCLUDED, FRAMEWORKS, bits, dtype_name, fw, make, ptr, type_framework
from strategies import NUMPY_LACKS, lacks, needs_newer_ml_dtypes, numpy_holds

#: the rows beyond numpy's own dtypes and bf16 (tests/core/test_bits.py has bf16's 65,536 patterns)
FORMAT_NAMES = list(dtypes.FORMATS)  # the low-precision rows one value a byte


def _holds(framework: str, dtype: str) -> bool:
    return registry.get(framework).holds(dtype)


def _patterns(dtype: str) -> np.ndarray:
    """Every bit pattern of ``dtype`` as an array of it (low bits of a byte for the padded types)."""
    return dtypes.all_patterns(dtype).view(dtypes.numpy_dtype(dtype))


def _fp4(codes: np.ndarray) -> np.ndarray:
    """fp4 codes (one a byte) as numpy's float4_e2m1fn; callers ask lacks first."""
    return codes.view(dtypes.numpy_dtype("float4_e2m1fn"))


# -- the table ----------------------------------------------------------------------


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Same values as ml_dtypes reads them: NaN where NaN, zeros with their sign."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        x, y = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(x)
    return bool(np.array_equal(nan, np.isnan(y)) and np.array_equal(x[~nan], y[~nan])
                and np.array_equal(np.signbit(x[~nan]), np.signbit(y[~nan])))


FLOAT_CANDIDATES = ("bfloat16", "float16", "float32")
INT_CANDIDATES = ("int8", "uint8", "int16", "uint16", "int32", "uint32")


@pytest.mark.parametrize("dtype", [d for d in dtypes.NAMES if dtypes.ROWS[d].family != "standard"
                                   and d not in dtypes.PACKED])
def test_widenings_are_exact_and_complete(dtype):
    """A row's widenings keep every value (ml_dtypes' astype), and none that would is left out;
    a row this ml_dtypes lacks has no values to make: our error names the ml_dtypes that has it."""
    row = dtypes.ROWS[dtype]
    if not numpy_holds(dtype):
        with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes(dtype)):
            _patterns(dtype)
        return
    a = _patterns(dtype)
    candidates = FLOAT_CANDIDATES if row.kind == "float" else INT_CANDIDATES
    exact = [w for w in candidates if w != dtype and _same_values(a, a.astype(dtypes.numpy_dtype(w)))]
    if row.kind != "float":  # the narrowest exact integer of each signedness, and wider of the same kind
        exact = [w for w in exact if w.startswith("u") == (row.kind == "uint")]
    assert list(row.widenings) == exact


@pytest.mark.parametrize("dtype", dtypes.NAMES)
def test_rows_agree_with_numpy(dtype):
    row = dtypes.ROWS[dtype]
    assert row.bits * row.packing <= 8 * row.itemsize
    # the rows the table says numpy lacks here are exactly those this ml_dtypes has no type for
    values = row.unpacked or dtype
    assert numpy_holds(dtype) == (row.family == "standard" or hasattr(ml_dtypes, values)), NUMPY_LACKS.get(dtype)
    if row.packing > 1:
        assert dtypes.numpy_missing(dtype) is not None and row.unpacked in dtypes.ROWS
        with pytest.raises(bb.UnsupportedDtypeError, match="packed"):
            dtypes.numpy_dtype(dtype)
        return
    if not numpy_holds(dtype):
        with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes(dtype)):
            dtypes.numpy_dtype(dtype)
        assert dtypes.name_of_numpy(np.dtype("uint8")) == "uint8"  # its carrier still is numpy's own
        return
    nd = dtypes.numpy_dtype(dtype)
    assert nd.itemsize == row.itemsize == dtypes.itemsize(dtype)
    assert dtypes.name_of_numpy(nd) == dtype
    if row.carrier is not None:
        assert np.dtype(row.carrier).itemsize == row.itemsize
        assert np.dtype(row.carrier).kind == "u"


#: dlpack.h's DLDataTypeCode (DLPack 1.1) for the rows beyond numpy's own: written out here, not
#: read from the table, so a wrong code in dtypes.TABLE cannot agree with itself
DLPACK_H = {"bfloat16": 4, "float8_e3m4": 7, "float8_e4m3": 8, "float8_e4m3b11fnuz": 9, "float8_e4m3fn": 10,
            "float8_e4m3fnuz": 11, "float8_e5m2": 12, "float8_e5m2fnuz": 13, "float8_e8m0fnu": 14,
            "float6_e2m3fn": 15, "float6_e3m2fn": 16, "float4_e2m1fn": 17, "float4_e2m1fn_x2": 17}


@pytest.mark.parametrize("dtype", [d for d in dtypes.NAMES if dtypes.ROWS[d].family != "standard"])
def test_dlpack_codes_are_dlpack_h(dtype):
    """The table's (code, bits, lanes) against dlpack.h's codes; the sub-byte ints have none."""
    row = dtypes.ROWS[dtype]
    if dtype not in DLPACK_H:
        assert row.dlpack is None
        return
    assert row.dlpack == (DLPACK_H[dtype], row.bits, row.packing)


def _exported(make_tensor, export) -> tuple[int, int, int] | None:
    """(code, bits, lanes) of the capsule a framework's own export makes; None where it refuses."""
    from bf16bridge.adapters import dlpack as _dlpack

    try:
        capsule = export(make_tensor())
    except (BufferError, RuntimeError, TypeError, ValueError):
        return None
    dt = _dlpack._tensor(capsule).dtype
    return dt.code, dt.bits, dt.lanes


def _jax_exports(dtype: str):
    jax = fw("jax")
    try:
        x = jax.device_put(np.zeros(2, dtypes.numpy_dtype(dtype)))
    except (TypeError, ValueError, RuntimeError):  # float6 before jax 0.11: "Unknown NumPy dtype"
        return None
    return _exported(lambda: x, lambda t: t.__dlpack__())


def _torch_exports(dtype: str):
    torch = fw("torch")
    t = getattr(torch, dtype, None)
    if not isinstance(t, torch.dtype):
        return None
    code = _exported(lambda: torch.zeros(2 * dtypes.ROWS[dtype].itemsize, dtype=torch.uint8).view(t),
                     torch.utils.dlpack.to_dlpack)
    if code is None:
        assert dtype not in registry.get("torch").dlpack_export, dtype
    return code


#: what FACTS.md found exporting at the newest set: all eight fp8 codes, fp4 and bf16 from jax; five
#: fp8, the packed fp4 and bf16 from torch (jax 0.4.30, the oldest set, exports no narrow row: the
#: adapter's own trial says so, and the test checks that trial against the real exports)
EXPORTS_AT_LEAST = {
    "jax": {d for d in dtypes.NAMES if d.startswith("float8_")} | {"bfloat16", "float4_e2m1fn"},
    "torch": {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
              "float4_e2m1fn_x2"},
}


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_dlpack_codes_match_what_the_frameworks_export(framework):
    """What torch and jax put in their capsules, tried for every row each can make (not only the
    rows their adapters declare: an adapter drops a row whose export differs from the table), is
    the table's (code, bits, lanes); torch's sub-byte ints go out as 8-bit ints (the type lost)."""
    exports = {"torch": _torch_exports, "jax": _jax_exports}[framework]
    got: dict[str, tuple[int, int, int]] = {}
    for dtype in dtypes.NAMES:
        row = dtypes.ROWS[dtype]
        if row.family == "standard" or (framework == "jax" and dtypes.numpy_missing(dtype) is not None):
            continue
        code = exports(dtype)
        if code is not None:
            got[dtype] = code
    for dtype, code in got.items():
        row = dtypes.ROWS[dtype]
        if row.dlpack is None:  # the type is lost: an 8-bit int of the same signedness
            assert framework == "torch" and code == (0 if row.kind == "int" else 1, 8, 1), (dtype, code)
        else:
            assert code == row.dlpack, (dtype, code, row.dlpack)
    # jax makes its tensors from numpy's: only the rows this ml_dtypes holds
    known = {d for d in EXPORTS_AT_LEAST[framework] if framework == "torch" or numpy_holds(d)}
    declared = registry.get(framework).dlpack_export
    assert set(got) & known == known & declared, "the adapter's declared exports differ from what it exports"
    # torch exports every row it holds; jax bf16, and of the narrow rows all or (0.4.30, the oldest
    # declared) none
    narrow = known - {"bfloat16"}
    assert set(got) & known == known or (framework == "jax" and "bfloat16" in got and not set(got) & narrow), (
        sorted(known - set(got)))


@pytest.mark.parametrize("dtype", [d for d in FORMAT_NAMES if dtypes.ROWS[d].bits < 8 * dtypes.ROWS[d].itemsize])
def test_the_pages_bit_exact_column_sees_a_padding_change(dtype):
    """docs/dtypes.md's bit-exact compares every byte, as these tests do: a route that set a padded
    row's padding bits (the value's own bits unchanged) would not be called bit-exact."""
    from bf16bridge.cli import tables

    if not numpy_holds(dtype):  # no numpy array of it here: the page's row says why
        with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes(dtype)):
            tables._base(dtype)
        return
    base = tables._base(dtype)
    back = base.copy()
    back.view(np.uint8)[3] |= np.uint8(0x80)  # the top bit: padding in every padded row
    assert tables._same_bits(base.copy(), base) and not tables._same_bits(back, base)


# -- what each framework holds, found by trying ------------------------------------

def _jax_holds_float6() -> bool:
    """jax 0.11 added the fp6 types (jnp.float6_e2m3fn): jax 0.11.2 (.venv-numpy25) stores them, bits
    kept (XLA on CPU cannot compute with them, nor cast them); 0.10.2 refuses them. By version, not
    by trying: the adapter's own trial is what these tests check."""
    from importlib import metadata

    from bf16bridge.core.versions import release

    try:
        return release(metadata.version("jax")) >= (0, 11)
    except metadata.PackageNotFoundError:
        return False  # test_environment fails when jax is required and missing


#: the issue's findings for torch 2.13, jax 0.10 (0.11: fp6 too), tf 2.21 with ml_dtypes 0.6 (checked
#: here by trying); HELD below is what of it this environment's libraries have
NEWEST_HELD = {
    "numpy": set(FORMAT_NAMES),
    "torch": {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
              "int4", "uint4", "int2", "uint2", "float4_e2m1fn_x2"},
    "jax": set(FORMAT_NAMES) - (set() if _jax_holds_float6() else {"float6_e2m3fn", "float6_e3m2fn"}),
    "tensorflow": {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
                   "float4_e2m1fn", "int4", "uint4", "int2", "uint2"},
}



def _tensorflow_has(dtype: str) -> bool:
    """Whether tensorflow itself has a type for this numpy dtype (tf 2.16 has none of the fnuz fp8s).
    Not asked where the run leaves tensorflow out: the tests that read it are deselected there."""
    if "tensorflow" in EXCLUDED:
        return True
    tf = fw("tensorflow")
    try:
        tf.dtypes.as_dtype(dtypes.numpy_dtype(dtype))
    except TypeError:
        return False
    return True


def _here(framework: str, dtype: str) -> bool:
    """Whether this environment's libraries have ``dtype`` for ``framework``: jax and tensorflow take
    the narrow rows from numpy, so only those this ml_dtypes holds (the table says which); torch has
    its own types."""
    if framework == "torch":
        return True
    return numpy_holds(dtype) and (framework != "tensorflow" or _tensorflow_has(dtype))


HELD = {f: {d for d in held if _here(f, d)} for f, held in NEWEST_HELD.items()}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_what_each_framework_holds(framework):
    a = registry.get(framework)
    held = {d for d in dtypes.LOW_PRECISION if a.holds(d)}
    assert held == HELD[framework]
    for d in set(dtypes.LOW_PRECISION) - held:
        why = a.cannot_hold(d)
        assert why and d in why, (framework, d, why)
        if d in NEWEST_HELD[framework] and not numpy_holds(d):  # the way out: the ml_dtypes that has it
            assert re.search(needs_newer_ml_dtypes(d), why), (framework, d, why)


# -- every bit pattern, every pair ----------------------------------------------------

PAIR_CASES = [(d, s, t) for d in FORMAT_NAMES for s in FRAMEWORKS for t in FRAMEWORKS
              if s != t and d in HELD[s] and d in HELD[t]]


def _bytes(x) -> np.ndarray:
    """A tensor's bytes as uint8, read by its own framework (conftest.bits)."""
    return bits(x).view(np.uint8).reshape(-1)


@pytest.mark.parametrize("dtype,source,target", PAIR_CASES)
def test_every_pattern_crosses_unchanged(dtype, source, target):
    a = _patterns(dtype)
    x = make(source, a)
    p = bb.plan(x, target)
    y = bb.convert(x, target, on_alias="allow")
    assert type_framework(y) == target
    assert dtype_name(y) == dtype and p.dtype_out == dtype and p.decision is None
    np.testing.assert_array_equal(_bytes(y), a.view(np.uint8))
    if p.copies:
        assert all(s.reason for s in p.steps if s.copies), p
    else:
        assert ptr(y) == ptr(x), p


PADDED = [d for d in FORMAT_NAMES if dtypes.ROWS[d].bits < 8 * dtypes.ROWS[d].itemsize and numpy_holds(d)]


@pytest.mark.parametrize("dtype,target", [(d, t) for d in PADDED for t in FRAMEWORKS if t != "numpy"
                                          and (d in HELD[t] or dtypes.UNPACKED.get(d) in HELD[t])])
def test_padding_bits_that_are_set_are_kept_but_where_a_route_packs(dtype, target):
    """What docs/dtypes.md says of padding bits no value needs (tables.py's text)."""
    value_bits = dtypes.ROWS[dtype].bits
    a = _patterns(dtype)
    raw = a.view(np.uint8).copy()
    raw |= np.uint8((0xFF << value_bits) & 0xFF)  # every padding bit set
    dirty = raw.view(a.dtype)
    # ml_dtypes ignores them in the integer rows, and reads a set one as the sign in the fp4/fp6 rows
    same_values = np.array_equal(dirty.astype(np.float32), a.astype(np.float32), equal_nan=True)
    assert same_values == (dtypes.ROWS[dtype].kind in ("int", "uint")), dtype
    # XLA packs the rows of 4 bits and fewer (jax 0.11 stores fp6 a byte each, as numpy does); torch
    # holds fp4 packed two a byte (float4_e2m1fn_x2)
    packed = any(step.kind == "pack" or "packed" in step.reason for step in bb.plan(dirty, target).steps)
    held_packed = dtype not in HELD[target]  # (torch: the _x2 row)
    assert packed == ((target == "jax" and dtypes.ROWS[dtype].bits <= 4) or held_packed), dtype
    if packed and not same_values:  # clearing them would change the value numpy reads: refused
        with pytest.raises(InvalidArgumentError, match="byte 0x[0-9A-F]{2} at flat index 0, which ml_dtypes reads as"):
            bb.convert(dirty, target, on_alias="allow")
        return
    back = np.asarray(bb.to_numpy(bb.convert(dirty, target, on_alias="allow"), on_alias="allow"))
    np.testing.assert_array_equal(back.view(np.uint8), a.view(np.uint8) if packed else raw)


def test_padding_bits_that_are_set_are_refused_by_a_checkpoints_f4_and_cleared_once_canonical(tmp_path):
    if lacks("float4_e2m1fn"):
        return
    a = _patterns("float4_e2m1fn")
    raw = (a.view(np.uint8) | np.uint8(0xF0)).view(a.dtype)
    with pytest.raises(InvalidArgumentError, match="byte 0xF0 at flat index 0"):  # F4 packs two values a byte
        bb.save({"a": raw}, tmp_path / "f4.safetensors")
    bb.save({"a": raw.astype(np.float32).astype(a.dtype)}, tmp_path / "f4.safetensors")
    back = bb.load(tmp_path / "f4.safetensors")["a"]
    np.testing.assert_array_equal(back.astype(np.float32).view(np.uint32), raw.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("dtype,source,target", PAIR_CASES)
def test_copy_true_copies_and_keeps_the_bits(dtype, source, target):
    a = _patterns(dtype)
    x = make(source, a)
    p = bb.plan(x, target, copy=True)
    assert p.copies and not p.shares_memory
    y = bb.convert(x, target, copy=True)
    np.testing.assert_array_equal(_bytes(y), a.view(np.uint8))
    if "tensorflow" not in (source, target):  # (tf has no pointer to read for these: always copies)
        assert ptr(y) != ptr(x)


@pytest.mark.parametrize("dtype", ["int4", "uint2", "float4_e2m1fn"])
def test_jax_sub_byte_types_copy_because_xla_packs_them(dtype):
    if lacks(dtype):
        return
    a = _patterns(dtype)
    for x, target in ((make("numpy", a), "jax"), (make("jax", a), "numpy")):
        p = bb.plan(x, target)
        assert p.copies and any("packed" in s.reason for s in p.steps if s.copies), p
        y = bb.convert(x, target)
        np.testing.assert_array_equal(_bytes(y), a.view(np.uint8))


#: zero-copy where a DLPack code both sides speak, or a free uint8 bit-view on both sides, exists
ZERO_COPY = [("float8_e4m3fn", "numpy", "torch"), ("float8_e4m3fn", "torch", "numpy"),
             ("float8_e5m2", "torch", "jax"), ("float8_e8m0fnu", "jax", "torch"),
             ("float8_e4m3", "numpy", "jax"), ("float8_e4m3b11fnuz", "jax", "numpy"),
             ("int4", "numpy", "torch"), ("uint2", "torch", "numpy")]


@pytest.mark.parametrize("dtype,source,target", ZERO_COPY)
def test_zero_copy_routes(dtype, source, target):
    if lacks(dtype):
        return
    x = make(source, _patterns(dtype))
    p = bb.plan(x, target, copy=False)
    assert not p.copies and p.shares_memory
    assert ptr(bb.convert(x, target, copy=False, on_alias="allow")) == ptr(x)


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("dtype,source", [("float8_e4m3fn", "numpy"), ("int4", "torch"), ("float4_e2m1fn", "jax")])
def test_tensorflow_copies_say_why(dtype, source):
    """tf 2.21 stores these but has no bitcast or DLPack for them: one copy, with its reason."""
    if lacks(dtype):
        return
    p = bb.plan(make(source, _patterns(dtype)), "tensorflow")
    assert p.copies
    assert any("tensorflow has no bit-view or DLPack" in s.reason for s in p.steps if s.copies)
    with pytest.raises(bb.CopyRequiredError):
        bb.plan(make(source, _patterns(dtype)), "tensorflow", copy=False)


# -- fallbacks --------------------------------------------------------------------------

#: (ml_dtypes' astype is the reference: the rows this ml_dtypes lacks are test_a_row_numpy_lacks_here's)
FALLBACK_CASES = [(d, s, t) for d in FORMAT_NAMES for s in FRAMEWORKS for t in FRAMEWORKS if s != t and d in HELD[s]
                  and d not in HELD[t] and dtypes.UNPACKED.get(d) not in HELD[t] and numpy_holds(d)]


def _values(y) -> np.ndarray:
    """A result's values as numpy, by the framework's own calls."""
    mod = type_framework(y)
    if mod == "torch":
        import torch

        return y.view(torch.uint16).numpy().view(ml_dtypes.bfloat16) if y.dtype == torch.bfloat16 else y.numpy()
    if mod == "tensorflow":
        import tensorflow as tf

        return tf.bitcast(y, tf.uint16).numpy().view(ml_dtypes.bfloat16) if y.dtype == tf.bfloat16 else y.numpy()
    return np.asarray(y)


@pytest.mark.parametrize("dtype,source,target", FALLBACK_CASES)
def test_fallback_error_names_the_dtype_the_target_and_the_way_out(dtype, source, target):
    x = make(source, _patterns(dtype))
    with pytest.raises(bb.UnsupportedDtypeError) as err:
        bb.convert(x, target)
    msg = str(err.value)
    assert dtype in msg and target in msg and "fallback='auto'" in msg and "fallback='bits'" in msg


@pytest.mark.parametrize("dtype,source,target", FALLBACK_CASES)
def test_every_fallback_the_error_offers_works_and_copy_false_offers_the_same(dtype, source, target):
    """The refusal offers only fallbacks that reach the target, and each does (with copy=None, the
    default); under copy=False the same ones are offered (each copies: its own error then names
    copy=None), never "no fallback exists" (a copy=False refusal once dropped every fallback that copies)."""
    import re

    x = make(source, _patterns(dtype))
    offered = {}
    for copy in (None, False):
        with pytest.raises(bb.UnsupportedDtypeError) as err:
            bb.convert(x, target, copy=copy)
        offered[copy] = re.findall(r"fallback='(\w+)'", str(err.value))
    assert offered[None] and offered[False] == offered[None], offered
    for fallback in offered[None]:
        bb.convert(x, target, fallback=fallback, on_alias="allow")


@pytest.mark.parametrize("dtype,source,target", FALLBACK_CASES)
def test_fallback_auto_widens_to_the_narrowest_exact_dtype_the_target_holds(dtype, source, target):
    a = _patterns(dtype)
    x = make(source, a)
    want = next(w for w in dtypes.ROWS[dtype].widenings if _holds(target, w))
    p = bb.plan(x, target, fallback="auto")
    assert p.dtype_out == want and "fallback='auto'" in p.decision and dtype in p.decision
    y = bb.convert(x, target, fallback="auto", on_alias="allow")
    got = _values(y)
    assert got.dtype == dtypes.numpy_dtype(want)
    assert _same_values(a, got)  # the widening is exact
    ref = a.astype(dtypes.numpy_dtype(want))  # ml_dtypes' astype: same bits except NaN payloads
    nan = np.isnan(ref.astype(np.float64)) if dtypes.ROWS[dtype].kind == "float" else np.zeros(a.shape, bool)
    np.testing.assert_array_equal(got.view(f"u{got.dtype.itemsize}")[~nan], ref.view(f"u{ref.dtype.itemsize}")[~nan])


@pytest.mark.parametrize("dtype,source,target", [c for c in FALLBACK_CASES if dtypes.ROWS[c[0]].kind == "float"])
def test_fallback_float32(dtype, source, target):
    a = _patterns(dtype)
    y = bb.convert(make(source, a), target, fallback="float32", on_alias="allow")
    got = _values(y)
    assert got.dtype == np.float32 and _same_values(a, got)


@pytest.mark.parametrize("dtype,source,target", FALLBACK_CASES)
def test_fallback_bits(dtype, source, target):
    a = _patterns(dtype)
    x = make(source, a)
    p = bb.plan(x, target, fallback="bits")
    assert p.dtype_out == "uint8" and "raw bit patterns" in p.decision
    y = bb.convert(x, target, fallback="bits", on_alias="allow")
    np.testing.assert_array_equal(_values(y), a.view(np.uint8))


#: (a row the target lacks for a reason of its own, tf 2.16's fnuz fp8s, is FALLBACK_CASES')
TORCH_ROWS = [(d, t) for d in sorted(NEWEST_HELD["torch"]) if d not in dtypes.PACKED for t in FRAMEWORKS
              if t != "torch" and d in NEWEST_HELD[t] and (d in HELD[t] or not numpy_holds(d))]


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dtype,target", TORCH_ROWS)
def test_a_row_numpy_lacks_here_is_refused_naming_the_ml_dtypes_that_has_it(dtype, target):
    """A torch tensor of a row the newest set carries to ``target``: where this ml_dtypes has the
    row it arrives as itself; where not (0.3.1: float8_e8m0fnu, int2, uint2), our error names the
    ml_dtypes that has it, and what it offers works: the raw bytes, or for a float row torch's own
    widening to float32."""
    torch = fw("torch")
    t = torch.from_numpy(dtypes.all_patterns(dtype)).view(getattr(torch, dtype))
    if dtype in HELD[target]:
        assert bb.plan(t, target).dtype_out == dtype
        return
    with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes(dtype)) as err:
        bb.convert(t, target)
    assert bits(bb.convert(t, target, fallback="bits")).tobytes() == bits(t).tobytes()
    if "fallback='float32'" in str(err.value):
        got = _values(bb.convert(t, target, fallback="float32", on_alias="allow"))
        want = t.to(torch.float32).numpy()
        assert got.dtype == np.float32 and _same_values(got, want)
    else:  # torch has no widening kernel for its sub-byte ints: bits is the only way, and said so
        assert dtypes.ROWS[dtype].kind != "float" and "fallback='auto'" not in str(err.value)


# -- packed layouts: torch's float4_e2m1fn_x2 <-> one value a byte ----------------------


def _torch_unpacked(t) -> np.ndarray:
    """torch's own reading of a float4_e2m1fn_x2 tensor: its ONNX exporter's unpacking (element 2i
    in the low nibble), one fp4 code a byte, in the logical shape."""
    from torch.onnx._internal.exporter._type_casting import unpack_float4x2_as_uint8

    return unpack_float4x2_as_uint8(t)


def _packed_torch(shape):
    torch = fw("torch")
    n = int(np.prod(shape))
    return torch.from_numpy(np.arange(n, dtype=np.uint8) * np.uint8(37)).reshape(shape).view(torch.float4_e2m1fn_x2)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("target", ["numpy", "jax", "tensorflow"])
@pytest.mark.parametrize("shape", [(256,), (4, 64), (2, 3, 1)])
def test_torch_packed_fp4_unpacks_as_torch_reads_it(target, shape):
    t = _packed_torch(shape)
    if lacks("float4_e2m1fn"):  # no row to unpack to: our error, and its way out (the raw bytes)
        with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes("float4_e2m1fn_x2")):
            bb.plan(t, target)
        assert bits(bb.convert(t, target, fallback="bits")).tobytes() == bits(t).tobytes()
        return
    p = bb.plan(t, target)
    assert p.dtype_out == "float4_e2m1fn" and p.copies and "unpacked" in p.decision
    assert [s.kind for s in p.steps if s.copies][0] == "unpack"
    y = bb.convert(t, target)
    assert dtype_name(y) == "float4_e2m1fn"
    want = _torch_unpacked(t)
    assert tuple(y.shape) == (*shape[:-1], shape[-1] * 2) == want.shape == p.result_shape
    assert p.shape == shape and p.to_dict()["result_shape"] == list(want.shape)
    assert str(p).splitlines()[0].endswith(f"-> {target} float4_e2m1fn [{'x'.join(map(str, want.shape))}]")
    np.testing.assert_array_equal(bits(y).reshape(want.shape), want)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("source", ["numpy", "jax", "tensorflow"])
def test_fp4_packs_for_torch_and_back(source):
    torch = fw("torch")
    codes = np.arange(64, dtype=np.uint8).reshape(2, 32) % 16  # every fp4 code, in both nibbles
    if lacks("float4_e2m1fn"):
        return
    x = make(source, _fp4(codes))
    p = bb.plan(x, "torch")
    assert p.dtype_out == "float4_e2m1fn_x2" and "packed" in p.decision
    assert any(s.kind == "pack" and s.copies and "float4_e2m1fn_x2" in s.reason for s in p.steps)
    t = bb.convert(x, "torch")
    assert t.dtype == torch.float4_e2m1fn_x2 and tuple(t.shape) == (2, 16) == p.result_shape
    assert p.shape == (2, 32) and str(p).splitlines()[0].endswith("-> torch float4_e2m1fn_x2 [2x16]")
    np.testing.assert_array_equal(_torch_unpacked(t), codes)  # torch reads the values we sent
    # the bytes torch's own packing helper makes of the same codes (element 2i low, 2i + 1 high:
    # torch.testing._internal.common_quantized.pack_uint4, `data[1::2] << 4 | data[::2]`)
    np.testing.assert_array_equal(t.view(torch.uint8).numpy(), codes[:, 1::2] << 4 | codes[:, ::2])
    back = bb.convert(t, source)
    np.testing.assert_array_equal(bits(back).reshape(codes.shape), codes)


@pytest.mark.frameworks("torch", "tensorflow")
def test_a_route_that_keeps_the_shape_says_so_once():
    """result_shape is the input's where no step packs or unpacks (a packed tensor kept packed
    too), and str(plan) then shows the shape once."""
    x = np.zeros((3, 4), dtypes.numpy_dtype("float8_e4m3fn"))
    p = bb.plan(x, "tensorflow")
    assert p.result_shape == p.shape == (3, 4) and str(p).splitlines()[0].endswith("-> tensorflow float8_e4m3fn")
    p = bb.plan(_packed_torch((2, 6)), "torch", copy=True)
    assert p.result_shape == p.shape == (2, 6)


#: float4_e2m1fn's 16 codes (OCP MX spec: sign, 2 exponent bits, 1 mantissa bit)
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.mark.frameworks("torch")
def test_packed_fp4_values():
    """Each byte of torch's float4_e2m1fn_x2 becomes two values, low nibble first."""
    torch = fw("torch")
    t = torch.from_numpy(np.array([0x21, 0xF7, 0x8C], np.uint8)).view(torch.float4_e2m1fn_x2)
    if lacks("float4_e2m1fn"):
        with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes("float4_e2m1fn_x2")):
            bb.convert(t, "numpy")
        return
    y = bb.convert(t, "numpy")
    want = [FP4_VALUES[c] for c in (0x1, 0x2, 0x7, 0xF, 0xC, 0x8)]
    np.testing.assert_array_equal(y.astype(np.float32), np.array(want, np.float32))
    np.testing.assert_array_equal(np.signbit(y.astype(np.float32)), np.signbit(want))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("shape", [(3,), (2, 5), ()])
def test_an_odd_last_dimension_is_refused_for_packing(shape):
    if lacks("float4_e2m1fn"):
        return
    x = make("numpy", _fp4(np.zeros(shape, np.uint8)))
    with pytest.raises(bb.UnsupportedDtypeError) as err:
        bb.plan(x, "torch")
    msg = str(err.value)
    assert "float4_e2m1fn" in msg and "even" in msg and "np.pad" in msg and "fallback='bits'" in msg
    y = bb.convert(x, "torch", fallback="bits")  # the way out it names works
    assert str(y.dtype) == "torch.uint8" and tuple(y.shape) == shape


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("target", ["numpy", "jax", "tensorflow"])
def test_a_0d_packed_tensor_is_refused_for_unpacking_and_its_way_out_works(target):
    """A 0-d float4_e2m1fn_x2 holds two values and has no last dimension to lay them along: plan
    and convert refuse it with our error naming reshape to (1,), and the reshaped one arrives as (2,)."""
    t = _packed_torch((1,)).reshape(())
    if lacks("float4_e2m1fn"):
        with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes("float4_e2m1fn_x2")):
            bb.plan(t.reshape(1), target)
        assert bits(bb.convert(t, target, fallback="bits")).tobytes() == bits(t).tobytes()
        return
    for call in (bb.plan, bb.convert):
        with pytest.raises(bb.UnsupportedDtypeError) as err:
            call(t, target)
        assert "0-d" in str(err.value) and "reshape it to (1,)" in str(err.value)
    p = bb.plan(t.reshape(1), target)
    y = bb.convert(t.reshape(1), target)
    assert tuple(y.shape) == p.result_shape == (2,)
    np.testing.assert_array_equal(bits(y).reshape(-1), _torch_unpacked(t.reshape(1)))
    assert bits(bb.convert(t, target, fallback="bits")).tobytes() == bits(t).tobytes()


@pytest.mark.frameworks("torch")
def test_a_0d_value_is_refused_for_packing_with_the_way_out():
    if lacks("float4_e2m1fn"):
        return
    x = make("numpy", _fp4(np.zeros((), np.uint8)))
    with pytest.raises(bb.UnsupportedDtypeError, match=r"reshape it to \(1,\) first, then pad"):
        bb.convert(x, "torch")


@pytest.mark.frameworks("torch")
def test_packing_is_refused_with_copy_false():
    if lacks("float4_e2m1fn"):
        return
    x = make("numpy", _fp4(np.zeros(4, np.uint8)))
    with pytest.raises(bb.CopyRequiredError):
        bb.convert(x, "torch", copy=False)


def test_the_planner_names_no_narrow_dtype():
    """A new dtype is a table row plus what each adapter holds: routes.py names none of them."""
    import inspect

    from bf16bridge.core import planner as routes

    source = inspect.getsource(routes)
    named = [d for d in dtypes.NAMES if dtypes.ROWS[d].family != "standard" and f'"{d}"' in source]
    assert named == []


# -- tensorflow's copy-kernel trials keep its native refusals off stderr ------------------


@pytest.mark.frameworks("tensorflow")
def test_tensorflow_copy_kernel_trial_prints_nothing(capfd):
    """Asking whether tensorflow's DeepCopy takes a narrow row runs it once; its refusal is
    logged natively (W0000 ... Unsupported data type: ...), and the adapter keeps those lines off
    the process's stderr."""
    from bf16bridge.adapters.tensorflow import probe as tfa

    held = sorted(d for d in FORMAT_NAMES if _holds("tensorflow", d))
    assert held
    tfa.copy_kernel.cache_clear()
    capfd.readouterr()
    answers = {d: registry.get("tensorflow").can_copy(d) for d in held}
    err = capfd.readouterr().err
    assert "Unsupported data type" not in err and "OP_REQUIRES" not in err, err
    assert set(answers.values()) <= {True, False}
