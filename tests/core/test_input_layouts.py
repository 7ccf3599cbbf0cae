"""Awkward layouts and memory: strided, reversed and broadcast inputs, buffers not 64-byte aligned (into
jax, torch and tensorflow, and unaligned tf tensors out), read-only memory, another byte order, an odd
address, 0-d and empty arrays. Each gives the right bits (a copy where needed, said so by plan) or our
CopyRequiredError under copy=False; the input is never modified, and a result outlives its source."""

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, FRAMEWORKS, aligned_copy, bits, make, ptr, type_framework
from input_cases import TARGETS, _bf16


def _expect(y, a):
    np.testing.assert_array_equal(bits(y), np.ascontiguousarray(a).view(np.uint16))


# -- strided, broadcast and reversed layouts ------------------------------------------------------


@pytest.mark.parametrize("dst", TARGETS)
@pytest.mark.parametrize("kind", ["transposed", "fortran", "negative", "stepped", "broadcast"])
def test_strided_numpy_inputs(kind, dst):
    base = aligned_copy(_bf16((6, 8)))
    a = {
        "transposed": base.T,
        "fortran": aligned_copy(base.T).T,  # column-major on a 64-byte boundary, so the outcome is fixed
        "negative": base[::-1, ::-2],
        "stepped": base[:, ::3],
        "broadcast": np.broadcast_to(base[:1], (6, 8)),
    }[kind]
    before = bits(a).copy()
    p = bb.plan(a, to=dst)
    y = bb.convert(a, dst)
    _expect(y, a)
    np.testing.assert_array_equal(bits(a), before)
    # broadcast_to gives a read-only array, which torch cannot hold without a copy
    if dst == "jax" and kind in ("transposed", "fortran") and _jax_keeps_a_bf16_transpose_of_numpy():
        assert not p.copies and ptr(y) == ptr(a), str(p)  # numpy 2.5's DLPack bf16 into a jax that keeps it
    elif dst in ("tensorflow", "jax") or (dst == "torch" and kind in ("negative", "broadcast")):
        assert p.copies, "this target takes no such layout without a copy"
        assert any(s.copies and s.reason for s in p.steps)
        with pytest.raises(bb.CopyRequiredError, match="copy=False"):
            bb.convert(a, dst, copy=False)
    elif dst == "torch":
        assert not p.copies and ptr(y) == ptr(a)


def _jax_keeps_a_bf16_transpose_of_numpy() -> bool:
    """Whether a transposed bf16 numpy array reaches jax without a copy: numpy exports bf16 over DLPack
    (NumPy 2.5's dtype registry) and this jax's import keeps a permuted buffer (its trial); else the
    route goes through uint16 and jax's bit-cast, which copies."""
    from bf16bridge.adapters.jax.probe import takes_permuted
    from bf16bridge.core import registry

    return "bfloat16" in registry.get("numpy").dlpack_export and takes_permuted()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dst", TARGETS)
@pytest.mark.parametrize("kind", ["transposed", "sliced"])
def test_strided_torch_inputs(kind, dst):
    import torch

    t = torch.from_numpy(aligned_copy(_bf16((8, 6))).view(np.uint16)).view(torch.bfloat16)
    x = t.T if kind == "transposed" else t[:, 1::2]
    y = bb.convert(x, dst)
    np.testing.assert_array_equal(bits(y), bits(x))
    p = bb.plan(x, to=dst)
    if dst == "jax" and kind == "transposed":  # zero-copy where this jax's import keeps a transpose (its trial)
        from bf16bridge.adapters.jax.probe import takes_permuted

        assert p.copies != takes_permuted() and (ptr(y) == ptr(x)) == takes_permuted(), str(p)
    elif dst in ("tensorflow", "jax"):
        assert p.copies
    elif dst == "numpy":
        assert not p.copies and ptr(y) == ptr(x) and tuple(y.strides) != (12, 2)


# -- buffers not 64-byte aligned: into jax, torch and tensorflow, and out of tensorflow -------------


