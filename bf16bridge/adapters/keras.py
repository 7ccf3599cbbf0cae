"""Keras 3 is not a framework of its own here: ``to="keras"`` means the framework of the
running Keras backend (``keras.config.backend()``). Imported only when a caller names keras."""

from __future__ import annotations

import keras

from ..errors import UnknownFrameworkError

_BACKENDS = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch", "numpy": "numpy"}


def backend() -> str:
    name = keras.config.backend()
    if name not in _BACKENDS:
        raise UnknownFrameworkError(
            f"to='keras' means the running Keras backend, and that is {name!r}, which bf16bridge has no "
            f"adapter for; name the framework instead (one of {', '.join(_BACKENDS)})"
        )
    return _BACKENDS[name]
