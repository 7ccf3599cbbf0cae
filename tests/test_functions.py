"""Bridged functions: a function of one framework called with another's tensors,
forward bit for bit against the callee run directly, gradients bit for bit against
the callee's own vector-Jacobian product, in every direction."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from conftest import BF16, FRAMEWORKS, bits, make, type_framework

AUTODIFF = ("torch", "jax", "tensorflow")


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 0.5).astype(np.float32).astype(BF16)


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


def _layer(callee):
    """tanh(x @ w) in the callee's own API."""
    if callee == "torch":
        import torch

        return lambda w, x: torch.tanh(x @ w)
    if callee == "jax":
        import jax.numpy as jnp

        return lambda w, x: jnp.tanh(x @ w)
    import tensorflow as tf

    return lambda w, x: tf.tanh(tf.matmul(x, w))


def _callee_vjp(callee, w, x, ct):
    """The callee framework's own vjp of _layer at (w, x) with cotangent ct: (dw, dx)."""
    return native_vjp(callee, _layer(callee), (w, x), ct)


def native_vjp(callee, f, primals, cts):
    """The callee framework's own vjp of ``f`` (its tensors in, a tensor or a list of them out) at
    ``primals`` (numpy arrays) with cotangents ``cts`` (numpy, matching f's output): one gradient
    per primal."""
    P = [make(callee, v) for v in primals]
    C = [make(callee, c) for c in cts] if isinstance(cts, list) else make(callee, cts)
    if callee == "torch":
        import torch

        for p in P:
            p.requires_grad_()
        return torch.autograd.grad(f(*P), P, C)
    if callee == "jax":
        import jax

        _, pullback = jax.vjp(f, *P)
        return pullback(C)
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(P)
        y = f(*P)
    return tape.gradient(y, P, output_gradients=C)


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
    want_dw, want_dx = _callee_vjp(callee, w, x, ct)
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
    plainly (jax sees concrete arrays, not jax.vjp's tracers), and the result has no graph."""
    import jax
    import torch

    seen: list = []

    @bb.bridge("jax")
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
    want = jax.grad(lambda p: jnp.sum(jnp.tanh(make("jax", _data((2, 4), 2)) @ p["w"] + p["b"])
                                      .astype(jnp.float32) ** 2))({"w": jw, "b": jnp.zeros(3, jnp.bfloat16)})
    np.testing.assert_array_equal(bits(params["layers"][0]["w"].grad), bits(want["w"]))
    np.testing.assert_array_equal(bits(params["layers"][0]["b"].grad), bits(want["b"]))


# -- under transformations -----------------------------------------------------------------


@pytest.mark.frameworks("torch")
def test_jax_caller_under_jit_forward_and_grad():
    import jax

    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    fn = bb.bridge("torch")(_layer("torch"))
    W, X, C = (make("jax", v) for v in (w, x, ct))
    y = jax.jit(fn)(W, X)
    np.testing.assert_array_equal(bits(y), bits(_layer("torch")(make("torch", w), make("torch", x))))
    g = jax.jit(jax.grad(lambda W, X: (fn(W, X) * C).sum()))(W, X)
    np.testing.assert_array_equal(bits(g), bits(_callee_vjp("torch", w, x, ct)[0]))


@pytest.mark.frameworks("torch")
def test_jax_callbacks_on_the_cpu_run_in_buffer_callback():
    """On the CPU with jax >= 0.8.1 (one CPU device) the callee under jit runs in a buffer_callback
    (jax's own buffers, no pure_callback host copies), forward and backward, and the probe says so;
    results and gradients are the callee's own, bit for bit. An older jax (the oldest set) takes
    pure_callback, and the same results."""
    import jax

    from bf16bridge.core import versions
    from bf16bridge.adapters.jax import internals as jax_internals

    assert jax_internals.BUFFER_CALLBACK is (versions.release(jax.__version__) >= (0, 8, 1))
    uses = jax_internals.BUFFER_CALLBACK and len(jax.devices("cpu")) == 1
    assert bb.probe().frameworks["jax"].facts["buffer_callback"][0] is uses
    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    W, X, C = (make("jax", v) for v in (w, x, ct))
    fn = bb.bridge("torch")(_layer("torch"))
    y = jax.jit(fn)(W, X)
    np.testing.assert_array_equal(bits(y), bits(_layer("torch")(make("torch", w), make("torch", x))))
    grad = jax.jit(jax.grad(lambda W, X: (fn(W, X) * C).sum()))
    np.testing.assert_array_equal(bits(grad(W, X)), bits(_callee_vjp("torch", w, x, ct)[0]))
    for lowered in (jax.jit(fn).lower(W, X).as_text(), grad.lower(W, X).as_text()):
        assert ("xla_buffer_python_cpu_callback" in lowered) is uses, lowered[:2000]


@pytest.fixture(params=["buffer_callback", "pure_callback"])
def jax_callback(request, monkeypatch):
    """Each path a traced jax caller's callee can take here: buffer_callback where this jax has it
    (else the test is the pure_callback one again, as the oldest set runs it), pure_callback forced."""
    from bf16bridge.adapters.jax import probe as jax_probe

    if request.param == "pure_callback":
        monkeypatch.setattr(jax_probe, "buffers_here", lambda platform: False)
    return request.param


@pytest.mark.filterwarnings("ignore:numpy has no autodiff")
@pytest.mark.parametrize("callee", ["numpy", "torch"])  # (a "torch" parameter needs torch: conftest)
def test_a_callee_that_keeps_its_input_under_jit_keeps_its_values(callee, jax_callback):
    """jax's buffers are valid only during a callback: a callee that keeps its input (a hook saving
    activations) got a view of one, whose values changed once XLA reused it (and a large one was read
    after it was freed). The callee gets copies of its own."""
    import jax
    import jax.numpy as jnp

    kept = []

    @bb.bridge(callee)
    def layer(h):
        kept.append(h)
        return h * 2

    @jax.jit
    def model(x):
        return layer(jnp.sin(x) + 1.0).sum()  # its input an intermediate: XLA's own temporary buffer

    x = jnp.linspace(0, 1, 1 << 14, dtype=jnp.float32)
    want = np.asarray(jnp.sin(x) + 1.0)
    model(x).block_until_ready()
    first = kept[-1]
    for i in range(10):
        model(x * (i + 2)).block_until_ready()  # the computation again: its temporaries reused
    np.testing.assert_array_equal(np.asarray(first), want)


@pytest.mark.filterwarnings("ignore:numpy has no autodiff")
@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2", "float4_e2m1fn"])
def test_types_jax_stores_packed_cross_a_traced_call_as_values(name, jax_callback):
    """jax stores sub-byte types packed (two values a byte); a view of its buffer read them one a byte:
    a callee reversing an int4 array under jit got other values, and a large result was written past
    jax's buffer (the process died). Such calls take pure_callback, which unpacks them."""
    import jax

    from bf16bridge.core import dtypes

    why = registry.get("jax").cannot_hold(name) or dtypes.numpy_missing(name)
    if why is not None:  # (not this jax's or ml_dtypes': our error for the call, checked elsewhere)
        return
    values = dtypes.all_patterns(name)[:16].view(dtypes.numpy_dtype(name))
    a = np.resize(values, (3, 5))
    x = jax.device_put(a)
    flip = bb.bridge("numpy")(lambda y: y[::-1])  # (torch has hardly an op for these types)
    from bf16bridge.adapters.jax import probe as jax_probe

    if not jax_probe.callback_takes_packed():  # jax 0.4.30: XLA refused them in a callback, its raw error
        with pytest.raises(bb.UnsupportedDtypeError, match=f"takes or gives {name} under a jax transformation"):
            jax.jit(flip)(x)
        return
    got = jax.jit(flip)(x)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), a[::-1].view(np.uint8))
    big = np.resize(values, (1 << 20,))
    np.testing.assert_array_equal(np.asarray(jax.jit(flip)(jax.device_put(big))).view(np.uint8),
                                  big[::-1].view(np.uint8))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("method", ["expand_dims", "broadcast_all", "sequential"])
