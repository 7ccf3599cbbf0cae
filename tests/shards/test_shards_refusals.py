"""convert_shards and from_shards in the test process (one jax device, no torch.distributed): a tensor
that is not sharded, a target without sharded tensors, shards that do not make the array they claim,
what from_shards needs told, the keywords, 64-bit shards into jax without x64; a jax mesh of one device
there and back; and an import that loads no framework."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError
from bf16bridge.shards import Shard
from conftest import BF16, bits, make, ptr
from shards_cases import _one_device_sharding


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
