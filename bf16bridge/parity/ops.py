"""The built-in operations, each defined per framework as data.

An Op says how to make its inputs (seeded), how to compute it in float64 from
the same bf16 bits (the reference), the per-element condition scale where the
operation has one, and one small function per framework. The functions import
their framework when called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from bf16bridge.core import dtypes, registry


@dataclass(frozen=True)
class Op:
    name: str
    doc: str
    inputs: Callable  # (rng, kind, params) -> {name: bf16 ndarray}
    reference: Callable  # (**float64 inputs, **params) -> float64 ndarray
    impl: dict  # framework -> fn(**inputs, **params)
    condition: Callable | None = None  # (**float64 inputs, **params) -> float64 ndarray
    params: dict = field(default_factory=dict)
    kinds: tuple = ("normal",)


def _bf16(x: np.ndarray) -> np.ndarray:
    from bf16bridge.kernels import to_bf16

    return to_bf16(np.ascontiguousarray(x, dtype=np.float32))


def _values(rng, shape, kind: str) -> np.ndarray:
    """Seeded bf16 inputs: normal; wide (values spread over 2**-20 .. 2**20); cancel
    (pairs of nearly equal magnitude and opposite sign, so sums cancel); ties (small
    integers: products and sums are exact integers, and those above 256 often fall
    exactly half-way between two bf16 numbers, so the final rounding must be to even)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "ties":
        x = rng.integers(-16, 17, shape).astype(np.float32)
    elif kind == "wide":
        x *= np.exp2(rng.integers(-20, 21, shape)).astype(np.float32)
    elif kind == "cancel":
        flat = x.reshape(-1)
        half = flat.size // 2
        flat[half:2 * half] = -flat[:half] * (1 + rng.standard_normal(half).astype(np.float32) * 2 ** -6)
        rng.shuffle(flat)
        x = flat.reshape(shape)
    elif kind != "normal":
        raise ValueError(f"input kind must be normal, wide, cancel or ties; got {kind!r}")
    return _bf16(x)


def _every_bf16(positive: bool = False) -> np.ndarray:
    """Every finite bf16 value (the whole input space of a unary op), or every positive one."""
    a = dtypes.all_bf16_patterns()
    bits = a.view(np.uint16)
    finite = (bits & 0x7F80) != 0x7F80
    keep = finite & ((bits < 0x8000) & (bits != 0) if positive else True)
    return np.ascontiguousarray(a[keep])


# -- framework modules, imported on first use ---------------------------------------


def _torch():
    import torch

    return torch


def _jnp():
    import jax.numpy as jnp

    return jnp


def _jax():
    import jax

    return jax


def _tf():
    return registry.framework("tensorflow")


# -- float64 references ---------------------------------------------------------------

# erfc, not 1 + erf: for x below about -5, 1 + erf(x / sqrt(2)) cancels to 0 even in float64
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _softmax64(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _conv64(x, w):
    win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))  # N C H' W' kh kw
    return np.einsum("nchwij,ocij->nohw", win, w)


def _layer_norm64(x, eps=1e-5):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps)


def _gelu_condition(x):
    """|f| + |x f'| (the input rounded, as jax and tensorflow round x / sqrt(2) before erfc), plus
    erf's rounding times |x| / 2, which 1 + erf cancels for negative x: to float32 in torch's erf form,
    to bf16 in jax's before its erfc form (jax 0.4.30 rounds erf(x / sqrt(2)) to bf16, then adds 1)."""
    with np.errstate(over="ignore", under="ignore"):
        cdf = 0.5 * _erfc(-x / math.sqrt(2))
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        return np.abs(x) * (cdf + np.abs(cdf + x * pdf) + 0.5 * np.abs(2 * cdf - 1))


def _softmax_condition(x):
    """s (1 + |z| + sum s |z|), z = x - max: the result's rounding, and each shifted input's (jax
    rounds x - max and the exponentials to bf16), through its own exponential and through the sum."""
    s, z = _softmax64(x), np.abs(x - x.max(axis=-1, keepdims=True))
    return s * (1 + z + (s * z).sum(axis=-1, keepdims=True))


def _attention64(q, k, v):
    return _softmax64(q @ k.T / math.sqrt(q.shape[-1])) @ v


# -- the table -------------------------------------------------------------------------

def _two(shape_a, shape_b):
    return lambda rng, kind, p: {"a": _values(rng, shape_a(p), kind), "b": _values(rng, shape_b(p), kind)}


def _one(shape):
    return lambda rng, kind, p: {"x": _values(rng, shape(p), kind)}


def _unary(positive=False):
    return lambda rng, kind, p: {"x": _every_bf16(positive)}


def _tf_conv(x, w):
    tf = _tf()
    y = tf.nn.conv2d(tf.transpose(x, [0, 2, 3, 1]), tf.transpose(w, [2, 3, 1, 0]), 1, "VALID")
    return tf.transpose(y, [0, 3, 1, 2])


def _tf_layer_norm(x):
    tf = _tf()
    m, v = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - m) * tf.math.rsqrt(v + tf.constant(1e-5, x.dtype))


OPS: dict = {}


def _add(op: Op) -> None:
    OPS[op.name] = op


