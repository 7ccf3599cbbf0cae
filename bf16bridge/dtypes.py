"""The bf16 dtype, bit helpers, and the other dtypes we carry.

Dtypes are named by their NumPy names ("bfloat16", "float32", ...); each
adapter maps its own dtype objects to these names. ml_dtypes is optional at
import time so that ``import bf16bridge`` works on a NumPy without it; then
``bfloat16`` is None and no NumPy array can hold bf16 (the probe says why).
"""

from __future__ import annotations

import numpy as np

try:  # ml_dtypes is a hard dependency, but a broken one must not break import
    import ml_dtypes as _ml_dtypes

    bfloat16 = np.dtype(_ml_dtypes.bfloat16)
    ML_DTYPES_ERROR: str | None = None
except Exception as err:  # noqa: BLE001 - record why, whatever it was
    _ml_dtypes = None
    bfloat16 = None
    ML_DTYPES_ERROR = f"{type(err).__name__}: {err}"

#: Dtypes whose values only some frameworks can hold, with the unsigned
#: integer of the same width that carries their bits through a bit-view.
BITS_OF = {"bfloat16": "uint16"}

#: Every dtype the bridge moves. Standard dtypes cross bit for bit wherever
#: both sides hold them; the ones in BITS_OF may need a bit-view on the way.
STANDARD = (
    "bool",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
    "complex64", "complex128",
)
ALL = STANDARD + tuple(BITS_OF)

#: 64-bit integers and the 32-bit ones fallback="auto" narrows them to, for a target that
#: cannot hold them (jax without x64), when every value fits (checked on the data)
NARROW = {"int64": "int32", "uint64": "uint32"}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a bridge dtype name (bfloat16 needs ml_dtypes)."""
    if name == "bfloat16":
        if bfloat16 is None:
            from .errors import UnsupportedDtypeError

            raise UnsupportedDtypeError(
                f"NumPy cannot hold bfloat16 here: ml_dtypes is unusable ({ML_DTYPES_ERROR}); "
                "install a working ml_dtypes, or pass fallback='float32' or 'bits'"
            )
        return bfloat16
    return np.dtype(name)


def itemsize(name: str) -> int:
    """Bytes per element of a bridge dtype name."""
    return 2 if name in BITS_OF else np.dtype(name).itemsize


def name_of_numpy(dtype: np.dtype) -> str | None:
    """The bridge name of a NumPy dtype, or None if we do not carry it."""
    name = np.dtype(dtype).name
    return name if name in ALL else None


def all_bf16_patterns() -> np.ndarray:
    """Every one of the 65,536 bf16 bit patterns as a bf16 array (NaN payloads and -0 included)."""
    return np.arange(1 << 16, dtype=np.uint16).view(numpy_dtype("bfloat16"))
