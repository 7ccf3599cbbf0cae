"""Declared results (bf16bridge/functions/declared.py): a traced caller declares a bridged call's results
by one call on zeros before the callee runs; a result whose shape or non-tensor value depends on the
inputs' values, a batched result of another shape under vmap, and a tf.function without full shapes
are our errors, and a callee that fails on zeros is told why it was called so."""

from __future__ import annotations

import re

import numpy as np
import pytest

import bf16bridge as bb
from bridge_cases import _data, _layer
from conftest import make


def _traced(caller, fn):
    """``fn`` run as ``caller`` traces it: under jax.jit, or in a tf.function."""
    if caller == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn)


@pytest.mark.filterwarnings("ignore:numpy has no autodiff")  # traced, every float input may want a gradient
@pytest.mark.parametrize("callee", ["numpy", "torch"])
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_result_whose_shape_depends_on_the_values_is_refused_under_a_trace(caller, callee):
    """A traced caller declares the results by a call on zeros. a[a > 0] of zeros is empty: jax ran no
    callback for an all-empty result and handed back [] (the callee's real (3,) result and its side
    effects gone), tensorflow kept the static shape 0 while the data had 3 values. Asked again on
    ones, the shape differs: our error at trace time. a[a >= 0] is declared (4,) and gives (3,) when
    it runs: our error there (inside the runtime's own error type), where tensorflow took it as (4,)."""
    x = make(caller, np.array([1.0, -2.0, 3.0, 4.0], np.float32))
    positive = bb.bridge(callee)(lambda a: (a * 2, a[a > 0]))
    np.testing.assert_array_equal(np.asarray(bb.convert(positive(x)[1], "numpy")), [1, 3, 4])  # eagerly
    with pytest.raises(bb.UnsupportedTypeError, match=r"\(4,\) on ones \(result\[1\]\), but float32 of shape "
                                                      r"\(0,\) when its results were declared.*depends on the "
                                                      "inputs' values"):
        _traced(caller, positive)(x)
    nonneg = bb.bridge(callee)(lambda a: a[a >= 0])
    with pytest.raises(Exception, match=r"shape \(3,\) here \(result\), but float32 of shape \(4,\)") as info:
        bb.convert(_traced(caller, nonneg)(x), "numpy")
    assert "UnsupportedTypeError" in str(info.value) or isinstance(info.value, bb.UnsupportedTypeError)
    # empty on zeros and on ones: jax would run no callback (every result empty), so it cannot be checked
    # when it runs: our error at once; tensorflow runs it, and checks it there
    above_one = bb.bridge(callee)(lambda a: a[a > 1])
    with pytest.raises(Exception, match="gives no tensor result with any element" if caller == "jax" else
                       r"shape \(2,\) here \(result\), but float32 of shape \(0,\)"):
        bb.convert(_traced(caller, above_one)(x), "numpy")
    # a non-tensor result that differs on ones is our error too (the call on ones once swallowed it, and jax
    # handed back ([], 0) for ([1, 3, 4], 3)); a number would be a 0-d tensor: a string is not
    counted = bb.bridge(callee)(lambda a: (a[a > 0], str(int((a > 0).sum()))))
    with pytest.raises(bb.UnsupportedTypeError, match="around its tensors, but .* when its results were declared"):
        _traced(caller, counted)(x)


@pytest.mark.filterwarnings("ignore:numpy has no autodiff")  # traced, every float input may want a gradient
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_callee_that_fails_on_zeros_under_a_trace_says_why_it_was_called_so(caller):
    def inverse(a):
        if not a.all():
            raise ZeroDivisionError("a zero")
        return 1 / a

    fn = bb.bridge("numpy")(inverse)
    x = make(caller, np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(np.asarray(bb.convert(fn(x), "numpy")), [1.0, 0.5])  # eagerly
    with pytest.raises(ZeroDivisionError, match="a zero") as info:
        _traced(caller, fn)(x)
    assert any("declares its results before it runs" in n and "on zeros" in n for n in info.value.__notes__)
    import jax.numpy as jnp  # an error of ours there is no matter of zeros: no note

    with pytest.raises(bb.UnsupportedTypeError, match="returned a jax tensor") as info:
        _traced(caller, bb.bridge("numpy")(lambda a: jnp.asarray(a)))(x)
    assert not any("on zeros" in n for n in getattr(info.value, "__notes__", ()))  # (jax adds one of its own)


@pytest.mark.frameworks("torch")
def test_batched_results_of_another_shape_are_our_error():
    """Under vmap with a vectorized method the callee's batched results are not checked against the
    declared ones before they reach jax: one of another shape is our error naming the function (written
    into jax's buffer it would have been broadcast, or left unwritten)."""
    import jax
    import torch

    fn = bb.bridge("torch", vmap_method="broadcast_all")(lambda x: torch.sin(x).sum(0))  # sums the batch too
    X = make("jax", _data((5, 4), 6))
    if not bb.probe().frameworks["jax"].facts["pure_callback vmap_method"][0]:
        with pytest.raises(bb.UnsupportedTypeError, match="upgrade jax"):  # (jax 0.4.30: one batching rule)
            jax.vmap(fn)(X)
        return
    with pytest.raises(Exception, match=re.escape(
            "<lambda>' returned bfloat16 of shape (4,) under vmap (vmap_method='broadcast_all', result), "
            "where the batch's result is bfloat16 of shape (5,): with that method the function is handed the "
            "whole batch")):
        jax.block_until_ready(jax.vmap(fn)(X))


@pytest.mark.frameworks("tensorflow")
def test_tf_function_with_unknown_dimensions_is_refused_clearly():
    import tensorflow as tf

    fn = bb.bridge("jax")(_layer("jax"))
    step = tf.function(fn, input_signature=[tf.TensorSpec([4, 3], tf.bfloat16),
                                            tf.TensorSpec([None, 4], tf.bfloat16)])
    with pytest.raises(bb.UnsupportedTypeError, match="input_signature"):
        step(make("tensorflow", _data((4, 3), 1)), make("tensorflow", _data((2, 4), 2)))
