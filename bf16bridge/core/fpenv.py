"""The floating-point environment of the running thread: whether it flushes subnormals, and a way
to keep them while foreign code runs there.

A bridged function's callee runs, under ``jax.jit`` and inside ``tf.function``, on a thread of the
caller's runtime (XLA's and tensorflow's CPU threads), which sets the processor's flush-to-zero and
denormals-are-zero flags (per thread: MXCSR on x86, FPCR on Arm). A numpy or torch callee there
would compute with subnormals as zeros, where called eagerly it keeps them: ``keeping()`` puts
the default environment back for the callee, and the runtime's after it. The bridge asks for it
only where the thread that made the call did not flush (``flushes()`` then), so a caller that
flushes on purpose (``torch.set_flush_denormal(True)``) is left flushing.

The reset goes through the C library's ``fegetenv``/``fesetenv`` (``FE_DFL_ENV``), on Linux; where
those cannot be reached, ``keeping`` warns once and runs as it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import warnings
from collections.abc import Iterator

from bf16bridge.errors import Bf16BridgeWarning

__all__ = ["flushes", "keeping"]

#: the smallest double, a subnormal: a thread that flushes (either flag) multiplies it to 0.0.
#: Module globals, so the product is computed when asked, not folded when this file is compiled
_TINY = 5e-324
_ONE = 1.0
#: glibc's and musl's FE_DFL_ENV: ((const fenv_t *) -1)
_DFL_ENV = ctypes.c_void_p(-1)
#: bytes for a saved fenv_t (32 on x86-64, 8 on aarch64: room for any Linux ABI)
_ENV_BYTES = 256

_lock = threading.Lock()
_libm: list = []  # [the library with fegetenv/fesetenv, or None where there is none], once looked up
_warned: list = []


def flushes() -> bool:
    """Whether this thread flushes subnormal floats to zero (flush-to-zero or denormals-are-zero)."""
    return _TINY * _ONE == 0.0


def _lib():
    if not _libm:
        with _lock:
            if not _libm:
                _libm.append(_find())
    return _libm[0]


def _find():
    if not sys.platform.startswith("linux"):
        return None  # FE_DFL_ENV is a symbol elsewhere (macOS) or there is no fenv (Windows): untested
    for name in (None, "libm.so.6"):  # the process's symbols (Python links libm), then libm itself
        try:
            lib = ctypes.CDLL(name)
            get, put = lib.fegetenv, lib.fesetenv
        except (OSError, AttributeError):
            continue
        get.argtypes = put.argtypes = [ctypes.c_void_p]
        get.restype = put.restype = ctypes.c_int
        return lib
    return None


@contextlib.contextmanager
def keeping() -> Iterator[None]:
    """Run the body with subnormals kept, where this thread flushes them; this thread's
    environment is put back after."""
    if not flushes():
        yield
        return
    lib = _lib()
    if lib is None:
        if not _warned:
            _warned.append(True)
            warnings.warn(
                f"this thread flushes subnormal floats to zero (its runtime's choice) and bf16bridge cannot reset "
                f"that on {sys.platform}: a bridged function's callee computes with subnormals as zeros here, as it "
                "does not when called eagerly", Bf16BridgeWarning, stacklevel=3)
        yield
        return
    saved = ctypes.create_string_buffer(_ENV_BYTES)
    if lib.fegetenv(saved) != 0 or lib.fesetenv(_DFL_ENV) != 0:  # pragma: no cover - glibc's never fail
        yield
        return
    try:
        yield
    finally:
        lib.fesetenv(saved)