@pytest.mark.parametrize("src", ["numpy", "torch", "tensorflow"])
@pytest.mark.parametrize("offset", [2, 16, 32])
def test_unaligned_buffer_into_jax_copies_and_says_so(src, offset):
    a = aligned_copy(_bf16((1000,)), offset_bytes=offset)
    x = a
    if src == "torch":
        import torch

        x = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    if src == "tensorflow":
        import tensorflow as tf

        # what a raw DLPack import makes (bf16bridge would have copied): a tf tensor that
        # aborts the process in any tf kernel; the bridge must get it out without running one
        x = tf.bitcast(tf.experimental.dlpack.from_dlpack(a.view(np.uint16).__dlpack__()), tf.bfloat16)
        assert ptr(x) == ptr(a)
    p = bb.plan(x, to="jax")
    assert p.copies and "aligned" in " ".join(s.reason for s in p.steps)
    y = bb.convert(x, "jax")
    _expect(y, a)
    with pytest.raises(bb.CopyRequiredError, match="64-byte aligned"):
        bb.convert(x, "jax", copy=False)


def _unaligned_source(src, a):
    """``a`` (an ALIGN-aligned or unaligned numpy buffer) as a ``src`` tensor over the same memory."""
    if src == "torch":
        import torch

        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    import tensorflow as tf

    # a raw DLPack import: tensorflow's own allocations are aligned
    return tf.bitcast(tf.experimental.dlpack.from_dlpack(a.view(np.uint16).__dlpack__()), tf.bfloat16)


@pytest.mark.frameworks("jax")
@pytest.mark.parametrize("src", ["torch", "tensorflow"])
@pytest.mark.parametrize("copy", [None, False])
def test_unaligned_input_after_aligned_ones_into_jax_is_copied_as_plan_says(src, copy):
    """convert's hot path keys a zero-copy route into jax without the input's alignment where jax's
    import refuses an unaligned buffer (Adapter.importer_aligned: no pointer read each call): an
    unaligned input of a kind whose aligned ones were served from the cache is planned afresh."""
    aligned = aligned_copy(_bf16((1000,)))
    unaligned = aligned_copy(_bf16((1000,), seed=1), offset_bytes=2)
    xa, xu = _unaligned_source(src, aligned), _unaligned_source(src, unaligned)
    for _ in range(2):  # the second from the cache
        y = bb.convert(xa, "jax", copy=copy)
        assert ptr(y) == ptr(aligned)
        _expect(y, aligned)
    assert bb.plan(xu, to="jax", copy=copy if copy is not False else None).copies
    if copy is False:
        with pytest.raises(bb.CopyRequiredError, match="64-byte aligned"):
            bb.convert(xu, "jax", copy=False)
    else:
        y = bb.convert(xu, "jax")
        _expect(y, unaligned)
        assert ptr(y) != ptr(unaligned) and ptr(y) % 64 == 0
    y = bb.convert(xa, "jax", copy=copy)  # and the aligned kind is still served zero-copy
    assert ptr(y) == ptr(aligned)


@pytest.mark.frameworks("jax")
@pytest.mark.parametrize("src", ["torch", "tensorflow"])
def test_unaligned_leaf_among_aligned_ones_into_jax_in_a_tree_or_a_bridged_call(src):
    """The same for leaves converted together (convert_tree looks the cache up once per type of
    leaf; a bridged call converts its arguments one by one): the unaligned leaf is planned afresh and
    copied, the aligned ones around it are served zero-copy."""
    aligned = aligned_copy(_bf16((1000,)))
    unaligned = aligned_copy(_bf16((1000,), seed=1), offset_bytes=2)
    xa, xu = _unaligned_source(src, aligned), _unaligned_source(src, unaligned)
    bb.convert(xa, "jax")  # the aligned kind's plan, cached
    ya, yu, yb = bb.convert_tree([xa, xu, xa], "jax")
    seen: list = []
    bb.bridge("jax", jit=False)(lambda a, b, c: seen.extend((a, b, c)) or a + b + c)(xa, xu, xa)
    for got in ((ya, yu, yb), seen):
        _expect(got[0], aligned)
        _expect(got[1], unaligned)
        _expect(got[2], aligned)
        assert ptr(got[0]) == ptr(got[2]) == ptr(aligned)
        assert ptr(got[1]) != ptr(unaligned) and ptr(got[1]) % 64 == 0


