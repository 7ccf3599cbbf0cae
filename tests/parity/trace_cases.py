"""The models the trace tests share: examples/trace_port.py's torch transformer and its flax linen port
(loaded from that file, so the example and the tests run one definition), with the porting mistakes
``bb.parity.trace`` must name, and a model whose bf16 cast fails at one layer.

Each mistake is planted in the flax port and names the layer it first touches, on both sides."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
import sys

import numpy as np
import torch


def _load_example():
    """examples/trace_port.py as a module (examples/ is not a package; the example stays a script)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "trace_port.py"
    spec = importlib.util.spec_from_file_location("trace_port_example", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # flax's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


example = _load_example()


@dataclasses.dataclass(frozen=True)
class Config:
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
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


def torch_model(cfg: Config = Config(), seed: int = 0) -> torch.nn.Module:
    """The example's torch model, its norms' weights drawn near 1 (not all alike), in ``cfg.dtype``."""
    torch.manual_seed(seed)
    m = example.Model(cfg.norm == "rms")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".ln" in name or name.startswith("ln_f"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
    return m.to(getattr(torch, cfg.dtype)).eval()


def token_ids(cfg: Config = Config(), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, example.V, (example.B, example.S), dtype=np.int64)


def port(cfg: Config = Config(), bugs=(), seed: int = 0):
    """(the torch model, the flax port as (module, variables), token ids), the port carrying ``bugs``."""
    bugs, rms = frozenset(bugs), cfg.norm == "rms"
    tm = torch_model(cfg, seed)
    return tm, (example.FModel(bugs, rms), example.to_flax(tm, bugs, rms)), token_ids(cfg, seed)


PAIRS = example.PAIRS


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
    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.ln = torch.nn.LayerNorm(d)
        self.fragile = Fragile(d)
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        return self.head(self.ln_f(self.fragile(self.ln(self.embed(ids)))))


def fragile_model(seed: int = 0) -> FragileModel:
    torch.manual_seed(seed)
    return FragileModel(example.V, example.D).eval()
