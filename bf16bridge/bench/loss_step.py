"""A torch training step whose loss is a jax function (issue 28): ``bb.bridge("jax")`` (compiled by default,
and ``jit=False`` as it ran before) against jitting the loss by hand in a raw-DLPack ``autograd.Function``
(``jax.jit`` of its vjp, or of ``value_and_grad``), torch_jax_interop's wrappers, and the loss in torch.
The target: the bridge at most 1.1x the best of the hand-jitted and torch_jax_interop steps. The frameworks'
modules come from ``functions.py`` (the module the import contract lets write framework code)."""

from __future__ import annotations

import contextlib

import bf16bridge as bb

TARGET = 1.1


def _jax_loss(jax, jnp):
    def loss(logits, targets):
        return -jnp.mean(jnp.sum(targets * jax.nn.log_softmax(logits), axis=-1))

    return loss


def _by_hand(loss, torch, jax, jnp) -> dict:
    """The loss jitted by hand, in a torch ``autograd.Function`` with raw DLPack moves: the vjp compiled
    (its pullback applied in a second program), and ``value_and_grad`` compiled (the gradient for a
    cotangent of one computed with the value, scaled by the cotangent in torch)."""
    fwd, apply = jax.jit(lambda l, t: jax.vjp(lambda l: loss(l, t), l)), jax.jit(lambda f, c: f(c))
    value_and_grad = jax.jit(jax.value_and_grad(loss))

    class Vjp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, t):
            out, ctx.pb = fwd(jnp.from_dlpack(logits.detach()), jnp.from_dlpack(t))
            return torch.from_dlpack(out)

        @staticmethod
        def backward(ctx, ct):
            return torch.from_dlpack(apply(ctx.pb, jnp.from_dlpack(ct))[0]), None

    class ValueAndGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, t):
            value, grad = value_and_grad(jnp.from_dlpack(logits.detach()), jnp.from_dlpack(t))
            ctx.grad = torch.from_dlpack(grad)
            return torch.from_dlpack(value)

        @staticmethod
        def backward(ctx, ct):
            return ct * ctx.grad, None

    return {"jax.jit(vjp) by hand": Vjp.apply, "jax.jit(value_and_grad) by hand": ValueAndGrad.apply}


def _peers(loss, log, jax) -> dict:
    """torch_jax_interop's two wrappers of the loss (none where it does not import)."""
    try:
        import torch_jax_interop as tji

        no_params: dict = {}
        plain = tji.WrappedJaxFunction(lambda p, l, t: jax.jit(loss)(l, t), no_params)
        # (its value_and_grad asks for the aux output whatever has_aux says: an empty one)
        scalar = tji.WrappedJaxScalarFunction(lambda p, *lt: (loss(*lt), no_params), no_params, has_aux=True)
    except Exception as err:  # noqa: BLE001 - a peer that does not import is reported, not fatal
        log(f"  loss step: torch_jax_interop left out ({type(err).__name__}: {err})")
        return {}
    return {"torch_jax_interop WrappedJaxFunction": plain,
            "torch_jax_interop WrappedJaxScalarFunction": lambda l, t: scalar(l, t)[0]}


def _stepper(f, x, targets, torch):
    """One SGD step of a fresh torch MLP (the same initial weights for every contender) with loss ``f``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        out = f(model(x), targets)
        out.backward()
        opt.step()
        return out

    return step, model


def judged_against(times: dict) -> str:
    """The contender the bridge is judged against: the fastest step of the loss jitted by hand and of
    torch_jax_interop's wrappers, in ``times`` (a step's seconds by contender, as ``compare`` gives them)."""
    return min((k for k in times if "by hand" in k or "interop" in k), key=lambda k: times[k]["best"])


@contextlib.contextmanager
def one_torch_thread(torch):
    """torch on one intra-op thread for the block: its threads spin against jax's and tensorflow's
    pools on a small shared machine, so one thread keeps the callee's own work steady and the ratio
    shows the call's overhead."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def bench_mlp_step(quick: bool, log, compare, torch, jax, jnp) -> dict:
    """Seconds a step of each contender (``compare``: functions.compare), the bridge's ratio to the best of
    the hand-jitted and torch_jax_interop steps, and whether its first step's loss and gradients equal the
    vjp jitted by hand, bit for bit."""
    loss = _jax_loss(jax, jnp)
    losses = {"bridge": bb.bridge("jax")(loss), "bridge, jit=False": bb.bridge("jax", jit=False)(loss),
              **_by_hand(loss, torch, jax, jnp), **_peers(loss, log, jax),
              "torch": lambda l, t: -(t * torch.log_softmax(l, -1)).sum(-1).mean()}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=gen)
    targets = torch.nn.functional.one_hot(torch.randint(0, 10, (32,), generator=gen), 10).float()
    with one_torch_thread(torch):
        steps = {k: _stepper(f, x, targets, torch) for k, f in losses.items()}
        first = {k: [s(), *(p.grad.clone() for p in m.parameters())] for k, (s, m) in steps.items()}
        same = all(torch.equal(a, b) for a, b in zip(first["bridge"], first["jax.jit(vjp) by hand"]))
        r = compare({k: s for k, (s, _) in steps.items()}, quick=quick)
    best = judged_against(r)
    ratio = r["bridge"]["best"] / r[best]["best"]
    log("  loss step " + "  ".join(f"{k} {v['best'] * 1e3:.3f} ms" for k, v in r.items())
        + f"; bridge / {best} {ratio:.2f}x (target {TARGET}x){'' if same else '  (BITS DIFFER)'}")
    return {"times": r, "best_peer": best, "ratio": ratio, "target": TARGET, "same_bits_as_jit_vjp_by_hand": same}
