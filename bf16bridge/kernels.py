"""float32 <-> bf16 widening and rounding: chunked, bit-exact with ml_dtypes.

``to_float32`` is exact (the 16 bf16 bits become the top half of the float32,
NaN payloads included). ``to_bf16`` rounds to nearest, ties to even, keeps
subnormals (no flush to zero), overflows to infinity, and turns every NaN into
the quiet NaN with its sign (0x7FC0 / 0xFFC0), as ml_dtypes (Eigen) does; an
exhaustive check over all 2**32 float32 inputs is
``python -m benchmarks.exhaustive_kernels``.

Both work chunk by chunk, so the extra memory is bounded by a chunk per thread,
whatever the size (``out=`` may be a memory-mapped file); the ml_dtypes and
numpy backends spread the chunks over threads (their loops release the GIL). Backends, fastest first as
measured here (``make bench``): ml_dtypes' own casts (the reference itself),
then integer kernels that an adapter offers (``Adapter.offers_kernels``: torch's;
"auto" picks one only when its framework is already imported, and never imports
one for this), then numpy's integer kernels, for a NumPy without a usable
ml_dtypes. An adapter's backend is named after the adapter (``backend="torch"``).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from . import dtypes, registry
from .errors import (Bf16BridgeError, CopyRequiredError, InvalidArgumentError, UnknownFrameworkError,
                     UnsupportedDtypeError)

#: elements per chunk: 4 Mi elements keeps each temporary at 16 MiB
CHUNK = 1 << 22
#: the smallest piece worth a thread of its own
MIN_PIECE = 1 << 18
#: show a progress bar when a conversion is still running after this many seconds
PROGRESS_AFTER_S = 1.0
#: the backends built on the core dependencies; adapters that offer kernels add theirs
BUILTIN = ("ml_dtypes", "numpy")


def _imported(name: str) -> bool:
    """Whether the framework behind a registered adapter is already imported."""
    s = registry.spec(name)
    return s.instance is not None or (s.requires or name) in sys.modules


def _kernel_adapter(name: str, imported_only: bool):
    """The registered adapter ``name`` if it offers kernels and its framework is imported
    (or, imported_only=False, importable)."""
    if imported_only and not _imported(name):
        return None
    try:
        adapter = registry.get(name)
    except Bf16BridgeError:
        return None
    return adapter if adapter.offers_kernels else None


def backends(*, importing: bool = False) -> list[str]:
    """The backend names ``backend=`` takes here: "auto", the built-in ones, and every
    registered adapter offering kernels whose framework is already imported (``importing=True``:
    or installed, importing it)."""
    return ["auto", *BUILTIN, *(n for n in registry.names() if _kernel_adapter(n, imported_only=not importing))]


def pick_backend(name: str = "auto") -> str:
    """The backend ``name`` stands for here ("auto": the fastest usable one)."""
    if name == "auto":
        if dtypes.bfloat16 is not None:
            return "ml_dtypes"
        return next((n for n in registry.names() if _kernel_adapter(n, imported_only=True)), "numpy")
    if name == "ml_dtypes" and dtypes.bfloat16 is None:
        raise UnsupportedDtypeError(f"backend 'ml_dtypes' is unusable here: {dtypes.ML_DTYPES_ERROR}; "
                                    f"use backend='auto'")
    if name in BUILTIN:
        return name
    try:
        key = registry.resolve(name)
    except UnknownFrameworkError:
        key = None
    # a backend asked for by name may import its framework (FrameworkNotInstalledError says how to install it)
    if key is None or not registry.get(key).offers_kernels:
        raise InvalidArgumentError(f"backend must be one of {', '.join(backends())} (or another adapter "
                                    f"offering kernels); got {name!r}")
    return key


def _kernels(name: str, widen: bool):
    """(the kernel, whether it spreads over threads itself) for a picked backend."""
    if name in BUILTIN:
        return (_WIDEN if widen else _ROUND)[name], False
    adapter = registry.get(name)
    return (adapter.widen_bits if widen else adapter.round_bits), adapter.kernels_threaded


def _flat_bits(x, width: int, what: str) -> np.ndarray:
    a = np.asarray(x)
    want = {16: ("bfloat16", "uint16"), 32: ("float32", "uint32")}[width]
    name = a.dtype.name
    if name not in want:
        raise UnsupportedDtypeError(f"{what} takes a {want[0]} array (or its {want[1]} bits); got dtype {a.dtype}")
    if not a.flags.c_contiguous:
        raise CopyRequiredError(f"{what} takes a C-contiguous array; pass np.ascontiguousarray(x) (a copy)")
    return a.reshape(-1).view(f"u{width // 8}")


def _out(out, shape, dtype, what: str) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.shape != tuple(shape) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgumentError(f"{what}: out must be a writable C-contiguous {dtype} array of shape {tuple(shape)}")
    return out


class _Progress:
    """A plain progress bar on stderr, shown only once a conversion has taken a while."""

    def __init__(self, total: int, label: str, enabled: bool | None):
        self.total, self.label, self.enabled = total, label, enabled
        self.start = time.perf_counter()
        self.shown = False

    def update(self, done: int) -> None:
        if self.enabled is False:
            return
        if not self.shown:
            if self.enabled is None and (time.perf_counter() - self.start < PROGRESS_AFTER_S or not sys.stderr.isatty()):
                return
            self.shown = True
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:6.1%}")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def to_float32(x, *, out=None, chunk: int = CHUNK, backend: str = "auto", threads: int | None = None,
               progress: bool | None = None) -> np.ndarray:
    """Widen a bf16 array (ml_dtypes.bfloat16, or its uint16 bits) to float32, exactly."""
    src = _flat_bits(x, 16, "to_float32")
    result = _out(out, np.shape(x), np.float32, "to_float32")
    dst = result.reshape(-1).view(np.uint32)
    _run(True, backend, src, dst, chunk, threads, _Progress(src.size, "bf16 -> float32", progress))
    return result


def to_bf16(x, *, out=None, chunk: int = CHUNK, backend: str = "auto", threads: int | None = None,
            progress: bool | None = None) -> np.ndarray:
    """Round a float32 array to bf16 (nearest, ties to even), bit-identical to ml_dtypes.

    Returns an ml_dtypes.bfloat16 array, or uint16 bits where ml_dtypes is unusable
    (then ``out`` must be uint16 too).
    """
    src = _flat_bits(x, 32, "to_bf16")
    bf16 = dtypes.bfloat16 if dtypes.bfloat16 is not None else np.dtype(np.uint16)
    result = _out(out, np.shape(x), bf16, "to_bf16")
    dst = result.reshape(-1).view(np.uint16)
    _run(False, backend, src, dst, chunk, threads, _Progress(src.size, "float32 -> bf16", progress))
    return result


_POOLS: dict = {}
_POOL_LOCK = threading.Lock()


def _run(widen: bool, backend: str, src, dst, chunk: int, threads: int | None, bar: _Progress) -> None:
    kernel, threaded = _kernels(pick_backend(backend), widen)
    n = src.size
    # a threaded backend parallelises inside each call; the others get a thread per piece
    workers = 1 if threaded else max(1, min(threads or os.cpu_count() or 1, 8))
    if chunk < 1:
        raise InvalidArgumentError(f"chunk must be a positive number of elements; got {chunk}")
    if workers > 1:
        chunk = min(chunk, max(MIN_PIECE, -(-n // workers)))
    spans = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
    if workers == 1 or len(spans) == 1:
        for lo, hi in spans:
            kernel(src[lo:hi], dst[lo:hi])
            bar.update(hi)
        return
    with _POOL_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="bf16bridge-kernel")
    # at most `workers` pieces in flight, so extra memory stays bounded by a chunk per thread
    pending = []  # (future, end of its span), oldest first
    for lo, hi in spans:
        pending.append((pool.submit(kernel, src[lo:hi], dst[lo:hi]), hi))
        if len(pending) >= workers:
            future, end = pending.pop(0)
            future.result()
            bar.update(end)
    for future, end in pending:
        future.result()
        bar.update(end)


# -- the kernels: bits in, bits out -------------------------------------------------


def _widen_ml_dtypes(src: np.ndarray, dst: np.ndarray) -> None:
    np.copyto(dst.view(np.float32), src.view(dtypes.bfloat16))


def _round_ml_dtypes(src: np.ndarray, dst: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):  # NaN inputs are expected; they become quiet NaNs
        np.copyto(dst.view(dtypes.bfloat16), src.view(np.float32), casting="unsafe")


def _widen_numpy(src: np.ndarray, dst: np.ndarray) -> None:
    np.left_shift(src, 16, out=dst, dtype=np.uint32)


def _round_numpy(src: np.ndarray, dst: np.ndarray) -> None:
    # r = (u + 0x7FFF + lsb) >> 16 rounds to nearest even, carrying into the
    # exponent (so the largest finite values overflow to inf, as they should).
    t = src >> 16  # the truncated result, as uint32
    lsb = t & 1
    t = src + lsb  # reuse: u + lsb (cannot overflow for non-NaN inputs)
    t += 0x7FFF
    t >>= 16
    nan = (src & 0x7FFFFFFF) > 0x7F800000
    dst[...] = t
    if nan.any():
        dst[nan] = ((src[nan] >> 16) & 0x8000) | 0x7FC0


_WIDEN = {"ml_dtypes": _widen_ml_dtypes, "numpy": _widen_numpy}
_ROUND = {"ml_dtypes": _round_ml_dtypes, "numpy": _round_numpy}
