"""tensorflow itself, as every module of this package imports it: imported once with its
import-time deprecation quieted, its version checked, and its dtypes and devices named the
bridge's way (``tf_dtype``, ``bridge_name``, ``device_name``)."""

from __future__ import annotations

import contextlib
import functools
import re
import warnings

from bf16bridge.core import dtypes
from bf16bridge.core import versions

# tensorflow 2.16's import reads jax.xla_computation where jax is installed, which jax 0.4.30 says is
# deprecated: tensorflow's business, not the caller's (under -W error it raised). The filter names
# tensorflow's modules, and only it is taken out afterwards: catch_warnings would restore the whole list,
# losing a filter another thread adds during the import
_QUIET_IMPORT = ("ignore", re.compile(r"jax\.xla_computation is deprecated", re.I), DeprecationWarning,
                 re.compile(r"tensorflow\."), 0)
warnings.filterwarnings("ignore", _QUIET_IMPORT[1].pattern, DeprecationWarning, _QUIET_IMPORT[3].pattern)
try:
    import tensorflow as tf
finally:
    with contextlib.suppress(ValueError):  # a warnings.resetwarnings() during the import took it already
        warnings.filters.remove(_QUIET_IMPORT)  # type: ignore[attr-defined]

versions.require("tensorflow", tf.__version__)

__all__ = ["tf", "tf_dtype", "bridge_name", "device_name"]


def tf_dtype(name: str):
    """tensorflow's dtype for the bridge's dtype ``name``."""
    return tf.as_dtype(dtypes.numpy_dtype(name)) if name != "bfloat16" else tf.bfloat16


@functools.lru_cache(maxsize=64)
def bridge_name(dtype) -> str | None:
    """The bridge name of a tf dtype, or None if we do not carry it."""
    if dtype == tf.bfloat16:
        return "bfloat16"
    return dtypes.name_of_numpy(dtype.as_numpy_dtype) if dtype.is_numpy_compatible else None


@functools.lru_cache(maxsize=64)
def device_name(name: str) -> str:
    """"cpu", or "gpu:0" and the like, from a tf device string."""
    spec = tf.DeviceSpec.from_string(name)
    kind = (spec.device_type or "CPU").lower()
    return "cpu" if kind == "cpu" else f"{kind}:{spec.device_index or 0}"
