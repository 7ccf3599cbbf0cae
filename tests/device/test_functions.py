"""bb.bridge with device tensors: torch caller -> jax callee and jax caller -> torch callee,
gradients included. Each result and gradient must equal the callee's own computation, bit
for bit, on the inputs the callee saw (docs/functions.md)."""

from __future__ import annotations

import numpy as np

import bf16bridge as bb
from devicehelp import DEVICE, host_bits, make, where

W_SHAPE, X_SHAPE = (64, 32), (16, 64)


def _bits(shape, seed):
    """bf16 bits of small normal values (no NaN or inf), reproducible."""
    v = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return (v.view(np.uint32) >> 16).astype(np.uint16)


def _inputs(framework, seed, torch_device, jax_device):
    """The bits of w and x, and w and x as tensors of ``framework`` on the test device."""
    wb, xb = _bits(W_SHAPE, seed), _bits(X_SHAPE, seed + 1)
    w = make(framework, wb.ravel(), torch_device, jax_device).reshape(W_SHAPE)
    x = make(framework, xb.ravel(), torch_device, jax_device).reshape(X_SHAPE)
    return wb, xb, w, x


def test_torch_caller_jax_callee_grad(torch_device, jax_device, record_property):
    import jax
    import jax.numpy as jnp

    seen = []

    def loss(w, x):
        seen.append(where(x))  # w is traced (the callee's jax.vjp); x, which wants no gradient, is not
        return jnp.sum(jnp.tanh(x @ w))

    _, _, w, x = _inputs("torch", 1, torch_device, jax_device)
    w.requires_grad_()
    out = bb.bridge("jax")(loss)(w, x)
    out.backward()
    # the callee's own computation on the same bits, on the same device
    _, _, wj, xj = _inputs("jax", 1, torch_device, jax_device)
    want, grad = jax.value_and_grad(loss)(wj, xj)
    record_property("callee_ran_on", seen[0])
    record_property("result_device", where(out))
    record_property("grad_device", where(w.grad))
    record_property("grad_mismatches", int((host_bits(w.grad) != host_bits(grad)).sum()))
    assert seen[0] == where(w), "the jax callee did not run on the caller's device"
    assert where(out) == where(w) and where(w.grad) == where(w)
    np.testing.assert_array_equal(host_bits(out), host_bits(want))
    np.testing.assert_array_equal(host_bits(w.grad), host_bits(grad))


def _torch_loss(seen):
    import torch

    def loss(w, x):
        seen.append(where(w))
        return torch.tanh(x @ w).sum()

    return loss


def _torch_reference(loss, wb, xb, device):
    """The torch callee's own value and gradient, on ``device``."""
    import torch

    dev = torch.device("cpu") if device == "cpu" else torch.device("cuda", int(device.split(":")[1]))
    w = make("torch", wb.ravel(), dev, None).reshape(W_SHAPE).requires_grad_()
    x = make("torch", xb.ravel(), dev, None).reshape(X_SHAPE)  # the same bits, on the callee's device
    out = loss(w, x)
    (g,) = torch.autograd.grad(out, [w])
    return out.detach(), g


def test_jax_caller_torch_callee(torch_device, jax_device, record_property):
    seen = []
    loss = _torch_loss(seen)
    wb, xb, wj, xj = _inputs("jax", 3, torch_device, jax_device)
    out = bb.bridge("torch")(loss)(wj, xj)  # concrete arrays: no transformation, a direct call
    want, _ = _torch_reference(_torch_loss([]), wb, xb, seen[0])
    record_property("callee_ran_on", seen[0])
    record_property("result_device", where(out))
    assert seen[0] == where(wj), "the torch callee did not run on the caller's device"
    assert where(out) == where(wj)
    np.testing.assert_array_equal(host_bits(out), host_bits(want))


def test_jax_caller_torch_callee_grad(torch_device, jax_device, record_property):
    import jax

    seen = []
    loss = _torch_loss(seen)
    wb, xb, wj, xj = _inputs("jax", 5, torch_device, jax_device)
    bridged = bb.bridge("torch")(loss)
    out, grad = jax.value_and_grad(lambda w: bridged(w, xj))(wj)
    # under jax.grad the callee runs in a jax callback: record where that put it
    ran = seen[-1]
    want, want_grad = _torch_reference(_torch_loss([]), wb, xb, ran)
    record_property("callee_ran_on", ran)
    record_property("callee_devices_seen", ", ".join(sorted(set(seen))))
    record_property("result_device", where(out))
    record_property("grad_device", where(grad))
    record_property("grad_mismatches", int((host_bits(grad) != host_bits(want_grad)).sum()))
    if DEVICE == "cuda" and ran == "cpu":
        record_property("finding", "under jax transformations the torch callee runs on the host "
                        "(jax.pure_callback hands it numpy arrays): two device<->host copies a call")
    assert where(out) == where(wj) and where(grad) == where(wj)
    np.testing.assert_array_equal(host_bits(out), host_bits(want))
    np.testing.assert_array_equal(host_bits(grad), host_bits(want_grad))
