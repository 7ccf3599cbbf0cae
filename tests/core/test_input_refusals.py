"""What convert refuses, with a clear error of ours: Python values, objects of no framework, dtypes
with no row, unknown targets (and the names a target goes by), masked arrays, torch sparse, meta, fake
and wrapper-subclass tensors and tensors whose storage was freed (a cached plan for a live one not
taken; a live one keeps its fast key), symbolic tf tensors, jax tracers and torch.func wrappers."""

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from conftest import BF16, FRAMEWORKS, aligned_copy, make, type_framework
from input_cases import TARGETS, _bf16


# -- what is no tensor, or no tensor we take: Python values, other types, dtypes, targets --------------


@pytest.mark.parametrize("bad", [1.5, 3, [1.0, 2.0], (1, 2), True])
def test_python_values_get_a_clear_error(bad):
    with pytest.raises(bb.UnsupportedTypeError, match="numpy.asarray") as err:
        bb.convert(bad, "torch")
    assert isinstance(err.value, TypeError)


def test_unsupported_type_names_it_and_lists_frameworks():
    with pytest.raises(bb.UnsupportedTypeError) as err:
        bb.convert(object(), "numpy")
    msg = str(err.value)
    assert "builtins.object" in msg and all(f in msg for f in FRAMEWORKS)


@pytest.mark.frameworks("torch")
def test_unsupported_dtype_is_named():
    with pytest.raises(bb.UnsupportedDtypeError, match="datetime64"):
        bb.convert(np.array(["2020-01-01"], dtype="datetime64[D]"), "torch")
    import torch

    # a torch dtype with no row in the table (fp8 has one now: tests/core/test_dtypes.py)
    with pytest.raises(bb.UnsupportedDtypeError, match="uint3"):
        bb.convert(torch.zeros(2, dtype=torch.uint8).view(torch.uint3), "numpy")


@pytest.mark.frameworks("torch")
def test_masked_array_is_refused():
    m = np.ma.masked_array(np.ones(3, BF16), mask=[0, 1, 0])
    with pytest.raises(bb.UnsupportedTypeError, match="mask"):
        bb.to_torch(m)


@pytest.mark.parametrize("to", ["pytroch", "mlx", ""])
def test_unknown_target(to):
    with pytest.raises(bb.UnknownFrameworkError) as err:
        bb.convert(np.zeros(2, BF16), to)
    assert "tensorflow (tf)" in str(err.value) and isinstance(err.value, ValueError)


@pytest.mark.frameworks("torch", "tensorflow")
def test_aliases():
    a = aligned_copy(_bf16((4,)))
    for alias, fw_name in [("np", "numpy"), ("pt", "torch"), ("tf", "tensorflow"), ("JAX", "jax")]:
        assert type_framework(bb.convert(a, alias)) == fw_name


# -- tensors with no memory of their own, or none at all -------------------------------------------------


@pytest.mark.frameworks("torch")
def test_torch_sparse_and_meta_get_clear_errors():
    import torch

    with pytest.raises(bb.UnsupportedTypeError, match="to_dense"):
        bb.to_numpy(torch.eye(3).to_sparse())
    with pytest.raises(bb.UnsupportedTypeError, match="meta"):
        bb.to_numpy(torch.empty(3, device="meta"))


def _tensors_without_memory():
    """torch tensors whose pointer is 0 or points at nothing they own (audit): each was moved
    "zero-copy" over garbage (a writable numpy array over the heap) or raised torch's own error"""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    freed = torch.ones(4, 8, dtype=torch.bfloat16)
    freed.untyped_storage().resize_(0)  # what FSDP does to a sharded parameter
    freed_offset = torch.ones(4, 8, dtype=torch.bfloat16)[1:]
    freed_offset.untyped_storage().resize_(0)
    short = torch.ones(8, dtype=torch.bfloat16)
    short.untyped_storage().resize_(8)  # half of what its 16 bytes need
    strided = torch.ones(4, 8, dtype=torch.bfloat16)[:, ::2]
    strided.untyped_storage().resize_(40)  # its last element needs bytes 52..53
    with FakeTensorMode():
        fake = torch.ones(3, dtype=torch.bfloat16)

    class Plain(torch.Tensor):  # a plain subclass holds memory of its own (review: told to convert what it holds)
        pass

    freed_subclass = torch.ones(4, dtype=torch.bfloat16).as_subclass(Plain)
    freed_subclass.untyped_storage().resize_(0)
    return {"freed": freed, "freed_subclass": freed_subclass, "freed_offset": freed_offset, "short": short, "strided_short": strided,
            "fake": fake, "zero": torch._efficientzerotensor(5, dtype=torch.bfloat16),
            "zero_offset": torch._efficientzerotensor(5, dtype=torch.bfloat16)[1:],
            "uninitialized": torch.nn.parameter.UninitializedParameter(dtype=torch.bfloat16)}


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dst", [d for d in TARGETS if d != "torch"])
@pytest.mark.parametrize("kind", ["freed", "freed_subclass", "freed_offset", "short", "strided_short", "fake", "zero", "zero_offset",
                                  "uninitialized"])