def test_a_gradient_the_callee_has_not_is_zeros_of_the_batch(method, jax_callback):
    """Under vmap a gradient the callee does not give (an input it does not use) is zeros of the
    batched input's shape: pure_callback's zeros had the unbatched shape (jax's "Incorrect output
    shape")."""
    import jax
    import jax.numpy as jnp

    if not bb.probe().frameworks["jax"].facts["pure_callback vmap_method"][0] and method != "sequential":
        return  # (jax 0.4.30: one batching rule; its refusal is test_jax_vmap_needs_a_declared_batching_rule's)
    fn = bb.bridge("torch", vmap_method=method)(lambda w, x: x * 2)
    w, X = jnp.ones(3, jnp.float32), jnp.arange(15, dtype=jnp.float32).reshape(5, 3)
    g = jax.vmap(jax.grad(lambda w, x: fn(w, x).sum()), (None, 0))(w, X)
    np.testing.assert_array_equal(np.asarray(g), np.zeros((5, 3), np.float32))


MULTI_DEVICE_CHILD = """
import numpy as np, jax, jax.numpy as jnp, torch, warnings, bf16bridge as bb
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
calls = []
@bb.bridge("torch")
def f(x):
    calls.append(tuple(x.shape))
    return torch.sin(x) * 2
x = jax.device_put(jnp.arange(16.0).reshape(8, 2), NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x", None)))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # (the SPMD partitioner's notes about the callback's one device)
    y = jax.block_until_ready(jax.jit(f)(x))
    n = len(calls)
    jax.block_until_ready(jax.jit(f)(x))
assert np.array_equal(np.asarray(y), np.asarray(torch.sin(torch.arange(16.0).reshape(8, 2)) * 2))
fact = bb.probe().frameworks["jax"].facts["buffer_callback"]
print(n, len(calls) - n, len(jax.devices()), fact[0], fact[1])
"""


