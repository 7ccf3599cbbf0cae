"""What a bridged call says when it fails, and what it makes of a Python number result (issue 28, item 3):
our error names the argument or result by its path (``args[1]``, ``kwargs['y']``, ``result['loss']``) and the
keyword with where it goes (``bb.bridge("jax", fallback="auto")``), with our frames cut at the call; a
Python number comes back as a 0-d tensor of the caller (eagerly, under gradients, under a trace), or our
error naming it, never a framework's raw error."""

from __future__ import annotations

import os
import traceback

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bits, make

_OURS = os.path.dirname(os.path.abspath(bb.__file__)) + os.sep


def _our_frames(err: BaseException) -> list:
    """The frames of bf16bridge in ``err``'s traceback, and in those of what it chains (all a user sees)."""
    found, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        found += [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename).startswith(_OURS)]
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    return found


# -- errors name the argument, the keyword and where it goes; our frames stop at the call --------------


@pytest.mark.frameworks("torch", "jax")
def test_an_int64_label_names_its_argument_and_the_bridges_fallback_with_a_short_traceback():
    """The usual torch loop with a jax loss and int64 labels: convert's error from 15 frames down named
    neither the argument nor that fallback= goes to bb.bridge."""
    import jax.numpy as jnp
    import torch

    def loss(logits, labels):
        return -jnp.mean(jnp.take_along_axis(logits, labels[:, None], axis=1))

    logits = torch.randn(4, 3, requires_grad=True)
    labels = torch.tensor([0, 2, 1, 0])  # int64, which jax without x64 does not hold
    with pytest.raises(bb.UnsupportedDtypeError) as info:
        bb.bridge("jax")(loss)(logits, labels)
    message = str(info.value)
    assert "loss', args[1] (to jax): jax cannot hold int64" in message
    assert 'bb.bridge("jax", fallback="auto")' in message
    assert len(_our_frames(info.value)) <= 2, _our_frames(info.value)
    assert traceback.extract_tb(info.value.__traceback__)[0].filename == __file__  # the user's line first
    # and the way out works: labels narrowed to int32 (every value fits), the gradient flows
    out = bb.bridge("jax", fallback="auto")(loss)(logits, labels)
    out.backward()
    assert logits.grad is not None and logits.grad.shape == (4, 3)


@pytest.mark.frameworks("torch", "jax")
def test_keyword_and_nested_arguments_are_named_by_their_paths():
    import torch

    fn = bb.bridge("jax")(lambda batch, *, y: batch["x"] * 2 + y.sum())
    x, y = torch.ones(3), torch.ones(3, dtype=torch.float64)
    with pytest.raises(bb.UnsupportedDtypeError, match=r"kwargs\['y'\] \(to jax\): jax cannot hold float64"):
        fn({"x": x}, y=y)
    with pytest.raises(bb.UnsupportedDtypeError, match=r"args\[0\]\['x'\] \(to jax\)"):
        fn({"x": y}, y=x)


@pytest.mark.frameworks("torch", "jax")
def test_a_result_the_caller_cannot_hold_is_named_by_its_path():
    import torch

    fn = bb.bridge("torch")(lambda x: {"loss": x.sum(), "wide": x.to(torch.float64)})
    with pytest.raises(bb.UnsupportedDtypeError, match=r"result\['wide'\] \(to jax\): jax cannot hold float64") as info:
        fn(make("jax", np.ones(3, np.float32)))
    assert len(_our_frames(info.value)) <= 2


@pytest.mark.frameworks("torch", "jax")
def test_an_error_the_callee_itself_raises_keeps_its_frames():
    """A bb error raised inside the function (its own convert) is the function's: its line stays in view."""
    def inner(x):
        return bb.convert(np.ones(2, np.float64), "jax") + x  # jax without x64: our error, from the function

    with pytest.raises(bb.UnsupportedDtypeError) as info:
        bb.bridge("jax", jit=False)(inner)(make("torch", np.ones(2, np.float32)))
    assert "inner" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]


# -- a Python number result: a 0-d tensor of the caller, in every mode -----------------------------------