@pytest.mark.frameworks("jax", "torch")
def test_a_zero_copy_import_into_jax_never_copies_an_unaligned_buffer():
    """The step plan() shows as jax's zero-copy import, handed a buffer not 64-byte aligned (what a
    cache key that did not read the alignment would hand it), refuses it (our CopyRequiredError,
    which convert answers by planning afresh) where jax can be asked not to copy: jax's own import
    copied it silently, and the plan served said zero-copy."""
    from bf16bridge.core import registry

    [step] = bb.plan(_unaligned_source("torch", aligned_copy(_bf16((1000,)))), to="jax").steps
    assert step.kind == "dlpack" and not step.copies
    a = aligned_copy(_bf16((1000,)), offset_bytes=2)
    if registry.get("jax").importer_aligned() is None:  # jax 0.4.30 takes it as it is: keys read alignment
        _expect(step.run(_unaligned_source("torch", a)), a)
        return
    with pytest.raises(bb.CopyRequiredError, match="not 64-byte aligned"):
        step.run(_unaligned_source("torch", a))


@pytest.mark.frameworks("jax", "tensorflow")
@pytest.mark.parametrize("copy", [None, False, True])
def test_an_empty_unaligned_tf_tensor_into_jax_is_planned_as_it_is_converted(copy):
    """An empty tf tensor over an unaligned pointer (imported zero-copy from numpy) was described as
    aligned (it has no bytes), and jax's import, which refuses an unaligned buffer empty or not,
    raised our internal UnalignedImport where plan() said zero-copy (found by the property tests)."""
    x = bb.convert(aligned_copy(_bf16((8,)), offset_bytes=2)[:0].view(np.uint16).reshape(2, 0), "tensorflow")
    said = []
    for call in (bb.plan, bb.convert):
        try:
            said.append(call(x, "jax", copy=copy))
        except bb.Bf16BridgeError as err:
            said.append(err)
    p, y = said
    # (whether tensorflow kept numpy's unaligned pointer for an empty buffer varies from run to run)
    if isinstance(p, Exception) or isinstance(y, Exception):  # refused alike, with the public error
        assert copy is False and type(p) is type(y) is bb.CopyRequiredError, said
        return
    assert isinstance(p, bb.Plan) and y.shape == (2, 0) and str(y.dtype) == "uint16"


@pytest.mark.frameworks("jax", "tensorflow")
def test_an_empty_tf_tensors_fast_key_reads_its_alignment_as_describe_does():
    """convert's fast key called every empty tf tensor unaligned while describe read its pointer: an
    unaligned empty one (jax 0.4.30's, imported zero-copy) took the zero-copy plan cached for an
    aligned one, which plan() refused under copy=False (found by the property tests at the oldest
    versions). The key and the description must say the same."""
    import jax.numpy as jnp
    import tensorflow as tf

    from bf16bridge.adapters.tensorflow.convert import ADAPTER

    empties = [tf.zeros((0,), tf.bfloat16), tf.zeros((2, 0), tf.uint16),
               bb.convert(jnp.zeros((0, 3), jnp.bfloat16), "tensorflow"),
               bb.convert(aligned_copy(_bf16((8,)), offset_bytes=2)[:0], "tensorflow")]
    for x in empties:
        assert ADAPTER.fast_key(x, True)[3] == ADAPTER.describe(x).aligned, x


@pytest.mark.frameworks("jax", "tensorflow")
def test_a_buffer_described_aligned_that_is_not_is_copied_not_refused(monkeypatch):
    """Where a source describes a buffer as aligned that jax's import finds is not (a property test
    found one tf scalar so, once), convert plans it again as unaligned: the bits arrive, copied, and
    copy=False gets the public CopyRequiredError, not the internal UnalignedImport."""
    from bf16bridge.core import registry

    if registry.get("jax").importer_aligned() is None:  # (jax 0.4.30: no refusing import to find it)
        return
    adapter = type(registry.get("tensorflow"))
    real = adapter.describe
    monkeypatch.setattr(adapter, "describe", lambda self, x, **kw: real(self, x, **kw)._replace(aligned=True))
    a = aligned_copy(_bf16((1000,)), offset_bytes=2)
    for _ in range(2):  # the second from the cache, keyed without the alignment
        _expect(bb.convert(_unaligned_source("tensorflow", a), "jax"), a)
        with pytest.raises(bb.CopyRequiredError) as info:
            bb.convert(_unaligned_source("tensorflow", a), "jax", copy=False)
        assert type(info.value) is bb.CopyRequiredError, repr(info.value)


