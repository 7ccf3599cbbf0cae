"""Sharded tensors, shard by shard (bf16bridge.shards).

Three kinds of test, in three kinds of process:
- here, in the test process (one jax device, no torch.distributed): the layout as data, the
  refusals, the keywords;
- a pytest child with eight jax host devices (``XLA_FLAGS`` must be set before jax is imported,
  so it cannot be this process), which runs the ``TestEightDevices`` tests of this file: every
  shard zero-copy (pointers) and bit-exact, indices, replicas, back with ``from_shards``, over a
  table and over hypothesis-drawn meshes, specs and shapes; and, over torch's single-process
  "fake" process group, DTensor's cut of uneven shapes against torch's own;
- two processes with torch.distributed (gloo) and jax.distributed (this file run as a script):
  DTensor <-> jax across processes, each converting only what it holds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from bf16bridge.errors import CopyRequiredError, DeviceError, InvalidArgumentError, UnsupportedTypeError
from bf16bridge.shards import Layout, Shard, Shards, bounds
from conftest import BF16, bits, make, ptr

#: set in the children this file starts: which part of it they run
CHILD = os.environ.get("BF16BRIDGE_SHARDS_CHILD")
HERE = os.path.abspath(__file__)


# -- the layout as data ------------------------------------------------------------------------

LAYOUTS = [
    # mesh axes, mesh shape, spec (per tensor dim), placements (per mesh axis)
    (("x",), (8,), (("x",), ()), (("shard", 0), ("replicate", None))[:1]),
    (("x", "y"), (4, 2), (("x",), ()), (("shard", 0), ("replicate", None))),
    (("x", "y"), (4, 2), ((), ("x",)), (("shard", 1), ("replicate", None))),
    (("x", "y"), (4, 2), (("y",), ("x",)), (("shard", 1), ("shard", 0))),
    (("x", "y"), (4, 2), (("x", "y"), ()), (("shard", 0), ("shard", 0))),
    (("x", "y"), (4, 2), ((), ()), (("replicate", None), ("replicate", None))),
    (("a", "b", "c"), (2, 2, 2), (("a", "c"), ("b",), ()), (("shard", 0), ("shard", 1), ("shard", 0))),
]


@pytest.mark.parametrize("axes,mesh,spec,placements", LAYOUTS)
def test_layout_placements_both_ways(axes, mesh, spec, placements):
    layout = Layout(axes, mesh, spec)
    assert layout.placements() == placements
    assert Layout.from_placements(axes, mesh, placements, len(spec)) == layout


def test_partial_placements_are_kept_as_data():
    layout = Layout.from_placements(("x", "y"), (4, 2), (("shard", 0), ("partial", None)), 2)
    assert layout.partial == ("y",)
    assert layout.placements() == (("shard", 0), ("partial", None))


@pytest.mark.parametrize("make_layout,error,words", [
    # a DTensor splits a dimension over several mesh axes in mesh order only
    (lambda: Layout(("x", "y"), (4, 2), (("y", "x"),)).placements(), UnsupportedTypeError, "mesh order"),
    (lambda: Layout(("x",), (8,), (("z",),)), InvalidArgumentError, "does not have"),
    (lambda: Layout(("x",), (8,), (("x",), ("x",))), InvalidArgumentError, "used twice"),
    (lambda: Layout(("x", "y"), (8,), ()), InvalidArgumentError, "sizes"),
    (lambda: Layout.from_placements(("x",), (2,), (("shard", 2),), 2), InvalidArgumentError, "Shard(2)"),
    (lambda: Layout.from_placements(("x",), (2,), (("stripe", 0),), 2), InvalidArgumentError, "'stripe'"),
])
def test_layout_refusals(make_layout, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        make_layout()


@pytest.mark.parametrize("index,shape,expected", [
    ((slice(None), slice(0, 4)), (8, 4), ((0, 8), (0, 4))),
    ((slice(2, None), slice(None, 3)), (8, 4), ((2, 8), (0, 3))),
    ((slice(6, 20),), (8,), ((6, 8),)),
    ((slice(0, 0),), (0,), ((0, 0),)),
])
def test_bounds_are_explicit(index, shape, expected):
    assert tuple((s.start, s.stop, s.step) for s in bounds(index, shape)) == tuple((a, b, None) for a, b in expected)


def test_bounds_refuse_steps():
    with pytest.raises(InvalidArgumentError, match="step 2"):
        bounds((slice(0, 8, 2),), (8,))


# -- refusals in a single-device process -----------------------------------------------------------

@pytest.mark.parametrize("framework", ["numpy", "torch", "jax", "tensorflow"])
def test_a_tensor_that_is_not_sharded_is_refused(framework):
    x = make(framework, np.zeros((4, 2), BF16))
    with pytest.raises(UnsupportedTypeError, match=r"is not sharded .* bb\.convert\(x, to='torch'\)"):
        bb.convert_shards(x, "torch")
    with pytest.raises(UnsupportedTypeError, match="is not sharded"):
        bb.shards.layout_of(x)


def test_not_a_tensor_is_refused():
    with pytest.raises(UnsupportedTypeError, match="not a tensor of any registered framework"):
        bb.convert_shards([1, 2], "jax")


def _one_shard(framework):
    return Shard((slice(0, 4), slice(0, 2)), "cpu", make(framework, np.zeros((4, 2), BF16)))


@pytest.mark.parametrize("target", ["numpy", "tensorflow"])
def test_from_shards_refuses_a_target_without_sharded_tensors(target):
    with pytest.raises(UnsupportedTypeError, match=f"{target} has no sharded tensor type.*gather"):
        bb.from_shards([_one_shard("numpy")], target)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("target,sharding,words", [
    ("jax", None, "no mesh layout: pass sharding="),
    ("jax", "P('x')", "a jax.sharding.Sharding"),
    ("torch", None, "needs a torch DeviceMesh"),
])
def test_from_shards_asks_for_what_it_lacks(target, sharding, words):
    with pytest.raises(InvalidArgumentError, match=words.replace("(", r"\(").replace(")", r"\)")):
        bb.from_shards([_one_shard("torch")], target, sharding=sharding)


def _piece(shape=(4, 2), dtype=BF16, index=(slice(0, 4), slice(0, 2))):
    return Shard(index, "cpu:0", make("numpy", np.zeros(shape, dtype)))


#: shards that do not make the array they claim, and what from_shards says (before the check,
#: jax raised its own ValueError and torch built a DTensor whose local tensor was not its part)
BAD_SHARDS = [
    ("a tensor smaller than its index", [_piece((3, 2))], None, "of shape (3, 2); its index spans (4, 2)"),
    ("a tensor of another rank", [_piece((8,))], None, "of shape (8,); its index spans (4, 2)"),
    ("two dtypes", [_piece(), _piece(dtype=np.float16)], None, "holds float16, and the other shards bfloat16"),
    ("bf16 and float32", [_piece(), _piece(dtype=np.float32)], None, "holds float32, and the other shards bfloat16"),
    ("a negative shape", [_piece()], (-4, 2), "whole numbers >= 0; got (-4, 2)"),
    ("a shape of another rank", [_piece()], (4, 2, 1), "does not lie in the global shape (4, 2, 1)"),
    ("an index past the shape", [_piece((8, 2), index=(slice(0, 8), slice(0, 2)))], (4, 2),
     "does not lie in the global shape (4, 2)"),
    ("an index without bounds", [_piece(index=(slice(None), slice(0, 2)))], None, "explicit bounds"),
    ("an index with a step", [_piece((2, 2), index=(slice(0, 4, 2), slice(0, 2)))], None, "no step"),
]


@pytest.mark.parametrize("target", ["jax", "torch"])
@pytest.mark.parametrize("what,pieces,shape,words", BAD_SHARDS, ids=[c[0] for c in BAD_SHARDS])
def test_from_shards_checks_each_shard_against_its_index(target, what, pieces, shape, words):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), PartitionSpec()) if target == "jax" else None
    with pytest.raises(InvalidArgumentError) as got:
        bb.from_shards(pieces, target, sharding=sharding, shape=shape)
    assert words in str(got.value)


# -- replicas: the shards given for one global index must hold the same bits -------------------------

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


def _one_device_sharding():
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), PartitionSpec())


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


@pytest.mark.parametrize("call,words", [
    (lambda x: bb.convert_shards(x, "torch", replicas="two"), "replicas must be one of"),
    (lambda x: bb.convert_shards(x, "torch", copy="yes"), "copy"),
    (lambda x: bb.from_shards([], "jax"), "no shards, and no shape="),
    (lambda x: bb.from_shards(["not a shard"], "jax"), "Shards or Shard objects"),
    # None or 0 skipped the comparison without a word (review)
    (lambda x: bb.from_shards([], "jax", compare_replicas=None), "compare_replicas must be True or False"),
    (lambda x: bb.from_shards([], "jax", compare_replicas=0), "compare_replicas must be True or False"),
    (lambda x: bb.convert_shards(x, "torch", compare_replicas="no"), "compare_replicas must be True or False"),
])
def test_keywords_are_checked(call, words):
    x = make("numpy", np.zeros(2, BF16))
    with pytest.raises((InvalidArgumentError, UnsupportedTypeError), match=words):
        call(x)


@pytest.mark.frameworks("torch")
def test_shard_is_frozen_and_compares_by_identity():
    s = _one_shard("torch")
    with pytest.raises(AttributeError):
        s.device = "cuda:0"  # type: ignore[misc]
    assert s == s and s != _one_shard("torch")  # never compares tensors elementwise


def test_a_mesh_of_one_device_is_a_sharding():
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    u16 = np.arange(32, dtype=np.uint16).reshape(4, 8)
    x = jax.device_put(u16.view(BF16), NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), PartitionSpec("x")))
    (s,) = bb.convert_shards(x, "numpy")
    assert s.index == (slice(0, 4), slice(0, 8)) and s.device == "cpu:0" and s.replica == 0
    assert ptr(s.tensor) == ptr(x) and bits(s.tensor).tolist() == u16.tolist()
    y = bb.from_shards([s], "jax", sharding=x.sharding, copy=False)
    assert ptr(y.addressable_shards[0].data) == ptr(x)


@pytest.mark.parametrize("dtype,value", [(np.int64, 2**40 + 1), (np.uint64, 2**63), (np.float64, 1 + 2**-40),
                                         (np.complex128, 1 + 2**-40 * 1j)])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_from_shards_into_jax_refuses_64_bit_shards_without_x64(dtype, value, framework):
    # jax.device_put of an int64 shard without x64 made an int32 array (2**40 + 1 became 1) without a word
    import jax

    shard = Shard((slice(0, 2),), "cpu:0", make(framework, np.full(2, value, dtype)))
    before = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", False)
        with pytest.raises(bb.UnsupportedDtypeError, match=rf"jax cannot hold these {np.dtype(dtype).name} shards"
                                                           r".*jax_enable_x64"):
            bb.from_shards([shard], "jax", sharding=_one_device_sharding())
        jax.config.update("jax_enable_x64", True)  # the flag is read at each call
        y = bb.from_shards([shard], "jax", sharding=_one_device_sharding())
        assert y.dtype == dtype and np.asarray(y).tobytes() == np.full(2, value, dtype).tobytes()
    finally:
        jax.config.update("jax_enable_x64", before)


def test_import_loads_no_framework():
    code = """
        import sys
        import bf16bridge as bb
        bb.shards, bb.convert_shards, bb.from_shards, bb.Shard
        print(sorted(m for m in ("torch", "jax", "jaxlib", "tensorflow") if m in sys.modules))
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the children --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(HERE)),
                                                         os.environ.get("PYTHONPATH", "")]), **extra)
    env.pop("PYTEST_ADDOPTS", None)
    return env


