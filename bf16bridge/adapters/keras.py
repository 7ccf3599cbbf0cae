"""Keras 3 is not a framework of its own here: ``to="keras"`` means the framework of the
running Keras backend (``keras.config.backend()``). Imported only when a caller names keras,
or once keras is imported, to say what a Keras layer in a tree is (``not_a_tensor``)."""

from __future__ import annotations

import keras

from bf16bridge.errors import UnknownFrameworkError

_BACKENDS = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch", "numpy": "numpy"}


def backend() -> str:
    name = keras.config.backend()
    if name not in _BACKENDS:
        raise UnknownFrameworkError(
            f"to='keras' means the running Keras backend, and that is {name!r}, which bf16bridge has no "
            f"adapter for; name the framework instead (one of {', '.join(_BACKENDS)})"
        )
    return _BACKENDS[name]


def not_a_tensor(x) -> str | None:
    """A Keras layer or model with weights: what it is and the way out (``registry.not_a_tensor``)."""
    if not isinstance(x, keras.Layer) or not x.weights:
        return None
    t = type(x)
    return (f"{t.__module__}.{t.__qualname__} is a Keras layer (or model) object, not a tensor or a tree of "
            "tensors: pass its weights, layer.weights (keras.Variables, converted by their value), or "
            "layer.get_weights() (numpy arrays)")