def test_torch_tensor_without_memory_is_refused(kind, dst):
    x = _tensors_without_memory()[kind]
    way_out = {"uninitialized": "run the module on one batch", "fake": "outside fake mode"}.get(kind, "summon_full_params")
    for _ in range(2):  # the second call may take the cached fast path
        with pytest.raises(bb.UnsupportedTypeError, match=way_out):
            bb.convert(x, dst)
    with pytest.raises(bb.UnsupportedTypeError, match=way_out):
        bb.plan(x, dst)


@pytest.mark.frameworks("torch")
def test_live_torch_tensors_keep_their_fast_key():
    """The memory check must not send a live tensor to the full path (review: nothing failed when
    fast_key gave no key at all; a frozen Parameter lost its key and took 3x as long)."""
    import torch

    adapter = registry.get("torch")
    base = torch.arange(64, dtype=torch.float32).to(torch.bfloat16)
    for x in (base, base[3:40], base.reshape(8, 8)[:, ::2], base.reshape(8, 8).T, base[:0],
              torch.nn.Parameter(base.clone(), requires_grad=False), torch.from_numpy(np.ones(9, np.float32))[2:]):
        assert adapter.fast_key(x, True) is not None, x.shape


@pytest.mark.frameworks("torch")
def test_a_wrapper_subclass_is_told_to_convert_what_it_holds():
    import torch
    from torch.testing._internal.two_tensor import TwoTensor

    t = TwoTensor(torch.ones(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16))
    # (review: it was told its storage was freed, and to clone it, which gives another wrapper)
    with pytest.raises(bb.UnsupportedTypeError, match="TwoTensor .a torch tensor subclass. has no memory of its own"):
        bb.to_numpy(t)


@pytest.mark.frameworks("torch")
def test_a_freed_tensor_does_not_take_a_plan_cached_for_a_live_one():
    import torch

    live = torch.ones(4, 8, dtype=torch.bfloat16)
    bb.to_numpy(live)
    bb.to_numpy(live)  # the plan for this key is cached now
    freed = torch.ones(4, 8, dtype=torch.bfloat16)
    freed.untyped_storage().resize_(0)
    with pytest.raises(bb.UnsupportedTypeError, match="storage was freed"):
        bb.to_numpy(freed)
    # an offset view: its pointer is not 0 (a zero tensor's: 2; a freed flat parameter's: its offset)
    live = torch.ones(5, dtype=torch.bfloat16)[1:]
    bb.to_numpy(live)
    bb.to_numpy(live)
    flat = torch.ones(64, dtype=torch.bfloat16)
    view = flat[33:37]
    flat.untyped_storage().resize_(0)
    for x in (torch._efficientzerotensor(5, dtype=torch.bfloat16)[1:], view):
        assert x.data_ptr() != 0
        with pytest.raises(bb.UnsupportedTypeError, match="storage was freed"):
            bb.to_numpy(x)


# -- symbolic and traced tensors ----------------------------------------------------------------------


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("dst", ["numpy", "torch", "jax"])
def test_tf_inside_tf_function_is_refused_before_any_gradient_question(dst):
    """Inside tf.function a tf input is symbolic: no data to move, refused with our error, tape
    or not (the bridge's functions, bb.bridge, are the way to cross there, gradients included)."""
    import tensorflow as tf

    v = tf.Variable(np.ones(3, BF16))

    @tf.function
    def f(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            for inp in (x, v):
                with pytest.raises(bb.UnsupportedTypeError, match="symbolic"):
                    bb.convert(inp, dst, on_alias="allow")
        return x

    f(tf.constant(np.ones(3, BF16)))


def test_jax_tracer_gets_a_clear_error():
    import jax

    def f(x):
        return bb.to_numpy(x)

    with pytest.raises(bb.UnsupportedTypeError, match="traced"):
        jax.jit(f)(make("jax", _bf16((3,))))


@pytest.mark.frameworks("torch")
def test_torch_func_wrappers_outside_bridge_get_our_error():
    import torch

    seen = []

    def f(x):
        with pytest.raises(bb.UnsupportedTypeError, match="torch.func transform") as err:
            bb.to_numpy(x)
        seen.append(err.value)
        return x.sum()

    torch.vmap(f)(torch.ones(2, 3))
    torch.func.grad(f)(torch.ones(3))
    assert len(seen) == 2
