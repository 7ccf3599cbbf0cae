"""The fast path keeps a plan whose only copies are decided by the dtype (packing, unpacking: a fresh
result every run), and sends an input its key cannot tell apart (a 0-d array, an odd last dimension,
a byte packing would change) back to the full path, which refuses it in the planner's own words."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import convert as convert_module, dtypes, fastpath
from bf16bridge.errors import Bf16BridgeError, CopyRequiredError
from strategies import lacks


def _packed_torch(n_bytes: int, ndim: int = 1):
    import torch

    raw = torch.from_numpy((np.arange(n_bytes) % 256).astype(np.uint8))
    raw = raw.reshape(-1, 2) if ndim == 2 else raw
    return raw.view(torch.float4_e2m1fn_x2)


def _by_hand(x) -> np.ndarray:
    """torch's packed fp4 unpacked by hand: the low nibble first, then the high, one value a byte."""
    import torch

    b = x.view(torch.uint8).numpy()
    out = np.empty((*b.shape[:-1], 2 * b.shape[-1]), np.uint8)
    out[..., 0::2], out[..., 1::2] = b & 0xF, b >> 4
    return out


def _error(call) -> tuple[type, str]:
    with pytest.raises(Bf16BridgeError) as err:
        call()
    return type(err.value), str(err.value)


@pytest.fixture
def no_full_path(monkeypatch):
    """After it is called, convert's full path (describe, plan) fails the test where it runs."""
    def arm():
        def refuse(*a, **k):
            raise AssertionError("the kept plan was not used: the input was planned again")
        monkeypatch.setattr(convert_module, "_convert", refuse)
    return arm


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("to", ["numpy", "jax"])
def test_a_packed_torch_tensor_runs_its_kept_plan_with_every_byte_unpacked_bit_for_bit(to, no_full_path):
    if lacks("float4_e2m1fn"):  # (our error naming the ml_dtypes that has it, asserted)
        return
    fastpath.clear()
    x = _packed_torch(256, ndim=2)
    first = bb.convert(x, to)
    no_full_path()
    again = bb.convert(x, to)
    for y in (first, again):
        assert np.array_equal(np.asarray(y).view(np.uint8), _by_hand(x))
    if to == "numpy":  # a fresh result every run: the two do not share memory
        assert not np.shares_memory(first, again)


@pytest.mark.frameworks("torch")
def test_a_0d_packed_input_after_a_kept_plan_gets_the_planners_refusal():
    import torch

    if lacks("float4_e2m1fn"):
        return

    zero_d = torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    fastpath.clear()
    cold = _error(lambda: bb.convert(zero_d, "numpy"))
    bb.convert(_packed_torch(8), "numpy")  # the same fast key as the 0-d input: its plan is kept
    assert _error(lambda: bb.convert(zero_d, "numpy")) == cold
    assert "no last dimension to lay them along" in cold[1]


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.parametrize("to", ["torch", "jax"])
def test_an_odd_or_uncanonical_input_after_a_kept_packing_plan_gets_the_cold_error(to):
    if lacks("float4_e2m1fn"):
        return
    fp4 = dtypes.numpy_dtype("float4_e2m1fn")
    good = np.zeros(4, np.uint8).view(fp4)
    odd = np.zeros(3, np.uint8).view(fp4)
    uncanonical = np.zeros(4, np.uint8)
    uncanonical[0] = 0x30  # ml_dtypes reads -0; packing keeps the low four bits: +0
    uncanonical = uncanonical.view(fp4)
    for bad in ((odd,) if to == "torch" else ()) + (uncanonical,):
        fastpath.clear()
        cold = _error(lambda: bb.convert(bad, to))
        bb.convert(good, to)
        assert _error(lambda: bb.convert(bad, to)) == cold, to


@pytest.mark.frameworks("torch")
def test_copy_false_still_refuses_a_packed_route_after_its_plan_was_kept():
    if lacks("float4_e2m1fn"):
        return
    fastpath.clear()
    x = _packed_torch(8)
    bb.convert(x, "numpy")
    with pytest.raises(CopyRequiredError):
        bb.convert(x, "numpy", copy=False)