@pytest.mark.frameworks("jax", "tensorflow")
def test_aligned_tf_tensors_into_jax_read_no_pointer_once_warm(monkeypatch):
    """tensorflow has no cheap data pointer (a DLPack capsule each): where jax's import refuses an
    unaligned buffer itself, the hot path of tf -> jax reads none (it cost about 4 us a tensor in a
    bridged call)."""
    from bf16bridge.core import registry
    from bf16bridge.adapters.tensorflow import convert as tf_adapter

    x = _unaligned_source("tensorflow", aligned_copy(_bf16((64, 64))))
    bb.convert(x, "jax")
    reads = []
    real = tf_adapter._pointer_capsule
    monkeypatch.setattr(tf_adapter, "_pointer_capsule", lambda t: reads.append(1) or real(t))
    y = bb.convert(x, "jax")
    assert ptr(y) == ptr(x)
    assert len(reads) == (0 if registry.get("jax").importer_aligned() is not None else 1)


@pytest.mark.frameworks("torch")
def test_unaligned_buffer_into_torch_stays_zero_copy():
    a = aligned_copy(_bf16((1000,)), offset_bytes=2)
    y = bb.convert(a, "torch", copy=False)
    assert ptr(y) == ptr(a)
    _expect(y, a)
    y.float().sum()  # torch computes on an unaligned tensor too


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("src", ["numpy", "torch"])
@pytest.mark.parametrize("offset", [2, 32])
def test_unaligned_buffer_into_tensorflow_is_copied_so_tf_can_compute(src, offset):
    import tensorflow as tf

    a = aligned_copy(_bf16((1000,)), offset_bytes=offset)
    x = a if src == "numpy" else bb.to_torch(a)
    p = bb.plan(x, to="tensorflow")
    assert p.copies and any("not 64-byte aligned" in s.reason for s in p.steps)
    y = bb.convert(x, "tensorflow")
    _expect(y, a)
    # a tf tensor over an unaligned buffer aborts the process in the first kernel
    # ("Check failed: IsAligned()"); the copy is what makes these calls safe
    tf.raw_ops.DeepCopy(x=y)
    float(tf.reduce_sum(tf.cast(y, tf.float32)))
    with pytest.raises(bb.CopyRequiredError, match="64-byte aligned"):
        bb.convert(x, "tensorflow", copy=False)


@pytest.mark.frameworks("tensorflow")
def test_unaligned_tf_tensor_leaves_without_running_a_tf_kernel():
    import tensorflow as tf

    a = aligned_copy(_bf16((1000,)), offset_bytes=2)
    x = tf.bitcast(tf.experimental.dlpack.from_dlpack(a.view(np.uint16).__dlpack__()), tf.bfloat16)
    for dst in ("numpy", "torch"):
        y = bb.convert(x, dst, copy=False, on_alias="allow")
        assert ptr(y) == ptr(a)
    y = bb.convert(x, "tensorflow", copy=True)  # an aligned, safe copy
    _expect(y, a)
    float(tf.reduce_sum(tf.cast(y, tf.float32)))


@pytest.mark.frameworks("tensorflow")
def test_unaligned_tf_tensor_is_copied_outside_tensorflow_as_plan_shows():
    import tensorflow as tf

    a = aligned_copy(_bf16((1000,)), offset_bytes=2)
    x = tf.bitcast(tf.experimental.dlpack.from_dlpack(a.view(np.uint16).__dlpack__()), tf.bfloat16)
    p = bb.plan(x, to="tensorflow", copy=True)
    assert [s.framework for s in p.steps if s.copies] == ["numpy"], str(p)
    y = bb.convert(x, "tensorflow", copy=True)
    _expect(y, a)
    assert ptr(y) != ptr(a) and ptr(y) % 64 == 0
    float(tf.reduce_sum(tf.cast(y, tf.float32)))  # a tf kernel on the result: aligned, safe


