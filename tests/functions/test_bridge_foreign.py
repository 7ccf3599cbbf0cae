"""A bridged call across frameworks (bf16bridge/functions/foreign.py, ForeignCall): the forward bit for
bit against the callee run directly, in every direction (numpy too); gradients bit for bit against the
callee's own vector-Jacobian product, in all six directions, through trees, keywords, a tf caller's
tapes and a torch caller's second backward; forward mode refused, not lost; the callee's subnormals
kept on a runtime's thread."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bridge_cases import _callee_vjp, _data, _layer, as_bridged_runs
from conftest import BF16, FRAMEWORKS, bits, make, type_framework


AUTODIFF = ("torch", "jax", "tensorflow")


def _elementwise(x, y, scale, *, shift):
    """Written once: +, * and a Python float mean the same in all four frameworks."""
    return {"sum": x + y, "pair": Out(x * y * scale, "tag"), "shift": shift}


Out = collections.namedtuple("Out", "prod label")


# -- forward, every ordered pair (numpy too) ------------------------------------------------


@pytest.mark.parametrize("caller", FRAMEWORKS)
@pytest.mark.parametrize("callee", FRAMEWORKS)
def test_forward_equals_the_callee_run_directly(caller, callee):
    a, b = _data((3, 5), 1), _data((3, 5), 2)
    fn = bb.bridge(callee)(_elementwise)
    x, y = make(caller, a), make(caller, b)  # (importing tensorflow 2.16 warns, of jax: not the call's)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a forward call says nothing
        got = fn(x, y, 2.0, shift=7)
    want = _elementwise(make(callee, a), make(callee, b), 2.0, shift=7)
    assert got["shift"] == 7 and got["pair"].label == "tag" and type(got["pair"]) is Out
    for g, w in ((got["sum"], want["sum"]), (got["pair"].prod, want["pair"].prod)):
        assert type_framework(g) == caller
        np.testing.assert_array_equal(bits(g), bits(w))


# -- gradients, six directions ---------------------------------------------------------------


def _caller_grads(caller, fn, w, x, ct, *, x_grad=True):
    """d/d(w, x) of sum(fn(w, x) * ct) in the caller's autodiff: the cotangent reaching fn is ct."""
    W, X, C = (make(caller, v) for v in (w, x, ct))
    if caller == "torch":
        W.requires_grad_()
        X.requires_grad_(x_grad)
        (fn(W, X) * C).sum().backward()
        return W.grad, X.grad
    if caller == "jax":
        import jax

        return jax.grad(lambda W, X: (fn(W, X) * C).sum(), argnums=(0, 1) if x_grad else 0)(W, X)
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch([W, X] if x_grad else [W])
        loss = tf.reduce_sum(fn(W, X) * C)
    return tape.gradient(loss, [W, X] if x_grad else W)


@pytest.mark.parametrize("caller", AUTODIFF)
@pytest.mark.parametrize("callee", AUTODIFF)
def test_gradients_equal_the_callees_own_vjp(caller, callee):
    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    fn = bb.bridge(callee)(_layer(callee))
    dw, dx = _caller_grads(caller, fn, w, x, ct)
    want_dw, want_dx = _callee_vjp(callee, w, x, ct, compiled=caller != callee)  # (a jax caller: as written)
    assert type_framework(dw) == caller and type_framework(dx) == caller
    np.testing.assert_array_equal(bits(dw), bits(want_dw))
    np.testing.assert_array_equal(bits(dx), bits(want_dx))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("callee", ["jax", "tensorflow"])
def test_inputs_that_do_not_require_grad_get_none(callee):
    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    dw, dx = _caller_grads("torch", bb.bridge(callee)(_layer(callee)), w, x, ct, x_grad=False)
    assert dx is None
    np.testing.assert_array_equal(bits(dw), bits(_callee_vjp(callee, w, x, ct)[0]))


