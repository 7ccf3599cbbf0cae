"""The bridge's use of NumPy 2.5's DLPack dtype registry (adapters/_numpy_registry.py).

NumPy 2.5 is not installable here, so these tests drive the logic with a stand-in numpy whose
``from_dlpack`` refuses ml_dtypes types until they are registered, as NumPy 2.5 does; the real
registry is exercised by tests/device/test_numpy_dlpack.py on the device machine (NumPy 2.5.2)."""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest

from bf16bridge import dtypes
from bf16bridge.adapters import _numpy_registry as registry

# DLPack 1.1's DLDataTypeCode (dlpack.h), written out here independently of dtypes.TABLE
DLPACK_CODES = {"bfloat16": 4, "float8_e3m4": 7, "float8_e4m3": 8, "float8_e4m3b11fnuz": 9,
                "float8_e4m3fn": 10, "float8_e4m3fnuz": 11, "float8_e5m2": 12, "float8_e5m2fnuz": 13,
                "float8_e8m0fnu": 14}


def fake_numpy(pre_registered=(), refuse=()):
    """A numpy whose DLPack takes only its own dtypes and the registered ones."""
    calls = []
    known = {np.dtype(getattr(ml_dtypes, n)) for n in pre_registered}

    def register_dlpack_dtype(key, dt, /):
        if dt.name in refuse:
            raise ValueError(f"DLPack key {key} already maps to another dtype")
        calls.append((key, dt.name))
        known.add(dt)

    def from_dlpack(a):
        if a.dtype.kind in "biufc" and a.dtype.name in dtypes.STANDARD or a.dtype in known:
            return a.copy()
        raise BufferError("DLPack only supports signed/unsigned integers, float and complex dtypes.")

    mod = types.SimpleNamespace(arange=np.arange, uint8=np.uint8, from_dlpack=from_dlpack,
                                dtypes=types.SimpleNamespace(register_dlpack_dtype=register_dlpack_dtype))
    return mod, calls


def held(names):
    return [n for n in names if dtypes.numpy_missing(n) is None]


def test_no_registry_does_nothing():
    mod, calls = fake_numpy()
    del mod.dtypes.register_dlpack_dtype
    r = registry.register(mod)
    assert not r.available and not r.registered and "NumPy >= 2.5" in str(r)
    assert not calls and not r.passes


def test_without_a_registry_what_numpy_passes_is_still_found():
    mod, _ = fake_numpy(pre_registered=["bfloat16"])
    del mod.dtypes.register_dlpack_dtype
    r = registry.register(mod)
    assert not r.available and r.passes == {"bfloat16"}


def test_this_numpy_has_none():
    # NumPy 2.4 here: nothing registered, nothing changed
    assert not hasattr(np.dtypes, "register_dlpack_dtype")
    assert registry.register() == registry.Registration(False)


def test_registers_bf16_and_fp8_with_dlpacks_codes():
    mod, calls = fake_numpy()
    r = registry.register(mod)
    expected = held(DLPACK_CODES)
    assert sorted(calls) == sorted(((DLPACK_CODES[n], 8 * dtypes.numpy_dtype(n).itemsize), n) for n in expected)
    assert set(r.registered) == set(expected) and not r.already
    assert "bfloat16" in r.registered and "registered by bf16bridge" in str(r)


def test_sub_byte_types_are_not_expressible():
    mod, calls = fake_numpy()
    r = registry.register(mod)
    skipped = dict(r.skipped)
    for name in held(["float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"]):
        assert "bits == 8 x itemsize" in skipped[name]
    for name in held(["int4", "uint4", "int2", "uint2"]):
        assert "no code" in skipped[name]
    assert not {n for _, n in calls} & set(skipped)


def test_leaves_what_ml_dtypes_registered():
    mod, calls = fake_numpy(pre_registered=["bfloat16", "float8_e4m3fn"])
    r = registry.register(mod)
    assert set(r.already) == {"bfloat16", "float8_e4m3fn"}
    assert not {n for _, n in calls} & {"bfloat16", "float8_e4m3fn"}


def test_a_refusal_is_recorded_not_raised():
    mod, _ = fake_numpy(refuse=["float8_e5m2"])
    r = registry.register(mod)
    assert "float8_e5m2" not in r.registered
    assert "refused" in dict(r.skipped)["float8_e5m2"]


def test_registered_but_still_failing_is_said():
    mod, _ = fake_numpy()
    mod.dtypes.register_dlpack_dtype = lambda key, dt, /: None  # accepts, changes nothing
    r = registry.register(mod)
    assert not r.registered
    assert "still fails" in dict(r.skipped)["bfloat16"]


@pytest.mark.parametrize("name", sorted(DLPACK_CODES))
def test_table_codes_are_dlpacks(name):
    assert dtypes.row(name).dlpack == (DLPACK_CODES[name], 8 * dtypes.row(name).itemsize, 1)


def test_the_probe_says_what_the_registration_found():
    import bf16bridge as bb
    from bf16bridge.adapters.numpy import REGISTRATION

    caps = bb.probe(refresh=True)
    assert caps.numpy.bf16_dlpack is False  # NumPy 2.4 here
    assert str(REGISTRATION) in caps.numpy.bf16_dlpack_why
