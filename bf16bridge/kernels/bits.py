"""The float32 <-> bf16 bit kernels and which backend runs them: ml_dtypes' own casts (the reference
itself), integer kernels a framework offers through its KernelHooks ("auto" picks one only when
its framework is already imported, and never imports one for this), or numpy's integer kernels,
for a NumPy without a usable ml_dtypes. A framework's backend is named after it (``backend="torch"``)."""

from __future__ import annotations

import sys

import numpy as np

from bf16bridge.adapters.hooks import KernelHooks
from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.errors import Bf16BridgeError, InvalidArgumentError, UnknownFrameworkError, UnsupportedDtypeError

#: the backends built on the core dependencies; frameworks that offer kernels add theirs
BUILTIN = ("ml_dtypes", "numpy")


def _imported(name: str) -> bool:
    """Whether the framework behind a registered adapter is already imported."""
    s = registry.spec(name)
    return s.instance is not None or (s.requires or name) in sys.modules


def _kernel_hooks(name: str, imported_only: bool):
    """The KernelHooks of registered framework ``name`` if it offers kernels and its framework is
    imported (or, imported_only=False, importable)."""
    if imported_only and not _imported(name):
        return None
    try:
        hooks = registry.hooks(name, KernelHooks)
    except Bf16BridgeError:
        return None
    return hooks if hooks.offers_kernels else None


def backends(*, importing: bool = False) -> list[str]:
    """The backend names ``backend=`` takes here: "auto", the built-in ones, and every
    registered framework offering kernels that is already imported (``importing=True``:
    or installed, importing it)."""
    return ["auto", *BUILTIN, *(n for n in registry.names() if _kernel_hooks(n, imported_only=not importing))]


def pick_backend(name: str = "auto") -> str:
    """The backend ``name`` stands for here ("auto": the fastest usable one)."""
    if name == "auto":
        if dtypes.bfloat16 is not None:
            return "ml_dtypes"
        return next((n for n in registry.names() if _kernel_hooks(n, imported_only=True)), "numpy")
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
    if key is None or not registry.hooks(key, KernelHooks).offers_kernels:
        raise InvalidArgumentError(f"backend must be one of {', '.join(backends())} (or another adapter "
                                    f"offering kernels); got {name!r}")
    return key


def bits_kernel(name: str, widen: bool):
    """(the bf16 bit kernel, whether it spreads over threads itself) for a picked backend."""
    if name in BUILTIN:
        return (WIDEN_BITS if widen else ROUND_BITS)[name], False
    hooks = registry.hooks(name, KernelHooks)
    return (hooks.widen_bits if widen else hooks.round_bits), hooks.kernels_threaded


# -- the built-in kernels: bits in, bits out -------------------------------------------


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


#: bf16 bits (uint16) -> float32 bits (uint32), per built-in backend
WIDEN_BITS = {"ml_dtypes": _widen_ml_dtypes, "numpy": _widen_numpy}
#: float32 bits (uint32) -> bf16 bits (uint16), rounded to nearest even, per built-in backend
ROUND_BITS = {"ml_dtypes": _round_ml_dtypes, "numpy": _round_numpy}
