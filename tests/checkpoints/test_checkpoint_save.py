"""bb.save's writing (bf16bridge/checkpoints/write.py): atomic (an interrupted save leaves the
target as it was; a symlink replaced, not written through), the umask kept, a long file name, a
header past the readers' cap refused before writing; jax arrays sharded over several devices and
torch DTensors written whole (replicas that disagree, partial sums, shards not here refused)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.checkpoints import format as fmt
from bf16bridge.checkpoints import write as ckwrite
from bf16bridge.errors import CheckpointError, InvalidArgumentError
from checkpoint_cases import _st_read


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("exists", [False, True])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_interrupted_save_leaves_the_target_as_it_was(tmp_path, monkeypatch, exists, error):
    import torch

    p = tmp_path / "m.safetensors"
    if exists:
        bb.save({"old": np.ones(3, np.float32)}, p)
    before = p.read_bytes() if exists else None
    calls = []
    real = ckwrite.convert

    def flaky(x, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise error("interrupted")
        return real(x, *args, **kwargs)

    monkeypatch.setattr(ckwrite, "convert", flaky)
    tree = {f"t{i}": torch.full((64,), float(i), dtype=torch.bfloat16) for i in range(3)}
    with pytest.raises(error):
        bb.save(tree, p)
    assert len(calls) == 2  # it failed midway, after one tensor was written
    assert (p.read_bytes() if p.exists() else None) == before
    assert os.listdir(tmp_path) == (["m.safetensors"] if exists else [])


def test_save_replaces_a_file_and_keeps_the_umask(tmp_path):
    p = tmp_path / "m.safetensors"
    bb.save({"a": np.zeros(1)}, p)
    bb.save({"b": np.ones(2)}, p)
    assert list(bb.load(p)) == ["b"]
    assert oct(os.stat(p).st_mode & 0o777) == oct(0o666 & ~ckwrite._umask())


@pytest.mark.parametrize("where", ["missing-dir", "a-directory"])
def test_a_save_that_cannot_write_is_a_checkpoint_error(tmp_path, where):
    p = tmp_path / "nope" / "m.safetensors" if where == "missing-dir" else tmp_path / "d"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"")  # a non-empty directory where the file should go
    with pytest.raises(CheckpointError, match="cannot write"):
        bb.save({"a": np.zeros(1)}, p)
    assert sorted(os.listdir(tmp_path)) == ["d"] and os.listdir(tmp_path / "d") == ["x"]


def test_a_long_file_name_is_saved(tmp_path):
    p = tmp_path / ("m" * 240 + ".safetensors")  # 252 bytes: a valid name; its temporary file's once was not
    bb.save({"a": np.arange(3, dtype=np.int16)}, p)
    assert os.listdir(tmp_path) == [p.name]
    assert _st_read(p) == {"a": ("I16", [3], np.arange(3, dtype="<i2").tobytes())}


def test_a_symlink_at_the_target_is_replaced_not_written_through(tmp_path):
    real, link = tmp_path / "real.safetensors", tmp_path / "link.safetensors"
    bb.save({"old": np.zeros(2)}, real)
    link.symlink_to(real)
    bb.save({"new": np.ones(2)}, link)
    assert not link.is_symlink() and list(bb.load(link)) == ["new"]
    assert list(bb.load(real)) == ["old"]  # docs/checkpoints.md says so


def test_a_header_past_the_readers_cap_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(fmt, "MAX_HEADER", 4096)  # the real cap is 100 MB of metadata and keys
    p = tmp_path / "m.safetensors"
    bb.save({"a": np.zeros(1)}, p, metadata={"k": "v" * 3000})
    with pytest.raises(InvalidArgumentError, match="header would be .* past the format's cap of 4096"):
        bb.save({"a": np.zeros(1)}, p, metadata={"k": "v" * 5000})
    assert list(bb.load(p)) == ["a"] and os.listdir(tmp_path) == ["m.safetensors"]


# -- sharded arrays, written whole (in a child process) --------------------------------------

_SHARDED = textwrap.dedent("""
    import sys
    import numpy as np, jax, jax.numpy as jnp, bf16bridge as bb
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
    bits = np.arange(96, dtype=np.uint16) * 683  # NaNs, infs, -0 among them
    a = jnp.asarray(bits.view(jnp.bfloat16).reshape(8, 12))
    tree = {"xy": jax.device_put(a, NamedSharding(mesh, P("x", "y"))),
            "x": jax.device_put(a.T, NamedSharding(mesh, P("x"))),  # sharded on x, replicated on y
            "replicated": jax.device_put(jnp.arange(12, dtype=jnp.int32), NamedSharding(mesh, P())),
            "one": jax.device_put(a, jax.devices()[3])}
    bb.save(tree, sys.argv[1])
    got = bb.load(sys.argv[1])
    for k, x in tree.items():
        want = np.asarray(x)
        assert got[k].shape == want.shape and got[k].dtype == want.dtype, k
        assert got[k].tobytes() == want.tobytes(), k
    # replicas that disagree (one device's copy changed): refused, not written from either
    sh = NamedSharding(mesh, P("x"))
    base = np.arange(96, dtype=np.int32).reshape(8, 12)
    odd = jax.make_array_from_single_device_arrays(base.shape, sh, [
        jax.device_put(base[i] + (d == jax.devices()[1]), d) for d, i in sh.addressable_devices_indices_map(base.shape).items()])
    try:
        bb.save({"odd": odd}, sys.argv[1] + ".0")
    except bb.Bf16BridgeError as err:  # naming a way out save has (review: convert_shards' keywords)
        assert "key 'odd'" in str(err) and "bb.save writes one value" in str(err), err
        assert "compare_replicas" not in str(err), err
    else:
        raise AssertionError("replicas that disagree were saved")
    bbconvert = sys.modules["bf16bridge.shards"]  # the module whose convert reads each replica
    real_convert = bbconvert.convert
    def unreadable(x, to, **kw):
        raise bb.DeviceError("numpy cannot reach this device (a test's stand-in)")
    bbconvert.convert = unreadable  # how the replica comparison reads a shard
    try:  # a replica save cannot read: our error, naming the key and no keyword save has not (review)
        bb.save({"x": tree["x"]}, sys.argv[1] + ".3")
    except bb.DeviceError as err:
        assert "key 'x'" in str(err) and "read to compare it with its replicas" in str(err), err
        assert "stand-in" in str(err) and "compare_replicas" not in str(err), err
    else:
        raise AssertionError("an unreadable replica was saved")
    finally:
        bbconvert.convert = real_convert
    gone = jax.device_put(a, NamedSharding(mesh, P("x")))
    gone.delete()
    try:  # a deleted (donated) sharded array: our error, naming the key
        bb.save({"gone": gone}, sys.argv[1] + ".1")
    except bb.UnsupportedTypeError as err:
        assert "key 'gone'" in str(err) and "deleted" in str(err), err
    else:
        raise AssertionError("a deleted array was saved")
    # another process's shards are not here (as on several hosts): refused, naming the key, nothing written
    import dataclasses, os
    from bf16bridge.checkpoints import write
    real = write.convert_shards
    write.convert_shards = lambda x, to, **kw: dataclasses.replace(real(x, to, **kw), shards=real(x, to, **kw).shards[:3])
    try:
        bb.save({"xy": tree["xy"]}, sys.argv[1] + ".2")
    except bb.UnsupportedTypeError as err:
        assert "key 'xy'" in str(err) and "holds 72 of its 96 values" in str(err), err
    assert not os.path.exists(sys.argv[1] + ".2")
    print("ok", len(tree))