@pytest.mark.frameworks("torch", "jax")
def test_python_numbers_come_back_as_0d_tensors_of_the_caller_eagerly():
    """Eagerly a float came back as a float (and jax.jit's callee as a 0-d array: two answers)."""
    import torch

    fn = bb.bridge("jax", jit=False)(lambda x: {"y": x * 2, "f": float(x.sum()), "n": 7, "ok": True, "c": 1 + 2j})
    got = fn(torch.ones(3))
    assert isinstance(got["y"], torch.Tensor)
    for k, dtype, value in (("f", torch.float64, 3.0), ("n", torch.int64, 7), ("ok", torch.bool, True),
                            ("c", torch.complex128, 1 + 2j)):
        assert isinstance(got[k], torch.Tensor) and got[k].dtype == dtype and got[k].shape == ()
        assert got[k].item() == value
    # a value the caller's dtype would round is our error naming the result: jax without x64 holds float32
    import jax

    assert not jax.config.jax_enable_x64
    seventh = bb.bridge("torch")(lambda x: (x, x.sum().item() / 7))
    with pytest.raises(bb.UnsupportedDtypeError, match=r"Python float 0\.42857\d* at result\[1\]: .* here "
                                                       r"float32 \(jax holds no float64 here.*does not hold "
                                                       r"0\.42857\d* exactly"):
        seventh(make("jax", np.full(3, 1.0, np.float32)))
    half = bb.bridge("torch")(lambda x: (x, x.sum().item() / 6))(make("jax", np.ones(3, np.float32)))[1]
    assert half.dtype == np.float32 and float(half) == 0.5
    with pytest.raises(bb.UnsupportedDtypeError, match=r"Python int 1099511627776 at result.*int32"):
        bb.bridge("torch")(lambda x: 2 ** 40)(make("jax", np.ones(3, np.float32)))


@pytest.mark.frameworks("torch", "jax")
def test_a_python_number_under_a_torch_gradient_is_a_constant_not_jaxs_raw_error():
    """With requires_grad the jax callee runs under jax.vjp: a number it computed from a traced input was
    jax's raw ConcretizationTypeError from 13 frames down; a constant number is a 0-d tensor without grad."""
    import jax.numpy as jnp
    import torch

    x = torch.ones(3, requires_grad=True)
    loss, scale = bb.bridge("jax")(lambda x: (jnp.sum(x * x), 0.5))(x)
    assert scale.dtype == torch.float64 and not scale.requires_grad and scale.item() == 0.5
    (loss * scale).backward()
    assert torch.equal(x.grad, torch.ones(3))
    for jit in (False, None):
        fn = bb.bridge("jax", jit=jit)(lambda x: float(jnp.sum(x)))
        with pytest.raises(bb.UnsupportedTypeError) as info:
            fn(x)
        message = str(info.value)
        assert "used a traced value as a Python value at " in message and "float(jnp.sum(x))" in message
        assert "ConcretizationTypeError" in message and "jax.vjp" in message
        assert len(_our_frames(info.value)) <= 2 and info.value.__cause__ is None
    with pytest.raises(bb.UnsupportedTypeError,
                       match=r'compiles the function with jax.jit.*bb.bridge\("jax", jit=False\)'):
        fn(x.detach())  # no gradient: the compiled forward reads the traced value


@pytest.mark.frameworks("torch", "jax")
def test_a_torch_callees_item_under_jax_jit_is_a_0d_array_and_no_gradient_crosses_it():
    """Under jax.jit a torch callee's .item() was "gives no tensor result with any element"; now its number is
    a 0-d result computed each run, and a gradient asked through it is our error naming .item()."""
    import jax
    import jax.numpy as jnp

    fn = bb.bridge("torch")(lambda x: (x * 2, x.sum().item()))
    x = jnp.asarray(np.arange(3, dtype=np.float32))
    y, total = jax.jit(fn)(x)
    assert total.shape == () and total.dtype == jnp.float32 and float(total) == 3.0
    assert float(jax.jit(fn)(x + 1)[1]) == 6.0  # computed by the run, not the declaring call on zeros
    g = jax.grad(lambda x: fn(x)[0].sum())(x)  # the number unused: its zero cotangent is no error
    np.testing.assert_array_equal(np.asarray(g), np.full(3, 2.0, np.float32))
    with pytest.raises(Exception, match=r"returned a Python number at result\[1\] \(float\(\), int\(\), \.item\(\)"
                                        r".*jax asks for a gradient through it"):
        jax.block_until_ready(jax.grad(lambda x: fn(x)[1])(x))


@pytest.mark.frameworks("torch", "tensorflow")
def test_a_python_number_comes_to_a_tensorflow_caller_as_a_0d_tensor_in_and_out_of_tf_function():
    import tensorflow as tf

    fn = bb.bridge("torch")(lambda x: {"y": x, "n": int(x.sum().item())})
    x = make("tensorflow", np.arange(4, dtype=np.float32))
    for run in (fn, tf.function(fn)):
        got = run(x)["n"]
        assert isinstance(got, tf.Tensor) and got.dtype == tf.int64 and got.shape == () and int(got) == 6
    np.testing.assert_array_equal(bits(fn(x)["y"]), bits(x))
