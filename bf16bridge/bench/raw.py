"""The same route as the bridge takes, written by hand with each framework's own calls: of the
public calls that move the bits zero-copy, the cheapest per call (capsules straight over where a
framework's ``from_dlpack(x)`` asks ``x`` first; numpy's own hand-off to torch).

The floor for a zero-copy route: what bf16bridge.core.convert costs on top of this is
its overhead (finding the framework, describing the input, planning, checking).
"""

from __future__ import annotations

from typing import Callable


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


def _modules(frameworks) -> dict:
    """{name: module} of each framework asked (default: all three), imported here; jax's numpy as "jnp"."""
    names = ("torch", "jax", "tensorflow") if frameworks is None else frameworks
    out: dict = {}
    if "torch" in names:
        import torch

        out["torch"] = torch
    if "jax" in names:
        import jax
        import jax.numpy as jnp

        out["jax"], out["jnp"] = jax, jnp
    if "tensorflow" in names:
        import tensorflow as tf

        out["tensorflow"] = tf
    return out


def raw_routes(frameworks=None) -> dict:
    """{(source, target): the raw call} between numpy and ``frameworks`` (default: every one), importing
    only those."""
    import ml_dtypes
    import numpy as np

    m = _modules(frameworks)
    bf16 = ml_dtypes.bfloat16
    out: dict[tuple[str, str], Callable] = {}
    if "torch" in m:
        torch = m["torch"]
        # numpy's own bridge to torch over a 16-bit integer view: cheaper per call than DLPack (int16:
        # every torch declared hands it to numpy; uint16 only from torch 2.3)
        out[("torch", "numpy")] = lambda t: t.view(torch.int16).numpy().view(bf16)
        out[("numpy", "torch")] = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if "jax" in m:
        jax, jnp = m["jax"], m["jnp"]
        out[("numpy", "jax")] = lambda a: jax.device_put(a)
        out[("jax", "numpy")] = lambda j: np.asarray(j)
    if "torch" in m and "jax" in m:
        out[("torch", "jax")] = lambda t: jnp.from_dlpack(t)
        # a capsule straight into torch's own import: torch.from_dlpack(j) first asks j its device and versions
        out[("jax", "torch")] = lambda j, _in=torch.utils.dlpack.from_dlpack: _in(j.__dlpack__())
    if "tensorflow" in m:
        out.update(_tf_routes(m, np, bf16))
    return out


def _tf_routes(m: dict, np, bf16) -> dict:
    tf = m["tensorflow"]
    tf_import = tf.experimental.dlpack.from_dlpack
    out: dict[tuple[str, str], Callable] = {
        ("numpy", "tensorflow"): lambda a: tf.bitcast(tf_import(a.view(np.uint16).__dlpack__()), tf.bfloat16),
        ("tensorflow", "numpy"): lambda x, _in=from_tf(np.from_dlpack): _in(tf.bitcast(x, tf.uint16)).view(bf16)}
    if "torch" in m:
        # capsules straight over (Tensor.__dlpack__ and torch.from_dlpack first check and ask what host
        # memory does not need)
        to_capsule, from_capsule = m["torch"].utils.dlpack.to_dlpack, m["torch"].utils.dlpack.from_dlpack
        out[("torch", "tensorflow")] = lambda t: tf_import(to_capsule(t))
        out[("tensorflow", "torch")] = lambda x, _out=tf.experimental.dlpack.to_dlpack: from_capsule(_out(x))
    if "jax" in m:
        out[("jax", "tensorflow")] = lambda j: tf_import(j.__dlpack__())
        out[("tensorflow", "jax")] = from_tf(m["jnp"].from_dlpack)
    return out


def extra_workarounds(frameworks=None) -> dict:
    """Other common recipes, besides bf16bridge.cli.workarounds.WORKAROUNDS (of ``frameworks`` only,
    where given)."""
    out: dict = {}
    if frameworks is None or "torch" in frameworks:
        out[("torch", "numpy")] = [("t.float().numpy()  (float32: 2x memory, not bf16)", lambda t: t.float().numpy())]
    if frameworks is not None and "tensorflow" not in frameworks:
        return out  # (keras's own backend is tensorflow's: not imported for a run without it)
    try:
        import keras

        if keras.backend.backend() == "tensorflow":
            out[("tensorflow", "numpy")] = [("keras.ops.convert_to_numpy(x)", keras.ops.convert_to_numpy)]
    except Exception:  # noqa: BLE001 - keras is optional for the harness
        pass
    return out
