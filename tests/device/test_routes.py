"""torch <-> jax on the device: bits, pointers, device index, busy streams, copies, host moves."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from devicehelp import BF16, DEVICE, PAIRS, host_bits, make, pair_id, ptr, where

pairs = pytest.mark.parametrize("src,dst", PAIRS, ids=[pair_id(p) for p in PAIRS])


@pairs
def test_all_patterns_bit_exact(src, dst, all_u16, torch_device, jax_device, record_property):
    x = make(src, all_u16, torch_device, jax_device)
    y = bb.convert(x, dst, on_alias="allow")
    got = host_bits(y)
    record_property("patterns", int(got.size))
    record_property("mismatches", int((got != all_u16).sum()))
    record_property("route", " -> ".join(s.label for s in bb.plan(x, dst).steps))
    assert got.size == 1 << 16
    np.testing.assert_array_equal(got, all_u16)


@pairs
def test_zero_copy_by_pointer(src, dst, all_u16, torch_device, jax_device, record_property):
    x = make(src, all_u16, torch_device, jax_device)
    y = bb.convert(x, dst, copy=False, on_alias="allow")
    record_property("source_ptr", hex(ptr(x)))
    record_property("result_ptr", hex(ptr(y)))
    assert ptr(x) == ptr(y)
    assert not bb.plan(x, dst).copies


@pairs
def test_device_index_kept(src, dst, all_u16, torch_device, jax_device, record_property):
    x = make(src, all_u16, torch_device, jax_device)
    y = bb.convert(x, dst, on_alias="allow")
    record_property("source_device", where(x))
    record_property("result_device", where(y))
    if DEVICE == "cuda":
        import torch

        n = torch.cuda.device_count()
        record_property("gpus", n)
        if n == 1:
            record_property("index_note", "one GPU: only index 0 was tried")
    assert where(y) == where(x)


def _busy_torch(all_u16, torch_device, size):
    """A torch tensor whose final bits are written by a kernel queued behind large matmuls."""
    import torch

    a = torch.randn(size, size, device=torch_device, dtype=torch.bfloat16)
    x = torch.full((1 << 16,), 0x5555, dtype=torch.int16, device=torch_device)
    pattern = torch.from_numpy(all_u16.view(np.int16).copy()).to(torch_device)
    if torch_device.type == "cuda":
        torch.cuda.synchronize(torch_device)
    for _ in range(4):
        a = a @ a / size
    x.copy_(pattern)  # on the same stream, after the matmuls
    busy = (not torch.cuda.current_stream(torch_device).query()) if torch_device.type == "cuda" else None
    return x.view(torch.bfloat16), busy, a


def _busy_jax(all_u16, jax_device, size):
    """A jax array still being computed: its bits depend on large matmuls queued before it."""
    import jax
    import jax.numpy as jnp

    with jax.default_device(jax_device):
        a = jax.random.normal(jax.random.key(0), (size, size), dtype=jnp.bfloat16)
    pattern = jax.device_put(all_u16, jax_device)
    a.block_until_ready()
    pattern.block_until_ready()
    for _ in range(4):
        a = a @ a / size
    # float x*0 is not folded away by XLA (NaN rules), so x waits for the matmuls; its bits are the pattern's
    x = jax.lax.bitcast_convert_type(pattern | (a[0, 0] * 0).astype(jnp.uint16), jnp.bfloat16)
    busy = not x.is_ready() if DEVICE == "cuda" else None
    return x, busy, a


@pairs
def test_producer_stream_busy(src, dst, all_u16, torch_device, jax_device, record_property):
    size = 16384 if DEVICE == "cuda" else 128
    if src == "torch":
        x, busy, keep = _busy_torch(all_u16, torch_device, size)
    else:
        x, busy, keep = _busy_jax(all_u16, jax_device, size)
    y = bb.convert(x, dst, on_alias="allow")
    if dst == "torch":
        read = y.view(__import__("torch").int16).clone()  # a kernel on torch's stream reads it at once
    else:
        read = y  # np.asarray(y): jax's own transfer reads it
    got = host_bits(read)
    record_property("producer_busy_at_handoff", "n/a on cpu (synchronous)" if busy is None else busy)
    record_property("mismatches", int((got != all_u16).sum()))
    del keep
    if DEVICE == "cuda":
        # the check means something only if the producer had not finished when the bridge took the tensor
        assert busy, "the producer's queue was already empty at the hand-off: make the queued work larger"
    np.testing.assert_array_equal(got, all_u16)


@pairs
def test_copy_true_stays_on_device(src, dst, all_u16, torch_device, jax_device, record_property):
    x = make(src, all_u16, torch_device, jax_device)
    y = bb.convert(x, dst, copy=True)
    record_property("source_device", where(x))
    record_property("result_device", where(y))
    record_property("route", " -> ".join(s.label for s in bb.plan(x, dst, copy=True).steps))
    assert ptr(y) != ptr(x)
    np.testing.assert_array_equal(host_bits(y), all_u16)
    assert where(y) == where(x), "copy=True moved the result off the input's device"


@pytest.mark.parametrize("src", ["torch", "jax"])
def test_numpy_target(src, all_u16, torch_device, jax_device, record_property):
    x = make(src, all_u16, torch_device, jax_device)
    if DEVICE == "cuda":
        for copy in (None, False):
            with pytest.raises(bb.DeviceError) as err:
                bb.convert(x, "numpy", copy=copy)
            record_property(f"copy={copy}", f"DeviceError: {err.value}")
    else:
        a = bb.convert(x, "numpy")
        record_property("copy=None", "cpu tensor: no DeviceError (host memory)")
        np.testing.assert_array_equal(a.view(np.uint16), all_u16)
    a = bb.convert(x, "numpy", copy=True)
    record_property("copy=True", f"{type(a).__name__} {a.dtype}, route: "
                    + " -> ".join(s.label for s in bb.plan(x, "numpy", copy=True).steps))
    assert isinstance(a, np.ndarray) and a.dtype == BF16
    np.testing.assert_array_equal(a.view(np.uint16), all_u16)


FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def _make_fp8(framework, name, torch_device, jax_device):
    """Every bit pattern of ``name`` as a tensor of ``framework`` on the test device, by its own calls."""
    bits = np.arange(256, dtype=np.uint8)
    if framework == "torch":
        import torch

        t = torch.empty(256, dtype=torch.uint8, device=torch_device)
        return t.copy_(torch.from_numpy(bits)).view(getattr(torch, name))
    import jax

    return jax.device_put(bits.view(np.dtype(getattr(ml_dtypes, name))), jax_device)


def _fp8_bits(x) -> np.ndarray:
    if type(x).__module__.split(".")[0] == "torch":
        import torch

        return x.view(torch.uint8).cpu().numpy().copy()
    return np.asarray(x).view(np.uint8).copy()


@pairs
@pytest.mark.parametrize("name", FP8)
def test_fp8_every_pattern_zero_copy(src, dst, name, torch_device, jax_device, record_property):
    """The fp8 rows torch and jax both hold cross on the device bit for bit, by pointer, device kept.
    Where jax cannot hold the row (ml_dtypes 0.3.1 has no e8m0): our error. Where jax does not export it
    over DLPack (jax 0.4.30 exports no fp8: found by trying), jax -> torch copies (a bit-cast), as the
    plan says."""
    from bf16bridge.core import dtypes
    from bf16bridge.core import registry

    missing = registry.get("jax").cannot_hold(name)
    if missing is not None:
        record_property("route", f"none: {missing}")
        assert "upgrade ml_dtypes" in missing and dtypes.numpy_missing(name) is not None
        if src == "torch":
            with pytest.raises(bb.UnsupportedDtypeError, match="upgrade ml_dtypes"):
                bb.convert(_make_fp8(src, name, torch_device, jax_device), dst)
        return
    x = _make_fp8(src, name, torch_device, jax_device)
    p = bb.plan(x, dst)
    record_property("route", " -> ".join(s.label for s in p.steps))
    y = bb.convert(x, dst, on_alias="allow")
    np.testing.assert_array_equal(_fp8_bits(y), np.arange(256, dtype=np.uint8))
    assert where(y) == where(x)
    # torch -> jax goes by its bit-view and numpy (host) or DLPack; jax -> torch needs jax's DLPack export
    if src == "torch" or name in registry.get("jax").dlpack_export:
        assert not p.copies and ptr(y) == ptr(x)
    else:
        assert p.copies and ptr(y) != ptr(x)