@pytest.mark.frameworks("torch")
def test_over_several_cpu_devices_a_traced_call_runs_the_callee_once():
    """With several CPU devices, a buffer_callback runs once on every device, each with the whole
    array: the callee ran 4 times a call over 4 devices. There the bridge keeps pure_callback (once a
    call), and the probe's jax fact says why."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    r = subprocess.run([sys.executable, "-c", MULTI_DEVICE_CHILD], env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    first, again, devices, uses, why = r.stdout.split(" ", 4)
    assert devices == "4" and again == "1", r.stdout  # once a call (the first also declares its results)
    from bf16bridge.adapters.jax import internals as jax_internals

    reason = "4 CPU devices" if jax_internals.BUFFER_CALLBACK else "jax 0.4.30 has no buffer_callback"
    assert int(first) == 2 and uses == "False" and why.startswith(reason), r.stdout


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
            "<lambda>' returned bfloat16 of shape (4,) under vmap (vmap_method='broadcast_all', result leaf 0), "
            "where the batch's result is bfloat16 of shape (5,): with that method the function is handed the "
            "whole batch")):
        jax.block_until_ready(jax.vmap(fn)(X))


@pytest.mark.frameworks("torch")
def test_jax_vmap_needs_a_declared_batching_rule():
    """Where jax.pure_callback takes vmap_method (the probe's jax fact), vmap needs one declared;
    jax 0.4.30's has none: its one rule runs the callee once per batch element (as "sequential"),
    and a method it cannot honour is our error, not jax's "not a valid JAX type" (the keyword was
    handed to the callback)."""
    import jax

    w, x = _data((4, 3), 3), _data((5, 2, 4), 4)
    W, X = make("jax", w), make("jax", x)
    want = bits(_layer("torch")(make("torch", w), make("torch", x)))
    plain = bb.bridge("torch")(_layer("torch"))
    takes_method = bb.probe().frameworks["jax"].facts["pure_callback vmap_method"][0]
    if takes_method:
        with pytest.raises(bb.UnsupportedTypeError, match="vmap_method"):
            jax.vmap(plain, in_axes=(None, 0))(W, X)
    else:
        np.testing.assert_array_equal(bits(jax.vmap(plain, in_axes=(None, 0))(W, X)), want)
    batched = bb.bridge("torch", vmap_method="sequential")(_layer("torch"))
    np.testing.assert_array_equal(bits(jax.vmap(batched, in_axes=(None, 0))(W, X)), want)
    expanded = bb.bridge("torch", vmap_method="expand_dims")(_layer("torch"))
    if takes_method:
        np.testing.assert_array_equal(bits(jax.vmap(expanded, in_axes=(None, 0))(W, X)), want)
    else:
        with pytest.raises(bb.UnsupportedTypeError, match="upgrade jax"):
            jax.vmap(expanded, in_axes=(None, 0))(W, X)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("method", ["sequential", "expand_dims", "broadcast_all", "legacy_vectorized"])
def test_jax_vmap_gradients_under_every_vmap_method(method):
    """Gradients under vmap, per example and through it, for an elementwise callee that takes batch
    dimensions: expand_dims and legacy_vectorized gave torch's and jax's raw shape errors (the backward
    ran with a size-1 batch dimension for the unbatched input); its callback now broadcasts."""
    import jax
    import jax.numpy as jnp
    import torch

    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal(8), jnp.float32)
    X = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
    native = lambda w, x: jnp.tanh(jnp.sin(x) * w)  # noqa: E731
    fn = bb.bridge("torch", vmap_method=method)(lambda w, x: torch.tanh(torch.sin(x) * w))
    if not bb.probe().frameworks["jax"].facts["pure_callback vmap_method"][0] and method != "sequential":
        with pytest.raises(bb.UnsupportedTypeError, match="upgrade jax"):  # (jax 0.4.30: one batching rule)
            jax.vmap(jax.grad(lambda w, x: fn(w, x).sum()), (None, 0))(w, X)
        return
    for transform in (lambda f: jax.vmap(f, (None, 0))(w, X),
                      lambda f: jax.vmap(jax.grad(lambda w, x: f(w, x).sum()), (None, 0))(w, X),
                      lambda f: jax.vmap(jax.grad(lambda w, x: f(w, x).sum(), 1), (None, 0))(w, X),
                      lambda f: jax.grad(lambda w: jax.vmap(f, (None, 0))(w, X).sum())(w),
                      lambda f: jax.jit(jax.vmap(jax.grad(lambda w, x: f(w, x).sum()), (None, 0)))(w, X)):
        want, got = np.asarray(transform(native)), np.asarray(transform(fn))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)  # (torch's sin and tanh, not XLA's)


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
    want = bits(_layer(callee)(make(callee, w), make(callee, x)))
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


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("callee", ["torch", "jax"])
def test_tf_caller_a_second_order_through_a_tf_function_is_refused_not_zero(callee):
    """A gradient taken inside a tf.function, differentiated again by a tape outside it: the callee's
    backward runs in a py_function, whose own gradient tensorflow took as zero (d2/dw2 of sum(w**3)
    came back 0, silently); our error now, as tensorflow reports an error raised in its graph."""
    import tensorflow as tf

    fn = bb.bridge(callee)(lambda w: (w * w * w).sum())
    w = tf.constant(np.linspace(0.5, 1, 4).astype(np.float32))

    @tf.function
    def first(w):
        with tf.GradientTape() as tape:
            tape.watch(w)
            y = fn(w)
        return tape.gradient(y, w)

    np.testing.assert_allclose(first(w).numpy(), 3 * w.numpy() ** 2, rtol=1e-6)  # the first order runs
    with tf.GradientTape() as outer:
        outer.watch(w)
        g = first(w)
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not support higher-order gradients"):
        outer.gradient(g, w)


@pytest.mark.frameworks("tensorflow", "jax")
def test_tf_caller_under_jit_compile_is_refused_clearly():
    """XLA compiles a tf.function(jit_compile=True) as a whole and cannot call back into Python, as
    the bridged call must: our error naming jit_compile, not tensorflow's about EagerPyFunc."""
    import tensorflow as tf

    fn = bb.bridge("jax")(_layer("jax"))
    W, X = make("tensorflow", _data((4, 3), 1)), make("tensorflow", _data((2, 4), 2))
    with pytest.raises(bb.UnsupportedTypeError, match=r"jit_compile=True\); drop jit_compile"):
        tf.function(fn, jit_compile=True)(W, X)
    np.testing.assert_array_equal(bits(tf.function(fn)(W, X)), bits(fn(W, X)))  # without it: runs


