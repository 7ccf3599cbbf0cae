"""Bridged calls under a caller's transformations: jax.jit, grad and vmap (buffer_callback or
pure_callback, every vmap method, several CPU devices, one compilation per signature), tf.function
(gradients inside it, jit_compile and higher orders refused clearly), torch.compile (a graph break
around the call), and an adapter first loaded under a trace."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from bridge_cases import _callee_vjp, _data, _layer, as_bridged_runs
from conftest import bits, make


# -- a jax caller: jit, its callbacks, vmap ----------------------------------------------------------


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


# -- a tf caller: tf.function ---------------------------------------------------------------------


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
    np.testing.assert_array_equal(bits(y), bits(as_bridged_runs("jax", _layer("jax"))(make("jax", w), make("jax", x))))
    np.testing.assert_array_equal(bits(dw), bits(_callee_vjp("jax", w, x, ct)[0]))


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


# -- a torch caller: torch.compile ----------------------------------------------------------------


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
