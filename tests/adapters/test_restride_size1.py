"""A contiguous torch tensor whose size-1 dimension carries a stride no row-major array has (torch
leaves such a stride arbitrary) leaves as a row-major view of the same memory (the torch adapter's
describe): DLPack would hand the odd stride on, and a jax array over it is one numpy.asarray
copies, so torch -> jax -> numpy under copy=False would be refused although nothing needs a copy.
A plan the fast path kept for another tensor of the dtype never runs on such a tensor as it is; a plan
kept for such tensors gives each the row-major view first (and a tensor with row-major size-1
dimensions runs its kept plan as any other)."""

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, aligned_copy, bits, ptr

#: (shape, strides) of contiguous tensors whose size-1 dimensions have strides row-major would not give
ODD = [((4, 1, 4), (4, 99, 1)), ((1, 4), (0, 1)), ((4, 1), (1, 5)), ((2, 1, 1, 3), (3, 7, 1, 1)), ((1,), (7,))]


def _tensor(shape, strides, dtype):
    import torch

    # over a 64-byte aligned buffer, which jax takes without a copy
    values = np.arange(int(np.prod(shape)), dtype=np.float32) - 2.5
    if dtype == "bfloat16":
        base = torch.from_numpy(aligned_copy(values.astype(BF16).view(np.uint16))).view(torch.bfloat16)
    else:
        base = torch.from_numpy(aligned_copy(values))
    t = base.as_strided(shape, strides)
    assert t.is_contiguous() and t.stride() == strides
    return t


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape,strides", ODD, ids=str)
def test_torch_to_jax_to_numpy_stays_zero_copy(shape, strides, dtype):
    t = _tensor(shape, strides, dtype)
    for _ in range(2):  # (the second call runs the plan kept for such tensors: it restrides too)
        j = bb.convert(t, "jax", copy=False)
        a = bb.convert(j, "numpy", copy=False)
        assert ptr(j) == ptr(a) == t.data_ptr()
        np.testing.assert_array_equal(bits(a), bits(t))
    assert t.stride() == strides  # the input is left as it was: the row-major view is a new one


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.parametrize("shape,strides", ODD, ids=str)
def test_a_plan_kept_for_another_tensor_restrides_too(shape, strides):
    """A plain tensor of the dtype converts first (its plan is kept for the next of its kind)."""
    import torch

    bb.convert(torch.zeros(8, dtype=torch.bfloat16), "jax", copy=False)
    bb.convert(torch.zeros(8, dtype=torch.bfloat16), "jax", copy=False)
    t = _tensor(shape, strides, "bfloat16")
    a = bb.convert(bb.convert(t, "jax", copy=False), "numpy", copy=False)
    assert ptr(a) == t.data_ptr()
    np.testing.assert_array_equal(bits(a), bits(t))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape,strides", ODD, ids=str)
def test_numpy_results_get_row_major_strides(shape, strides, dtype):
    t = _tensor(shape, strides, dtype)
    a = bb.convert(t, "numpy", copy=False)
    assert ptr(a) == t.data_ptr()
    assert a.strides == np.empty(shape, a.dtype).strides  # row-major
    np.testing.assert_array_equal(bits(a), bits(t))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("to", ["numpy", "jax", "tensorflow", "torch"])
@pytest.mark.parametrize("grad", [False, True], ids=["plain", "requires_grad"])
def test_size_1_tensors_take_the_kept_plan_and_odd_ones_stay_apart(to, grad, torch_described):
    """Row-major and odd size-1 strides, each after the other: each kind keeps its own plan (nothing
    described again), and every result has the input's bits over its memory, row-major."""
    import torch

    plain = [_tensor((1, 4), (4, 1), "bfloat16"), _tensor((2, 1, 3), (3, 3, 1), "bfloat16")]
    odd = [_tensor((1, 4), (0, 1), "bfloat16"), _tensor((2, 1, 3), (3, 7, 1), "bfloat16")]
    if grad:
        plain, odd = [t.requires_grad_() for t in plain], [t.requires_grad_() for t in odd]
    kw = {"on_grad": "drop"}
    for t in (plain[0], odd[0]):  # each kind planned once
        bb.convert(t, to, **kw)
    torch_described.clear()
    for _ in range(2):
        for t in (*plain, *odd):
            y = bb.convert(t, to, **kw)
            a = y if to == "torch" else bb.convert(y, "numpy", on_alias="allow")  # (torch's: not torch_described here)
            np.testing.assert_array_equal(bits(a), bits(t.detach()))
            if to in ("numpy", "jax", "torch"):  # zero-copy both ways (tensorflow imports row-major only)
                assert ptr(a) == t.data_ptr(), (to, t.shape, t.stride())
            if to == "torch":
                assert y.stride() == tuple(np.empty(t.shape).strides[i] // 8 for i in range(t.dim()))
                assert not y.requires_grad
    assert not torch_described, [(tuple(t.shape), t.stride()) for t in torch_described]
