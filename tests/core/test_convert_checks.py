"""convert's own checks: its keywords are checked before anything is planned or cached (our
InvalidArgumentError; an unknown keyword is a TypeError); copy=False does what the plan says, checked by
pointer, never a silent copy, one way for every call; a result is writable as its plan says."""

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, FRAMEWORKS, aligned_copy, bf16_ramp, bits, make, ptr


# -- argument errors are ours, found before anything is cached -------------------------------


@pytest.mark.parametrize("bad", [{"on_alias": "maybe"}, {"on_grad": "keep"}, {"on_alias": "copy", "copy": False}])
def test_alias_and_grad_keywords_are_checked(bad):
    with pytest.raises(bb.InvalidArgumentError):
        bb.convert(bf16_ramp(), "torch", **bad)


@pytest.mark.parametrize("kwargs", [{"copy": "yes"}, {"copy": 0}, {"copy": 1}, {"copy": np.False_},
                                    {"fallback": "float16"}, {"for_compute": True}, {"for_compute": "yes"}])
def test_bad_keywords_raise_our_error_before_anything_is_cached(kwargs):
    with pytest.raises(bb.InvalidArgumentError) as err:
        bb.convert(bf16_ramp(), "jax", **kwargs)
    assert isinstance(err.value, bb.Bf16BridgeError) and isinstance(err.value, ValueError)
    with pytest.raises(bb.InvalidArgumentError):
        bb.plan(bf16_ramp(), "jax", **kwargs)


def test_copy_zero_does_not_poison_copy_false():
    unaligned = aligned_copy(bf16_ramp(64), offset_bytes=2)
    with pytest.raises(bb.InvalidArgumentError):
        bb.to_jax(unaligned, copy=0)
    with pytest.raises(bb.CopyRequiredError):
        bb.to_jax(unaligned, copy=False)


def test_convert_takes_no_unknown_keywords():
    with pytest.raises(TypeError):
        bb.to_torch(bf16_ramp(), kopy=True)  # type: ignore[call-arg]


# -- copy=False and writability: what the plan says, the call does ----------------------------


@pytest.mark.frameworks("torch")
def test_zero_stride_torch_view_reaches_numpy_as_planned():
    import torch

    t = torch.arange(64, dtype=torch.bfloat16).as_strided((1, 2), (0, 1))
    j = bb.to_jax(t, copy=False)
    p = bb.plan(j, to="numpy", copy=False)
    y = bb.to_numpy(j, copy=False)  # shares, as the plan says, or raises: never a silent copy
    assert p.shares_memory and ptr(y) == ptr(j) == ptr(t)
    np.testing.assert_array_equal(bits(y), bits(t))


@pytest.mark.parametrize("dst", FRAMEWORKS)
def test_numpy_scalar_with_copy_false_is_decided_one_way(dst):
    outcomes = set()
    for i in range(64):
        try:
            bb.convert(np.float32(i), dst, copy=False)
            outcomes.add("ok")
        except bb.CopyRequiredError:
            outcomes.add("copy required")
    assert outcomes == {"copy required"}
    y = bb.convert(np.float32(3), dst)
    assert bits(y) == np.float32(3).view(np.uint32)


@pytest.mark.parametrize("dst", ["torch", "jax", "tensorflow"])
@pytest.mark.parametrize("copy", [None, True, False])
def test_structured_field_with_odd_stride_is_copied_or_refused(dst, copy):
    s = np.zeros(5, dtype=[("a", np.float32), ("c", np.complex64)])
    s["c"] = np.arange(5) + 1j * np.arange(5, 10)
    field = s["c"]
    assert field.strides == (12,)
    if copy is False:
        with pytest.raises(bb.CopyRequiredError, match="multiples"):
            bb.convert(field, dst, copy=False)
        return
    np.testing.assert_array_equal(bits(bb.convert(field, dst, copy=copy)), bits(np.ascontiguousarray(field)))


@pytest.mark.parametrize("src", ["jax", "tensorflow"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_empty_result_writability_matches_the_plan(src, dtype):
    mod = __import__("jax.numpy" if src == "jax" else src, fromlist=["zeros"])
    made = [make(src, np.zeros((0, 3), dtype=BF16 if dtype == "bfloat16" else dtype)),
            mod.zeros((0, 3), getattr(mod, dtype))]  # the framework's own empty tensor, too
    for x in made:
        y = bb.to_numpy(x)
        assert y.flags.writeable == bb.plan(x, to="numpy").writable
