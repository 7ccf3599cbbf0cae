"""What convert_shards keeps between calls: the jax hooks' places (layout, each device's index, name and
replica) per sharding and global shape, and the fast path's plans looked up once per call. An array of
another shape, sharding, device order or dtype gets its own answer; a deleted one is still refused;
what the shards would warn is said once per call, with their number, on the cached path too. And
``Shard``, a frozen record with an __init__ of its own."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fastpath
from bf16bridge.errors import UnsupportedTypeError
from bf16bridge.shards import Shard, bounds
from conftest import BF16, bits
from shards_cases import CHILD, _make_mesh


def test_shard_is_a_frozen_record_of_what_it_is_given():
    t = np.zeros(2, BF16)
    s = Shard((slice(0, 2),), "cpu:1", t, 3)
    assert (s.index, s.device, s.tensor, s.replica) == ((slice(0, 2),), "cpu:1", t, 3)
    assert Shard(index=(slice(0, 2),), device="cpu:0", tensor=t).replica == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.replica = 0  # type: ignore[misc]
    assert dataclasses.replace(s, replica=1).replica == 1 and dataclasses.replace(s, replica=1).tensor is t
    assert [f.name for f in dataclasses.fields(s)] == ["index", "device", "tensor", "replica"]
    assert repr(s).startswith("Shard(index=(slice(0, 2, None),), device='cpu:1'")


def _check(x, got, dtype=BF16):
    """Each shard of ``got`` (convert_shards(x, "numpy")) is x's own: index, device, replica, bits."""
    own = x.addressable_shards
    assert got.shape == x.shape and len(got) == len(own)
    whole = bits(x)
    for s, e in zip(got, own):
        assert (s.index, s.device, s.replica) == (bounds(e.index, x.shape), f"cpu:{e.device.id}", e.replica_id)
        assert s.tensor.dtype == dtype
        np.testing.assert_array_equal(bits(s.tensor), whole[s.index])


if CHILD == "jax8":
    class TestEightDevices:
        def test_places_are_kept_per_sharding_and_shape(self):
            """Each array after the first shares all but one thing with it: the global shape, the
            spec, the mesh's device order, the dtype. Each must get its own indices and devices."""
            import jax
            from jax.sharding import Mesh, NamedSharding, PartitionSpec

            rows = NamedSharding(_make_mesh((4, 2), ("x", "y")), PartitionSpec("x", None))
            first = jax.device_put(np.arange(8 * 8, dtype=np.uint16).reshape(8, 8).view(BF16), rows)
            _check(first, bb.convert_shards(first, "numpy"))
            taller = jax.device_put(np.arange(16 * 8, dtype=np.uint16).reshape(16, 8).view(BF16), rows)
            _check(taller, bb.convert_shards(taller, "numpy"))
            cols = NamedSharding(rows.mesh, PartitionSpec(None, ("x", "y")))
            across = jax.device_put(np.asarray(first), cols)
            _check(across, bb.convert_shards(across, "numpy"))
            backwards = Mesh(np.array(jax.devices()[::-1]).reshape(4, 2), ("x", "y"))
            reordered = jax.device_put(np.asarray(first), NamedSharding(backwards, PartitionSpec("x", None)))
            got = bb.convert_shards(reordered, "numpy")
            _check(reordered, got)
            assert got.layout.devices == tuple(f"cpu:{i}" for i in range(7, -1, -1))
            wide = jax.device_put(np.arange(8 * 8, dtype=np.float32).reshape(8, 8), rows)
            got = bb.convert_shards(wide, "numpy")
            _check(wide, got, np.float32)
            assert got.dtype == "float32"

        def test_a_deleted_array_is_refused_after_its_places_were_kept(self):
            import jax
            from jax.sharding import NamedSharding, PartitionSpec

            sharding = NamedSharding(_make_mesh((8,), ("x",)), PartitionSpec("x"))
            x = jax.device_put(np.arange(64, dtype=np.uint16).view(BF16), sharding)
            bb.convert_shards(x, "numpy")
            x.delete()
            with pytest.raises(UnsupportedTypeError, match="this jax array was deleted"):
                bb.convert_shards(x, "numpy")

        def test_the_alias_warning_is_counted_on_the_cached_path(self):
            """The first call plans each shard (convert's full path, gathered); the second runs the
            kept plans, whose messages are counted by the call: one warning, for 8 shards, each time
            (each catch_warnings starts the once-per-process record over)."""
            import jax
            from jax.sharding import NamedSharding, PartitionSpec

            sharding = NamedSharding(_make_mesh((8,), ("x",)), PartitionSpec(None, "x"))
            x = jax.device_put(np.arange(3 * 8, dtype=np.uint16).reshape(3, 8).view(BF16), sharding)
            fastpath.clear()  # (other tests kept plans for these shards' devices)
            for _ in range(2):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    bb.convert_shards(x, "torch")
                assert [str(w.message).split(":")[0] for w in seen] == ["8 shards"]
