"""A small transformer written in torch and ported to flax linen, with the porting mistakes
``bb.parity.trace`` must name: the models the trace tests share (examples/trace_port.py is the same
port, as a user would write it).

Each mistake is planted in the flax port and names the layer it first touches, on both sides."""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

import bf16bridge as bb


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    d: int = 32
    heads: int = 2
    layers: int = 2
    seq: int = 8
    batch: int = 2
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    eps: float = 1e-5
    dtype: str = "float32"


#: each planted mistake, the layer it first touches (torch's name, flax's name), and the config it needs
BUGS = {
    "eps": (("blocks.0.ln1", "blocks_0.ln1"), {}),  # LayerNorm eps 1e-6 in the port, 1e-5 in torch
    "gelu_tanh": (("blocks.0.mlp", "blocks_0.mlp"), {}),  # jax.nn.gelu's default, the tanh form
    "softmax_bf16": (("blocks.0.attn", "blocks_0.attn"), {}),  # softmax of the scores in bf16
    "untransposed": (("blocks.0.attn.o", "blocks_0.attn.o"), {}),  # torch's (out, in) weight as flax's (in, out)
    "mask_off_by_one": (("blocks.0.attn", "blocks_0.attn"), {}),  # each position sees the next one too
    "rms_one_plus": (("blocks.0.ln1", "blocks_0.ln1"), {"norm": "rms"}),  # RMSNorm's weight as (1 + w)
}

#: a mistake only the gradients show (the forward is the same), and the parameter the backward reaches first
#: beyond rounding: RMSNorm's normaliser under stop_gradient, so the gradient misses its projection term
GRAD_BUGS = {
    "rms_stop_gradient": (("blocks.1.mlp.fc2.bias", "blocks_1.mlp.fc2.bias"), {"norm": "rms"}),
}