@pytest.mark.frameworks("torch", "jax")
def test_a_torch_caller_under_no_grad_runs_the_callee_without_its_vjp():
    """Under torch.no_grad() nothing records, inputs that require grad included: the callee runs
    plainly (jax sees concrete arrays, not jax.vjp's tracers; jit=False: not jax.jit's either), and the
    result has no graph."""
    import jax
    import torch

    seen: list = []

    @bb.bridge("jax", jit=False)
    def f(a, b):
        seen.append(isinstance(a, jax.core.Tracer))
        return a * b

    a, b = (make("torch", _data((3, 5), i)).requires_grad_() for i in (1, 2))
    with torch.no_grad():
        y = f(a, b)
    assert seen == [False] and not y.requires_grad and y.grad_fn is None
    np.testing.assert_array_equal(bits(y), bits(make("jax", _data((3, 5), 1)) * make("jax", _data((3, 5), 2))))
    f(a, b)  # and with grad mode on, through jax.vjp
    assert seen == [False, True]


@pytest.mark.frameworks("torch")
def test_gradients_reach_pytree_leaves_and_keywords():
    import jax.numpy as jnp
    import torch

    @bb.bridge("jax")
    def loss_fn(params, x, *, power):
        h = jnp.tanh(x @ params["layers"][0]["w"] + params["layers"][0]["b"])
        return {"loss": jnp.sum(h.astype(jnp.float32) ** power), "n": 3}

    w = make("torch", _data((4, 3), 1))
    params = {"layers": [{"w": w.clone().requires_grad_(),
                          "b": torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)}]}
    x = make("torch", _data((2, 4), 2))
    out = loss_fn(params, x, power=2)
    assert out["n"] == 3
    out["loss"].backward()
    import jax

    jw = jnp.asarray(_data((4, 3), 1))
    # a scalar loss: as the bridge computes it, jax.jit of its gradient (docs/functions.md)
    want = jax.jit(jax.grad(lambda p, x: jnp.sum(jnp.tanh(x @ p["w"] + p["b"]).astype(jnp.float32) ** 2)))(
        {"w": jw, "b": jnp.zeros(3, jnp.bfloat16)}, make("jax", _data((2, 4), 2)))
    np.testing.assert_array_equal(bits(params["layers"][0]["w"].grad), bits(want["w"]))
    np.testing.assert_array_equal(bits(params["layers"][0]["b"].grad), bits(want["b"]))


@pytest.mark.frameworks("tensorflow")
def test_tf_variable_caller_gets_the_callees_gradient():
    import tensorflow as tf

    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    fn = bb.bridge("torch")(_layer("torch"))
    W = tf.Variable(make("tensorflow", w))
    X, C = make("tensorflow", x), make("tensorflow", ct)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fn(W, X) * C)
    np.testing.assert_array_equal(bits(tape.gradient(loss, W)), bits(_callee_vjp("torch", w, x, ct)[0]))


