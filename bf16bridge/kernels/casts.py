"""The conversions users call: ``to_dtype`` (float32 or float64 to bf16 or a low-precision format,
bit-identical to ml_dtypes' astype) and ``to_float32`` (back, exactly), chunked over threads.
docs/kernels.md has the rounding, saturation and NaN per dtype."""

from __future__ import annotations

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core.memory import output_array
from bf16bridge.errors import CopyRequiredError, InvalidArgumentError, UnsupportedDtypeError
from bf16bridge.kernels.bf16 import round_to_bf16, widen_bf16
from bf16bridge.kernels.rounding import format_backend, format_kernel
from bf16bridge.core.chunks import CHUNK, Progress, spread

#: every dtype the kernels round to (to_dtype) and widen from (to_float32): bf16 and every format
KERNEL_DTYPES = ("bfloat16", *dtypes.FORMATS)
_KERNEL_NAMES = frozenset(KERNEL_DTYPES)
#: {ml_dtypes' dtype: its name} for the kernel dtypes this ml_dtypes has: a dtype's ``.name`` is a
#: Python property in numpy, slow on a hot path; a lookup is not
_BY_DTYPE = {d: n for n in KERNEL_DTYPES if (d := dtypes.numpy_dtype_or_none(n)) is not None}
_U8, _U32, _F32, _F64 = np.dtype(np.uint8), np.dtype(np.uint32), np.dtype(np.float32), np.dtype(np.float64)


def _kernel_name(dtype) -> str:
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            d = np.dtype(dtype)
            name = _BY_DTYPE.get(d) or d.name
        except TypeError:
            name = str(dtype)
    if name not in _KERNEL_NAMES:
        raise UnsupportedDtypeError(f"to_dtype / to_float32 take the narrow dtypes {', '.join(KERNEL_DTYPES)}; "
                                    f"got {dtype!r}")
    return name


def _float_source(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype not in (_F32, _F64):
        raise UnsupportedDtypeError(f"{what} takes a float32 or float64 array; got dtype {a.dtype} "
                                    f"(pass x.astype(np.float32) first)")
    if not a.flags.c_contiguous:
        raise CopyRequiredError(f"{what} takes a C-contiguous array; pass np.ascontiguousarray(x) (a copy)")
    return a


def to_float32(x, *, dtype=None, out=None, chunk: int = CHUNK, backend: str = "auto",
               threads: int | None = None, progress: bool | None = None) -> np.ndarray:
    """Widen to float32, exactly: bf16 (ml_dtypes.bfloat16, or its uint16 bits), or any dtype in
    KERNEL_DTYPES (its ml_dtypes array, or its uint8 bits with ``dtype=`` naming it).
    NaN patterns become the quiet NaN with their sign; bf16 keeps its NaN payloads."""
    name = _kernel_name(dtype) if dtype is not None else None
    a = np.asarray(x)
    if name not in (None, "bfloat16") or _BY_DTYPE.get(a.dtype, "bfloat16") != "bfloat16":
        return _widen_format(a, name, out, chunk, backend, threads, progress)
    return widen_bf16(a, out, chunk, backend, threads, progress)


def _widen_format(a: np.ndarray, name: str | None, out, chunk, backend, threads, progress) -> np.ndarray:
    held = _BY_DTYPE.get(a.dtype) or ("uint8" if a.dtype == _U8 else a.dtype.name)
    if name is None:
        name = held
    if held != name and held != "uint8":
        raise UnsupportedDtypeError(f"to_float32(dtype={name!r}) takes a {name} array or its uint8 bits; "
                                    f"got dtype {a.dtype}")
    if not a.flags.c_contiguous:
        raise CopyRequiredError("to_float32 takes a C-contiguous array; pass np.ascontiguousarray(x) (a copy)")
    nd = dtypes.numpy_dtype_or_none(name)
    kernel = format_kernel(name, format_backend(backend, name, nd, widen=True), None, nd)
    result = output_array(out, a.shape, _F32, "to_float32", a)
    spread(kernel, False, a.reshape(-1).view(_U8), result.reshape(-1).view(_U32), chunk, threads,
           Progress(a.size, f"{name} -> float32", progress))
    return result


def to_dtype(x, dtype, *, saturate: bool = False, out=None, chunk: int = CHUNK, backend: str = "auto",
             threads: int | None = None, progress: bool | None = None) -> np.ndarray:
    """Round a float32 (or float64) array to a kernel dtype, bit-identical to ml_dtypes' astype.

    Floats round to nearest, ties to even; float64 rounds to float32 first (as ml_dtypes does:
    two roundings). ``saturate=True`` clamps to +-the largest finite value before rounding
    (inf too; NaN stays NaN where the format has one). Integers truncate toward zero, as astype
    does. docs/kernels.md has the table per dtype. Returns an array of ml_dtypes' dtype, or its
    uint8 bits (one value a byte) where this ml_dtypes lacks the dtype (then ``out`` must be uint8).
    """
    name = _kernel_name(dtype)
    src = _float_source(x, "to_dtype")
    if not isinstance(saturate, bool):
        raise InvalidArgumentError(f"saturate must be True or False; got {saturate!r}")
    if name == "bfloat16":
        return round_to_bf16(src, saturate, out, chunk, backend, threads, progress)
    nd = dtypes.numpy_dtype_or_none(name)
    result = output_array(out, src.shape, nd if nd is not None else _U8, "to_dtype", src)
    kernel = format_kernel(name, format_backend(backend, name, nd), saturate, nd)
    spread(kernel, False, src.reshape(-1), result.reshape(-1).view(_U8), chunk, threads,
           Progress(src.size, lambda: f"{src.dtype.name} -> {name}", progress))
    return result
