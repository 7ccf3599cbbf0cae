"""device=: host tensors to the GPU in one copy (a "place" step of the plan), device tensors already
there zero-copy (by pointer), and back to the host, for torch and jax targets, by a device object of
the target and by a name ("cuda:N" in both). In the dry run the test device is the CPU: nothing
moves, and the plans say so."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from devicehelp import BF16, DEVICE, host_bits, make, ptr, where

TARGETS = ["torch", "jax"]


def _host(src: str, u16: np.ndarray):
    """``u16`` as a bf16 tensor of ``src`` in host memory, by the framework's own calls."""
    if src == "numpy":
        return u16.view(BF16).copy()
    if src == "torch":
        import torch

        return torch.from_numpy(u16.view(np.int16).copy()).view(torch.bfloat16)
    import jax

    return jax.device_put(u16.view(BF16), jax.devices("cpu")[0])


def _devices(dst: str, torch_device, jax_device) -> list:
    """The test device as ``device=`` may name it for target ``dst``: its own device object, and a name."""
    name = "cpu" if torch_device.type == "cpu" else f"cuda:{torch_device.index}"
    return [torch_device if dst == "torch" else jax_device, name]


def _ptr(x) -> int:
    return x.ctypes.data if isinstance(x, np.ndarray) else ptr(x)


def _route(p) -> str:
    return " -> ".join(f"{s.label}{' [copy]' if s.copies else ''}" for s in p.steps) or "(no steps)"


@pytest.mark.parametrize("dst", TARGETS)
@pytest.mark.parametrize("src", ["numpy", "torch", "jax"])
def test_host_to_device_in_one_copy(src, dst, all_u16, torch_device, jax_device, record_property):
    x = _host(src, all_u16)
    for device in _devices(dst, torch_device, jax_device):
        p = bb.plan(x, dst, device=device)
        y = bb.convert(x, dst, device=device, on_alias="allow")
        record_property(f"route ({type(device).__name__})", _route(p))
        record_property("result_device", where(y))
        np.testing.assert_array_equal(host_bits(y), all_u16)
        if DEVICE == "cuda":
            assert where(y) == f"gpu:{torch_device.index}"
            assert [s.kind for s in p.steps if s.copies] == ["place"], _route(p)  # the move is the one copy
            assert p.to_device is not None and not p.shares_memory
            # copy=True: the move is the copy (no host copy before it); copy=False refuses the move
            assert [s.kind for s in bb.plan(x, dst, device=device, copy=True).steps if s.copies] == ["place"]
            with pytest.raises(bb.CopyRequiredError, match="copy=None"):
                bb.convert(x, dst, device=device, copy=False)
        else:
            assert where(y) == "cpu" and "place" not in [s.kind for s in p.steps]


@pytest.mark.parametrize("dst", TARGETS)
@pytest.mark.parametrize("src", ["torch", "jax"])
def test_already_on_the_device_zero_copy(src, dst, all_u16, torch_device, jax_device, record_property):
    x = make(src, all_u16, torch_device, jax_device)
    for device in _devices(dst, torch_device, jax_device):
        p = bb.plan(x, dst, device=device)
        y = bb.convert(x, dst, device=device, copy=False, on_alias="allow")
        record_property(f"route ({type(device).__name__})", _route(p))
        record_property("pointers_equal", ptr(y) == ptr(x))
        assert not p.copies and "place" not in [s.kind for s in p.steps]
        assert ptr(y) == ptr(x) and where(y) == where(x)
        np.testing.assert_array_equal(host_bits(y), all_u16)


@pytest.mark.parametrize("dst", ["numpy", *TARGETS])
@pytest.mark.parametrize("src", ["torch", "jax"])
def test_device_to_host_in_one_copy(src, dst, all_u16, torch_device, jax_device, record_property):
    x = make(src, all_u16, torch_device, jax_device)
    p = bb.plan(x, dst, device="cpu")
    y = bb.convert(x, dst, device="cpu", on_alias="allow")
    record_property("route", _route(p))
    record_property("result_device", "cpu" if isinstance(y, np.ndarray) else where(y))
    np.testing.assert_array_equal(host_bits(y), all_u16)
    if not isinstance(y, np.ndarray):
        assert where(y) == "cpu"
    if DEVICE == "cuda":
        assert sum(s.copies for s in p.steps) == 1, _route(p)  # to the host: one copy
        assert _ptr(y) != ptr(x)
    else:
        assert not p.copies and _ptr(y) == ptr(x)


@pytest.mark.parametrize("dst", TARGETS)
def test_a_gpu_this_machine_lacks_is_refused(dst, torch_device, jax_device, record_property):
    with pytest.raises(bb.DeviceError, match="has: 'cpu'") as err:
        bb.convert(_host("numpy", np.arange(4, dtype=np.uint16)), dst, device="cuda:99")
    record_property("error", str(err.value))
