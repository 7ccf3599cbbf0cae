"""Sharded tensors on the device (issue 12): a jax array over a mesh of the GPUs crosses to torch
shard by shard without a copy, each shard staying on its GPU, and comes back; a DTensor over a
one-rank mesh crosses to jax and back; a host-only target is refused per shard, naming it.

On a machine with one GPU the mesh has one device (still a mesh: its shards are what cross);
with several, one shard per GPU. The dry run does the same over one CPU device.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

import bf16bridge as bb
from devicehelp import BF16, DEVICE, host_bits, ptr, where


@pytest.fixture(scope="module")
def mesh_array(jax_device, all_u16):
    """Every bf16 bit pattern, sharded by rows over every jax device of the test's platform."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices(jax_device.platform) if DEVICE == "cuda" else [jax_device]
    devices = devices[:1 << (len(devices).bit_length() - 1)]  # a power of two: the rows split evenly
    u16 = all_u16.reshape(len(devices) * 64, -1)
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), PartitionSpec("x", None))
    return jax.device_put(u16.view(BF16), sharding), u16


def test_shards_to_torch_zero_copy(mesh_array, record_property):
    x, u16 = mesh_array
    got = bb.convert_shards(x, "torch", on_alias="allow")
    same = [ptr(s.tensor) == ptr(a.data) for s, a in zip(got, x.addressable_shards)]
    kept = [where(s.tensor) == where(a.data) for s, a in zip(got, x.addressable_shards)]
    wrong = sum(int((host_bits(s.tensor) != u16[s.index]).sum()) for s in got)
    record_property("shards", len(got))
    record_property("devices", ", ".join(s.device for s in got))
    record_property("pointers_equal", f"{sum(same)} of {len(same)}")
    record_property("devices_kept", f"{sum(kept)} of {len(kept)}")
    record_property("mismatches", wrong)
    assert len(got) == len(x.addressable_shards) and all(same) and all(kept) and wrong == 0


def test_shards_back_to_jax_no_copy(mesh_array, record_property):
    x, u16 = mesh_array
    got = bb.convert_shards(x, "torch", on_alias="allow")
    y = bb.from_shards(got, "jax", sharding=x.sharding, copy=False)
    same = [ptr(a.data) == ptr(s.tensor) for a, s in zip(y.addressable_shards, got)]
    record_property("pointers_equal", f"{sum(same)} of {len(same)}")
    record_property("sharding", str(y.sharding.spec))
    assert all(same) and y.sharding.is_equivalent_to(x.sharding, x.ndim)
    np.testing.assert_array_equal(host_bits(y), u16)


def test_shards_to_host_target(mesh_array, record_property):
    x, u16 = mesh_array
    if DEVICE == "cuda":
        with pytest.raises(bb.DeviceError, match=r"the shard \[0:\d+, 0:\d+\] on gpu:\d+: "):
            bb.convert_shards(x, "numpy")
        got = bb.convert_shards(x, "numpy", copy=True)  # the way out the error names
        record_property("copy=None", "refused with DeviceError, naming the shard")
    else:
        got = bb.convert_shards(x, "numpy")
        record_property("copy=None", "host shards: zero-copy")
    record_property("copy=True", f"{len(got)} host shards")
    for s in got:
        np.testing.assert_array_equal(np.ascontiguousarray(s.tensor).view(np.uint16), u16[s.index])


@pytest.fixture(scope="module")
def one_rank():
    """torch.distributed with one rank (this process), for a DTensor on the test device."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_dtensor_to_jax_and_back(one_rank, torch_device, jax_device, all_u16, record_property):
    import jax
    import torch
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh(torch_device.type, (1,), mesh_dim_names=("x",))
    local = torch.empty(1024, 64, dtype=torch.int16, device=torch_device)
    local.copy_(torch.from_numpy(all_u16.view(np.int16).reshape(1024, 64)))
    d = DTensor.from_local(local.view(torch.bfloat16), mesh, [Shard(0)], run_check=False)
    got = bb.convert_shards(d, "jax")
    (s,) = got
    record_property("shard_device", where(s.tensor))
    record_property("pointer_equal", ptr(s.tensor) == local.data_ptr())
    assert ptr(s.tensor) == local.data_ptr() and where(s.tensor) == where(local)
    sharding = NamedSharding(Mesh(np.array([jax_device]), ("x",)), PartitionSpec("x", None))
    y = bb.from_shards(got, "jax", sharding=sharding, copy=False)
    assert ptr(y.addressable_shards[0].data) == local.data_ptr()
    back = bb.convert_shards(y, "torch", as_dtensor=mesh, copy=False, on_alias="allow")
    record_property("round_trip_pointer_equal", back.to_local().data_ptr() == local.data_ptr())
    assert isinstance(back, DTensor) and back.to_local().data_ptr() == local.data_ptr()
    np.testing.assert_array_equal(host_bits(back.to_local()), all_u16.reshape(1024, 64))
    jax.block_until_ready(y)