#: the TestEightDevices tests the child must pass (it fails here when fewer ran)
EIGHT_DEVICE_TESTS = 83


@pytest.mark.frameworks("torch")
def test_eight_jax_devices_in_a_child():
    env = _env(BF16BRIDGE_SHARDS_CHILD="jax8", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                          "-k", "TestEightDevices", HERE], capture_output=True, text=True, timeout=600, env=env,
                         cwd=os.path.dirname(HERE))
    tail = (out.stdout + out.stderr)[-6000:]
    assert out.returncode == 0, tail
    assert f"{EIGHT_DEVICE_TESTS} passed" in out.stdout and "skipped" not in out.stdout, tail


@pytest.mark.frameworks("torch")
def test_dtensor_and_jax_across_two_processes():
    jax_port, torch_port = _free_port(), _free_port()
    env = _env(BF16BRIDGE_SHARDS_CHILD="dtensor")
    procs = [subprocess.Popen([sys.executable, HERE, str(rank), str(jax_port), str(torch_port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"rank {rank}: all checks passed" in out, f"rank {rank}:\n{out[-6000:]}"


# -- eight jax host devices (run in the child) ------------------------------------------------------

def _unreduced(mesh, sharded: str, unreduced: str):
    """A NamedSharding over ``sharded`` with ``unreduced`` axes, or None where this jax's PartitionSpec
    has none (jax 0.4.30: an array of partial sums cannot be made there)."""
    from jax.sharding import NamedSharding, PartitionSpec

    try:
        return NamedSharding(mesh, PartitionSpec(sharded, unreduced={unreduced}))
    except TypeError:
        return None


def _make_mesh(shape, axes, devices=None):
    """jax.make_mesh where this jax has it; jax 0.4.30 has not: a Mesh over the first devices."""
    import jax

    make = getattr(jax, "make_mesh", None)
    if make is not None:
        return make(tuple(shape), tuple(axes), **({} if devices is None else {"devices": devices}))
    devs = (jax.devices() if devices is None else devices)[:int(np.prod(shape))]
    return jax.sharding.Mesh(np.array(devs, dtype=object).reshape(tuple(shape)), tuple(axes))


def _sharded(u16: np.ndarray, mesh_shape, axes, spec):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = _make_mesh(mesh_shape, axes, devices=jax.devices()[:int(np.prod(mesh_shape))])
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in spec]
    return jax.device_put(u16.view(BF16), NamedSharding(mesh, PartitionSpec(*entries)))


def _disagreeing(mesh_shape, axes, spec, *, device, at):
    """A (64, 6) bf16 jax array laid out as ``spec`` whose shard on cpu:``device`` has one bit of
    element ``at`` flipped against the other replicas of its index; and that shard's bits."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    u16 = np.arange(64 * 6, dtype=np.uint16).reshape(64, 6)
    sharding = NamedSharding(_make_mesh(mesh_shape, axes), PartitionSpec(*spec))
    buffers = []
    for dev, idx in sharding.addressable_devices_indices_map(u16.shape).items():
        part = u16[idx].copy()
        if dev.id == device:
            part[at] ^= 1
            flipped = part.copy()
        buffers.append(jax.device_put(part.view(BF16), dev))
    return jax.make_array_from_single_device_arrays(u16.shape, sharding, buffers), flipped


def _check_shards(x, got, target, *, zero_copy=True, replicas="all"):
    """Every shard of ``got`` (convert_shards(x, target)) against x's own addressable shards."""
    expected = [s for s in x.addressable_shards if replicas == "all" or s.replica_id == 0]
    every_zero_copy = True  # what it returns: whether every shard crossed without a copy
    assert isinstance(got, Shards) and len(got) == len(expected)
    assert got.shape == x.shape and got.dtype == "bfloat16" and (got.source, got.framework) == ("jax", target)
    whole = bits(x)
    for s, e in zip(got, expected):
        assert s.index == bounds(e.index, x.shape)
        assert s.device == f"cpu:{e.device.id}" and s.replica == e.replica_id
        assert type(s.tensor).__module__.split(".")[0] == {"jax": "jaxlib"}.get(target, target)
        np.testing.assert_array_equal(bits(s.tensor), whole[s.index])
        # tensorflow takes only a 64-byte aligned buffer (jax 0.4.30 allocates shards 16-byte aligned)
        copied = not zero_copy or (target == "tensorflow" and ptr(e.data) % 64 != 0)
        assert (ptr(s.tensor) != ptr(e.data)) if copied else (ptr(s.tensor) == ptr(e.data))
        every_zero_copy = every_zero_copy and not copied
    return every_zero_copy


def _check_back(x, y, *, same_buffers=True):
    """``y`` (from_shards) against ``x``: its sharding, bits, and, where asked, the same buffers."""
    assert y.shape == x.shape and y.dtype == x.dtype
    assert y.sharding.is_equivalent_to(x.sharding, x.ndim)
    np.testing.assert_array_equal(bits(y), bits(x))
    for a, b in zip(y.addressable_shards, x.addressable_shards):
        assert a.device == b.device and a.index == b.index
        if same_buffers:
            assert ptr(a.data) == ptr(b.data)


CASES = [
    # mesh shape, axes, spec per dim, global shape
    ((8,), ("x",), (("x",), ()), (64, 6)),
    ((4, 2), ("x", "y"), (("x",), ()), (64, 6)),           # replicated over y
    ((4, 2), ("x", "y"), (("x",), ("y",)), (32, 6)),
    ((4, 2), ("x", "y"), ((), ("x", "y")), (3, 16)),       # one dim over both axes
    ((2, 2, 2), ("a", "b", "c"), (("c",), ("a",), ()), (4, 4, 5)),
    ((8,), ("x",), ((), ()), (5, 3)),                     # every device holds all of it
]
TARGETS = ["torch", "numpy", "tensorflow"]
#: narrow dtypes jax holds (fp8 rows, fp4 one a byte, a sub-byte int), sharded
NARROW_SHARDED = ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn", "int4"]

if CHILD == "jax8":
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import strategies  # noqa: F401  (the derandomized, bounded "ci" profile)

    @st.composite
    def _layouts(draw):
        """A mesh of 1 to 3 axes over 1 to 8 devices, a spec putting each axis on at most one
        dimension (in any order within it), a shape each dimension of which the spec divides."""
        mesh = draw(st.sampled_from([(8,), (4,), (2,), (1,), (4, 2), (2, 4), (2, 2), (8, 1), (2, 2, 2), (1, 2, 4)]))
        axes = tuple("abc"[: len(mesh)])
        ndim = draw(st.integers(1, 3))
        spec: list[list[str]] = [[] for _ in range(ndim)]
        for a in draw(st.permutations(axes)):
            dim = draw(st.integers(-1, ndim - 1))
            if dim >= 0:
                spec[dim].append(a)
        size = dict(zip(axes, mesh))
        shape = tuple(int(np.prod([size[a] for a in s])) * draw(st.integers(1, 3)) for s in spec)
        return mesh, axes, tuple(tuple(s) for s in spec), shape

    @pytest.fixture(scope="module")
    def fake_rank():
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=8)
        yield 5
        dist.destroy_process_group()

    class TestEightDevices:
        def test_eight_devices_here(self):
            import jax

            assert len(jax.devices()) == 8

        @pytest.mark.parametrize("target", TARGETS)
        @pytest.mark.parametrize("mesh,axes,spec,shape", CASES)
        def test_each_shard_zero_copy_and_bit_exact(self, mesh, axes, spec, shape, target):
            u16 = np.random.default_rng(len(shape)).integers(0, 1 << 16, size=shape, dtype=np.uint16)
            x = _sharded(u16, mesh, axes, spec)
            got = bb.convert_shards(x, target, on_alias="allow")
            zero_copy = _check_shards(x, got, target)
            assert got.layout == Layout(axes, mesh, spec, (), tuple(f"cpu:{i}" for i in range(int(np.prod(mesh)))))
            y = bb.from_shards(got, "jax", sharding=x.sharding, copy=False)
            _check_back(x, y, same_buffers=zero_copy)

        def test_replicas_one_per_index_and_back(self):
            x = _sharded(np.arange(64 * 6, dtype=np.uint16).reshape(64, 6), (4, 2), ("x", "y"), (("x",), ()))
            got = bb.convert_shards(x, "torch", replicas="one", on_alias="allow")
            _check_shards(x, got, "torch", replicas="one")
            assert len(got) == 4 and {s.replica for s in got} == {0}
            # the dropped replicas come back from the kept ones (host memory: no copy on cpu devices)
            _check_back(x, bb.from_shards(got, "jax"), same_buffers=False)

        def test_copy_true_copies_every_shard(self):
            x = _sharded(np.arange(64, dtype=np.uint16), (8,), ("x",), (("x",),))
            _check_shards(x, bb.convert_shards(x, "torch", copy=True), "torch", zero_copy=False)

        @pytest.mark.parametrize("via", ["jax", "torch"])
        def test_from_shards_copy_true_copies_every_shard(self, via):
            x = _sharded(np.arange(64, dtype=np.uint16), (4, 2), ("x", "y"), (("x",),))
            y = bb.from_shards(bb.convert_shards(x, via, on_alias="allow"), "jax", sharding=x.sharding, copy=True)
            _check_back(x, y, same_buffers=False)
            assert not {ptr(a.data) for a in y.addressable_shards} & {ptr(a.data) for a in x.addressable_shards}

        def test_copy_false_refuses_a_shard_that_must_copy(self):
            import torch

            x = _sharded(np.arange(64, dtype=np.uint16), (8,), ("x",), (("x",),))
            got = bb.convert_shards(x, "torch", on_alias="allow")
            # a shard one element past an aligned boundary: jax takes it only by copying
            raw = torch.empty(16, dtype=torch.bfloat16)
            odd = raw[1:9]
            shards = [Shard(s.index, s.device, odd if i == 3 else s.tensor) for i, s in enumerate(got)]
            with pytest.raises(CopyRequiredError, match=r"the shard \[24:32\] must be copied onto cpu:3"):
                bb.from_shards(shards, "jax", sharding=x.sharding, copy=False)
            y = bb.from_shards(shards, "jax", sharding=x.sharding)  # allowed: copied
            assert bits(y.addressable_shards[3].data).tolist() == bits(odd).tolist()

        def test_layout_rebuilds_the_sharding(self):
            x = _sharded(np.arange(32 * 6, dtype=np.uint16).reshape(32, 6), (4, 2), ("x", "y"), (("x",), ("y",)))
            y = bb.from_shards(bb.convert_shards(x, "numpy"), "jax", copy=False)
            _check_back(x, y)

        def test_plain_shard_lists_take_the_shape_from_the_indices(self):
            x = _sharded(np.arange(64, dtype=np.uint16).reshape(8, 8), (8,), ("x",), ((), ("x",)))
            plain = list(bb.convert_shards(x, "torch", on_alias="allow"))
            _check_back(x, bb.from_shards(plain, "jax", sharding=x.sharding, copy=False))

        def test_one_alias_warning_for_all_shards(self):
            x = _sharded(np.arange(64, dtype=np.uint16), (8,), ("x",), (("x",),))
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                bb.convert_shards(x, "torch")
            assert [str(w.message).split(":")[0] for w in seen] == ["8 shards"]

        def test_missing_and_foreign_devices_are_named(self):
            import jax
            from jax.sharding import NamedSharding, PartitionSpec

            x = _sharded(np.arange(64, dtype=np.uint16), (8,), ("x",), (("x",),))
            got = bb.convert_shards(x, "numpy")
            with pytest.raises(InvalidArgumentError, match=r"puts \[56:64\] on cpu:7, but no shard given holds it"):
                bb.from_shards(list(got)[:7], "jax", sharding=x.sharding, shape=(64,))
            foreign = Shards(got.shards, got.shape, got.dtype,
                             Layout(("x",), (8,), (("x",),), (), tuple(f"gpu:{i}" for i in range(8))), "jax", "numpy")
            with pytest.raises(DeviceError, match="holds device 'gpu:0', which jax does not have here"):
                bb.from_shards(foreign, "jax")
            uneven = NamedSharding(_make_mesh((8,), ("x",)), PartitionSpec("x"))
            with pytest.raises(InvalidArgumentError, match=r"\[56:64\] on cpu:7 does not lie in the global shape \(60,\)"):
                bb.from_shards(got, "jax", sharding=uneven, shape=(60,))
            cut = [Shard((slice(i * 8, min(60, i * 8 + 8)),), f"cpu:{i}", np.zeros(min(60, i * 8 + 8) - i * 8, BF16))
                   for i in range(8)]  # as torch.chunk cuts 60 over 8: jax splits evenly only
            with pytest.raises(InvalidArgumentError, match="cannot lay out"):
                bb.from_shards(cut, "jax", sharding=uneven, shape=(60,))

        def test_unreduced_values_are_refused(self):
            import jax
            from jax.sharding import NamedSharding, PartitionSpec

            mesh = _make_mesh((4, 2), ("x", "y"))
            unreduced = _unreduced(mesh, "x", "y")
            if unreduced is None:  # no partial sums in this jax: its layouts say none (no unreduced attribute read)
                assert bb.shards.layout_of(jax.device_put(np.ones((8, 4), BF16),
                                                          NamedSharding(mesh, PartitionSpec("x")))).partial == ()
                return
            x = jax.device_put(np.ones((8, 4), BF16), unreduced)
            assert bb.shards.layout_of(x).partial == ("y",)
            with pytest.raises(UnsupportedTypeError, match=r"partial sums over mesh axes \('y',\)"):
                bb.convert_shards(x, "torch")

        def test_replicas_that_disagree_are_said_both_ways(self):
            """A jax array whose replicas disagree (jax's make_array_from_single_device_arrays does
            not compare them): replicas="one" kept replica 0 without a word, and from_shards built
            the disagreement again; both now name the index and the devices."""
            x, flipped = _disagreeing((4, 2), ("x", "y"), ("x",), device=3, at=(5, 2))
            words = (r"the replicas of shard \[16:32, 0:6\] disagree: cpu:3 \(replica 1\) differs first at element "
                     r"\(5, 2\), against cpu:2 \(replica 0\)")
            with pytest.raises(InvalidArgumentError, match=words + r".*replicas='all' returns each.*"
                               r"compare_replicas=False keeps replica 0 without comparing"):
                bb.convert_shards(x, "numpy", replicas="one")
            kept = bb.convert_shards(x, "numpy", replicas="one", compare_replicas=False)
            assert [s.device for s in kept] == ["cpu:0", "cpu:2", "cpu:4", "cpu:6"]
            assert bits(kept[1].tensor).tolist() == bits(x.addressable_shards[2].data).tolist()
            every = bb.convert_shards(x, "numpy")  # "all" hands each replica over as it is, numbered
            assert [bits(s.tensor).tolist() for s in every] == [bits(a.data).tolist() for a in x.addressable_shards]
            assert every[3].replica == 1 and bits(every[3].tensor).tolist() == flipped.tolist()
            with pytest.raises(InvalidArgumentError, match=words + ".*compare_replicas=False builds it as given"):
                bb.from_shards(every, "jax", sharding=x.sharding)
            y = bb.from_shards(every, "jax", sharding=x.sharding, compare_replicas=False)  # as given
            assert [bits(a.data).tolist() for a in y.addressable_shards] == [bits(s.tensor).tolist() for s in every]

        def test_from_shards_refuses_partial_sums(self):
            """Shards whose layout says partial sums, or a jax sharding with unreduced axes: before,
            the first became an array replicated over the partial axis (sums taken for copies), the
            second raised jax's NotImplementedError."""
            import jax
            from jax.sharding import NamedSharding, PartitionSpec

            x = _sharded(np.arange(64 * 6, dtype=np.uint16).reshape(64, 6), (4, 2), ("x", "y"), (("x",), ()))
            got = bb.convert_shards(x, "numpy")
            partial = Layout(got.layout.mesh_axes, got.layout.mesh_shape, got.layout.spec, ("y",), got.layout.devices)
            with pytest.raises(UnsupportedTypeError, match=r"partial sums over mesh axes \('y',\)"):
                bb.from_shards(Shards(got.shards, got.shape, got.dtype, partial, "jax", "numpy"), "jax")
            unreduced = _unreduced(_make_mesh((4, 2), ("x", "y")), "x", "y")
            if unreduced is not None:  # (jax 0.4.30 has no unreduced axes)
                with pytest.raises(UnsupportedTypeError, match=r"unreduced mesh axes \('y',\)"):
                    bb.from_shards(got, "jax", sharding=unreduced)

        def test_benchmark_runs_quick(self):
            from benchmarks import shards as bench

            got = bench.run(quick=True, log=lambda s: None)
            assert got["shards"] == 8 and got["nbytes"] == bench.SIZE["quick"]
            assert set(got["ratios"]) == {"convert_shards / hand_loop", "np_asarray / convert_shards",
                                          "np_asarray / memcpy", "from_shards / hand_assemble",
                                          "replicated from_shards: compared / compare_replicas=False",
                                          "replicated convert_shards one: compared / compare_replicas=False",
                                          "replicated from_shards: compared / memcpy"}
            assert all(v > 0 for v in got["ratios"].values())

        @settings(max_examples=25)
        @given(_layouts(), st.integers(0, 2**32 - 1))
        def test_drawn_meshes_specs_and_shapes(self, layout, seed):
            mesh, axes, spec, shape = layout
            x = _sharded(np.random.default_rng(seed).integers(0, 1 << 16, size=shape, dtype=np.uint16),
                         mesh, axes, spec)
            got = bb.convert_shards(x, "torch", on_alias="allow")
            _check_shards(x, got, "torch")
            _check_back(x, bb.from_shards(got, "jax", sharding=x.sharding, copy=False))
            _check_back(x, bb.from_shards(got, "jax", copy=False))  # the layout alone rebuilds it
            one = bb.convert_shards(x, "numpy", replicas="one")
            assert len(one) == len({tuple((s.start, s.stop) for s in i.index) for i in got})
            try:
                placements = got.layout.placements()
            except UnsupportedTypeError:  # a dimension over several axes out of mesh order
                assert any(list(s) != sorted(s, key=axes.index) for s in spec)
            else:
                assert Layout.from_placements(axes, mesh, placements, len(shape), got.layout.devices) == got.layout

        @pytest.mark.parametrize("target", TARGETS)
        @pytest.mark.parametrize("shape", [(8, 8), (8, 0)], ids=["8x8", "empty"])
        @pytest.mark.parametrize("dtype", NARROW_SHARDED)
        def test_narrow_dtypes_cross_shard_by_shard_and_back_bit_exact(self, dtype, shape, target):
            """Every bit pattern of a narrow dtype, sharded over a partially replicated mesh (and an
            empty array: 0-size shards), to ``target`` and back: each shard bit for bit, or our
            error naming the shard. torch holds fp4 packed two a byte (float4_e2m1fn_x2): its
            shards' tensors have half the columns, which from_shards once refused as the wrong
            shape."""
            import jax
            import ml_dtypes
            from jax.sharding import NamedSharding, PartitionSpec

            from bf16bridge import Bf16BridgeError
            from bf16bridge.core import dtypes

            if dtypes.numpy_missing(dtype) is not None:  # (ml_dtypes 0.3.1 has no fp4, no e8m0) no such jax array
                assert "upgrade ml_dtypes" in registry.get("jax").cannot_hold(dtype)
                return
            np_dtype = np.dtype(getattr(ml_dtypes, dtype))
            u8 = np.resize(dtypes.all_patterns(dtype).view(np.uint8), shape)
            a = u8.view(np_dtype)
            x = jax.device_put(a, NamedSharding(_make_mesh((4, 2), ("x", "y")), PartitionSpec("x")))
            try:
                got = bb.convert_shards(x, target, on_alias="allow")
            except Bf16BridgeError as err:
                assert f"the shard [0:2, 0:{shape[1]}] on cpu:0" in str(err)
                assert registry.get(target).cannot_hold(dtype) is not None
                return
            assert len(got) == 8 and got.shape == shape
            for s in got:
                np.testing.assert_array_equal(np.asarray(bb.convert(s.tensor, "numpy")).view(np.uint8), u8[s.index])
            y = bb.from_shards(got, "jax", sharding=x.sharding)
            assert y.dtype == np_dtype and y.sharding.is_equivalent_to(x.sharding, 2)
            np.testing.assert_array_equal(np.asarray(y).view(np.uint8), u8)

        # DTensor in one process: torch's "fake" process group plays one rank of eight (fake_rank)
        @settings(max_examples=40)
        @given(st.sampled_from([(8,), (4, 2), (2, 4), (2, 2, 2)]), st.data())
        def test_dtensor_cut_matches_torch(self, fake_rank, mesh_shape, data):
            import torch
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor, Replicate, Shard
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            ndim = data.draw(st.integers(1, 3))
            placements = [data.draw(st.one_of(st.just(Replicate()), st.builds(Shard, st.integers(0, ndim - 1))))
                          for _ in mesh_shape]
            shape = tuple(data.draw(st.integers(0, 11)) for _ in range(ndim))  # uneven and empty too
            mesh = init_device_mesh("cpu", mesh_shape)
            local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
            local = torch.zeros(local_shape, dtype=torch.bfloat16)
            d = DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape),
                                   stride=tuple(int(np.prod(shape[i + 1:])) for i in range(ndim)))
            got = bb.convert_shards(d, "numpy")
            (s,) = got
            assert s.index == tuple(slice(o, o + n) for o, n in zip(offset, local_shape))
            assert s.tensor.shape == tuple(local_shape)
            assert ptr(s.tensor) == local.data_ptr() or local.numel() == 0
            coord = mesh.get_coordinate()
            kept = [c for c, p in zip(coord, placements) if not isinstance(p, Shard)]
            assert (s.replica == 0) == (not any(kept))
            assert got.layout.placements() == tuple(("shard", p.dim) if isinstance(p, Shard) else ("replicate", None)
                                                    for p in placements)

        def test_as_dtensor_refuses_several_parts_in_one_process(self, fake_rank):
            from torch.distributed.device_mesh import init_device_mesh

            x = _sharded(np.arange(64, dtype=np.uint16), (8,), ("x",), (("x",),))
            with pytest.raises(InvalidArgumentError, match="one local tensor per rank; these shards hold 8"):
                bb.convert_shards(x, "torch", as_dtensor=init_device_mesh("cpu", (8,)), on_alias="allow")
            with pytest.raises(InvalidArgumentError, match="as_dtensor makes a torch DTensor"):
                bb.convert_shards(x, "numpy", as_dtensor=init_device_mesh("cpu", (8,)))


        def test_as_dtensor_compares_the_replicas_it_drops(self, fake_rank):
            """A jax array replicated over 8 devices to a DTensor in one process: the DTensor takes
            one of the 8 (cpu:0's) and dropped the others unread, a disagreeing one too."""
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (8,))
            x, _ = _disagreeing((8,), ("x",), (), device=5, at=(0, 1))
            with pytest.raises(InvalidArgumentError, match=r"cpu:5 \(replica 5\) differs first at element \(0, 1\)"):
                bb.convert_shards(x, "torch", as_dtensor=mesh, on_alias="allow")
            d = bb.convert_shards(x, "torch", as_dtensor=mesh, on_alias="allow", compare_replicas=False)
            assert bits(d.to_local()).tolist() == bits(x.addressable_shards[0].data).tolist()

        @pytest.mark.parametrize("to", ["numpy", "jax", "torch"])
        @pytest.mark.parametrize("dim", [0, 1, None])
        def test_a_packed_fp4_dtensor_says_its_shards_in_values_and_comes_back(self, fake_rank, to, dim):
            """torch holds fp4 two values a byte (float4_e2m1fn_x2): its shards cross unpacked, and the
            global shape and index are said in values, as from_shards reads them (they were said in
            bytes: a (4, 2) shard of a (32, 4) array was a (4, 4) tensor, and from_shards refused it)."""
            import torch
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor, Replicate
            from torch.distributed.tensor import Shard as TorchShard

            mesh = init_device_mesh("cpu", (8,))
            byte_shape = {0: (32, 4), 1: (4, 32), None: (4, 4)}[dim]
            local = torch.arange(16, dtype=torch.uint8).reshape(4, 4).view(torch.float4_e2m1fn_x2)
            d = DTensor.from_local(local, mesh, [Replicate() if dim is None else TorchShard(dim)], run_check=False,
                                   shape=torch.Size(byte_shape), stride=(byte_shape[1], 1))
            from bf16bridge.core import dtypes

            held = dtypes.numpy_missing("float4_e2m1fn") is None  # (not by ml_dtypes 0.3.1)
            if not held and to != "torch":
                with pytest.raises(bb.UnsupportedDtypeError, match="upgrade ml_dtypes"):
                    bb.convert_shards(d, to, on_alias="allow")
                return
            got = bb.convert_shards(d, to, on_alias="allow")
            assert got.shape == (*byte_shape[:-1], byte_shape[-1] * 2)
            (s,) = got  # rank 5 of 8
            want = {0: (slice(20, 24), slice(0, 8)), 1: (slice(0, 4), slice(40, 48)), None: (slice(0, 4), slice(0, 8))}
            assert s.index == want[dim]
            if held:
                values = np.asarray(bb.convert(s.tensor, "numpy", on_alias="allow"))
                assert values.shape == (4, 8) and values.dtype.name == "float4_e2m1fn"
                nibbles = np.stack([np.arange(16) & 15, np.arange(16) >> 4], -1).reshape(4, 8)  # low nibble first
                np.testing.assert_array_equal(values.view(np.uint8) & 15, nibbles)
            else:  # torch's own packed tensor, its bytes as they were
                assert torch.equal(s.tensor.view(torch.uint8), local.view(torch.uint8))
            back = bb.from_shards(got, "torch", sharding=mesh, on_alias="allow")
            assert back.dtype == torch.float4_e2m1fn_x2 and tuple(back.shape) == byte_shape
            assert back.placements == d.placements
            assert torch.equal(back.to_local().view(torch.uint8), local.view(torch.uint8))
            if to == "numpy" and dim is None and held:  # an odd count of values cannot be packed two a byte
                import ml_dtypes

                odd = [bb.shards.Shard((slice(0, 4), slice(0, 5)), "cpu", np.zeros((4, 5), ml_dtypes.float4_e2m1fn))]
                with pytest.raises(InvalidArgumentError, match="5 values of fp4.*multiple of 2"):
                    bb.from_shards(odd, "torch", sharding=(mesh, [Replicate()]), shape=(4, 5))

        @pytest.mark.parametrize("to", ["numpy", "torch", "jax", "tensorflow"])
        def test_convert_refuses_a_dtensor_naming_the_ways_out(self, fake_rank, to):
            # a DTensor is a torch.Tensor with data_ptr() 0: convert gave zeros to jax, a plan said zero-copy
            import torch
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor
            from torch.distributed.tensor import Shard as TorchShard

            from bf16bridge.core import registry

            from bf16bridge.core import fastpath

            d = DTensor.from_local(torch.arange(4, dtype=torch.bfloat16), init_device_mesh("cpu", (8,)),
                                   [TorchShard(0)], run_check=False)
            ways_out = r"DTensor.*bb\.convert_shards\(x, to\).*x\.full_tensor\(\)"
            for call in (lambda: bb.plan(d, to), lambda: bb.convert(d, to), lambda: bb.convert(d, to),
                         lambda: bb.convert_tree({"w": d}, to)):
                with pytest.raises(UnsupportedTypeError, match=ways_out):
                    call()
            with pytest.warns(bb.Bf16BridgeWarning, match=r"on_unsupported='keep' kept 1 leaf .*\['w'\]"):
                assert bb.convert_tree({"w": d}, to, on_unsupported="keep")["w"] is d
            assert registry.get("torch").fast_key(d, True) is None
            assert not any(issubclass(key[0], DTensor) for key in fastpath.CACHE)

        def test_cast_tree_keeps_a_jax_array_s_sharding(self):
            x = _sharded(np.arange(64 * 6, dtype=np.uint16).reshape(64, 6) + 0x3F80, (4, 2), ("x", "y"), (("x",), ()))
            out, report = bb.cast_tree({"h.0.w": x}, "float32")
            y = out["h.0.w"]
            assert report.leaves[0].action == "cast" and y.dtype == np.float32
            assert y.sharding.is_equivalent_to(x.sharding, 2)
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x).astype(np.float32))

        def test_cast_tree_casts_a_dtensor_s_part_and_keeps_it_sharded(self, fake_rank):
            # an FSDP2 state dict: its DTensors cast as torch's own .to casts them (this rank's part), tied
            # ones (the same part under two keys) kept together; it was refused as "no memory of its own"
            import torch
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor
            from torch.distributed.tensor import Shard as TorchShard

            mesh = init_device_mesh("cpu", (8,))
            raw = np.array([0x7FC00001, 0xFF800000, 0x80000000, 0x3F808000, 0x3F818000, 0x3F800001], np.uint32)
            part = torch.from_numpy(raw.view(np.float32).reshape(2, 3).copy())

            def dt(t):
                return DTensor.from_local(t, mesh, [TorchShard(1)], run_check=False, shape=torch.Size((2, 24)),
                                          stride=(24, 1))

            tree = {"h.0.w": dt(part), "wte": dt(part.clone()), "ln_f.weight": dt(part.clone())}
            tree["lm_head.weight"] = dt(tree["ln_f.weight"].to_local())  # tied to a kept leaf
            out, report = bb.cast_tree(tree, "bfloat16")
            w = out["h.0.w"]
            assert isinstance(w, DTensor) and w.placements == (TorchShard(1),) and tuple(w.shape) == (2, 24)
            expected = part.to(torch.bfloat16).view(torch.uint16).numpy()
            np.testing.assert_array_equal(w.to_local().view(torch.uint16).numpy(), expected)
            assert {r.path: r.action for r in report.leaves} == {
                "h.0.w": "cast", "wte": "cast", "ln_f.weight": "kept", "lm_head.weight": "kept"}
            assert out["lm_head.weight"] is tree["lm_head.weight"] and out["ln_f.weight"] is tree["ln_f.weight"]

        def test_dtensor_from_shards_checks_the_local_shard(self, fake_rank):
            import torch
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard as TorchShard

            mesh = init_device_mesh("cpu", (8,))
            index = (slice(10, 12),)  # rank 5's part of a (16,) tensor over 8 ranks
            d = bb.from_shards([Shard(index, "cpu", torch.ones(2, dtype=torch.bfloat16))], "torch",
                               sharding=(mesh, [TorchShard(0)]), shape=(16,))
            assert tuple(d.shape) == (16,) and tuple(d.to_local().shape) == (2,)
            for bad, words in [(torch.ones(1, dtype=torch.bfloat16), r"of shape \(1,\); its index spans \(2,\)"),
                               (torch.ones(1, 2, dtype=torch.bfloat16), r"of shape \(1, 2\); its index spans")]:
                with pytest.raises(InvalidArgumentError, match=words):
                    bb.from_shards([Shard(index, "cpu", bad)], "torch", sharding=(mesh, [TorchShard(0)]), shape=(16,))

        def test_dtensor_from_shards_checks_the_placements_given(self, fake_rank):
            """Placements passed with sharding=(mesh, placements): a wrong count built a DTensor whose
            placements do not match its mesh, and Shard(2) of a 2-d tensor was a raw IndexError."""
            import torch
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Replicate
            from torch.distributed.tensor import Shard as TorchShard

            mesh = init_device_mesh("cpu", (4, 2))
            part = [Shard((slice(0, 4), slice(0, 4)), "cpu", torch.ones(4, 4, dtype=torch.bfloat16))]
            for placements, words in [([TorchShard(0)], "1 placements for a mesh of 2 axes: pass one per mesh axis"),
                                      ([TorchShard(0)] * 3, "3 placements for a mesh of 2 axes"),
                                      ([TorchShard(2), Replicate()], r"Shard\(2\) .* of a 2-d tensor: shard a dim"),
                                      ([TorchShard(-3), Replicate()], r"Shard\(-3\)")]:
                with pytest.raises(InvalidArgumentError, match=words):
                    bb.from_shards(part, "torch", sharding=(mesh, placements), shape=(16, 4))


