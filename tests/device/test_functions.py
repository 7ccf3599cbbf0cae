"""bb.bridge with device tensors: torch caller -> jax callee and jax caller -> torch callee,
gradients included. Each result and gradient must equal the callee's own computation, bit
for bit, on the inputs the callee saw (docs/functions.md)."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.adapters.hooks import BridgeHooks
from bf16bridge.core import registry
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
    out = bb.bridge("jax", jit=False)(loss)(w, x)  # eager: the callee records where x is, not a tracer
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


def _jax_path(platform):
    """Whether the bridge runs a traced jax caller's torch callee on jax's own buffers on ``platform``."""
    from bf16bridge.adapters.jax import probe as jax_probe

    return jax_probe.buffers_here(platform) and (platform == "cpu" or "cuda" in registry.hooks(
        "torch", BridgeHooks).device_streams())


def test_jax_jit_caller_torch_callee_on_jaxs_buffers_in_order(all_u16, torch_device, jax_device, record_property):
    """Under jax.jit the torch callee runs on jax's own buffers: on the GPU (one CUDA device, torch with
    CUDA) on the device, its work queued on the computation's stream, so it reads its input only after
    the jit's large matmuls that write it, and jax reads its result only after it; on the CPU on jax's
    host buffers. Every bit pattern comes through; the callee's input is jax's buffer (by pointer)."""
    import jax
    import jax.numpy as jnp
    import torch

    size = 16384 if DEVICE == "cuda" else 128
    seen = {}

    @bb.bridge("torch")
    def copy(x):
        seen.update(device=where(x), ptr=x.data_ptr(),
                    stream=torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None,
                    default_stream=torch.cuda.default_stream(x.device).cuda_stream if x.is_cuda else None)
        return x.clone()

    @jax.jit
    def run(a, pattern):
        for _ in range(4):
            a = a @ a / size
        # float x*0 is not folded away by XLA (NaN rules): x waits for the matmuls, its bits the pattern's
        x = jax.lax.bitcast_convert_type(pattern | (a[0, 0] * 0).astype(jnp.uint16), jnp.bfloat16)
        y = copy(x)
        return jax.lax.bitcast_convert_type(y, jnp.uint16) ^ jnp.uint16(0x5555), x

    with jax.default_device(jax_device):
        a = jax.random.normal(jax.random.key(0), (size, size), dtype=jnp.bfloat16)
    pattern = jax.device_put(all_u16, jax_device)
    jax.block_until_ready((a, pattern))
    out, x = run(a, pattern)
    got = np.asarray(out) ^ np.uint16(0x5555)
    platform = "cuda" if DEVICE == "cuda" else "cpu"
    on_buffers = _jax_path(platform)
    from bf16bridge.core import versions

    # where it must: one device of the platform, torch with CUDA on the GPU (this machine's case), a jax
    # with buffer_callback; otherwise the check would pass on the path it means to leave
    assert on_buffers or len(jax.devices(platform)) > 1 or not registry.hooks("torch", BridgeHooks).device_streams() \
        or versions.release(jax.__version__) < (0, 8, 1), "the bridge took pure_callback where it should not"
    record_property("path", "buffer_callback" if on_buffers else "pure_callback")
    record_property("callee_ran_on", seen["device"])
    record_property("callee_stream_is_torchs_default", seen["stream"] == seen["default_stream"]
                    if seen["stream"] is not None else "n/a (cpu)")
    record_property("mismatches", int((got != all_u16).sum()))
    # the callee's input is a copy of jax's buffer (valid only during the callback: a kept input must be)
    record_property("input_is_a_copy", seen["ptr"] != x.unsafe_buffer_pointer())
    np.testing.assert_array_equal(got, all_u16)
    if on_buffers:
        assert seen["device"] == where(x), "the callee did not run where jax's buffers are"
        if DEVICE == "cuda":
            assert seen["stream"] != seen["default_stream"], "the callee ran on torch's own stream, not jax's"
    # and its gradient, under jit, on the same path: the callee's own, bit for bit
    wb, xb, wj, xj = _inputs("jax", 7, torch_device, jax_device)
    seen_grad = []
    bridged = bb.bridge("torch")(_torch_loss(seen_grad))
    out, grad = jax.jit(jax.value_and_grad(lambda w: bridged(w, xj)))(wj)
    want, want_grad = _torch_reference(_torch_loss([]), wb, xb, seen_grad[-1])
    record_property("grad_callee_ran_on", seen_grad[-1])
    record_property("grad_mismatches", int((host_bits(grad) != host_bits(want_grad)).sum()))
    np.testing.assert_array_equal(host_bits(out), host_bits(want))
    np.testing.assert_array_equal(host_bits(grad), host_bits(want_grad))
    if on_buffers:
        assert seen_grad[-1] == where(wj)


def test_jax_jit_torch_callee_keeping_its_input_and_giving_no_gradient(torch_device, jax_device, record_property):
    """On jax's buffers (a callback's, valid only during it) a callee that keeps its input keeps a copy
    of its own: the values stay after the computation runs again; and a gradient the callee has not
    (an input it does not use) is written as zeros into jax's buffer (on the device: zero_ on jax's
    stream)."""
    import jax
    import jax.numpy as jnp

    kept = []

    @bb.bridge("torch")
    def layer(w, h):
        kept.append(h)
        return h * 2  # w unused: its gradient is None in torch

    @jax.jit
    def loss(w, x):
        return layer(w, jnp.sin(x) + 1.0).sum()  # h: an intermediate, XLA's own temporary buffer

    with jax.default_device(jax_device):
        x = jnp.linspace(0, 1, 1 << 20, dtype=jnp.float32)
        w = jnp.full((1 << 20,), 7.0, jnp.float32)
    g = jax.jit(jax.grad(loss))(w, x)
    np.testing.assert_array_equal(np.asarray(g), np.zeros(1 << 20, np.float32))
    want = np.asarray(jnp.sin(x) + 1.0)
    loss(w, x).block_until_ready()
    first = kept[-1]
    for i in range(10):
        loss(w, x * (i + 2)).block_until_ready()  # the computation again: its temporaries reused
    got = first.detach().cpu().numpy()
    record_property("kept_on", where(first))
    record_property("kept_mismatches", int((got != want).sum()))
    record_property("zero_grad_on", where(g))
    np.testing.assert_array_equal(got, want)


def test_jax_jit_packed_types_through_a_callee(jax_device, record_property):
    """int4 (a type jax stores packed, two values a byte) under jit through a numpy callee reversing it:
    it takes pure_callback (a view of jax's buffer would read one value a byte), and comes back with
    the right values, or our UnsupportedDtypeError where this jax's callbacks refuse it."""
    import warnings

    import jax
    import jax.numpy as jnp

    from bf16bridge.adapters.jax import probe as jax_probe

    a = np.resize(np.arange(-8, 8, dtype=np.int8), (6, 5))
    with jax.default_device(jax_device):
        x = jnp.asarray(a, dtype=jnp.int4)
    flip = bb.bridge("numpy")(lambda y: y[::-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bb.Bf16BridgeWarning)  # (numpy has no autodiff: jax's inputs)
        if not jax_probe.callback_takes_packed():
            with pytest.raises(bb.UnsupportedDtypeError, match="takes or gives int4"):
                jax.jit(flip)(x)
            record_property("int4", "refused with our error (this jax's callbacks cannot carry it)")
            return
        got = np.asarray(jax.jit(flip)(x)).astype(np.int8)
    record_property("int4", "values kept" if np.array_equal(got, a[::-1]) else "WRONG values")
    record_property("result_device", where(jax.jit(flip)(x)))
    np.testing.assert_array_equal(got, a[::-1])
