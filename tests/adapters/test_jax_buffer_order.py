"""A jax array imported over DLPack keeps its exporter's buffer order (a transpose, or another stride on
a size-1 dimension): numpy.asarray copies such an array, and tensorflow's DLPack import refuses it.
The jax adapter describes it as strided, so the plan says what the result is (a copy where one is
needed, zero-copy over DLPack where the target takes those strides), and the result agrees."""

import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fastpath
from conftest import bits, ptr

pytestmark = pytest.mark.frameworks("torch", "jax")


def _foreign(layout, dtype):
    """(a jax array over a torch buffer in another order than row-major, that torch tensor)."""
    import jax.numpy as jnp
    import torch

    base = torch.arange(1, 25, dtype=torch.float32).to(getattr(torch, dtype))
    t = {
        # issue 32's: shape [2], unsqueezed and transposed (a size-1 dimension of stride 2)
        "[2] unsqueezed, transposed": base[:2].unsqueeze(0).t(),
        "size-1 stride 99": base[:16].reshape(4, 4).unsqueeze(1).as_strided((4, 1, 4), (4, 99, 1)),
        "transposed": base[:12].reshape(3, 4).t(),
        "permuted 3-d": base.reshape(2, 3, 4).permute(2, 0, 1),
    }[layout]
    j = jnp.from_dlpack(t)
    assert ptr(j) == t.data_ptr(), "jax copied on import: the case this file needs is gone"
    if hasattr(j, "format"):  # jax 0.6 and later
        assert tuple(j.format.layout.major_to_minor) != tuple(range(j.ndim))
    else:  # jax 0.4.30: the order as text, minor to major
        assert repr(j.layout.device_local_layout) != f"DeviceLocalLayout({{{','.join(map(str, range(j.ndim)[::-1]))}}})"
    return j, t


LAYOUTS = ["[2] unsqueezed, transposed", "size-1 stride 99", "transposed", "permuted 3-d"]


def _knows_order():
    """Whether this jax says a buffer's order (Array.format, jax 0.6 and later): jax 0.4.30 does not,
    and its plan takes such an array as row-major; convert then says the copy it did not foresee."""
    import jax

    return hasattr(jax.numpy.zeros(1), "format")


def _converted(j, to, copy, fallback="error"):
    """(the result, or None where refused with CopyRequiredError; the copies convert said it made
    although its plan said zero-copy)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            y = bb.convert(j, to, copy=copy, fallback=fallback, on_alias="allow")
        except bb.CopyRequiredError as err:
            assert copy is False and "copy=None" in str(err), str(err)
            y = None
    return y, [str(w.message) for w in caught if "although the plan said zero-copy" in str(w.message)]


def _agrees(j, t, to, copy, fallback="error"):
    """Plan and result agree: both refuse (copy=False), or the result shares memory exactly where the
    plan says it does, with torch's bits. Where this jax does not say the order, the plan may say
    zero-copy: then the copy is said (copy=None) or refused (copy=False)."""
    try:
        p = bb.plan(j, to, copy=copy, fallback=fallback)
    except bb.CopyRequiredError:
        assert copy is False
        with pytest.raises(bb.CopyRequiredError):
            bb.convert(j, to, copy=copy, fallback=fallback, on_alias="allow")
        return None
    y, said = _converted(j, to, copy, fallback)
    if y is None or said:
        assert not _knows_order() and p.shares_memory, (str(p), said)
        return p
    assert p.shares_memory == (ptr(y) == ptr(j)), str(p)
    got = bits(y)
    assert got.dtype.itemsize == bits(t).dtype.itemsize
    np.testing.assert_array_equal(got.reshape(bits(t).shape), bits(t))
    return p


@pytest.mark.parametrize("copy", [None, True, False])
@pytest.mark.parametrize("to", ["numpy", "tensorflow", "torch"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_plan_and_result_agree(layout, dtype, to, copy):
    j, t = _foreign(layout, dtype)
    fastpath.clear()
    for _ in range(2):  # the second call takes the plan the first kept, if kept
        _agrees(j, t, to, copy)


def test_issue_32s_case_plans_the_copy_it_makes():
    """bf16 [2] from torch, unsqueezed and transposed, to numpy with fallback='bits': the plan said it
    shared memory, and the result was a copy."""
    j, t = _foreign("[2] unsqueezed, transposed", "bfloat16")
    if not _knows_order():
        y, said = _converted(j, "numpy", None, "bits")
        assert ptr(y) != ptr(j) and said
        return
    p = _agrees(j, t, "numpy", None, fallback="bits")
    assert p.copies and not p.shares_memory
    with pytest.raises(bb.CopyRequiredError, match="copy=None"):
        bb.plan(j, "numpy", copy=False, fallback="bits")


def test_float32_crosses_to_numpy_zero_copy_over_dlpack():
    """numpy.from_dlpack takes the strides numpy.asarray would copy: the route keeps zero-copy."""
    j, t = _foreign("transposed", "float32")
    if not _knows_order():
        assert _converted(j, "numpy", False)[0] is None
        return
    p = bb.plan(j, "numpy", copy=False)
    assert p.shares_memory and [s.label for s in p.steps] == ["numpy.from_dlpack"], str(p)
    y = bb.convert(j, "numpy", copy=False)
    assert ptr(y) == ptr(j) and not y.flags.writeable
    np.testing.assert_array_equal(y, t.numpy())


@pytest.mark.parametrize("to", ["numpy", "tensorflow"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_after_a_row_major_array_the_kept_plan_does_not_serve_it(dtype, to):
    """The fast path keys jax arrays by dtype and placement, not buffer order: a plan kept for a
    row-major array meets a foreign one. Under copy=False its pointer check (numpy.asarray) or
    tensorflow's refusal of the strides sends the input to the full path, which plans it; under
    copy=None the result is still right (tensorflow's raw error before)."""
    import jax.numpy as jnp

    j, t = _foreign("transposed", dtype)
    row_major = jnp.asarray(np.zeros(j.shape, dtype=np.asarray(j).dtype))
    for copy in (False, None):
        fastpath.clear()
        for _ in range(2):
            try:
                bb.convert(row_major, to, copy=copy, on_alias="allow")  # (the keywords _converted passes)
            except bb.CopyRequiredError:  # (jax 0.4.30's buffers are 16-byte aligned: tensorflow refuses them)
                assert not _knows_order()
        try:
            full = bb.plan(j, to, copy=copy)
        except bb.CopyRequiredError:
            with pytest.raises(bb.CopyRequiredError, match="copy=None"):
                bb.convert(j, to, copy=copy)
            continue
        y, said = _converted(j, to, copy)
        if y is None or said:  # a copy the plan could not foresee: refused, or said
            assert not _knows_order() and full.shares_memory
            continue
        np.testing.assert_array_equal(bits(y), bits(t))
        assert full.shares_memory == (ptr(y) == ptr(j)), str(full)