@pytest.mark.frameworks("tensorflow")
def test_tf_caller_inside_tf_function_forward_and_grad():
    import tensorflow as tf

    w, x, ct = _data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)
    fn = bb.bridge("jax")(_layer("jax"))

    @tf.function
    def step(W, X, C):
        with tf.GradientTape() as tape:
            tape.watch(W)
            loss = tf.reduce_sum(fn(W, X) * C)
        return fn(W, X), tape.gradient(loss, W)

    y, dw = step(*(make("tensorflow", v) for v in (w, x, ct)))
    np.testing.assert_array_equal(bits(y), bits(_layer("jax")(make("jax", w), make("jax", x))))
    np.testing.assert_array_equal(bits(dw), bits(_callee_vjp("jax", w, x, ct)[0]))


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
    with pytest.raises(bb.UnsupportedTypeError, match=r"\(4,\) on ones \(result leaf 1\), but float32 of shape "
                                                      r"\(0,\) when its results were declared.*depends on the "
                                                      "inputs' values"):
        _traced(caller, positive)(x)
    nonneg = bb.bridge(callee)(lambda a: a[a >= 0])
    with pytest.raises(Exception, match=r"shape \(3,\) here \(result leaf 0\), but float32 of shape \(4,\)") as info:
        bb.convert(_traced(caller, nonneg)(x), "numpy")
    assert "UnsupportedTypeError" in str(info.value) or isinstance(info.value, bb.UnsupportedTypeError)
    # empty on zeros and on ones: jax would run no callback (every result empty), so it cannot be checked
    # when it runs: our error at once; tensorflow runs it, and checks it there
    above_one = bb.bridge(callee)(lambda a: a[a > 1])
    with pytest.raises(Exception, match="gives no tensor result with any element" if caller == "jax" else
                       r"shape \(2,\) here \(result leaf 0\), but float32 of shape \(0,\)"):
        bb.convert(_traced(caller, above_one)(x), "numpy")
    # a non-tensor result that differs on ones is our error too (the call on ones once swallowed it, and jax
    # handed back ([], 0) for ([1, 3, 4], 3))
    counted = bb.bridge(callee)(lambda a: (a[a > 0], int((a > 0).sum())))
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