# -- torch: the original -------------------------------------------------------------------------------
class TorchAttention(torch.nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.q, self.k, self.v, self.o = (torch.nn.Linear(cfg.d, cfg.d) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape
        h = self.cfg.heads
        q, k, v = (t(x).view(b, s, h, d // h).transpose(1, 2) for t in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
        p = torch.softmax(scores.float(), -1).to(x.dtype)
        return self.o((p @ v).transpose(1, 2).reshape(b, s, d))


class TorchMLP(torch.nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(cfg.d, 4 * cfg.d), torch.nn.Linear(4 * cfg.d, cfg.d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _torch_norm(cfg: Config):
    return torch.nn.LayerNorm(cfg.d, eps=cfg.eps) if cfg.norm == "layer" else torch.nn.RMSNorm(cfg.d, eps=cfg.eps)


class TorchBlock(torch.nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = _torch_norm(cfg), TorchAttention(cfg), _torch_norm(cfg), TorchMLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TorchModel(torch.nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.d)
        self.blocks = torch.nn.ModuleList(TorchBlock(cfg) for _ in range(cfg.layers))
        self.ln_f = _torch_norm(cfg)
        self.head = torch.nn.Linear(cfg.d, cfg.vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def torch_model(cfg: Config = Config(), seed: int = 0) -> TorchModel:
    """The torch model, its norms' weights drawn near 1 (not all alike), in ``cfg.dtype``."""
    torch.manual_seed(seed)
    m = TorchModel(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".ln" in name or name.startswith("ln_f"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
    return m.to(getattr(torch, cfg.dtype)).eval()


def token_ids(cfg: Config = Config(), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab, (cfg.batch, cfg.seq), dtype=np.int64)


# -- flax linen: the port ------------------------------------------------------------------------------
class FlaxRMSNorm(nn.Module):
    eps: float
    one_plus: bool = False
    stop_gradient: bool = False

    @nn.compact
    def __call__(self, x):
        w = self.param("scale", nn.initializers.ones, (x.shape[-1],)).astype(jnp.float32)
        x32 = x.astype(jnp.float32)
        inv = jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
        y = x32 * (jax.lax.stop_gradient(inv) if self.stop_gradient else inv)
        return (y * (1 + w if self.one_plus else w)).astype(x.dtype)


def _flax_norm(cfg: Config, bugs: frozenset, name: str):
    if cfg.norm == "rms":
        return FlaxRMSNorm(cfg.eps, "rms_one_plus" in bugs, "rms_stop_gradient" in bugs, name=name)
    return nn.LayerNorm(epsilon=1e-6 if "eps" in bugs else cfg.eps, name=name)


class FlaxAttention(nn.Module):
    cfg: Config
    bugs: frozenset

    @nn.compact
    def __call__(self, x):
        b, s, d = x.shape
        h = self.cfg.heads
        q, k, v = (nn.Dense(d, name=n)(x).reshape(b, s, h, d // h).transpose(0, 2, 1, 3) for n in "qkv")
        scores = q @ k.swapaxes(-1, -2) / math.sqrt(d // h)
        scores = jnp.where(jnp.triu(jnp.ones((s, s), bool), 2 if "mask_off_by_one" in self.bugs else 1), -jnp.inf,
                           scores)
        wide = jnp.bfloat16 if "softmax_bf16" in self.bugs else jnp.float32
        p = jax.nn.softmax(scores.astype(wide), -1).astype(x.dtype)
        return nn.Dense(d, name="o")((p @ v).transpose(0, 2, 1, 3).reshape(b, s, d))


class FlaxMLP(nn.Module):
    cfg: Config
    bugs: frozenset

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4 * self.cfg.d, name="fc1")(x)
        return nn.Dense(self.cfg.d, name="fc2")(jax.nn.gelu(h, approximate="gelu_tanh" in self.bugs))


class FlaxBlock(nn.Module):
    cfg: Config
    bugs: frozenset

    @nn.compact
    def __call__(self, x):
        x = x + FlaxAttention(self.cfg, self.bugs, name="attn")(_flax_norm(self.cfg, self.bugs, "ln1")(x))
        return x + FlaxMLP(self.cfg, self.bugs, name="mlp")(_flax_norm(self.cfg, self.bugs, "ln2")(x))


class FlaxModel(nn.Module):
    cfg: Config
    bugs: frozenset = frozenset()

    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(self.cfg.vocab, self.cfg.d, name="embed")
        x = embed(ids)
        for i in range(self.cfg.layers):
            x = FlaxBlock(self.cfg, self.bugs, name=f"blocks_{i}")(x)
        return embed.attend(_flax_norm(self.cfg, self.bugs, "ln_f")(x))  # tied


def flax_variables(model: TorchModel, cfg: Config, bugs: frozenset = frozenset()) -> dict:
    """The torch model's weights moved to flax with the bridge (bit for bit), each Linear's (out, in)
    weight transposed to Dense's (in, out) kernel (but blocks.0.attn.o's, with "untransposed")."""
    j = bb.convert_tree({k: v.detach() for k, v in model.state_dict().items()}, to="jax")

    def dense(p: str, untransposed: bool = False) -> dict:
        return {"kernel": j[p + ".weight"] if untransposed else j[p + ".weight"].T, "bias": j[p + ".bias"]}

    def norm(p: str) -> dict:
        return {"scale": j[p + ".weight"], **({"bias": j[p + ".bias"]} if cfg.norm == "layer" else {})}
    params: dict = {"embed": {"embedding": j["embed.weight"]}, "ln_f": norm("ln_f")}
    for i in range(cfg.layers):
        b = f"blocks.{i}"
        params[f"blocks_{i}"] = {
            "ln1": norm(b + ".ln1"), "ln2": norm(b + ".ln2"),
            "attn": {n: dense(f"{b}.attn.{n}", "untransposed" in bugs and i == 0 and n == "o") for n in "qkvo"},
            "mlp": {"fc1": dense(b + ".mlp.fc1"), "fc2": dense(b + ".mlp.fc2")}}
    return {"params": params}


def port(cfg: Config = Config(), bugs=(), seed: int = 0):
    """(the torch model, the flax port as (module, variables), token ids), the port carrying ``bugs``."""
    bugs = frozenset(bugs)
    tm = torch_model(cfg, seed)
    return tm, (FlaxModel(cfg, bugs), flax_variables(tm, cfg, bugs)), token_ids(cfg, seed)


#: the tied head is embed.attend in flax: pair it by hand (the names cannot say it)
PAIRS = {"head": "embed:attend"}


# -- a model whose bf16 cast fails, one layer to blame ------------------------------------------------------
class Fragile(torch.nn.Module):
    """x W1^T - x W2^T with W2 close to W1: the difference cancels, so in bf16 (each product rounded at its
    own size) little of it is left, where in float32 all of it is."""

    def __init__(self, d: int):
        super().__init__()
        w = torch.randn(d, d) / math.sqrt(d)
        self.w1 = torch.nn.Parameter(w)
        self.w2 = torch.nn.Parameter(w + 0.003 * torch.randn(d, d))

    def forward(self, x):
        return x @ self.w1.T - x @ self.w2.T


class FragileModel(torch.nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.d)
        self.ln = torch.nn.LayerNorm(cfg.d)
        self.fragile = Fragile(cfg.d)
        self.ln_f = torch.nn.LayerNorm(cfg.d)
        self.head = torch.nn.Linear(cfg.d, cfg.vocab, bias=False)

    def forward(self, ids):
        return self.head(self.ln_f(self.fragile(self.ln(self.embed(ids)))))


def fragile_model(cfg: Config = Config(), seed: int = 0) -> FragileModel:
    torch.manual_seed(seed)
    return FragileModel(cfg).eval()
