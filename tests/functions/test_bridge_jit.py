"""A bridged jax function compiled (issue 28, item 4): ``bb.bridge("jax")`` traces the forward and the vjp once
per signature with ``jax.jit`` (``jit=False`` runs it as written), non-tensor arguments are static, and the
results and gradients are jax's own compiled ones, bit for bit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bridge_cases import _callee_vjp, _data, _layer, native_vjp
from conftest import bits, make

pytestmark = pytest.mark.frameworks("torch", "jax")


def _counted(seen: list):
    """tanh(x @ w) * scale, noting each time jax traces (or runs) it: a side effect runs once per trace."""
    import jax.numpy as jnp

    def f(w, x, scale=1.0):
        seen.append(type(x).__name__)
        return jnp.tanh(x @ w) * scale

    return f


def test_the_callee_is_traced_once_per_signature_forward_and_vjp():
    import torch

    seen: list = []
    fn = bb.bridge("jax")(_counted(seen))
    w, x = make("torch", _data((4, 3), 1)), make("torch", _data((2, 4), 2))
    for _ in range(4):
        fn(w, x)
    assert len(seen) == 1 and "Tracer" in seen[0]  # (a jit tracer: compiled, not run as written)
    w.requires_grad_()
    for _ in range(4):
        fn(w, x).float().sum().backward()
    assert len(seen) == 2  # the vjp's own trace, once
    fn(w, make("torch", _data((5, 4), 3)))  # a new shape: traced again
    assert len(seen) == 3
    with torch.no_grad():
        fn(w, x, 2.0)  # a new static value: traced again, once
        fn(w, x, 2.0)
    assert len(seen) == 4


def test_jit_false_runs_the_function_as_written_each_call():
    seen: list = []
    fn = bb.bridge("jax", jit=False)(_counted(seen))
    w, x = make("torch", _data((4, 3), 1)), make("torch", _data((2, 4), 2))
    for _ in range(3):
        fn(w, x)
    assert seen == ["ArrayImpl"] * 3  # concrete arrays, every call


@pytest.mark.parametrize("caller", ["torch", "tensorflow", "numpy"])
def test_results_and_gradients_are_jaxs_compiled_ones_bit_for_bit(caller):
    """The forward equals jax.jit(f), the gradients jax.jit(jax.vjp(f)) applied by a jax.jit, bit for bit; with
    jit=False, f and jax.vjp(f) as written (XLA's fused code may round tanh(x @ w) differently: jax 0.4.30)."""
    import jax

    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    f = _layer("jax")
    for jit, as_run in ((None, jax.jit(f)), (False, f)):
        got = bb.bridge("jax", jit=jit)(f)(make(caller, w), make(caller, x))
        np.testing.assert_array_equal(bits(got), bits(as_run(make("jax", w), make("jax", x))))
    if caller != "torch":
        return
    import torch

    for jit in (None, False):
        want_dw, want_dx = _callee_vjp("jax", w, x, ct, compiled=jit is None)
        W, X = (make("torch", v).requires_grad_() for v in (w, x))
        dw, dx = torch.autograd.grad(bb.bridge("jax", jit=jit)(f)(W, X), (W, X), make("torch", ct))
        np.testing.assert_array_equal(bits(dw), bits(want_dw))
        np.testing.assert_array_equal(bits(dx), bits(want_dx))


def test_non_tensor_arguments_are_static_and_static_arguments_are_checked():
    import jax.numpy as jnp
    import torch

    def f(x, mode, *, power=2):
        if mode == "sum":  # Python control flow on a static value: fine under jit
            return jnp.sum(x ** power)
        return x ** power

    fn = bb.bridge("jax", static_argnums=(1,), static_argnames=("power",))(f)
    x = torch.arange(4, dtype=torch.float32)
    assert fn(x, "sum").item() == 14.0 and fn(x, "sum", power=3).item() == 36.0
    assert torch.equal(fn(x, "each"), x ** 2)
    with pytest.raises(bb.InvalidArgumentError, match=r"args\[1\] is named static .* holds a tensor"):
        fn(x, x)
    with pytest.raises(bb.InvalidArgumentError, match=r"kwargs\['power'\] is named static .* holds a tensor"):
        fn(x, "sum", power=x)
    with pytest.raises(bb.InvalidArgumentError, match="static_argnums="):
        bb.bridge("jax", static_argnums=("x",))(f)


def test_jit_true_on_a_callee_that_compiles_nothing_is_refused():
    fn = bb.bridge("torch", jit=True)(lambda x: x * 2)
    with pytest.raises(bb.InvalidArgumentError, match=r"jit=True\): bf16bridge compiles only a jax callee"):
        fn(make("jax", np.ones(3, np.float32)))
    with pytest.raises(bb.InvalidArgumentError, match="jit="):
        bb.bridge("jax", jit="yes")


def test_an_unhashable_argument_runs_uncompiled_and_says_so_once():
    import jax.numpy as jnp

    class Config:  # compared by value, not hashable: cannot be a compiled-in constant
        def __init__(self, k):
            self.k = k

        def __eq__(self, other):
            return self.k == other.k

        __hash__ = None  # type: ignore[assignment]

    seen: list = []

    def f(x, c):
        seen.append(type(x).__name__)
        return jnp.sum(x) * c.k

    fn = bb.bridge("jax")(f)
    x = make("torch", np.ones(3, np.float32))
    with pytest.warns(bb.Bf16BridgeWarning, match="cannot be hashed.*runs as written"):
        assert fn(x, Config(2)).item() == 6.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fn(x, Config(3)).item() == 9.0
    assert seen == ["ArrayImpl", "ArrayImpl"]


def test_many_compiled_signatures_warn_once():
    import jax.numpy as jnp

    from bf16bridge.functions.compiled import SIGNATURES_WARNED

    fn = bb.bridge("jax")(lambda x, k: jnp.sum(x) * k)
    x = make("torch", np.ones(2, np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(SIGNATURES_WARNED + 2):
            fn(x, k)
    said = [w for w in caught if issubclass(w.category, bb.Bf16BridgeWarning)]
    assert len(said) == 1 and "compiled for" in str(said[0].message) and "as a tensor" in str(said[0].message)


def test_what_a_trace_gives_beside_tensors_is_kept_per_shape():
    """A number or a tree fixed by the input shapes (x.shape[0]) comes from the trace of that shape, whichever
    shape was traced last."""
    fn = bb.bridge("jax")(lambda x: {"y": x * 2, "n": x.shape[0], "tag": f"rows={x.shape[0]}"})
    for n in (2, 3, 2, 3):
        got = fn(make("torch", np.ones(n, np.float32)))
        assert got["n"].item() == n and got["tag"] == f"rows={n}" and got["y"].shape == (n,)


def test_a_scalar_losss_gradient_comes_with_the_forward_and_again_for_any_other_cotangent():
    """loss.backward() takes the gradients computed in the forward's own program (jax.jit(jax.value_and_grad)
    gives the same); another cotangent, or a second backward over a retained graph, runs the compiled vjp:
    three backwards accumulate three gradients (the forward's are handed over once: torch accumulates into
    a gradient in place)."""
    import jax
    import torch

    f = _layer("jax")
    w, x = _data((4, 3), 3), _data((2, 4), 4)
    scalar = lambda w, x: f(w, x).astype("float32").sum()  # noqa: E731
    bridged = bb.bridge("jax")(scalar)
    _, (want_w, _) = jax.jit(jax.value_and_grad(scalar, argnums=(0, 1)))(make("jax", w), make("jax", x))
    W = make("torch", w).requires_grad_()
    loss = bridged(W, make("torch", x))
    loss.backward(retain_graph=True)
    np.testing.assert_array_equal(bits(W.grad), bits(want_w))
    # the compiled vjp's, as native_vjp computes them: on jax 0.4.30 XLA's fused forward-and-gradient program
    # may round a gradient differently from the vjp's two programs (on jax 0.10 they agree)
    pulled = [make("torch", np.asarray(native_vjp("jax", scalar, (w, x), np.float32(c), wanted=[0])[0]))
              for c in (1, 2)]
    loss.backward(retain_graph=True)
    (loss * 2).backward()
    np.testing.assert_array_equal(bits(W.grad), bits(make("torch", np.asarray(want_w)) + pulled[0] + pulled[1]))
