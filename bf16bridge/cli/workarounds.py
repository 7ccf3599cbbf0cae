"""What people write today for each ordered pair, keeping bf16 where they can.

Used by the demo and the benchmark harness as the baseline the bridge is
measured against. These are deliberately the common recipes (widen to float32,
cross, narrow), not anything bf16bridge does. Each entry imports its
frameworks when called, so listing them imports nothing.
"""

from __future__ import annotations

from typing import Callable


def _np():
    import ml_dtypes
    import numpy as np

    return np, ml_dtypes


def _tf():
    from bf16bridge.core import registry

    return registry.framework("tensorflow")


def torch_to_numpy(t):
    np, ml = _np()
    return t.float().numpy().astype(ml.bfloat16)


def torch_to_jax(t):
    import jax.numpy as jnp

    return jnp.asarray(t.float().numpy(), dtype=jnp.bfloat16)


def torch_to_tensorflow(t):
    tf = _tf()

    return tf.cast(tf.constant(t.float().numpy()), tf.bfloat16)


def numpy_to_torch(a):
    import torch

    np, _ = _np()
    return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)


def numpy_to_jax(a):
    import jax.numpy as jnp

    return jnp.asarray(a)


def numpy_to_tensorflow(a):
    tf = _tf()

    return tf.constant(a)


def jax_to_numpy(j):
    np, _ = _np()
    return np.asarray(j)  # already zero-copy (read-only) on CPU


def jax_to_torch(j):
    import torch

    np, _ = _np()
    return torch.from_numpy(np.asarray(j).astype(np.float32)).to(torch.bfloat16)


def jax_to_tensorflow(j):
    tf = _tf()

    np, _ = _np()
    return tf.constant(np.asarray(j))


def tensorflow_to_numpy(x):
    return x.numpy()


def tensorflow_to_torch(x):
    import torch

    np, _ = _np()
    return torch.from_numpy(x.numpy().astype(np.float32)).to(torch.bfloat16)


def tensorflow_to_jax(x):
    import jax.numpy as jnp

    return jnp.asarray(x.numpy())


#: (source, target) -> (the code as a user writes it, a function running it)
WORKAROUNDS: dict[tuple[str, str], tuple[str, Callable]] = {
    ("torch", "numpy"): ("t.float().numpy().astype(ml_dtypes.bfloat16)", torch_to_numpy),
    ("torch", "jax"): ("jnp.asarray(t.float().numpy(), dtype=jnp.bfloat16)", torch_to_jax),
    ("torch", "tensorflow"): ("tf.cast(tf.constant(t.float().numpy()), tf.bfloat16)", torch_to_tensorflow),
    ("numpy", "torch"): ("torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)", numpy_to_torch),
    ("numpy", "jax"): ("jnp.asarray(a)", numpy_to_jax),
    ("numpy", "tensorflow"): ("tf.constant(a)", numpy_to_tensorflow),
    ("jax", "numpy"): ("np.asarray(j)", jax_to_numpy),
    ("jax", "torch"): ("torch.from_numpy(np.asarray(j).astype(np.float32)).to(torch.bfloat16)", jax_to_torch),
    ("jax", "tensorflow"): ("tf.constant(np.asarray(j))", jax_to_tensorflow),
    ("tensorflow", "numpy"): ("x.numpy()", tensorflow_to_numpy),
    ("tensorflow", "torch"): ("torch.from_numpy(x.numpy().astype(np.float32)).to(torch.bfloat16)", tensorflow_to_torch),
    ("tensorflow", "jax"): ("jnp.asarray(x.numpy())", tensorflow_to_jax),
}

#: pairs whose usual workaround is already zero-copy on CPU
ZERO_COPY_ALREADY = {("jax", "numpy")}