# -- two processes: torch.distributed (gloo) and jax.distributed (run as a script) -----------------------

def _two_processes(rank: int, jax_port: int, torch_port: int) -> None:
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{jax_port}", num_processes=2, process_id=rank,
                               initialization_timeout=60)
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank, world_size=2)
    warnings.simplefilter("error")
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("x",))
        u16 = np.random.default_rng(0).integers(0, 1 << 16, size=(8, 6), dtype=np.uint16)  # the same on both
        full = torch.from_numpy(u16.view(np.int16).copy()).view(torch.bfloat16)
        d = distribute_tensor(full, mesh, [Shard(0)])
        local = d.to_local()

        # DTensor -> jax: this process's shard only, zero-copy, bit-exact, its rows
        got = bb.convert_shards(d, "jax")
        (s,) = got
        assert s.index == (slice(4 * rank, 4 * rank + 4), slice(0, 6)) and s.device == "cpu" and s.replica == 0
        assert got.layout == Layout(("x",), (2,), (("x",), ()), (), ("rank:0", "rank:1"))
        assert ptr(s.tensor) == local.data_ptr()
        np.testing.assert_array_equal(bits(s.tensor), u16[s.index])

        # one global jax array over both processes, from the layout alone, no copy
        g = bb.from_shards(got, "jax", copy=False)
        assert g.shape == (8, 6) and not g.is_fully_addressable
        assert tuple(g.sharding.spec) == ("x", None) and len(g.sharding.device_set) == 2
        (mine,) = g.addressable_shards
        assert mine.device.process_index == rank and ptr(mine.data) == local.data_ptr()

        # and back: a DTensor over the same mesh, the same buffer, the same bits everywhere
        back = bb.convert_shards(g, "torch", as_dtensor=mesh, copy=False, on_alias="allow")
        assert isinstance(back, DTensor) and tuple(back.placements) == (Shard(0),) and back.shape == (8, 6)
        assert back.to_local().data_ptr() == local.data_ptr()
        np.testing.assert_array_equal(bits(back.full_tensor()), u16)  # a gather: the test's check only

        # replicated: each process holds it all, as replica = its rank; "one" keeps rank 0's
        r = distribute_tensor(full, mesh, [Replicate()])
        (s,) = bb.convert_shards(r, "numpy")
        assert s.index == (slice(0, 8), slice(0, 6)) and s.replica == rank
        assert len(bb.convert_shards(r, "numpy", replicas="one")) == (1 if rank == 0 else 0)
        gr = bb.from_shards(bb.convert_shards(r, "jax"), "jax")
        assert tuple(gr.sharding.spec) == (None, None) and gr.sharding.is_fully_replicated
        # replicas="one" leaves rank 1 nothing to build a DTensor from: said as such (it was told to
        # reorder the mesh's ranks)
        if rank == 0:
            assert bits(bb.convert_shards(r, "torch", replicas="one", as_dtensor=mesh).to_local()).tolist() == u16.tolist()
        else:
            try:
                bb.convert_shards(r, "torch", replicas="one", as_dtensor=mesh)
                raise AssertionError("a DTensor was built from no shard")
            except InvalidArgumentError as err:
                assert "no shard was given for it" in str(err) and "replicas='all'" in str(err), err

        # uneven (DTensor cuts 5 rows as 3 + 2): indices right, and jax's even split refused clearly
        u = distribute_tensor(full[:5], mesh, [Shard(0)])
        (s,) = bb.convert_shards(u, "numpy")
        assert s.index == ((slice(0, 3),) if rank == 0 else (slice(3, 5),)) + (slice(0, 6),)
        np.testing.assert_array_equal(bits(s.tensor), u16[s.index])
        try:
            bb.from_shards(bb.convert_shards(u, "numpy"), "jax")
            raise AssertionError("an uneven split reached jax")
        except InvalidArgumentError as err:
            assert "split 2 ways unevenly" in str(err), err

        # Partial: partial sums are not shards of one array
        p = DTensor.from_local(torch.ones(2, dtype=torch.bfloat16), mesh, [Partial()])
        try:
            bb.convert_shards(p, "jax")
            raise AssertionError("a Partial DTensor crossed")
        except UnsupportedTypeError as err:
            assert "partial sums" in str(err) and "redistribute" in str(err), err

        # a mesh whose ranks are ordered otherwise than jax's devices: said, not mixed up
        flipped = init_device_mesh("cpu", (2,), mesh_dim_names=("x",))
        flipped_mesh = type(flipped)("cpu", [1, 0], mesh_dim_names=("x",))
        try:
            bb.convert_shards(g, "torch", as_dtensor=flipped_mesh, on_alias="allow")
            raise AssertionError("a shard went to the wrong rank")
        except InvalidArgumentError as err:
            assert "order the mesh's ranks" in str(err), err
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(f"rank {rank}: all checks passed", flush=True)


if __name__ == "__main__" and CHILD == "dtensor":
    _two_processes(*map(int, sys.argv[1:4]))
    sys.stdout.flush()
    os._exit(0)  # torch, jax and their threads at exit: the checks are done
