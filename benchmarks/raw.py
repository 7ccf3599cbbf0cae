"""The same route as the bridge takes, written by hand with each framework's own calls.

The floor for a zero-copy route: what bf16bridge.core.convert costs on top of this is
its overhead (finding the framework, describing the input, planning, checking).
"""

from __future__ import annotations


def _mods():
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    import tensorflow as tf
    import torch

    return np, ml_dtypes, torch, jax, jnp, tf


class _Capsule:
    """A DLPack capsule as an object with ``__dlpack__``, what np.from_dlpack and jnp.from_dlpack take."""

    def __init__(self, capsule, device):
        self._capsule, self._device = capsule, device

    def __dlpack__(self, **_):
        return self._capsule

    def __dlpack_device__(self):
        return self._device


def _wrapped(x):
    import tensorflow as tf

    return _Capsule(tf.experimental.dlpack.to_dlpack(x), (1, 0))  # kDLCPU, device 0


def from_tf(importer):
    """``importer`` (a DLPack importer: torch.from_dlpack, np.from_dlpack, jnp.from_dlpack) taking a
    tensorflow tensor: itself where tensorflow's tensors have ``__dlpack__``, else (tensorflow 2.16,
    the oldest declared) through its own exporter's capsule, wrapped. Chosen once, when the contenders
    are built, so nothing is asked inside a timed call."""
    import tensorflow as tf

    if hasattr(type(tf.constant(0)), "__dlpack__"):
        return importer
    return lambda x: importer(_wrapped(x))


def raw_routes() -> dict:
    np, ml, torch, jax, jnp, tf = _mods()
    bf16 = ml.bfloat16
    tf_import = tf.experimental.dlpack.from_dlpack
    return {
        ("torch", "numpy"): lambda t: np.from_dlpack(t.view(torch.uint16)).view(bf16),
        ("torch", "jax"): lambda t: jnp.from_dlpack(t),
        ("torch", "tensorflow"): lambda t: tf_import(t.__dlpack__()),
        ("numpy", "torch"): lambda a: torch.from_dlpack(a.view(np.uint16)).view(torch.bfloat16),
        ("numpy", "jax"): lambda a: jax.device_put(a),
        ("numpy", "tensorflow"): lambda a: tf.bitcast(tf_import(a.view(np.uint16).__dlpack__()), tf.bfloat16),
        ("jax", "torch"): lambda j: torch.from_dlpack(j),
        ("jax", "numpy"): lambda j: np.asarray(j),
        ("jax", "tensorflow"): lambda j: tf_import(j.__dlpack__()),
        ("tensorflow", "torch"): from_tf(torch.from_dlpack),
        ("tensorflow", "numpy"): lambda x, _in=from_tf(np.from_dlpack): _in(tf.bitcast(x, tf.uint16)).view(bf16),
        ("tensorflow", "jax"): from_tf(jnp.from_dlpack),
    }


def extra_workarounds() -> dict:
    """Other common recipes, besides bf16bridge.cli.workarounds.WORKAROUNDS."""
    np, ml, torch, jax, jnp, tf = _mods()
    out = {("torch", "numpy"): [("t.float().numpy()  (float32: 2x memory, not bf16)", lambda t: t.float().numpy())]}
    try:
        import keras

        if keras.backend.backend() == "tensorflow":
            out[("tensorflow", "numpy")] = [("keras.ops.convert_to_numpy(x)", keras.ops.convert_to_numpy)]
    except Exception:  # noqa: BLE001 - keras is optional for the harness
        pass
    return out
