"""Casting (bb.cast_tree, bb.cast_module) against the loops a user writes instead, as ratios in one
run (``bf16bridge bench --only casting``).

- A GPT-2-small-shaped float32 torch state dict, ``lm_head.weight`` tied to ``wte.weight`` (one
  tensor under two keys, as a state dict of GPT-2 gives it): ``bb.cast_tree`` (norms kept in
  float32, the tied tensor cast once), ``bb.cast_tree(policy=[])`` (every floating leaf cast, as
  the loop does) and the hand loop ``{k: v.to(torch.bfloat16) for k, v in sd.items()}``, which
  casts the tied tensor twice and unties it.
- A small transformer-shaped ``nn.Module``: ``bb.cast_module`` (norms kept, with their hooks, and
  a report) against ``model.to(torch.bfloat16)``. Both are in place, so each call gets a fresh
  float32 copy of the model, made outside the time.
- The same GPT-2 shapes as flax-style jax params (nested dicts, no tie): ``bb.cast_tree`` against
  ``jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)``, each blocked until ready.

Every comparison checks what was timed: the leaves both cast have the same bits, the kept leaves
are the input's own.
"""

from __future__ import annotations

import copy
import gc
import statistics
import time

import numpy as np

import bf16bridge as bb

from .checkpoints import gpt2_shapes
from .timing import compare
from .harness import machine

#: GPT-2 small, and a small stand-in for --quick
FULL_GPT2, QUICK_GPT2 = {"layers": 12, "d": 768, "vocab": 50257, "ctx": 1024}, \
    {"layers": 2, "d": 64, "vocab": 512, "ctx": 64}
#: the nn.Module: blocks, width, vocabulary
FULL_MODULE, QUICK_MODULE = {"layers": 4, "d": 256, "vocab": 8192}, {"layers": 1, "d": 32, "vocab": 64}
FRESH_ROUNDS, QUICK_FRESH_ROUNDS = 15, 2
HAND_LOOP = "{k: v.to(torch.bfloat16) for k, v in sd.items()}"
TREE_MAP = "jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)"


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _bits(t):
    import torch

    return t.detach().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(_bits(a), _bits(b)))


def torch_state_dict(shape: dict) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(s, generator=g) * 0.02 for k, s in gpt2_shapes(**shape).items()}
    sd["lm_head.weight"] = sd["wte.weight"]  # tied, as GPT-2's state_dict() gives it
    return sd


def bench_state_dict(quick: bool, log) -> dict:
    import torch

    sd = torch_state_dict(QUICK_GPT2 if quick else FULL_GPT2)
    ours, report = bb.cast_tree(sd, "bfloat16")
    every, _ = bb.cast_tree(sd, "bfloat16", policy=[])
    hand = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    kept = {leaf.path for leaf in report.kept}
    same = (all(_same(ours[k], sd[k]) if k in kept else _same(ours[k], hand[k]) for k in sd)
            and all(_same(every[k], hand[k]) for k in sd))
    tied_once = ours["lm_head.weight"] is ours["wte.weight"] and every["lm_head.weight"] is every["wte.weight"]
    times = compare({"cast_tree": lambda: bb.cast_tree(sd, "bfloat16"),
                     "cast_tree, policy=[]": lambda: bb.cast_tree(sd, "bfloat16", policy=[]),
                     "hand loop": lambda: {k: v.to(torch.bfloat16) for k, v in sd.items()}}, quick=quick)
    unique = {id(v): v for v in sd.values()}.values()
    row = {"tensors": len(sd), "unique_tensors": len(unique), "nbytes": _nbytes(unique),
           "tied": ["lm_head.weight", "wte.weight"], "tied_nbytes": _nbytes([sd["wte.weight"]]),
           "kept": len(kept), "kept_nbytes": _nbytes([sd[k] for k in kept]), "same_bits": bool(same),
           "tied_cast_once": bool(tied_once), "hand_loop_unties": hand["lm_head.weight"] is not hand["wte.weight"],
           "times": times}
    log(f"  casting torch state dict ({len(sd)} tensors): "
        + "  ".join(f"{k} {v['best'] * 1e3:.1f} ms" for k, v in times.items()) + f"  same bits: {same}")
    return row


