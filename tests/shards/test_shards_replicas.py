"""Replicas in from_shards (bf16bridge.shards' replica checks): the shards given for one global index
must hold the same bits (a NaN's payload and a zero's sign count), across frameworks, strided views,
scalars, padded 4-bit types and torch's packed fp4; the first difference named; replicas over one
buffer not read; compare_replicas checked before any assembly."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError
from bf16bridge.shards import Shard
from conftest import BF16, bits, make
from shards_cases import _one_device_sharding


def _u16(*values, shape=(2, 2)):
    return np.resize(np.array(values, dtype=np.uint16), shape).view(BF16)


def _replicas(first, second, frameworks=("numpy", "numpy")):
    """Two shards of one index (the whole array): on cpu:0 (replica 0) and cpu:1 (replica 1)."""
    index = tuple(slice(0, n) for n in first.shape)
    return [Shard(index, f"cpu:{i}", make(f, a), replica=i) for i, (f, a) in enumerate(zip(frameworks, (first, second)))]


#: (what, the two replicas' bits, their frameworks, where they first differ or None where they
#: agree); bits, not values: a NaN's payload and a zero's sign count, and a NaN agrees with
#: itself. Tensors are made in the test (making a jax one here would start jax in the
#: two-process children, before jax.distributed.initialize)
REPLICAS = [
    ("the same bits", (_u16(1, 2, 3, 4), _u16(1, 2, 3, 4)), ("numpy", "numpy"), None),
    ("the same NaN payload", (_u16(0x7FC1, 0, 0xFFC0, 7), _u16(0x7FC1, 0, 0xFFC0, 7)), ("numpy", "numpy"), None),
    ("torch and numpy, the same bits", (_u16(5, 6, 7, 8), _u16(5, 6, 7, 8)), ("torch", "numpy"), None),
    ("jax and torch, the same bits", (_u16(5, 6, 7, 8), _u16(5, 6, 7, 8)), ("jax", "torch"), None),
    ("empty", (_u16(shape=(2, 0)), _u16(shape=(2, 0))), ("numpy", "torch"), None),
    ("one element", (_u16(1, 2, 3, 4), _u16(1, 2, 3, 5)), ("numpy", "numpy"), (1, 1)),
    ("a NaN payload", (_u16(0, 0x7FC0, 0, 0), _u16(0, 0x7FC1, 0, 0)), ("numpy", "numpy"), (0, 1)),
    ("a zero's sign", (_u16(0, 0, 0x8000, 0), _u16(0, 0, 0, 0)), ("numpy", "numpy"), (1, 0)),
    ("torch and numpy", (_u16(1, 2, 3, 4), _u16(1, 9, 3, 4)), ("torch", "numpy"), (0, 1)),
    ("jax and torch", (_u16(1, 2, 3, 4), _u16(9, 2, 3, 4)), ("jax", "torch"), (0, 0)),
]


@pytest.mark.parametrize("what,values,frameworks,differ", [pytest.param(*c, marks=pytest.mark.frameworks(*c[2]))
                                                         for c in REPLICAS], ids=[c[0] for c in REPLICAS])
def test_from_shards_compares_replicas_bit_for_bit(what, values, frameworks, differ):
    """Two tensors given for one global index must hold the same bits: before the check,
    from_shards built an array whose replicas disagreed (each device took its own shard)."""
    shards = _replicas(*values, frameworks)
    sharding = _one_device_sharding()
    if differ is None:
        y = bb.from_shards(shards, "jax", sharding=sharding)
        assert bits(y).tolist() == bits(shards[0].tensor).tolist()
        return
    index = _show_index(shards[0].index)
    with pytest.raises(InvalidArgumentError) as got:
        bb.from_shards(shards, "jax", sharding=sharding)
    message = str(got.value)
    assert f"the replicas of shard {index} disagree: cpu:1 (replica 1) differs first at element {differ}" in message
    assert "against cpu:0 (replica 0)" in message and "compare_replicas=False" in message
    # the opt-out builds it as given (cpu:0's shard on cpu:0): what compare_replicas=False says it skips
    y = bb.from_shards(shards, "jax", sharding=sharding, compare_replicas=False)
    assert bits(y).tolist() == bits(shards[0].tensor).tolist()


def _show_index(index):
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"


@pytest.mark.frameworks("torch")
def test_replicas_of_a_strided_view_and_a_scalar_are_compared():
    import torch

    whole = torch.arange(12, dtype=torch.int16).view(torch.bfloat16).reshape(3, 4)
    col = whole[:, 1:3]  # not contiguous: compared where it lies, not by its raw buffer
    same = Shard((slice(0, 3), slice(0, 2)), "cpu:1", np.ascontiguousarray(bb.convert(col, "numpy")), replica=1)
    ok = [Shard((slice(0, 3), slice(0, 2)), "cpu:0", col), same]
    assert bits(bb.from_shards(ok, "jax", sharding=_one_device_sharding())).tolist() == bits(col).tolist()
    other = np.ascontiguousarray(bb.convert(col, "numpy"))
    other.view(np.uint16)[2, 1] ^= 1
    bad = [ok[0], Shard(same.index, "cpu:1", other, replica=1)]
    with pytest.raises(InvalidArgumentError, match=r"cpu:1 \(replica 1\) differs first at element \(2, 1\)"):
        bb.from_shards(bad, "jax", sharding=_one_device_sharding())
    scalars = [Shard((), f"cpu:{i}", np.array(v, np.uint16).view(BF16), replica=i) for i, v in enumerate((1, 2))]
    with pytest.raises(InvalidArgumentError, match=r"the replicas of shard \[\] disagree: .* at element \(\)"):
        bb.from_shards(scalars, "jax", sharding=_one_device_sharding())


@pytest.mark.parametrize("dtype", ["float4_e2m1fn", "int4"])
def test_replicas_of_padded_types_compare_their_value_bits(dtype):
    """A one-a-byte 4-bit type's replicas are compared in the values ml_dtypes reads (jax clears the
    high bits, numpy need not): int4's high bits hold no value, so replicas that differ only there
    agree; fp4's are read as the sign (0xF0 is -0.0), so there they differ where the values do;
    a value bit that differs is said."""
    import ml_dtypes

    from bf16bridge.core import dtypes

    if dtypes.numpy_missing(dtype) is not None:  # (ml_dtypes 0.3.1 has no fp4) no such array, nor replica
        assert "upgrade ml_dtypes" in registry.get("jax").cannot_hold(dtype)
        return
    low = np.arange(16, dtype=np.uint8).reshape(4, 4)
    index = (slice(0, 4), slice(0, 4))
    t = getattr(ml_dtypes, dtype)
    a = low.view(t)
    padded = (low | 0xF0).view(t)
    ok = [Shard(index, "cpu:0", make("jax", a)), Shard(index, "cpu:1", padded, replica=1)]
    values = [x.astype(np.float32).view(np.uint32) for x in (a, padded)]
    if np.array_equal(*values):  # int4
        bb.from_shards(ok, "jax", sharding=_one_device_sharding())
    else:  # fp4: 0x00 and 0xF0 are +0.0 and -0.0
        first = tuple(int(i) for i in np.argwhere(values[0] != values[1])[0])
        assert first == (0, 0)
        with pytest.raises(InvalidArgumentError, match=r"differs first at element \(0, 0\)"):
            bb.from_shards(ok, "jax", sharding=_one_device_sharding())
        ok = [ok[0], Shard(index, "cpu:1", (low | np.where(low >= 8, 0xF0, 0)).astype(np.uint8).view(t), replica=1)]
        bb.from_shards(ok, "jax", sharding=_one_device_sharding())  # high bits that keep the values agree
    flipped = low.copy()
    flipped[3, 2] ^= 1
    bad = [ok[0], Shard(index, "cpu:1", flipped.view(t), replica=1)]
    with pytest.raises(InvalidArgumentError, match=r"differs first at element \(3, 2\)"):
        bb.from_shards(bad, "jax", sharding=_one_device_sharding())


@pytest.mark.frameworks("torch")
def test_replicas_packed_by_torch_compare_with_unpacked_ones():
    """torch holds fp4 two values a byte (float4_e2m1fn_x2, half the columns); a jax replica of
    the same index holds one a byte: compared value for value, and a difference is named by its
    place in the unpacked array."""
    import ml_dtypes

    from bf16bridge.core import dtypes

    u8 = np.resize(dtypes.all_patterns("float4_e2m1fn").view(np.uint8), (2, 8))
    index = (slice(0, 2), slice(0, 8))
    if dtypes.numpy_missing("float4_e2m1fn") is not None:  # (not in ml_dtypes 0.3.1) torch's replica cannot cross
        import torch

        packed = torch.from_numpy(u8[:, 0::2] | (u8[:, 1::2] << 4)).view(torch.float4_e2m1fn_x2)
        with pytest.raises(bb.UnsupportedDtypeError, match="upgrade ml_dtypes"):
            bb.from_shards([Shard(index, "cpu:0", packed)], "jax", sharding=_one_device_sharding())
        return
    fp4 = ml_dtypes.float4_e2m1fn
    packed = bb.convert(u8.view(fp4), "torch")
    assert tuple(packed.shape) == (2, 4)
    ok = [Shard(index, "cpu:0", make("jax", u8.view(fp4))), Shard(index, "cpu:1", packed, replica=1)]
    bb.from_shards(ok, "jax", sharding=_one_device_sharding())
    flipped = u8.copy()
    flipped[1, 5] ^= 1
    bad = [ok[0], Shard(index, "cpu:1", bb.convert(flipped.view(fp4), "torch"), replica=1)]
    with pytest.raises(InvalidArgumentError, match=r"cpu:1 \(replica 1\) differs first at element \(1, 5\)"):
        bb.from_shards(bad, "jax", sharding=_one_device_sharding())


@pytest.mark.parametrize("dtype,unsigned", [(np.complex128, np.uint64), (np.float32, np.uint32), (np.int8, np.uint8)])
def test_replicas_name_the_element_whatever_its_width(dtype, unsigned):
    """complex128 (16 bytes, wider than any unsigned integer) is compared by its bytes: the
    element named is still an element, not a byte."""
    a = np.zeros((2, 3), dtype)
    b = a.copy()
    # the last element's last word: the imaginary part of a complex (numpy 1.x refuses uint64 ^ a Python int)
    b.view(unsigned)[1, -1] ^= unsigned(1)
    index = (slice(0, 2), slice(0, 3))
    pieces = [Shard(index, "cpu:0", a), Shard(index, "cpu:1", b, replica=1)]
    with pytest.raises(InvalidArgumentError, match=r"differs first at element \(1, 2\), against cpu:0"):
        bb.from_shards(pieces, "jax", sharding=_one_device_sharding())


@pytest.mark.frameworks("torch")
def test_replicas_over_the_same_memory_are_not_read(monkeypatch):
    """Replicas that alias one buffer (one array given for each device; jax replicas put from one
    aligned host buffer) hold the same bits by construction: the comparison does not read them."""
    import torch

    def read(*args):
        raise AssertionError("replicas over one buffer were read")

    monkeypatch.setattr(bb.shards, "_first_difference", read)
    a = make("numpy", _u16(1, 2, 3, 4))
    t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    index = (slice(0, 2), slice(0, 2))
    for pair in [(a, a), (a, a.view(BF16)), (t, t.view(torch.bfloat16)), (t, a)]:
        bb.from_shards([Shard(index, f"cpu:{i}", x, replica=i) for i, x in enumerate(pair)], "jax",
                       sharding=_one_device_sharding())
    with pytest.raises(AssertionError, match="were read"):  # and where they do not alias, they are read
        bb.from_shards([Shard(index, "cpu:0", a), Shard(index, "cpu:1", a.copy(), replica=1)], "jax",
                       sharding=_one_device_sharding())


@pytest.mark.frameworks("torch")
def test_a_replica_that_cannot_be_read_is_named():
    import torch

    index = (slice(0, 2), slice(0, 2))
    meta = torch.empty(2, 2, dtype=torch.bfloat16, device="meta")  # no data: convert refuses it
    pieces = [Shard(index, "cpu:0", np.zeros((2, 2), BF16)), Shard(index, "meta", meta, replica=1)]
    with pytest.raises(UnsupportedTypeError, match=r"the shard \[0:2, 0:2\] on meta, read to compare it with its "
                                                   r"replicas \(compare_replicas=False skips that\): .*meta device"):
        bb.from_shards(pieces, "jax", sharding=_one_device_sharding())


@pytest.mark.frameworks("torch")
def test_compare_replicas_is_checked_before_any_assembly():
    # the comparison runs in shards.py for every target: torch's DTensor assembly takes one
    # tensor of the index and would drop the other without a word
    shards = _replicas(_u16(1, 2, 3, 4), _u16(1, 2, 3, 5), ("torch", "torch"))
    with pytest.raises(InvalidArgumentError, match=r"the replicas of shard \[0:2, 0:2\] disagree"):
        bb.from_shards(shards, "torch", sharding="not a mesh")
