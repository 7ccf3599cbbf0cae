"""What a route is checked against before it runs: the input's size (this machine's memory, for a
copy; the bytes each framework on the route can address, for a view too) and, for a packing step,
its shape. The planner (``core.planner``) asks these of every plan it makes."""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from bf16bridge.core import dtypes, registry
from bf16bridge.core.adapter import STRIDED, Source
from bf16bridge.core.plan import size
from bf16bridge.errors import CopyTooLargeError, ShapeTooLargeError, UnsupportedDtypeError


def _memory_limit() -> int | None:
    """Bytes of physical memory here; a host copy larger than this is refused before allocating."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: no check
        return None


MEMORY_LIMIT = _memory_limit()


def check_copy_size(src: Source, source: str, target: str, steps: tuple) -> None:
    """Refuse a route whose copy needs more than this machine's memory, before allocating."""
    if MEMORY_LIMIT is None:
        return
    n = 1
    for d in src.shape:
        n *= d
    biggest = max((n * dtypes.itemsize(s.dtype) for s in steps if s.copies and s.kind not in ("to_host", "place")),
                  default=0)
    if biggest > MEMORY_LIMIT:
        shape = "x".join(map(str, src.shape))
        raise CopyTooLargeError(
            f"{source} -> {target} must copy this [{shape}] {src.dtype} input, and the copy needs "
            f"{size(biggest)}, more than this machine's {size(MEMORY_LIMIT)} of "
            "memory; a broadcast or expanded view is small only until copied: convert the un-broadcast "
            "tensor and broadcast it in the target framework"
        )


def size_guard(src: Source, source: str, target: str, steps: tuple,
               shape_dtype: Callable[[Any], tuple]) -> Callable[[Any], Any] | None:
    """For a plan the fast path keeps: the size checks above, made of each later input of its key before
    it runs (its shape read by the source adapter's ``shape_dtype``), as the planner made them of ``src``;
    None where no input of the key can fail them (no copy, and a dense layout: memory that exists, which
    every framework addresses)."""
    copies = [s for s in steps if s.copies and s.kind not in ("to_host", "place")]
    if not copies and src.layout < STRIDED:
        return None
    # the most elements an input may have and pass both checks (each check's own arithmetic, per element)
    limits = [limit // dtypes.itemsize(s.dtype) for s in steps
              if (limit := registry.get(s.framework).max_nbytes) is not None and dtypes.itemsize(s.dtype)]
    if copies and MEMORY_LIMIT is not None:
        limits.append(MEMORY_LIMIT // max(dtypes.itemsize(s.dtype) or 1 for s in copies))
    if not limits:
        return None
    most = min(limits)

    def sized(x):
        shape = shape_dtype(x)[0]
        if math.prod(shape) > most:  # the planner's own check says why, in its words
            check_copy_size(src._replace(shape=shape), source, target, steps)
            check_addressable(src._replace(shape=shape), source, target, steps)
        return x

    return sized


def packing_fails(src: Source, steps: tuple) -> bool:
    """Whether a route's packing or unpacking cannot lay out this input's values (see check_packing)."""
    kinds = {s.kind for s in steps}
    return ("pack" in kinds and (not src.shape or src.shape[-1] % 2)) or ("unpack" in kinds and not src.shape)


def check_packing(src: Source, source: str, target: str, steps: tuple) -> None:
    """A packing step pairs values along the last dimension: refuse an odd one before running
    (with ``fallback='error'``, or when no fallback reaches the target), and an unpacking step a
    0-d input (its two values have no last dimension to lie along)."""
    for step in steps:
        if step.kind == "unpack" and not src.shape:
            raise UnsupportedDtypeError(
                f"{target} holds {step.dtype} one value a byte ({step.label}), and this 0-d {source} "
                f"{src.dtype} input holds {dtypes.ROWS[src.dtype].packing} values in its one byte with no "
                "last dimension to lay them along; reshape it to (1,) first (the result then has shape "
                f"(2,)), or pass fallback='bits' (raw {dtypes.BITS_OF.get(src.dtype, 'bits')})")
        if step.kind == "pack" and (not src.shape or src.shape[-1] % 2):
            shape = "x".join(map(str, src.shape)) or "scalar"
            if not src.shape:
                shape += " (0-d: reshape it to (1,) first, then pad)"
            raise UnsupportedDtypeError(
                f"{target} holds {src.dtype} packed two values a byte along the last dimension ({step.label}), "
                f"and this [{shape}] {source} input's last dimension is not even; pad it to an even length "
                "(numpy: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, 1)])) and keep the logical length yourself, "
                f"or pass fallback='bits' (raw {dtypes.BITS_OF.get(src.dtype, 'bits')}) or fallback='auto'")


def check_addressable(src: Source, source: str, target: str, steps: tuple) -> None:
    """Refuse a route through a framework that cannot describe an array of this shape even as a view
    (``Adapter.max_nbytes``: numpy's is the largest intp), as numpy's own "array is too big" would."""
    n = math.prod(src.shape)
    for step in steps:
        limit = registry.get(step.framework).max_nbytes
        need = n * dtypes.itemsize(step.dtype)
        if limit is not None and need > limit:
            shape = "x".join(map(str, src.shape))
            raise ShapeTooLargeError(
                f"{source} -> {target}: {step.framework} cannot describe this [{shape}] {src.dtype} input, even "
                f"as a view ({step.label}): its shape spans {need:,} bytes ({size(need)}), more than the {limit:,} "
                f"{step.framework} can address (an expanded or broadcast view holds less, but its shape is "
                "what counts); convert the un-broadcast tensor and broadcast it where it is used, or a slice"
            )
