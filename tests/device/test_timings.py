"""The bridge's routes against the workarounds people write (widen to float32 on the host and
back), timed in the same run; ratios above 1 mean the bridge is faster. Recorded, not asserted:
only that each zero-copy route really shared memory."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from devicehelp import BF16, DEVICE, best_time, host_bits, make, ptr, sync

N = (64 << 20) if DEVICE == "cuda" else (1 << 20)  # elements: 128 MiB of bf16 on the GPU
REPS = 5 if DEVICE == "cuda" else 3


def _workarounds(torch_device, jax_device):
    import jax
    import jax.numpy as jnp
    import torch

    return {
        # torch -> jax: through a float32 numpy array on the host, narrowed again on the device
        ("torch", "jax"): lambda t: jax.device_put(t.float().cpu().numpy(), jax_device).astype(jnp.bfloat16),
        # jax -> torch: the same, the other way
        ("jax", "torch"): lambda j: torch.from_numpy(np.array(j.astype(jnp.float32))).to(torch_device).bfloat16(),
        # device -> numpy: .cpu().float().numpy() (float32: twice the memory, and not bf16)
        ("torch", "numpy"): lambda t: t.cpu().float().numpy(),
        ("jax", "numpy"): lambda j: np.asarray(j.astype(jnp.float32)),
    }


ROUTES = [("torch", "jax"), ("jax", "torch"), ("torch", "numpy"), ("jax", "numpy")]


@pytest.mark.parametrize("src,dst", ROUTES, ids=[f"{s}->{d}" for s, d in ROUTES])
def test_bridge_against_workaround(src, dst, torch_device, jax_device, record_property):
    u16 = np.random.default_rng(0).integers(0, 1 << 16, N, dtype=np.uint16)
    # no NaN, inf or subnormal (a device may flush those when widening): the workaround keeps the rest exactly
    exponent = u16 & 0x7F80
    u16[(exponent == 0x7F80) | (exponent == 0)] = 0x3F80
    x = make(src, u16, torch_device, jax_device)
    sync(x)
    copy = True if dst == "numpy" else None  # a device tensor reaches numpy only by a host copy
    workaround = _workarounds(torch_device, jax_device)[(src, dst)]

    def bridge():
        sync(bb.convert(x, dst, copy=copy, on_alias="allow"))

    def other():
        sync(workaround(x))

    t_bridge, t_other = best_time(bridge, REPS), best_time(other, REPS)
    y = bb.convert(x, dst, copy=copy, on_alias="allow")
    if dst != "numpy":
        assert ptr(y) == ptr(x), "the zero-copy route copied"
    np.testing.assert_array_equal(host_bits(y), u16)
    w = workaround(x)
    # the workaround is a fair comparison: it gives the same values
    np.testing.assert_array_equal(host_bits(w.astype(BF16) if isinstance(w, np.ndarray) else w), u16)
    record_property("elements", N)
    record_property("mib", round(N * 2 / 2**20, 1))
    record_property("bridge_ms", round(t_bridge * 1e3, 4))
    record_property("workaround_ms", round(t_other * 1e3, 4))
    record_property("ratio", round(t_other / t_bridge, 2))
    record_property("bridge_zero_copy", dst != "numpy")
    record_property("bridge_dtype", "bfloat16")
    record_property("workaround_dtype", "float32" if dst == "numpy" else "bfloat16")
    assert str(y.dtype).endswith("bfloat16")


SMALL = 1024  # elements: a per-call cost, not a bandwidth
PAIRS_RAW = [("torch", "jax"), ("jax", "torch")]


@pytest.mark.parametrize("src,dst", PAIRS_RAW, ids=[f"{s}->{d}" for s, d in PAIRS_RAW])
def test_overhead_against_raw_dlpack(src, dst, torch_device, jax_device, record_property):
    """A small device tensor: ``bb.convert`` against the framework's own DLPack import, the call
    a user would write without the bridge (it has no bf16 checks, no plan, no notes). Both
    zero-copy, so the ratio is the bridge's per-call cost. Recorded, not asserted."""
    import jax.numpy as jnp
    import torch

    u16 = np.arange(SMALL, dtype=np.uint16) + 0x3F00
    x = make(src, u16, torch_device, jax_device)
    sync(x)
    raw_call = jnp.from_dlpack if dst == "jax" else torch.from_dlpack
    calls = 2000 if DEVICE == "cuda" else 500

    def many(fn):
        def run():
            for _ in range(calls):
                fn(x)
        return run

    t_bridge = best_time(many(lambda v: bb.convert(v, dst, on_alias="allow")), 3) / calls
    t_raw = best_time(many(raw_call), 3) / calls
    y, r = bb.convert(x, dst, on_alias="allow"), raw_call(x)
    assert ptr(y) == ptr(x) == ptr(r)
    np.testing.assert_array_equal(host_bits(y), u16)
    record_property("elements", SMALL)
    record_property("bridge_us", round(t_bridge * 1e6, 2))
    record_property("raw_us", round(t_raw * 1e6, 2))
    record_property("bridge_over_raw", round(t_bridge / t_raw, 2))


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")  # (the hand-written wrapper's)
@pytest.mark.parametrize("elements", [1024, (16 << 20) if DEVICE == "cuda" else (1 << 20)])
def test_bridged_call_under_jit_against_pure_callback(elements, torch_device, jax_device, record_property):
    """A torch callee (x * 2, float32) under jax.jit: the bridged call against the hand-written wrapper
    a user writes without the bridge, jax.pure_callback with numpy <-> torch (host copies). Same
    results; the times recorded, not asserted."""
    import jax
    import jax.numpy as jnp
    import torch

    x = jax.device_put(jnp.arange(elements, dtype=jnp.float32), jax_device)
    bridged = jax.jit(bb.bridge("torch")(lambda t: t * 2))
    aval = jax.ShapeDtypeStruct(x.shape, x.dtype)
    by_hand = jax.jit(lambda v: jax.pure_callback(lambda a: (torch.from_numpy(np.asarray(a)) * 2).numpy(), aval, v))
    np.testing.assert_array_equal(np.asarray(bridged(x)), np.asarray(by_hand(x)))
    t_bridge = best_time(lambda: bridged(x).block_until_ready(), 20)
    t_hand = best_time(lambda: by_hand(x).block_until_ready(), 20)
    record_property("elements", elements)
    record_property("bridge_us", round(t_bridge * 1e6, 1))
    record_property("pure_callback_us", round(t_hand * 1e6, 1))
    record_property("pure_callback_over_bridge", round(t_hand / t_bridge, 2))