_add(Op(
    "matmul", "A (m x k) @ B (k x n), bf16 in and out",
    _two(lambda p: (p["m"], p["k"]), lambda p: (p["k"], p["n"])),
    lambda a, b, **p: a @ b,
    {"torch": lambda a, b, **p: a @ b,
     "jax": lambda a, b, **p: _jnp().matmul(a, b),
     "tensorflow": lambda a, b, **p: _tf().linalg.matmul(a, b)},
    condition=lambda a, b, **p: np.abs(a) @ np.abs(b),
    params={"m": 64, "k": 256, "n": 64}, kinds=("normal", "wide", "cancel", "ties"),
))
_add(Op(
    "conv2d", "2-d convolution, NCHW input, OIHW filter, stride 1, no padding",
    lambda rng, kind, p: {"x": _values(rng, (2, p["c"], p["hw"], p["hw"]), kind),
                          "w": _values(rng, (p["o"], p["c"], 3, 3), kind)},
    lambda x, w, **p: _conv64(x, w),
    {"torch": lambda x, w, **p: _torch().nn.functional.conv2d(x, w),
     "jax": lambda x, w, **p: _jax().lax.conv_general_dilated(x, w, (1, 1), "VALID",
                                                             dimension_numbers=("NCHW", "OIHW", "NCHW")),
     "tensorflow": lambda x, w, **p: _tf_conv(x, w)},
    condition=lambda x, w, **p: _conv64(np.abs(x), np.abs(w)),
    params={"c": 8, "o": 8, "hw": 16}, kinds=("normal", "ties"),
))
_add(Op(
    "softmax", "softmax over the last axis",
    _one(lambda p: (p["rows"], p["cols"])), lambda x, **p: _softmax64(x),
    {"torch": lambda x, **p: _torch().softmax(x, -1),
     "jax": lambda x, **p: _jax().nn.softmax(x, axis=-1),
     "tensorflow": lambda x, **p: _tf().nn.softmax(x, axis=-1)},
    condition=lambda x, **p: _softmax_condition(x),
    params={"rows": 64, "cols": 256}, kinds=("normal", "wide"),
))
_add(Op(
    "layer_norm", "layer normalisation over the last axis, eps 1e-5, no affine",
    _one(lambda p: (p["rows"], p["cols"])), lambda x, **p: _layer_norm64(x),
    {"torch": lambda x, **p: _torch().nn.functional.layer_norm(x, (x.shape[-1],)),
     "jax": lambda x, **p: _jax().nn.standardize(x, axis=-1, epsilon=1e-5),
     "tensorflow": lambda x, **p: _tf_layer_norm(x)},
    # x - mean cancels: scale errors by (|x| + |mean|) / std
    condition=lambda x, **p: (np.abs(x) + np.abs(x.mean(-1, keepdims=True))) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
    params={"rows": 64, "cols": 256},
))
_add(Op(
    "gelu", "GELU (exact, with erf) over every finite bf16 value",
    _unary(), lambda x, **p: 0.5 * x * _erfc(-x / math.sqrt(2)),
    {"torch": lambda x, **p: _torch().nn.functional.gelu(x),
     "jax": lambda x, **p: _jax().nn.gelu(x, approximate=False),
     "tensorflow": lambda x, **p: _tf().nn.gelu(x, approximate=False)},
    condition=lambda x, **p: _gelu_condition(x),
    kinds=("all",),
))
_add(Op(
    "sum", "sum over the last axis",
    _one(lambda p: (p["rows"], p["cols"])), lambda x, **p: x.sum(axis=-1),
    {"torch": lambda x, **p: x.sum(-1),
     "jax": lambda x, **p: _jnp().sum(x, axis=-1),
     "tensorflow": lambda x, **p: _tf().reduce_sum(x, axis=-1)},
    condition=lambda x, **p: np.abs(x).sum(axis=-1),
    params={"rows": 64, "cols": 1024}, kinds=("normal", "cancel", "ties"),
))
_add(Op(
    "mean", "mean over the last axis",
    _one(lambda p: (p["rows"], p["cols"])), lambda x, **p: x.mean(axis=-1),
    {"torch": lambda x, **p: x.mean(-1),
     "jax": lambda x, **p: _jnp().mean(x, axis=-1),
     "tensorflow": lambda x, **p: _tf().reduce_mean(x, axis=-1)},
    condition=lambda x, **p: np.abs(x).mean(axis=-1),
    params={"rows": 64, "cols": 1024}, kinds=("normal", "cancel"),
))
for _name, _np_fn, _positive in (("exp", np.exp, False), ("log", np.log, True), ("tanh", np.tanh, False)):
    _add(Op(
        _name, f"{_name} over every {'positive' if _positive else 'finite'} bf16 value",
        _unary(_positive), (lambda f: lambda x, **p: f(x))(_np_fn),
        {"torch": (lambda n: lambda x, **p: getattr(_torch(), n)(x))(_name),
         "jax": (lambda n: lambda x, **p: getattr(_jnp(), n)(x))(_name),
         "tensorflow": (lambda n: lambda x, **p: getattr(_tf().math, n)(x))(_name)},
        kinds=("all",),
    ))
_add(Op(
    "attention", "softmax(Q K^T / sqrt(d)) V, one head",
    lambda rng, kind, p: {n: _values(rng, (p["seq"], p["d"]), kind) for n in ("q", "k", "v")},
    lambda q, k, v, **p: _attention64(q, k, v),
    {"torch": lambda q, k, v, **p: _torch().softmax(q @ k.T / math.sqrt(q.shape[-1]), -1) @ v,
     "jax": lambda q, k, v, **p: _jax().nn.softmax(q @ k.T / math.sqrt(q.shape[-1]), axis=-1) @ v,
     "tensorflow": lambda q, k, v, **p: _tf().linalg.matmul(
         _tf().nn.softmax(_tf().linalg.matmul(q, k, transpose_b=True) / math.sqrt(q.shape[-1]), axis=-1), v)},
    # the last product cancels like any matmul: scale by |P| |V|
    condition=lambda q, k, v, **p: _softmax64(q @ k.T / math.sqrt(q.shape[-1])) @ np.abs(v),
    params={"seq": 64, "d": 64},
))