# -- a tf caller's tapes, a torch caller's second backward --------------------------------------


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("callee", ["torch", "jax"])
def test_tf_caller_a_tape_opened_between_two_calls_is_seen(callee):
    """An eager tf call asks whether any tape is active (one C call) on every call, nothing kept:
    calls without a tape, then one under a tape that watches an input (its gradient, the callee's
    own), then one under a tape that watches none of them (no gradient, no error), then none again."""
    import tensorflow as tf

    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    fn = bb.bridge(callee)(_layer(callee))
    W, X, C = (make("tensorflow", v) for v in (w, x, ct))
    want = bits(as_bridged_runs(callee, _layer(callee))(make(callee, w), make(callee, x)))
    for _ in range(2):
        np.testing.assert_array_equal(bits(fn(W, X)), want)
    with tf.GradientTape() as tape:
        tape.watch(W)
        loss = tf.reduce_sum(fn(W, X) * C)
    np.testing.assert_array_equal(bits(tape.gradient(loss, W)), bits(_callee_vjp(callee, w, x, ct)[0]))
    with tf.GradientTape() as tape:
        other = tf.constant(1.0)
        tape.watch(other)
        loss = tf.reduce_sum(fn(W, X) * C)
    assert tape.gradient(loss, W) is None
    np.testing.assert_array_equal(bits(fn(W, X)), want)


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("callee", ["torch", "jax"])
def test_tf_caller_a_persistent_tape_asks_again(callee):
    """A persistent tape asks the callee's pullback more than once: the same gradient twice, a
    second target, and tape.jacobian's rows (one by one, or vectorized by pfor, its default, which
    traces the gradient into a graph, which is refused naming the way out). torch's graph was freed
    by the first ask (its raw RuntimeError), and pfor met our misleading "convert eagerly" error."""
    import tensorflow as tf

    w, x, ct, ct2 = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5), _data((2, 3), 6)
    fn = bb.bridge(callee)(_layer(callee))
    W, X, C, C2 = (make("tensorflow", v) for v in (w, x, ct, ct2))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(W)
        y = fn(W, X)
        loss, loss2 = tf.reduce_sum(y * C), tf.reduce_sum(y * C2)
    want, want2 = bits(_callee_vjp(callee, w, x, ct)[0]), bits(_callee_vjp(callee, w, x, ct2)[0])
    np.testing.assert_array_equal(bits(tape.gradient(loss, W)), want)
    np.testing.assert_array_equal(bits(tape.gradient(loss, W)), want)
    np.testing.assert_array_equal(bits(tape.gradient(loss2, W)), want2)
    rows = []  # d y[i, j] / d W: the callee's vjp of each one-hot cotangent
    for i in range(2):
        for j in range(3):
            onehot = np.zeros((2, 3), np.float32)
            onehot[i, j] = 1
            rows.append(bits(_callee_vjp(callee, w, x, onehot.astype(BF16))[0]))
    jac = tape.jacobian(y, W, experimental_use_pfor=False)
    assert tuple(jac.shape) == (2, 3, 4, 3)
    np.testing.assert_array_equal(bits(jac).reshape(6, 4, 3), np.stack(rows))
    # pfor (the default) traces the gradient into a graph: our error naming the way out (run there,
    # a gradient of that jacobian came back zeros, silently)
    with pytest.raises(bb.UnsupportedTypeError, match="experimental_use_pfor=False"):
        tape.jacobian(y, W)
    del tape


@pytest.mark.frameworks("torch", "tensorflow")
def test_torch_caller_tf_callee_asks_the_pullback_twice():
    """backward(retain_graph=True) then a second backward, or two autograd.grad over one graph:
    tensorflow's non-persistent tape raised its raw "can only be used to compute one set of
    gradients" on the second. The tape is persistent, freed with torch's graph."""
    import tensorflow as tf
    import torch

    fn = bb.bridge("tensorflow")(lambda w: tf.reduce_sum(tf.sin(w) * w))
    w = torch.linspace(-1, 1, 4, requires_grad=True)
    y = fn(w)
    y.backward(retain_graph=True)
    once = w.grad.clone()
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), (2 * once).numpy())
    w2 = torch.linspace(-1, 1, 4, requires_grad=True)
    y2 = fn(w2)
    a, = torch.autograd.grad(y2 * 2, w2, retain_graph=True)
    b, = torch.autograd.grad(y2 * 3, w2)
    np.testing.assert_allclose((a / 2).numpy(), (b / 3).numpy(), rtol=1e-6)
    np.testing.assert_allclose((a / 2).numpy(), once.numpy(), rtol=1e-6)


