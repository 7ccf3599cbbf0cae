"""A torch transformer block ported to flax linen, and bb.parity.trace finding a porting mistake.

    python examples/trace_port.py                     # the faithful port: every layer passes
    python examples/trace_port.py gelu_tanh           # a planted mistake, named at the layer it first touches
    python examples/trace_port.py --dtype bfloat16 mask_off_by_one
    python examples/trace_port.py --html trace.html eps   # the report with its per-layer plot
    python examples/trace_port.py --grads rms_stop_gradient   # a mistake only the gradients show
    python examples/trace_port.py --time              # a trace against the two models' plain runs

The mistakes: eps (LayerNorm eps 1e-6 in the port, 1e-5 in torch), gelu_tanh (jax.nn.gelu's default, the
tanh form), softmax_bf16 (the attention's softmax in bf16), untransposed (blocks.0.attn.o's torch weight
used as the flax kernel as it is), mask_off_by_one (each position sees the next one too), rms_one_plus
(RMSNorm's weight applied as 1 + w), rms_stop_gradient (RMSNorm's normaliser under stop_gradient: the forward
is the same, the gradients are not); with an rms_ mistake the model uses RMSNorm.

tests/parity/trace_cases.py loads this file for the trace tests' models: one definition of them.
"""

import argparse
import math
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

import bf16bridge as bb

V, D, H, LAYERS, S, B = 64, 32, 2, 2, 8, 2
#: the tied head is embed.attend in flax: paired by hand (the names cannot say it)
PAIRS = {"head": "embed:attend"}


