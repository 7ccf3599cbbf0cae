"""A plan says when converting depends on the data it cannot see (``Plan.depends_on_values``, a
"values:" line of str(plan), to_dict()): fallback='auto''s checked narrowing of int64 to int32 (jax
without x64), refused when a value does not fit; a packing step, refused on a byte no ml_dtypes value
has. A plan that holds whatever the values says nothing of them."""

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from conftest import aligned_copy
from strategies import lacks


@pytest.fixture
def no_x64():
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.frameworks("jax")
@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_the_checked_narrowing_says_the_values_decide(no_x64, dtype):
    small = aligned_copy(np.arange(4, dtype=dtype))
    p = bb.plan(small, "jax", fallback="auto")
    narrow = {"int64": "int32", "uint64": "uint32"}[dtype]
    assert p.dtype_out == narrow and [s.kind for s in p.steps][0] == "narrow", str(p)
    assert p.depends_on_values == (f"the narrowing to {narrow} refuses any value outside {narrow} "
                                   "(UnsupportedDtypeError when converting)")
    assert f"  values: {p.depends_on_values}; the plan cannot see them" in str(p).splitlines()
    assert p.to_dict()["depends_on_values"] == p.depends_on_values
    np.testing.assert_array_equal(np.asarray(bb.convert(small, "jax", fallback="auto")), np.arange(4))
    big = aligned_copy(np.array([0, 2**40], dtype=dtype))
    assert bb.plan(big, "jax", fallback="auto").depends_on_values == p.depends_on_values
    with pytest.raises(bb.UnsupportedDtypeError, match="only when every value fits"):
        bb.convert(big, "jax", fallback="auto")


@pytest.mark.frameworks("torch")
def test_a_packing_says_the_bytes_decide():
    if lacks("float4_e2m1fn"):  # (an ml_dtypes before 0.5: our error naming the one that has it, asserted)
        return
    a = aligned_copy(np.zeros(4, dtype=ml_dtypes.float4_e2m1fn))
    p = bb.plan(a, "torch")
    assert "pack" in [s.kind for s in p.steps], str(p)
    assert "packing refuses a byte whose high bits are set" in p.depends_on_values
    assert "values:" in str(p)


@pytest.mark.parametrize("to", ["numpy", "torch", "jax", "tensorflow"])
def test_a_plan_that_holds_whatever_the_values_says_nothing(to):
    for a in (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)):
        p = bb.plan(aligned_copy(a), to, fallback="auto")
        assert p.depends_on_values is None and "values:" not in str(p), str(p)