# -- bad use --------------------------------------------------------------------------------


@pytest.mark.frameworks("torch")
def test_mixed_caller_frameworks_are_refused():
    fn = bb.bridge("jax")(_layer("jax"))
    with pytest.raises(bb.InvalidArgumentError, match="jax, torch|numpy, torch"):
        fn(make("torch", _data((4, 3), 1)), make("numpy", _data((2, 4), 2)))


@pytest.mark.frameworks("torch")
def test_a_callee_returning_another_frameworks_tensor_is_refused():
    fn = bb.bridge("jax")(lambda x: np.asarray(x))
    with pytest.raises(bb.UnsupportedTypeError, match="returned a numpy tensor"):
        fn(make("torch", _data((3,), 1)))


@pytest.mark.frameworks("torch")
def test_numpy_callee_says_gradients_stop():
    import torch

    fn = bb.bridge("numpy")(lambda x: x * 2)
    x = make("torch", _data((3,), 1)).requires_grad_()
    with pytest.warns(bb.Bf16BridgeWarning, match="numpy has no autodiff"):
        y = fn(x)
    assert not y.requires_grad
    np.testing.assert_array_equal(bits(y), bits(_data((3,), 1) * 2))
    assert isinstance(y, torch.Tensor)


@pytest.mark.frameworks("torch")
def test_a_result_the_caller_cannot_hold_gives_our_error():
    import jax
    import torch

    assert not jax.config.jax_enable_x64
    fn = bb.bridge("torch")(lambda x: (x, x.to(torch.float64)))
    # eagerly too, which function, which result, and where a fallback goes (convert's bare error before)
    with pytest.raises(bb.UnsupportedDtypeError, match=r"the bridged torch function '.*<lambda>', result leaf 1, to "
                                                       r"jax: .*jax_enable_x64.*bb.bridge\(\.\.\., fallback="):
        fn(make("jax", _data((3,), 1)))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("copy_inputs", [False, True])