# -- forward mode: refused, not lost -------------------------------------------------------------


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("callee", ["numpy", "jax", "tensorflow"])
def test_torch_forward_mode_through_a_bridged_call_is_refused_not_lost(callee):
    """A dual tensor (torch.autograd.forward_ad) crossed as its primal: the result had no tangent,
    silently, where torch's own function gives one."""
    import torch
    import torch.autograd.forward_ad as fwAD

    fn = bb.bridge(callee)(lambda w: w * 2)
    with fwAD.dual_level():
        w = fwAD.make_dual(torch.ones(3), torch.ones(3))
        with pytest.raises(bb.UnsupportedTypeError, match="dual tensor.*forward_ad.*reverse mode"):
            fn(w)
        with pytest.warns(bb.Bf16BridgeWarning, match="forward-mode tangent"):  # convert says it drops it
            bb.convert(w, "numpy")
        np.testing.assert_array_equal(bb.convert(w, "numpy", on_grad="drop"), [1, 1, 1])
        with pytest.raises(bb.UnsupportedTypeError, match="forward-mode tangent"):
            bb.convert(w, "numpy", on_grad="error")
        plain = torch.ones(3)  # (no tangent: as ever, at once and without a word)
        np.testing.assert_array_equal(bits(fn(plain)), bits(torch.full((3,), 2.0)))


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("callee", ["jax", "torch"])
def test_tf_forward_accumulator_through_a_bridged_call_is_refused_not_lost(callee):
    """acc.jvp of a bridged call's result was None (zeros with unconnected_gradients=ZERO): the
    accumulator watched the input, no tape did, so the callee ran without a gradient rule."""
    import tensorflow as tf

    fn = bb.bridge(callee)(lambda w: w * 2)
    w = tf.constant([1.0, 2.0])
    with tf.autodiff.ForwardAccumulator(w, tf.ones_like(w)):
        with pytest.raises(bb.UnsupportedTypeError, match="ForwardAccumulator.*reverse mode"):
            fn(w)
    v = tf.Variable([1.0, 2.0])
    with tf.autodiff.ForwardAccumulator(v, tf.ones_like(v)), tf.GradientTape():
        with pytest.raises(bb.UnsupportedTypeError, match="ForwardAccumulator"):
            fn(v)
    np.testing.assert_array_equal(fn(w).numpy(), [2.0, 4.0])  # none active: as ever


# -- the callee's floating-point environment on a runtime's thread ---------------------------------


#: float32 subnormals (the smallest too) and a normal value: a thread that flushes makes them 0
_SUBNORMALS = np.array([1e-39, -3e-39, 2.0**-149, 1.0], np.float32)


def _scaled(callee):
    """x * w in the callee's own API: with w of ones, x's subnormals come back only where kept."""
    return lambda x, w: x * w


@pytest.mark.parametrize("callee", ["numpy", "torch"])
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_callee_on_a_runtime_thread_keeps_subnormals_as_called_eagerly(caller, callee):
    """Under jax.jit and in tf.function the callee runs on XLA's or tensorflow's threads, which flush
    subnormals (FTZ/DAZ): a numpy or torch callee there computed 1e-39 * 1 as 0, where eagerly it
    gives 1e-39. The bridge keeps them for the callee (fpenv), forward and, with a torch callee, in
    its backward (the gradient with respect to w is x)."""
    import warnings as _w

    x, w = _SUBNORMALS, np.ones(4, np.float32)
    fn = bb.bridge(callee)(_scaled(callee))
    X, W = make(caller, x), make(caller, w)
    want = bits(fn(X, W))  # eagerly, on this thread
    np.testing.assert_array_equal(want, bits(x))
    with _w.catch_warnings():
        _w.simplefilter("ignore", bb.Bf16BridgeWarning)  # numpy has no autodiff: said, not asked here
        if caller == "jax":
            import jax

            y = jax.jit(fn)(X, W)
            g = jax.jit(jax.grad(lambda X, W: fn(X, W).sum(), argnums=1))(X, W) if callee == "torch" else None
        else:
            import tensorflow as tf

            @tf.function
            def step(X, W):
                with tf.GradientTape() as tape:
                    tape.watch(W)
                    y = fn(X, W)
                    loss = tf.reduce_sum(y)
                return y, (tape.gradient(loss, W) if callee == "torch" else None)

            y, g = step(X, W)
    np.testing.assert_array_equal(bits(y), want)
    if callee == "torch":
        np.testing.assert_array_equal(bits(g), bits(x))


@pytest.mark.frameworks("torch", "jax")
def test_a_caller_that_flushes_on_purpose_is_left_flushing():
    """torch.set_flush_denormal(True) on the calling thread: the callee flushes eagerly, and does
    under jax.jit too (the state of the thread that made the call, not the default, is kept)."""
    import jax
    import torch

    fn = bb.bridge("torch")(_scaled("torch"))
    X, W = make("jax", _SUBNORMALS), make("jax", np.ones(4, np.float32))
    assert torch.set_flush_denormal(True)
    try:
        eager, jitted = fn(X, W), jax.jit(fn)(X, W)
    finally:
        torch.set_flush_denormal(False)
    np.testing.assert_array_equal(np.asarray(eager), [0, 0, 0, 1])
    np.testing.assert_array_equal(bits(jitted), bits(eager))
