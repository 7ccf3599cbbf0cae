"""Host memory the bridge allocates: 64-byte aligned numpy buffers, placed where copies run
fastest, and the output array a conversion writes into (a new one, or the caller's ``out=`` checked).

Pure numpy: every adapter and feature allocates through here (framework adapters do not import
each other). docs/routes.md says where and why copies are placed as they are.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from bf16bridge.core import dtypes, registry
from bf16bridge.core.adapter import ALIGN
from bf16bridge.core.autograph import plain_python
from bf16bridge.errors import InvalidArgumentError

#: the size of a memory page, for placing a copy's destination (``aligned_bytes``)
PAGE = 4096
#: from this many bytes on, a copy of a contiguous array starts at its source's offset within a
#: page (rounded up to ALIGN): memcpy into fresh memory beyond the cache runs slower when the
#: destination sits further into its page than the source (docs/routes.md); below it the extra
#: page of slack is not worth it
PAGE_MATCH_FROM = 1 << 20
#: from this many bytes on, every allocation is fresh memory (glibc's malloc maps it anew), which
#: numpy backs with huge pages: adapters whose framework allocates without them put large host
#: copies in numpy's memory from this size on (docs/routes.md, tests/core/test_copy.py)
FRESH_MEMORY_FROM = 32 << 20


@plain_python
def aligned_empty(shape, dtype="bfloat16", like: str | None = None):
    """An uninitialised C-ordered array whose buffer starts on a 64-byte boundary.

    jax and tensorflow take such arrays without a copy; numpy's own allocations (and torch's on
    aarch64) are usually not so aligned. ``dtype`` is a numpy dtype or a name ("bfloat16").

    ``like``: a framework ("numpy", "torch", "jax", "tensorflow" or an alias): the array as that
    framework's CPU tensor over the same aligned memory, by its zero-copy route from numpy (where
    none exists for ``dtype``, its own copy, kept only if aligned too). jax's and tensorflow's arrays
    never change in place, so theirs start zeroed (as ``jnp.empty``'s do).
    """
    a = _aligned_array(shape, dtype)
    if like is None:
        return a
    target = registry.resolve(like)
    if target == registry.HUB:
        return a
    adapter = registry.get(target)
    if adapter.immutable:  # nothing can write it afterwards: zeros, not leftovers
        a.reshape(-1).view(np.uint8)[...] = 0
    from bf16bridge.core.convert import convert
    from bf16bridge.errors import CopyRequiredError, UnsupportedDtypeError

    # the buffer is this function's own: a writable numpy alias of it is no one's
    try:
        return convert(a, target, copy=False, on_alias="allow")
    except CopyRequiredError:
        x = convert(a, target, on_alias="allow")
    try:
        at = adapter.data_ptr(x) % ALIGN
    except UnsupportedDtypeError as err:
        raise UnsupportedDtypeError(f"aligned_empty(like={like!r}): {target} takes no {a.dtype} array from numpy "
                                    f"without a copy, and its copy's address cannot be read ({err}); use another "
                                    "dtype, or like='numpy'") from err
    if at:
        raise UnsupportedDtypeError(f"aligned_empty(like={like!r}): {target} takes no {a.dtype} array from numpy "
                                    f"without a copy, and its own copy starts {at} bytes past a 64-byte boundary; "
                                    "use another dtype, or like='numpy'")
    return x


_INTP_MAX = int(np.iinfo(np.intp).max)


def _aligned_array(shape, dtype) -> np.ndarray:
    """aligned_empty's numpy array, its arguments checked (our errors, naming them)."""
    try:
        dtype = dtypes.numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    except TypeError as err:
        raise InvalidArgumentError(
            f"aligned_empty: {dtype!r} is not a dtype; pass a numpy dtype or a name such as 'bfloat16'"
        ) from err
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidArgumentError(f"aligned_empty: the shape must be whole numbers >= 0; got {shape!r}")
    if dtype.hasobject or dtype.itemsize == 0 or dtype.subdtype is not None:
        # a raw buffer viewed as Python objects is not an array of them; a sub-array dtype adds dimensions
        raise InvalidArgumentError(f"aligned_empty: dtype {dtype} holds Python objects, no bytes, or a sub-array; "
                                   "pass a numeric dtype (a sub-array's shape goes into the shape), or use np.empty")
    n = math.prod(shape) * dtype.itemsize
    if n > _INTP_MAX - ALIGN:
        raise InvalidArgumentError(f"aligned_empty: shape {shape} of {dtype} is {n} bytes, more than any "
                                   "array can address")
    return aligned_bytes(n).view(dtype).reshape(shape)


def _address(raw: np.ndarray) -> int:
    """The address of a fresh, writable uint8 array's first byte (without building
    ``__array_interface__``'s dict, for small allocations made on every packed conversion)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(raw))  # type: ignore[arg-type]  # (an ndarray is a buffer)


def aligned_bytes(n: int, like: int | None = None) -> np.ndarray:
    """``n`` uninitialised bytes starting on an ALIGN boundary; with ``like`` (an address) and
    ``n >= PAGE_MATCH_FROM``, at ``like``'s offset within a page, rounded up to ALIGN."""
    if like is None or n < PAGE_MATCH_FROM:
        raw = np.empty(n + ALIGN, dtype=np.uint8)
        start = (-_address(raw)) % ALIGN
    else:
        raw = np.empty(n + PAGE, dtype=np.uint8)
        at = -(-(like % PAGE) // ALIGN) * ALIGN  # a multiple of ALIGN, PAGE itself at most
        start = (at - _address(raw)) % PAGE
    return raw[start:start + n]


def output_array(out, shape, dtype: np.dtype, what: str, src: np.ndarray) -> np.ndarray:
    """The array a conversion of ``src`` writes into: a new one, or ``out`` checked (a writable
    C-contiguous ``dtype`` array of ``shape`` that does not overlap ``src``)."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.shape != tuple(shape) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgumentError(f"{what}: out must be a writable C-contiguous {dtype} array of shape {tuple(shape)}")
    if np.may_share_memory(out, src):  # chunks (and threads) write results over inputs not yet read
        raise InvalidArgumentError(f"{what}: out overlaps the input's memory, which the conversion would overwrite "
                                   "before reading it; pass a separate array, or leave out= out")
    return out
