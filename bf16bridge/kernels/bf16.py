"""float32 <-> bf16, chunked, bit-exact with ml_dtypes.

Widening is exact (the 16 bf16 bits become the top half of the float32, NaN payloads included).
Rounding goes to nearest, ties to even, keeps subnormals (no flush to zero), overflows to
infinity, and turns every NaN into the quiet NaN with its sign (0x7FC0 / 0xFFC0), as ml_dtypes
(Eigen) does; ``python -m bf16bridge.bench.exhaustive_kernels`` checks all 2**32 float32 inputs.
"""

from __future__ import annotations

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core.memory import output_array
from bf16bridge.errors import CopyRequiredError, UnsupportedDtypeError
from bf16bridge.kernels.bits import bits_kernel, pick_backend
from bf16bridge.core.chunks import CHUNK, Progress, spread

_U16, _U32, _F32 = np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.float32)
#: what _flat_bits takes for each width (dtypes compared whole: a byte-swapped float32 is not float32)
_FLAT: dict[int, tuple[tuple[str, str], tuple[np.dtype, ...], np.dtype]] = {
    16: (("bfloat16", "uint16"), tuple(d for d in (dtypes.bfloat16, _U16) if d is not None), _U16),
    32: (("float32", "uint32"), (_F32, _U32), _U32)}


def _flat_bits(a: np.ndarray, width: int, what: str) -> np.ndarray:
    # dtype objects compared, not dtype.name: that is a Python property in numpy, slow on a hot path
    names, takes, bits = _FLAT[width]
    d = a.dtype
    # another package's own bfloat16 type (not ml_dtypes'), in this machine's byte order, holds the same bits
    if d not in takes and not (d.name in names and d.itemsize == width // 8 and d.isnative):
        # a byte-swapped array has the same name ('>f4' is "float32"): its bytes read as ours are wrong values
        swapped = not d.isnative and d.newbyteorder("=") in takes
        # (a byte-swapped bfloat16 prints as ">V2": named by its native twin)
        shown = f"{d.newbyteorder('=').name} in the other byte order ({d.str})" if swapped else str(d)
        raise UnsupportedDtypeError(f"{what} takes a {names[0]} array (or its {names[1]} bits); got dtype {shown}"
                                    + (" (byte-swapped: pass x.astype(x.dtype.newbyteorder('=')), a copy in "
                                       "this machine's byte order)" if swapped else ""))
    if not a.flags.c_contiguous:
        raise CopyRequiredError(f"{what} takes a C-contiguous array; pass np.ascontiguousarray(x) (a copy)")
    return a.reshape(-1).view(bits)


def widen_bf16(a: np.ndarray, out, chunk: int, backend: str, threads: int | None, progress) -> np.ndarray:
    """bf16 (ml_dtypes.bfloat16, or its uint16 bits) to float32, exactly: ``to_float32``'s bf16 half."""
    src = _flat_bits(a, 16, "to_float32")
    result = output_array(out, a.shape, _F32, "to_float32", src)
    dst = result.reshape(-1).view(np.uint32)
    kernel, threaded = bits_kernel(pick_backend(backend), True)
    spread(kernel, threaded, src, dst, chunk, threads, Progress(src.size, "bf16 -> float32", progress))
    return result


def to_bf16(x, *, out=None, chunk: int = CHUNK, backend: str = "auto", threads: int | None = None,
            progress: bool | None = None) -> np.ndarray:
    """Round a float32 array to bf16 (nearest, ties to even), bit-identical to ml_dtypes.

    Returns an ml_dtypes.bfloat16 array, or uint16 bits where ml_dtypes is unusable
    (then ``out`` must be uint16 too).
    """
    a = np.asarray(x)
    src = _flat_bits(a, 32, "to_bf16")
    bf16 = dtypes.bfloat16 if dtypes.bfloat16 is not None else _U16
    result = output_array(out, a.shape, bf16, "to_bf16", src)
    dst = result.reshape(-1).view(np.uint16)
    kernel, threaded = bits_kernel(pick_backend(backend), False)
    spread(kernel, threaded, src, dst, chunk, threads, Progress(src.size, "float32 -> bf16", progress))
    return result


def round_to_bf16(src: np.ndarray, saturate: bool, out, chunk, backend, threads, progress) -> np.ndarray:
    """``to_dtype(src, "bfloat16")``: float64 rounds to float32 first (as ml_dtypes does);
    saturate=True clamps to +-the largest finite bf16 before rounding."""
    if src.dtype == np.float32 and not saturate:
        return to_bf16(src, out=out, chunk=chunk, backend=backend, threads=threads, progress=progress)
    inner, threaded = bits_kernel(pick_backend(backend), False)
    big = dtypes.ROWS["bfloat16"].largest if saturate else None

    def kernel(s: np.ndarray, d: np.ndarray) -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            f = np.clip(s, -big, big) if big is not None else s
            f = f.astype(np.float32, copy=False)
        inner(f.view(np.uint32), d)

    bf16 = dtypes.bfloat16 if dtypes.bfloat16 is not None else _U16
    result = output_array(out, src.shape, bf16, "to_dtype", src)
    spread(kernel, threaded, src.reshape(-1), result.reshape(-1).view(np.uint16), chunk, threads,
           Progress(src.size, lambda: f"{src.dtype.name} -> bfloat16", progress))
    return result
