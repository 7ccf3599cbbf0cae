"""convert_shards and from_shards over jax arrays on eight jax host devices.

``XLA_FLAGS`` must be set before jax is imported, so these run in a pytest child (started by
``test_eight_jax_devices_in_a_child``), which runs the ``TestEightDevices`` tests of every shards test
file: here, every shard zero-copy (pointers) and bit-exact, indices, replicas, copies, back with
``from_shards``, over a table, over hypothesis-drawn meshes, specs and shapes, and in every narrow dtype
jax holds; and test_shards_dtensor.py's: torch DTensors over torch's single-process "fake" process group.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from bf16bridge.errors import CopyRequiredError, DeviceError, InvalidArgumentError, UnsupportedTypeError
from bf16bridge.shards import Layout, Shard, Shards, bounds
from conftest import BF16, bits, ptr
from shards_cases import CHILD, _disagreeing, _env, _make_mesh, _sharded

HERE = os.path.abspath(__file__)
#: the files the child runs the TestEightDevices tests of: every shards test file
SHARDS_FILES = sorted(glob.glob(os.path.join(os.path.dirname(HERE), "test_*.py")))


#: the TestEightDevices tests the child must pass (it fails here when fewer ran)
EIGHT_DEVICE_TESTS = 86


@pytest.mark.frameworks("torch")
def test_eight_jax_devices_in_a_child():
    env = _env(BF16BRIDGE_SHARDS_CHILD="jax8", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                          "-k", "TestEightDevices", *SHARDS_FILES], capture_output=True, text=True, timeout=600,
                         env=env, cwd=os.path.dirname(HERE))
    tail = (out.stdout + out.stderr)[-6000:]
    assert out.returncode == 0, tail
    assert f"{EIGHT_DEVICE_TESTS} passed" in out.stdout and "skipped" not in out.stdout, tail


# -- eight jax host devices (run in the child) ------------------------------------------------------


def _unreduced(mesh, sharded: str, unreduced: str):
    """A NamedSharding over ``sharded`` with ``unreduced`` axes, or None where this jax's PartitionSpec
    has none (jax 0.4.30: an array of partial sums cannot be made there)."""
    from jax.sharding import NamedSharding, PartitionSpec

    try:
        return NamedSharding(mesh, PartitionSpec(sharded, unreduced={unreduced}))
    except TypeError:
        return None


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
            from bf16bridge.bench import shards as bench

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

        def test_cast_tree_keeps_a_jax_array_s_sharding(self):
            x = _sharded(np.arange(64 * 6, dtype=np.uint16).reshape(64, 6) + 0x3F80, (4, 2), ("x", "y"), (("x",), ()))
            out, report = bb.cast_tree({"h.0.w": x}, "float32")
            y = out["h.0.w"]
            assert report.leaves[0].action == "cast" and y.dtype == np.float32
            assert y.sharding.is_equivalent_to(x.sharding, 2)
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x).astype(np.float32))