# -- torch: the original ---------------------------------------------------------------------------------
class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t(x).view(b, s, H, D // H).transpose(1, 2) for t in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // H)
        scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
        p = torch.softmax(scores.float(), -1).to(x.dtype)
        return self.o((p @ v).transpose(1, 2).reshape(b, s, D))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def norm(rms: bool):
    return torch.nn.RMSNorm(D, eps=1e-5) if rms else torch.nn.LayerNorm(D, eps=1e-5)


class Block(torch.nn.Module):
    def __init__(self, rms: bool):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = norm(rms), Attention(), norm(rms), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Model(torch.nn.Module):
    def __init__(self, rms: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleList(Block(rms) for _ in range(LAYERS))
        self.ln_f = norm(rms)
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# -- flax linen: the port (each mistake behind a flag) -----------------------------------------------
class RMSNorm(nn.Module):
    one_plus: bool = False
    stop_gradient: bool = False

    @nn.compact
    def __call__(self, x):
        w = self.param("scale", nn.initializers.ones, (x.shape[-1],)).astype(jnp.float32)
        x32 = x.astype(jnp.float32)
        inv = jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5)
        y = x32 * (jax.lax.stop_gradient(inv) if self.stop_gradient else inv)
        return (y * (1 + w if self.one_plus else w)).astype(x.dtype)


def fnorm(bugs, rms: bool, name: str):
    if rms:
        return RMSNorm("rms_one_plus" in bugs, "rms_stop_gradient" in bugs, name=name)
    return nn.LayerNorm(epsilon=1e-6 if "eps" in bugs else 1e-5, name=name)


class FAttention(nn.Module):
    bugs: frozenset

    @nn.compact
    def __call__(self, x):
        b, s, _ = x.shape
        q, k, v = (nn.Dense(D, name=n)(x).reshape(b, s, H, D // H).transpose(0, 2, 1, 3) for n in "qkv")
        scores = q @ k.swapaxes(-1, -2) / math.sqrt(D // H)
        mask = jnp.triu(jnp.ones((s, s), bool), 2 if "mask_off_by_one" in self.bugs else 1)
        scores = jnp.where(mask, -jnp.inf, scores)
        wide = jnp.bfloat16 if "softmax_bf16" in self.bugs else jnp.float32
        p = jax.nn.softmax(scores.astype(wide), -1).astype(x.dtype)
        return nn.Dense(D, name="o")((p @ v).transpose(0, 2, 1, 3).reshape(b, s, D))


class FBlock(nn.Module):
    bugs: frozenset
    rms: bool

    @nn.compact
    def __call__(self, x):
        x = x + FAttention(self.bugs, name="attn")(fnorm(self.bugs, self.rms, "ln1")(x))
        h = fnorm(self.bugs, self.rms, "ln2")(x)
        return x + FMLP(self.bugs, name="mlp")(h)


class FMLP(nn.Module):
    bugs: frozenset

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4 * D, name="fc1")(x)
        return nn.Dense(D, name="fc2")(jax.nn.gelu(h, approximate="gelu_tanh" in self.bugs))


class FModel(nn.Module):
    bugs: frozenset = frozenset()
    rms: bool = False

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(V, D, name="embed")
        x = embed(ids)
        for i in range(LAYERS):
            x = FBlock(self.bugs, self.rms, name=f"blocks_{i}")(x)
        return embed.attend(fnorm(self.bugs, self.rms, "ln_f")(x))  # tied


def to_flax(model: Model, bugs, rms: bool) -> dict:
    """The torch weights moved to jax with the bridge, bit for bit; torch's (out, in) Linear weight
    transposed to flax's (in, out) Dense kernel."""
    j = bb.convert_tree({k: v.detach() for k, v in model.state_dict().items()}, to="jax")

    def dense(p, untransposed=False):
        return {"kernel": j[p + ".weight"] if untransposed else j[p + ".weight"].T, "bias": j[p + ".bias"]}

    def norm_params(p):
        return {"scale": j[p + ".weight"], **({} if rms else {"bias": j[p + ".bias"]})}
    params = {"embed": {"embedding": j["embed.weight"]}, "ln_f": norm_params("ln_f")}
    for i in range(LAYERS):
        b = f"blocks.{i}"
        params[f"blocks_{i}"] = {
            "ln1": norm_params(b + ".ln1"), "ln2": norm_params(b + ".ln2"),
            "attn": {n: dense(f"{b}.attn.{n}", "untransposed" in bugs and i == 0 and n == "o") for n in "qkvo"},
            "mlp": {"fc1": dense(b + ".mlp.fc1"), "fc2": dense(b + ".mlp.fc2")}}
    return {"params": params}


def timed(torch_model, flax_model, variables, ids, n=15):
    """Median and best of a trace and of the two models' plain runs (torch under no_grad, flax's apply
    uncompiled: the calls the trace makes), interleaved."""
    t_ids, j_ids = bb.to_torch(ids), bb.to_jax(ids, fallback="auto")

    def plain():
        with torch.no_grad():
            torch_model(t_ids)
        jax.block_until_ready(flax_model.apply(variables, j_ids))
    runs = {"plain": plain,
            "trace": lambda: bb.parity.trace(torch_model, (flax_model, variables), ids, pairs=PAIRS)}
    times = {k: [] for k in runs}
    for f in runs.values():
        f()
    for _ in range(n):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    for stat in (min, statistics.median):
        p, t = stat(times["plain"]), stat(times["trace"])
        print(f"{stat.__name__}: plain {p * 1e3:.1f} ms, trace {t * 1e3:.1f} ms, {t / p:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bugs", nargs="*", help="mistakes to plant in the port")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--grads", action="store_true", help="judge every parameter's gradient too")
    ap.add_argument("--html", help="write the report, with its plot, to this file")
    ap.add_argument("--time", action="store_true")
    args = ap.parse_args()
    rms = any(b.startswith("rms_") for b in args.bugs)
    torch.manual_seed(0)
    torch_model = Model(rms).to(getattr(torch, args.dtype)).eval()
    bugs = frozenset(args.bugs)
    flax_model, variables = FModel(bugs, rms), to_flax(torch_model, bugs, rms)
    ids = np.random.default_rng(0).integers(0, V, (B, S))
    if args.time:
        torch.set_num_threads(1)  # torch's and XLA's thread pools would fight over a small machine's cores
        timed(torch_model, flax_model, variables, ids)
        return
    rep = bb.parity.trace(torch_model, (flax_model, variables), ids, pairs=PAIRS, grads=args.grads)
    print(rep)
    if args.html:
        with open(args.html, "w") as f:
            f.write(rep.html())
        print(f"wrote {args.html}")


if __name__ == "__main__":
    main()
