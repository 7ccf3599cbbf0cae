"""Where each framework's fresh allocations start (a probe fact), and bb.aligned_empty(..., like=...):
a 64-byte aligned tensor of that framework, over aligned numpy memory where a zero-copy route exists.
Addresses and bits are read with each framework's own calls (conftest's ptr and bits)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.adapters import trials
from conftest import BF16, bits, dtype_name, fw, ptr


def test_allocation_offsets_keeps_every_allocation_alive_while_it_reads_them():
    made, alive = [], []

    class Block:
        def __init__(self, n):
            self.n = n

    def make(n):
        b = Block(n)
        made.append(weakref.ref(b))
        return b

    def pointer(b):
        alive.append(sum(r() is not None for r in made))
        return 1000 + b.n  # an address: its offset is what is read

    got = trials.allocation_offsets(make, pointer)
    assert got == tuple((1000 + n) % 64 for n in trials.ALLOCATION_SIZES)
    assert alive == [len(trials.ALLOCATION_SIZES)] * len(alive)  # all alive at each read: distinct blocks
    gc.collect()


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_the_probe_records_each_frameworks_allocation_offsets():
    caps = bb.probe(frameworks="all", refresh=True)
    # the built-in frameworks (another test may have registered a stand-in adapter of its own)
    found = {"numpy": caps.numpy.alignment,
             **{n: f.alignment for n, f in caps.frameworks.items() if n in ("torch", "jax", "tensorflow")}}
    assert len(found) == 4, sorted(caps.frameworks)
    for name, a in found.items():
        assert a is not None and len(a.offsets) == len(trials.ALLOCATION_SIZES), name
        assert all(0 <= o < 64 for o in a.offsets) and a.aligned == (not any(a.offsets)), (name, a)
        assert f"fresh {name} allocations" in a.why and ", ".join(map(str, a.offsets)) in a.why
        if not a.aligned:
            assert f"aligned_empty(..., like={name!r})" in a.why
    assert "allocations" in str(caps)
    assert bb.probe(trials=False, refresh=True).numpy.alignment is None  # fallback="auto" allocates nothing to read


# tensorflow holds float8_e4m3fn but takes none from numpy without a copy: our error, tested below
CASES = [(like, dtype) for like in ("numpy", "torch", "jax", "tensorflow")
         for dtype in ("bfloat16", "float32", "uint8", "float8_e4m3fn") if (like, dtype) != ("tensorflow", "float8_e4m3fn")]


@pytest.mark.parametrize("like,dtype", CASES)
def test_aligned_empty_like_a_framework_is_aligned_and_of_that_dtype(like, dtype, all_bf16):
    x = bb.aligned_empty((256, 256) if dtype == "bfloat16" else (3, 5), dtype, like=like)
    assert type(x).__module__.split(".")[0] in {"numpy": ("numpy",), "torch": ("torch",),
                                                 "jax": ("jax", "jaxlib"), "tensorflow": ("tensorflow",)}[like]
    assert ptr(x) % 64 == 0 and dtype_name(x) == dtype and tuple(x.shape) == ((256, 256) if dtype == "bfloat16" else (3, 5))
    if like in ("jax", "tensorflow"):  # never written in place: zeros, not leftovers
        assert not bits(x).any()
    if dtype == "bfloat16" and like in ("numpy", "torch"):  # writable: every pattern written and read back
        if like == "torch":
            torch = fw("torch")
            x.view(torch.uint16).copy_(torch.from_numpy(all_bf16.view(np.int16).reshape(256, 256)).view(torch.uint16))
        else:
            x.view(np.uint16)[...] = all_bf16.reshape(256, 256)
        np.testing.assert_array_equal(bits(x).reshape(-1), all_bf16)


@pytest.mark.frameworks("torch", "jax")
def test_aligned_empty_like_torch_crosses_to_jax_and_back_without_a_copy(all_bf16):
    """The way out for a torch tensor over numpy's 16-byte aligned memory (torch.from_numpy): torch ->
    jax -> torch over one buffer, every bf16 pattern intact."""
    torch = fw("torch")
    t = bb.aligned_empty(all_bf16.shape, "bfloat16", like="pt")
    t.view(torch.uint16).copy_(torch.from_numpy(all_bf16.view(np.int16)).view(torch.uint16))
    j = bb.convert(t, "jax")
    back = bb.convert(j, "torch", on_alias="allow")
    assert ptr(j) == ptr(t) == ptr(back)
    np.testing.assert_array_equal(bits(back), all_bf16)


def test_aligned_empty_like_refuses_what_it_cannot_make_with_our_errors():
    with pytest.raises(bb.UnknownFrameworkError, match="unknown framework 'cupy'"):
        bb.aligned_empty(4, like="cupy")
    with pytest.raises(bb.InvalidArgumentError, match="shape must be whole numbers"):
        bb.aligned_empty((2, -3), like="numpy")
    a = bb.aligned_empty(7, BF16, like="np")
    assert isinstance(a, np.ndarray) and a.dtype == BF16 and a.ctypes.data % 64 == 0


@pytest.mark.frameworks("tensorflow")
def test_aligned_empty_like_tensorflow_says_why_it_cannot_make_an_fp8_tensor():
    with pytest.raises(bb.UnsupportedDtypeError, match=r"aligned_empty\(like='tf'\): tensorflow takes no "
                                                        r"float8_e4m3fn array from numpy without a copy"):
        bb.aligned_empty(4, "float8_e4m3fn", like="tf")
