"""The numpy adapter: a big-endian bf16 array keeps its values on every route (its copy swaps the
bytes, never garbles them); its data pointer (numpy_internals) reads no memory by address where id()
is no address (off CPython)."""

import sys

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, FRAMEWORKS, aligned_copy, bf16_ramp, bits, ptr


@pytest.mark.parametrize("dst", FRAMEWORKS)
def test_big_endian_bf16_keeps_its_values(dst, all_bf16):
    native = all_bf16.view(BF16)
    big = native.astype(BF16.newbyteorder(">"))
    assert big.view(np.uint16)[1] != 1  # really stored swapped
    for copy in (None, True):
        y = bb.convert(big, dst, copy=copy)
        np.testing.assert_array_equal(bits(y), all_bf16)


@pytest.mark.parametrize("implementation", ["pypy", "graalpy"])
def test_numpy_pointer_reads_no_memory_off_cpython(monkeypatch, implementation):
    # id(x) is an address only on CPython: elsewhere the pointer comes from __array_interface__
    import types

    from bf16bridge.adapters import numpy_internals as internals

    a = aligned_copy(bf16_ramp(64))[2:]
    monkeypatch.setattr(sys, "implementation", types.SimpleNamespace(name=implementation))
    assert internals.data_offset() is None
    monkeypatch.setattr(internals, "DATA_OFFSET", None)
    monkeypatch.setattr(internals, "read_pointer", None)  # any read of memory by address fails
    assert internals.data_pointer(a) == a.__array_interface__["data"][0] == ptr(a)