""")


def test_save_writes_a_jax_array_sharded_over_several_devices_whole(tmp_path):
    # once refused with a way out (convert_shards) that gives shards, not a file's tensor
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    run = subprocess.run([sys.executable, "-c", _SHARDED, str(tmp_path / "m.safetensors")], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0 and "ok 4" in run.stdout, run.stderr[-3000:]


_DTENSOR = textwrap.dedent("""
    import os, socket, sys
    import torch, torch.distributed as dist, bf16bridge as bb
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor, DTensor
    mesh = init_device_mesh("cpu", (1,))
    t = torch.arange(12, dtype=torch.int16).view(torch.bfloat16).reshape(3, 4)
    tree = {"shard": distribute_tensor(t, mesh, [Shard(0)]), "replicate": distribute_tensor(t, mesh, [Replicate()])}
    bb.save(tree, sys.argv[1])
    got = bb.load(sys.argv[1], to="torch")
    assert all(torch.equal(got[k].view(torch.int16), t.view(torch.int16)) for k in tree), got
    # torch's packed fp4, sharded: written whole, in values, as its full tensor is (it was refused, its
    # shards' index said in bytes, their tensors in values)
    for placement in (Shard(0), Shard(1), Replicate()):
        x2 = DTensor.from_local(torch.arange(8, dtype=torch.uint8).reshape(2, 4).view(torch.float4_e2m1fn_x2), mesh,
                                [placement])
        if bb.dtypes.numpy_missing("float4_e2m1fn"):  # an ml_dtypes without fp4: our error, naming the way out
            try:
                bb.save({"a": x2}, sys.argv[1] + ".x2")
            except bb.UnsupportedDtypeError as err:
                assert "key 'a'" in str(err) and "upgrade ml_dtypes" in str(err), err
            else:
                raise AssertionError("an fp4 this ml_dtypes cannot hold was saved")
            continue
        bb.save({"a": x2}, sys.argv[1] + ".x2")
        bb.save({"a": x2.full_tensor()}, sys.argv[1] + ".full")
        with open(sys.argv[1] + ".x2", "rb") as f, open(sys.argv[1] + ".full", "rb") as g:
            assert f.read() == g.read(), placement
        assert bb.open(sys.argv[1] + ".x2").info("a").shape == (2, 8), placement
    try:  # partial sums are no array's values: refused, naming the key
        bb.save({"p": DTensor.from_local(t, mesh, [Partial()])}, sys.argv[1])
    except bb.UnsupportedTypeError as err:
        assert "key 'p'" in str(err) and "partial sums" in str(err), err
    else:
        raise AssertionError("a Partial DTensor was saved")
    dist.destroy_process_group()
    print("ok")
""")


@pytest.mark.frameworks("torch")
def test_save_writes_a_dtensor_whole_and_refuses_partial_sums(tmp_path):
    run = subprocess.run([sys.executable, "-c", _DTENSOR, str(tmp_path / "m.safetensors")], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
