"""Inputs whose size a framework cannot hold are our errors, naming the input and the way out, never a
framework's raw error: a torch view whose shape spans more bytes than numpy can address (numpy's
"array is too big", even zero-copy), and a numpy array of a dtype with no bytes (jax's float0, whose
itemsize 0 made the fast path's alignment check divide by zero)."""

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fastpath
from bf16bridge.errors import ShapeTooLargeError
from conftest import aligned_copy


@pytest.fixture
def huge_view():
    import torch

    # 2**62 elements of 2 bytes over one: numpy can describe no array of 2**63 bytes, a view neither
    return torch.zeros(1, dtype=torch.bfloat16).expand(2**31, 2**31)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("copy", [None, False])
def test_a_view_numpy_cannot_address_is_our_error(huge_view, copy):
    for call in (bb.plan, bb.convert):
        with pytest.raises(ShapeTooLargeError) as err:
            call(huge_view, "numpy", copy=copy)
        said = str(err.value)
        assert isinstance(err.value, ValueError) and isinstance(err.value, bb.Bf16BridgeError)
        assert "numpy cannot describe this [2147483648x2147483648] bfloat16 input" in said, said
        assert "9,223,372,036,854,775,807" in said and "un-broadcast" in said, said


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("to", ["numpy", "jax", "tensorflow"])
def test_its_copy_is_refused_before_allocating(huge_view, to):
    """copy=True (and any target that must copy it) says the copy is larger than this machine."""
    copies = [True] + ([None] if to != "numpy" else [])
    for copy in copies:
        with pytest.raises(bb.CopyTooLargeError, match="un-broadcast"):
            bb.convert(huge_view, to, copy=copy)


def _float0(shape):
    import jax

    return np.zeros(shape, dtype=jax.dtypes.float0)


@pytest.mark.frameworks("jax")
@pytest.mark.parametrize("shape", [(3,), (2, 3), ()])
@pytest.mark.parametrize("to", ["numpy", "torch", "jax", "tensorflow"])
def test_a_dtype_of_no_bytes_is_our_error(to, shape):
    a = aligned_copy(np.zeros(8, dtype=np.float32))
    for _ in range(2):  # a plan kept for numpy arrays of this target: the fast path reads the next one's key
        bb.convert(a, to)
    assert fastpath.plans(np.ndarray, to, None, "error", False, "warn", "warn", None) is not None or to == "numpy"
    for _ in range(2):
        with pytest.raises(bb.UnsupportedDtypeError, match=r"numpy array of dtype \[\('float0', 'V'\)\] is not moved"):
            bb.convert(_float0(shape), to)
    with pytest.raises(bb.UnsupportedDtypeError):
        bb.plan(_float0(shape), to)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("to", ["numpy", "jax", "tensorflow"])
def test_after_a_small_view_of_its_kind_the_huge_one_is_still_our_error(huge_view, to):
    """A plan kept for a small expanded view (zero-copy into numpy, a copy into jax and tensorflow)
    runs the planner's size checks on the next view of its kind before anything else."""
    import torch

    small = torch.zeros(1, dtype=torch.bfloat16).expand(4, 4)
    for _ in range(2):
        bb.convert(small, to)
    error = ShapeTooLargeError if to == "numpy" else bb.CopyTooLargeError
    with pytest.raises(error, match="un-broadcast"):
        bb.convert(huge_view, to)
