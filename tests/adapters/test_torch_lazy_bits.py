"""A torch tensor with a pending negation or conjugation (``torch._neg_view``, ``c.conj()``,
``c.conj().imag``) converts to exactly the bits torch itself gives when it materialises it
(``t.resolve_neg().resolve_conj().contiguous()``), NaN payloads and both signs included, whatever its
layout: torch's kernel flips a NaN's sign where it runs vectorised and gives a canonical NaN
elsewhere, so a copy into another layout than torch's own resolve gives other bits."""

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bits

TARGETS = ["numpy", "jax", "tensorflow", "torch"]


def _float32_patterns():
    """Every sign and exponent with NaN payloads (signalling and quiet), infinities, zeros and
    ordinary values: 65,536 float32 bit patterns."""
    rng = np.random.default_rng(32)
    hi = np.arange(1 << 9, dtype=np.uint32) << 23  # sign and exponent
    lo = np.concatenate([[0, 1, 0x400000, 0x400001, 0x7fffff, 0x3fffff],
                         rng.integers(0, 1 << 23, 128 - 6)]).astype(np.uint32)
    return (hi[:, None] | lo[None, :]).ravel()


def _patterns(dtype):
    """A 1-d torch tensor of 65,536 elements of ``dtype``: every bf16 and float16 pattern; float32
    and complex64 over _float32_patterns."""
    import torch

    if dtype in ("bfloat16", "float16"):
        return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(getattr(torch, dtype))
    f = torch.from_numpy(_float32_patterns().view(np.float32))
    if dtype == "float32":
        return f
    return torch.view_as_complex(torch.cat([f, f.flip(0)]).reshape(-1, 2))  # each pattern as re and im


def _layouts(base):
    """Views of the same 65,536 elements (or a slice of them) in several layouts."""
    u = base.reshape(64, 4, -1).unsqueeze(1)
    odd = u.as_strided(u.shape, (u.stride(0), 100, *u.stride()[2:]))  # a size-1 dim with a stride of 100
    five = base[:108].reshape(2, 2, 3, 3, 3).unsqueeze(3)
    five = five.as_strided(five.shape, (*five.stride()[:3], 100, *five.stride()[4:]))
    return {
        "flat": base,
        "[2, 2, 3, 1, 3, 3], size-1 stride 100, permuted": five.permute(5, 3, 0, 4, 2, 1),
        "2-d": base.reshape(256, -1),
        "transposed": base.reshape(256, -1).t(),
        "permuted 3-d": base.reshape(16, 64, -1).permute(2, 0, 1),
        "size-1 stride 100": odd,
        "size-1 stride 100, permuted": odd.permute(3, 1, 0, 2),
        "stepped": base[::2],
        "sliced 2-d": base.reshape(256, -1)[:, 1:200:3],
        "odd length": base[:1001],
    }


def _lazy(dtype):
    """The pending bits a tensor of ``dtype`` can carry, as functions making them."""
    import torch

    if dtype != "complex64":
        return {"neg": torch._neg_view}
    return {
        "conj": lambda t: t.conj(),
        "neg": torch._neg_view,
        "neg of conj": lambda t: torch._neg_view(t.conj()),
        "conj().imag": lambda t: t.conj().imag,
        "neg of conj, .real": lambda t: torch._neg_view(t.conj()).real,
    }


def _as_bits(x):
    """The unsigned-int bits of a tensor as one flat array (a complex one's parts one after another)."""
    return bits(x).ravel()


def _torch_reference(t):
    """What torch itself gives when it materialises ``t``: the bits every conversion must give."""
    out = t.resolve_neg().resolve_conj().contiguous()
    assert not (out.is_neg() or out.is_conj())
    return _plain_bits(out)


def _plain_bits(t):
    import torch

    if t.is_complex():
        t = torch.view_as_real(t)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width).numpy().view(f"u{t.element_size()}").ravel()


def _result_bits(y):
    """The bits of a conversion's result (a torch result is read without resolving anything: it
    must carry no pending bit)."""
    if type(y).__module__.split(".")[0] == "torch":
        assert not (y.is_neg() or y.is_conj())
        return _plain_bits(y)
    return _as_bits(y)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "complex64"])
def test_lazy_bits_convert_to_torchs_own_materialisation(dtype, to):
    base = _patterns(dtype)
    kept = base.clone()
    failures = []
    for layout, view in _layouts(base).items():
        for lazy, make_lazy in _lazy(dtype).items():
            t = make_lazy(view)
            assert t.is_neg() or t.is_conj(), (layout, lazy)
            expected = _torch_reference(t)
            for copy in (None, True):
                y = bb.convert(t, to, copy=copy)
                got = _result_bits(y)
                assert got.shape == expected.shape, (layout, lazy, copy)
                differ = np.flatnonzero(got != expected)
                if differ.size:
                    i = differ[0]
                    failures.append(f"{layout}, {lazy}, copy={copy}: {differ.size} differ, first "
                                    f"{got[i]:#x} where torch gives {expected[i]:#x}")
    assert not failures, "\n".join(failures)
    np.testing.assert_array_equal(_plain_bits(base), _plain_bits(kept))


@pytest.mark.frameworks("torch")
def test_the_copy_step_is_torchs_own_resolve_with_row_major_strides():
    """The adapter's copy of a lazy tensor: no pending bit left, contiguous with row-major strides
    (a size-1 dimension's stride would cross DLPack as it is), torch's own bits."""
    import torch

    from bf16bridge.adapters.torch.convert import ADAPTER

    base = _patterns("bfloat16")
    for layout, view in _layouts(base).items():
        t = torch._neg_view(view)
        y = ADAPTER.copy(t)
        assert not y.is_neg() and y.is_contiguous(), layout
        strides, n = [], 1
        for size in reversed(y.shape):
            strides.insert(0, n)
            n *= size
        assert y.stride() == tuple(strides), (layout, y.stride())
        np.testing.assert_array_equal(_plain_bits(y), _torch_reference(t), err_msg=layout)


@pytest.mark.frameworks("torch")
def test_a_lazy_negation_torch_cannot_materialise_is_our_error():
    import torch

    t = torch._neg_view(torch.zeros(4, dtype=torch.float8_e4m3fn))
    with pytest.raises(bb.UnsupportedDtypeError, match="float8_e4m3fn.*negation.*convert the tensor the view"):
        bb.convert(t, "numpy")