def _module(shape: dict):
    """A GPT-2-like nn.Module: embeddings, pre-norm blocks (LayerNorm, attention projections, MLP),
    a final LayerNorm and a head tied to the token embedding."""
    import torch
    from torch import nn

    d, vocab = shape["d"], shape["vocab"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            q, k, v = self.qkv(self.ln_1(x)).chunk(3, dim=-1)
            x = x + self.proj(nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
            return x + self.out(nn.functional.gelu(self.fc(self.ln_2(x))))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(256, d)
            self.h = nn.ModuleList(Block() for _ in range(shape["layers"]))
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[-1]))
            for b in self.h:
                x = b(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(0)
    return Tiny().eval()


def compare_fresh(contenders: dict, make, rounds: int) -> dict:
    """Seconds a call of each contender on a fresh object from ``make()`` (made outside the time):
    for calls that change their input in place. The contenders alternate, the order rotating."""
    fns = list(contenders.items())
    times: dict = {k: [] for k in contenders}
    for r in range(rounds + 1):
        k = r % len(fns)
        for name, fn in fns[k:] + fns[:k]:
            obj = make()
            gc.collect()
            t0 = time.perf_counter()
            fn(obj)
            dt = time.perf_counter() - t0
            if r:  # the first round warms up
                times[name].append(dt)
    return {k: {"best": min(v), "median": statistics.median(v), "calls": len(v)} for k, v in times.items()}


def bench_module(quick: bool, log) -> dict:
    import torch

    shape = QUICK_MODULE if quick else FULL_MODULE
    template = _module(shape)
    ours, report = bb.cast_module(copy.deepcopy(template), "bfloat16")
    plain = copy.deepcopy(template).to(torch.bfloat16)
    kept = {leaf.path for leaf in report.kept}
    mine, theirs, orig = dict(ours.named_parameters()), dict(plain.named_parameters()), dict(
        template.named_parameters())
    same = all(_same(mine[k], orig[k]) if k in kept else _same(mine[k], theirs[k]) for k in orig)
    ids = torch.randint(0, shape["vocab"], (1, 16))
    with torch.no_grad():
        runs = ours(ids).dtype == torch.bfloat16
    times = compare_fresh({"cast_module": lambda m: bb.cast_module(m, "bfloat16"),
                           "module.to(torch.bfloat16)": lambda m: m.to(torch.bfloat16)},
                          lambda: copy.deepcopy(template), QUICK_FRESH_ROUNDS if quick else FRESH_ROUNDS)
    params = list(template.parameters())
    row = {"shape": shape, "modules": sum(1 for _ in template.modules()), "parameters": len(params),
           "nbytes": _nbytes(params), "kept": len(kept), "same_bits": bool(same), "runs_in_bf16": bool(runs),
           "times": times}
    log(f"  casting nn.Module ({row['modules']} modules, {_nbytes(params) / (1 << 20):.1f} MiB): "
        + "  ".join(f"{k} {v['best'] * 1e3:.2f} ms" for k, v in times.items()) + f"  same bits: {same}")
    return row


def _nest(flat: dict) -> dict:
    """Dotted names as nested dicts under "params", as flax linen keeps them."""
    out: dict = {}
    for k, v in flat.items():
        *path, leaf = k.split(".")
        node = out
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    return {"params": out}


def bench_jax(quick: bool, log) -> dict:
    import jax
    import jax.numpy as jnp

    g = np.random.default_rng(0)
    flat = {k: jnp.asarray((g.standard_normal(s, dtype=np.float32) * 0.02))
            for k, s in gpt2_shapes(**(QUICK_GPT2 if quick else FULL_GPT2)).items()}
    params = _nest(flat)
    ours, report = bb.cast_tree(params, "bfloat16")
    theirs = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    kept = {leaf.path for leaf in report.kept}
    a, b, src = ({".".join(str(k.key) for k in p): x for p, x in jax.tree_util.tree_leaves_with_path(t)}
                 for t in (ours, theirs, params))

    def same(x, y) -> bool:
        return x.dtype == y.dtype and np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))

    ok = kept <= set(a) and all(same(a[k], src[k]) if k in kept else same(a[k], b[k]) for k in a)
    times = compare({"cast_tree": lambda: jax.block_until_ready(bb.cast_tree(params, "bfloat16")[0]),
                     "jax.tree.map astype": lambda: jax.block_until_ready(
                         jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))}, quick=quick)
    leaves = jax.tree.leaves(params)
    row = {"tensors": len(leaves), "nbytes": int(sum(x.nbytes for x in leaves)), "kept": len(kept),
           "same_bits": ok, "times": times}
    log(f"  casting jax params ({len(leaves)} arrays): "
        + "  ".join(f"{k} {v['best'] * 1e3:.1f} ms" for k, v in times.items()) + f"  same bits: {ok}")
    return row


def run(quick: bool, log=print) -> dict:
    from bf16bridge.core import registry

    for name in ("torch", "jax"):
        registry.get(name)
    out = {"mode": "quick" if quick else "full", "machine": machine(),
           "gpt2": QUICK_GPT2 if quick else FULL_GPT2, "code": {"hand loop": HAND_LOOP, "tree map": TREE_MAP}}
    out["state_dict"] = bench_state_dict(quick, log)
    gc.collect()
    out["module"] = bench_module(quick, log)
    gc.collect()
    out["jax"] = bench_jax(quick, log)
    return out
