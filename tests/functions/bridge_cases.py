"""What the bridged-function tests share: bf16 data, a layer written in each framework's own API, and
each framework's own vector-Jacobian product to compare a bridged call's gradients with
(test_fuzz_calls.py uses ``native_vjp`` too)."""

from __future__ import annotations

import numpy as np

from conftest import BF16, make


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 0.5).astype(np.float32).astype(BF16)


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


def as_bridged_runs(callee, f):
    """``f`` as ``bb.bridge(callee)`` runs it by default: a jax function compiled (``jax.jit``), any other as
    written; what a bridged call's results equal bit for bit."""
    if callee == "jax":
        import jax

        return jax.jit(f)
    return f


def _callee_vjp(callee, w, x, ct, compiled=True):
    """The callee framework's own vjp of _layer at (w, x) with cotangent ct: (dw, dx)."""
    return native_vjp(callee, _layer(callee), (w, x), ct, compiled=compiled)


def native_vjp(callee, f, primals, cts, wanted=None, compiled=True):
    """The callee framework's own vjp of ``f`` (its tensors in, a tensor or a list of them out) at
    ``primals`` (numpy arrays) with cotangents ``cts`` (numpy, matching f's output): one gradient
    per primal. A jax one as ``bb.bridge("jax")`` runs it (docs/functions.md): ``jax.jit`` of ``jax.vjp``
    over the primals in ``wanted`` (default all), its pullback applied by a ``jax.jit`` too (XLA's fused
    code may round differently from ``jax.vjp`` run op by op, as on jax 0.4.30); None for the others.
    ``compiled=False``: ``jax.vjp`` as written (a jax caller's call, or ``jit=False``)."""
    P = [make(callee, v) for v in primals]
    C = [make(callee, c) for c in cts] if isinstance(cts, list) else make(callee, cts)
    if callee == "torch":
        import torch

        for p in P:
            p.requires_grad_()
        return torch.autograd.grad(f(*P), P, C)
    if callee == "jax":
        import jax

        if not compiled:
            return jax.vjp(f, *P)[1](C)
        chosen = [i for i in range(len(P)) if wanted is None or i in wanted]

        def of_chosen(*xs):
            full = list(P)
            for i, v in zip(chosen, xs):
                full[i] = v
            return f(*full)

        _, pullback = jax.jit(lambda *xs: jax.vjp(of_chosen, *xs))(*[P[i] for i in chosen])
        grads = iter(jax.jit(lambda p, c: p(c))(pullback, C))
        return [next(grads) if i in chosen else None for i in range(len(P))]
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(P)
        y = f(*P)
    return tape.gradient(y, P, output_gradients=C)
