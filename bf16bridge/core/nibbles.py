"""Two 4-bit values a byte, as torch's float4_e2m1fn_x2 (and its pack_uint4) keeps them: element
2i in the low nibble, element 2i + 1 in the high one (torch.testing._internal.common_quantized.pack_uint4
and torch.onnx's unpack_float4x2_as_uint8; tests/kernels/test_narrow_kernels.py checks both).

Pure numpy over ``core.dtypes``; docs/kernels.md describes the calls.
"""

from __future__ import annotations

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core.chunks import BLOCK
from bf16bridge.core.formats import refuse_changed_padding
from bf16bridge.core.memory import output_array
from bf16bridge.errors import InvalidArgumentError, UnsupportedDtypeError

#: the dtypes whose values are 4 bits: what pack_nibbles takes and unpack_nibbles gives
NIBBLE_DTYPES = tuple(n for n, f in dtypes.FORMATS.items() if f.bits == 4)

#: a pair of bytes as one number, the first byte the low one, whatever this machine's byte order
_PAIR = np.dtype("<u2")
_U8 = np.dtype(np.uint8)
#: up to this many packed bytes, unpack_nibbles looks each byte's pair up in a table (one numpy call);
#: above it, four elementwise calls a block run faster than the lookup
GATHER_UP_TO = 1 << 12
#: each byte's two nibbles as the pair unpack_nibbles writes: the low nibble in the first byte
_UNPACKED_PAIR = (lambda b: ((b & 0xF) | (b >> 4 << 8)).astype(_PAIR))(np.arange(256, dtype=np.uint16))
#: what unpack_nibbles gives for each dtype name it takes (uint8 where this ml_dtypes lacks the dtype)
_GIVES = {"uint8": _U8, **{n: dtypes.numpy_dtype_or_none(n) or _U8 for n in NIBBLE_DTYPES}}


def _nibble_source(a: np.ndarray, what: str) -> np.ndarray:
    name = a.dtype.name
    if name == "uint8":
        if a.size and int(a.max()) > 0xF:
            raise InvalidArgumentError(f"{what} takes 4-bit values: a uint8 array must hold 0..15; this one holds "
                                       f"{int(a.max())} (mask it with a & 0xF if only the low nibble counts)")
    elif name not in NIBBLE_DTYPES:
        raise UnsupportedDtypeError(f"{what} takes a 4-bit dtype ({', '.join(NIBBLE_DTYPES)}) or its uint8 "
                                    f"nibbles; got dtype {a.dtype}")
    else:
        refuse_changed_padding(a.view(np.uint8), name, what)
    return a.view(np.uint8)


def pack_nibbles(a, *, out=None) -> np.ndarray:
    """Two 4-bit values a byte (uint8), as torch's float4_e2m1fn_x2: element 2i in the low nibble,
    2i + 1 in the high one. The last dimension halves and must be even. Takes float4_e2m1fn,
    int4 or uint4 arrays (ml_dtypes keeps one value a byte, in the low nibble) or uint8 nibbles."""
    a = np.asarray(a)
    if a.ndim == 0:
        raise InvalidArgumentError("pack_nibbles packs pairs along the last dimension; got a 0-d array "
                                   "(pass a.reshape(1) padded to two values: np.pad(a.reshape(1), [(0, 1)]))")
    if a.shape[-1] % 2:
        raise InvalidArgumentError(
            f"pack_nibbles packs pairs along the last dimension, which must be even; got shape {a.shape} "
            f"(pad it: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, 1)]), and keep the logical length)")
    bits = _nibble_source(a, "pack_nibbles")
    shape = (*a.shape[:-1], a.shape[-1] // 2)
    result = output_array(out, shape, _U8, "pack_nibbles", bits)
    # each pair read as one little-endian uint16, the first value in its low byte (no strided access,
    # which is slower); a copy only for a non-contiguous input
    pairs = np.ascontiguousarray(bits).reshape(-1).view(_PAIR)
    flat = result.reshape(-1)
    hi, low = np.empty(min(BLOCK, flat.size), np.uint16), np.empty(min(BLOCK, flat.size), np.uint16)
    for lo in range(0, flat.size, BLOCK):
        p = pairs[lo:lo + BLOCK]
        h, w = hi[:p.size], low[:p.size]
        np.right_shift(p, 4, out=h)  # the second value's nibble to bits 4..7
        np.bitwise_and(h, 0xF0, out=h)
        np.bitwise_and(p, 0xF, out=w)
        np.bitwise_or(w, h, out=flat[lo:lo + BLOCK], casting="unsafe")
    return result


def unpack_nibbles(bits, dtype, *, out=None) -> np.ndarray:
    """The inverse of pack_nibbles: each byte's low nibble, then its high one, as ``dtype``
    (float4_e2m1fn, int4, uint4, or "uint8" for plain nibbles); the last dimension doubles.
    Where this ml_dtypes lacks the dtype, the nibbles come back as uint8."""
    b = np.asarray(bits)
    if b.dtype != _U8:
        raise UnsupportedDtypeError(f"unpack_nibbles takes packed bytes (uint8, as a float4_e2m1fn_x2 tensor "
                                    f"viewed as uint8 gives them); got dtype {b.dtype}")
    nd = _GIVES.get(dtype if isinstance(dtype, str) else np.dtype(dtype).name)
    if nd is None:
        raise UnsupportedDtypeError(f"unpack_nibbles gives a 4-bit dtype ({', '.join(NIBBLE_DTYPES)}) or "
                                    f"'uint8'; got {dtype!r}")
    if b.ndim == 0:
        raise InvalidArgumentError("unpack_nibbles needs an array with a last dimension; got a 0-d array")
    return unpack_into(b, output_array(out, (*b.shape[:-1], b.shape[-1] * 2), nd, "unpack_nibbles", b))


def unpack_into(b: np.ndarray, result: np.ndarray) -> np.ndarray:
    """unpack_nibbles' kernel, unchecked: packed bytes ``b`` (uint8, at least 1-d) into ``result``, a
    C-contiguous array of one-byte values shaped as ``b`` with its last dimension doubled, apart from
    ``b``'s memory. For a caller that made both so (an adapter's unpacking step); returns ``result``."""
    src = b.reshape(-1)  # (a copy where b is not contiguous)
    pairs = result.reshape(-1).view(_PAIR)  # as pack_nibbles reads them (every dtype given is a byte wide)
    if src.size <= GATHER_UP_TO:  # (mode="clip": every byte is an index; "raise" would buffer the output)
        _UNPACKED_PAIR.take(src, out=pairs, mode="clip")
        return result
    hi = np.empty(min(BLOCK, src.size), np.uint16)
    for lo in range(0, src.size, BLOCK):
        s, p = src[lo:lo + BLOCK], pairs[lo:lo + BLOCK]
        h = hi[:s.size]
        np.left_shift(s, 4, out=h, dtype=np.uint16)  # the high nibble to bits 8..11: the second byte
        np.bitwise_and(h, 0xF00, out=h)
        np.bitwise_and(s, 0xF, out=p, dtype=np.uint16)
        np.bitwise_or(p, h, out=p)
    return result