@pytest.mark.parametrize("dst", ["jax", "tensorflow"])
def test_aligned_empty_makes_numpy_arrays_that_cross_without_a_copy(dst):
    a = bb.aligned_empty((33, 7))
    assert a.dtype == BF16 and a.shape == (33, 7) and ptr(a) % 64 == 0
    a[...] = _bf16((33, 7))
    y = bb.convert(a, dst, copy=False)
    assert ptr(y) == ptr(a)
    assert bb.aligned_empty(5, np.float32).dtype == np.float32


# -- read-only memory -------------------------------------------------------------------------------


@pytest.mark.frameworks("torch")
def test_readonly_numpy_into_torch_copies():
    a = aligned_copy(_bf16((64,)))
    a.flags.writeable = False
    p = bb.plan(a, to="torch")
    assert p.copies and p.writable
    assert any("read-only" in s.reason for s in p.steps if s.copies)
    y = bb.convert(a, "torch")
    _expect(y, a)
    assert ptr(y) != ptr(a)
    y[0] = 1.0  # writable and detached from the read-only source
    assert bits(a)[0] == _bf16((64,)).view(np.uint16)[0]
    with pytest.raises(bb.CopyRequiredError, match="read-only"):
        bb.convert(a, "torch", copy=False)


@pytest.mark.parametrize("dst", ["jax", "tensorflow"])
def test_readonly_numpy_into_immutable_frameworks_is_zero_copy(dst):
    a = aligned_copy(_bf16((64,)))
    a.flags.writeable = False
    y = bb.convert(a, dst, copy=False)
    assert ptr(y) == ptr(a)
    _expect(y, a)
    assert not a.flags.writeable


@pytest.mark.parametrize("src", ["jax", "tensorflow"])
def test_immutable_sources_give_readonly_numpy(src):
    x = make(src, _bf16((16,)))
    y = bb.to_numpy(x)
    assert not y.flags.writeable and not bb.plan(x, to="numpy").writable
    assert ptr(y) == ptr(x)
    with pytest.raises(ValueError):
        y[0] = 1


@pytest.mark.frameworks("torch")
def test_readonly_mark_is_not_laundered_through_another_framework():
    # jax -> numpy is read-only; that numpy array into torch must copy
    y = bb.to_numpy(make("jax", _bf16((16,))))
    p = bb.plan(y, to="torch")
    assert p.copies and p.writable


# -- byte order, element alignment, empty and 0-d arrays, lifetimes ----------------------------------


@pytest.mark.parametrize("dst", ["torch", "jax", "tensorflow"])
def test_big_endian_numpy_is_copied_to_native_order(dst):
    a = (np.arange(6, dtype=np.float32) - 2.5).astype(">f4")
    p = bb.plan(a, to=dst)
    assert p.copies and "byte order" in p.steps[0].reason
    y = bb.convert(a, dst)
    np.testing.assert_array_equal(bits(y), a.astype("<f4").view(np.uint32))
    with pytest.raises(bb.CopyRequiredError, match="byte order"):
        bb.convert(a, dst, copy=False)


@pytest.mark.parametrize("dst", ["torch", "jax", "tensorflow"])
def test_element_misaligned_numpy_is_copied(dst):
    raw = np.zeros(1 + 2 * 16, dtype=np.uint8)
    a = raw[1:].view(np.uint16).view(BF16)  # an odd address
    a[...] = _bf16((16,))
    assert not a.flags.aligned
    assert "aligned to its element size" in bb.plan(a, to=dst).steps[0].reason
    _expect(bb.convert(a, dst), a)


@pytest.mark.parametrize("src", FRAMEWORKS)
@pytest.mark.parametrize("dst", TARGETS)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2)])
def test_zero_d_and_empty(src, dst, shape):
    a = _bf16(shape) if shape == () else np.zeros(shape, dtype=BF16)
    x = make(src, a)
    y = bb.convert(x, dst, on_alias="allow")
    assert tuple(y.shape) == shape and type_framework(y) == dst
    _expect(y, a)


@pytest.mark.parametrize("src,dst", [(s, d) for s in FRAMEWORKS for d in FRAMEWORKS if s != d])
def test_result_outlives_its_source(src, dst):
    import gc

    a = _bf16((1000,), seed=3)
    x = make(src, a)
    y = bb.convert(x, dst, on_alias="allow")
    del x
    gc.collect()
    _ = [np.ones(1000, np.uint16) * 7 for _ in range(50)]  # reuse freed memory, if any was freed
    _expect(y, a)
