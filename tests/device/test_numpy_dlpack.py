"""NumPy 2.5's DLPack dtype registry (np.dtypes.register_dlpack_dtype, numpy#31256): whether
ml_dtypes registers bf16 there (ml_dtypes#376), and whether np.from_dlpack then takes a bf16
tensor. This records what it finds; it fails only when a route that works gives wrong bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from devicehelp import BF16, host_bits, make


def test_registry_present(record_property):
    record_property("numpy", np.__version__)
    record_property("ml_dtypes", ml_dtypes.__version__)
    has = hasattr(np.dtypes, "register_dlpack_dtype")
    record_property("register_dlpack_dtype", has)
    caps = bb.probe()
    record_property("probe_numpy_bf16_dlpack", f"{caps.numpy.bf16_dlpack} ({caps.numpy.bf16_dlpack_why})")


@pytest.mark.parametrize("src", ["torch", "jax"])
def test_from_dlpack_host_copy(src, all_u16, torch_device, jax_device, record_property):
    """``np.from_dlpack(x.cpu())`` for a bf16 tensor made on the device, moved to the host."""
    x = make(src, all_u16, torch_device, jax_device)
    if src == "torch":
        host = x.cpu()
    else:
        import jax

        host = jax.device_put(x, jax.devices("cpu")[0])
    try:
        a = np.from_dlpack(host)
    except (BufferError, RuntimeError, TypeError) as err:
        record_property("np.from_dlpack", f"refused: {type(err).__name__}: {err}")
    else:
        record_property("np.from_dlpack", f"works: dtype {a.dtype}")
        assert a.dtype == BF16, f"np.from_dlpack gave {a.dtype}, not ml_dtypes' bfloat16"
        np.testing.assert_array_equal(host_bits(a), all_u16)
    plan = bb.plan(host, "numpy")
    record_property("bridge_route", " -> ".join(s.label for s in plan.steps))


def test_bridge_registration(all_u16, torch_device, jax_device, record_property):
    """Where NumPy has the registry and ml_dtypes did not register bf16, the bridge does (once the
    numpy adapter is built), and then ``np.from_dlpack`` takes bf16 from torch directly, bits kept,
    and the planner's torch -> numpy route is that one hand-over."""
    from bf16bridge.core import registry
    from bf16bridge.adapters import numpy_registry as _numpy_registry

    adapter = registry.get("numpy")  # builds the adapter: the registration runs here
    done = _numpy_registry.register()  # a second call finds what the first did
    record_property("registration", str(done))
    record_property("numpy_dlpack_rows", ",".join(sorted(adapter.dlpack_import - frozenset(bb.dtypes.STANDARD))))
    if not done.available:
        assert "bfloat16" not in adapter.dlpack_import
        return
    assert "bfloat16" in done.already, f"bf16 still does not cross numpy's DLPack: {done}"
    assert "bfloat16" in adapter.dlpack_import and "bfloat16" in adapter.dlpack_export
    host = make("torch", all_u16, torch_device, jax_device).cpu()
    a = np.from_dlpack(host)
    assert a.dtype == BF16
    np.testing.assert_array_equal(host_bits(a), all_u16)
    plan = bb.plan(host, "numpy")
    record_property("bridge_route_after_registration", " -> ".join(s.label for s in plan.steps))
    assert [s.kind for s in plan.steps] == ["dlpack"] and not plan.copies
