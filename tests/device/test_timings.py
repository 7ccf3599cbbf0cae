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
