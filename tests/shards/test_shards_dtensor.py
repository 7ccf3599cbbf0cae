"""torch DTensors shard by shard, in two kinds of process.

- in the eight-device pytest child that test_shards_eight_devices.py starts (its ``TestEightDevices``
  tests here), over torch's single-process "fake" process group (one rank of eight): DTensor's cut of
  uneven shapes against torch's own, as_dtensor, packed fp4, convert's refusal, cast_tree,
  from_shards' checks of the local shard and the placements;
- two processes with torch.distributed (gloo) and jax.distributed (this file run as a script):
  DTensor <-> jax across processes, each converting only what it holds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError
from bf16bridge.shards import Layout, Shard
from conftest import bits, ptr
from shards_cases import CHILD, _disagreeing, _env, _sharded

HERE = os.path.abspath(__file__)


if CHILD == "jax8":
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import strategies  # noqa: F401  (the derandomized, bounded "ci" profile)

    @pytest.fixture(scope="module")
    def fake_rank():
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=8)
        yield 5
        dist.destroy_process_group()

    class TestEightDevices:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