def test_a_callee_writing_its_input_writes_the_callers_tensor_unless_copied(copy_inputs):
    a = make("numpy", _data((4,), 1))
    before = bits(a).copy()

    @bb.bridge("torch", copy_inputs=copy_inputs)
    def bump(x):
        x.add_(1)  # in place: the input is a view of the caller's array unless copied
        return x * 1

    bump(a)
    assert np.array_equal(bits(a), before) == copy_inputs


@pytest.mark.frameworks("torch")
def test_bridged_function_keeps_its_name_and_same_framework_calls_through():
    def my_fn(x):
        return x + 1

    fn = bb.bridge("torch")(my_fn)
    assert fn.__name__ == "my_fn" and "torch" in repr(fn)
    t = make("torch", _data((3,), 1))
    np.testing.assert_array_equal(bits(fn(t)), bits(t + 1))


def test_unknown_framework_is_refused():
    with pytest.raises(bb.UnknownFrameworkError):
        bb.bridge("mxnet")


def test_bridge_imports_no_framework():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, bf16bridge as bb
        fn = bb.bridge("jax")(lambda x: x)
        print(sorted(m for m in ("jax", "torch", "tensorflow") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_first_call_of_a_process_may_come_under_a_jax_trace():
    """The jax adapter loads on first use and tries what this jax does (its buffers' alignment, its
    casts' bits); where that use is under jax.jit, the trials run at once, not traced (a traced trial
    failed the adapter's import, again on every later call: a function bridged only under jit never
    ran). Fresh processes: a bridged numpy function, then cast_tree, each first under jit."""
    import subprocess
    import sys
    import textwrap

    for first in ("jax.jit(bb.bridge('numpy')(lambda a: a * 2))(x)",
                  "jax.jit(lambda a: bb.cast_tree({'w': a}, 'float16')[0]['w'])(x)"):
        code = textwrap.dedent(f"""
            import jax, jax.numpy as jnp, numpy as np, bf16bridge as bb
            x = jnp.asarray(np.array([1.5, -2.0, 3.25], np.float32))
            print(np.asarray({first}).astype(np.float32).tolist())
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split()[-3:] == (["[3.0,", "-4.0,", "6.5]"] if "bridge" in first else ["[1.5,", "-2.0,", "3.25]"])
    # and what it found holds eagerly after: its narrow-dtype trials once ran on tracers there, and every
    # fp8 row was taken as one jax cannot hold, for the whole process
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, ml_dtypes, bf16bridge as bb
        jax.jit(bb.bridge('numpy')(lambda a: a * 2))(jnp.ones(2))
        a = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
        print((np.asarray(bb.convert(a, to="jax")).view(np.uint8) == a.view(np.uint8)).all())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1] == "True", out.stderr[-3000:]


@pytest.mark.frameworks("torch")  # the framework imported late: torch (torch.compile)
def test_a_framework_imported_after_the_first_call_is_still_asked_about_its_compiler():
    import subprocess
    import sys
    import textwrap

    # which adapters have a graph compiler to step out of is kept between calls: importing
    # torch after the first bridged call must make torch's hook (torch.compile) count
    code = textwrap.dedent("""
        import numpy as np, bf16bridge as bb
        from bf16bridge.functions import bridged as functions
        fn = bb.bridge("numpy")(lambda x: x)
        fn(np.ones(2, np.float32))
        before = [a.name for a in functions.compilers()]
        import torch
        print(before, [a.name for a in functions.compilers()])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] ['torch']"


@pytest.mark.frameworks("torch")
def test_examples_run():
    """The examples under examples/ are part of the docs: they run, and check themselves."""
    import pathlib
    import runpy

    here = pathlib.Path(__file__).parents[1] / "examples"
    scripts = sorted(here.glob("*.py"))
    assert len(scripts) >= 2
    for script in scripts:
        runpy.run_path(str(script), run_name="__main__")


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


@pytest.mark.frameworks("torch")
def test_torch_compile_breaks_the_graph_around_a_bridged_call():
    import torch

    fn = bb.bridge("jax")(_layer("jax"))
    w, x = _data((4, 3), 3), _data((2, 4), 4)

    def model(W, X):
        return fn(W * 1, X) + 1  # torch ops on both sides of the bridged call

    W = make("torch", w).requires_grad_()
    with warnings.catch_warnings():  # dynamo reads .grad of non-leaf tensors while tracing: its own warning
        warnings.filterwarnings("ignore", "The .grad attribute of a Tensor that is not a leaf", UserWarning)
        y = torch.compile(model, backend="eager")(W, make("torch", x))
    y.float().sum().backward()
    W2 = make("torch", w).requires_grad_()
    y2 = model(W2, make("torch", x))
    y2.float().sum().backward()
    np.testing.assert_array_equal(bits(y), bits(y2))
    np.testing.assert_array_equal(bits(W.grad), bits(W2.grad))


@pytest.mark.frameworks("tensorflow")
def test_tf_function_with_unknown_dimensions_is_refused_clearly():
    import tensorflow as tf

    fn = bb.bridge("jax")(_layer("jax"))
    step = tf.function(fn, input_signature=[tf.TensorSpec([4, 3], tf.bfloat16),
                                            tf.TensorSpec([None, 4], tf.bfloat16)])
    with pytest.raises(bb.UnsupportedTypeError, match="input_signature"):
        step(make("tensorflow", _data((4, 3), 1)), make("tensorflow", _data((2, 4), 2)))


@pytest.mark.frameworks("tensorflow")
def test_tf_adapter_first_loaded_inside_a_tf_function_trace():
    """The tensorflow adapter tries its DLPack entry point when it loads; loaded for the first
    time inside a tf.function's trace, it must try eagerly, not on a symbolic tensor."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import tensorflow as tf, jax.numpy as jnp, numpy as np, bf16bridge as bb
        fn = bb.bridge("jax")(lambda x: jnp.tanh(x) * 2)
        step = tf.function(lambda x: fn(x))
        x = tf.constant([0.5, -1.0], tf.bfloat16)
        want = np.asarray(jnp.tanh(jnp.asarray([0.5, -1.0], jnp.bfloat16)) * 2).view(np.uint16)
        assert (tf.bitcast(step(x), tf.uint16).numpy() == want).all()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.frameworks("torch")
def test_a_jax_caller_compiles_a_bridged_call_once_per_signature():
    """jax caches a pure_callback's computation by the callback's identity: a bridged call must
    reuse its callbacks, or every gradient step compiles again (25 ms a call here)."""
    import logging

    import jax

    fn = bb.bridge("torch")(_layer("torch"))
    W, X, C = (make("jax", v) for v in (_data((4, 3), 3), _data((2, 4), 4), _data((2, 3), 5)))
    grad = jax.grad(lambda W, X: (fn(W, X) * C).sum())
    grad(W, X)  # the first call compiles

    class Count(logging.Handler):
        n = 0

        def emit(self, record):
            if "Compiling" in record.getMessage() or "compil" in record.getMessage().lower():
                Count.n += 1

    handler = Count()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            for _ in range(3):
                grad(W, X)
    finally:
        logger.removeHandler(handler)
    assert Count.n == 0
