"""The narrow kernels (bb.kernels: to_dtype, to_float32, pack_nibbles, unpack_nibbles) against the
calls a user would write instead, as ratios in one run (``bf16bridge bench --only kernels``).

For bf16 and every narrow float dtype, float32 -> dtype and dtype -> float32: our kernel (the
default call, and on one thread), ml_dtypes' ``astype`` (the reference: the same bits) and, where
torch holds the dtype, torch's own ``.to()``. The contenders alternate call by call
(``timing.compare``); each keeps its fastest and its median call. What was timed is checked
in the run: each contender's result against ml_dtypes' ``astype``, bit for bit (ours must agree;
torch's differences are counted, with examples). The input is float32 normals scaled to the
dtype's range, and its last sixteenth random float32 bit patterns (NaN, inf, subnormals,
overflow), so the specials are in what is timed and compared. Nibbles: ``pack_nibbles`` and
``unpack_nibbles`` against the numpy one-liners.
"""

from __future__ import annotations

import gc
import os
import warnings

import numpy as np

from bf16bridge import kernels
from bf16bridge.core import dtypes

from .timing import compare
from .harness import SIZES, held_by_numpy, machine

QUICK_SIZES, FULL_SIZES = ("1 KiB", "1 MiB"), ("1 KiB", "32 MiB")
#: the dtypes timed: bf16 and every narrow float (the integers are left out: no float rounding)
DTYPES = ("bfloat16", *(n for n, f in kernels.FORMATS.items() if not f.integer))
#: the numpy one-liners a user writes for two 4-bit values a byte (element 2i in the low nibble)
PACK_BY_HAND = "(u[..., 1::2] << 4) | (u[..., 0::2] & 0xF)"
UNPACK_BY_HAND = "np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], -1)"


def _bits(a) -> np.ndarray:
    """The bits of a numpy or torch result, as unsigned integers of its width."""
    if not isinstance(a, np.ndarray):
        a = a.view({1: _torch().uint8, 2: _torch().uint16, 4: _torch().uint32}[a.element_size()]).numpy()
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _torch():
    import torch

    return torch


def _sample(n: int, name: str) -> np.ndarray:
    """n float32 values for ``name``: normals scaled to its range, the last sixteenth random bit patterns."""
    rng = np.random.default_rng(3)
    big = dtypes.ROWS[name].largest
    x = rng.standard_normal(n).astype(np.float32) * np.float32(big / 8 if big < 1e6 else 1.0)
    if name in kernels.FORMATS and not kernels.FORMATS[name].signed:
        x = np.abs(x)  # float8_e8m0fnu: no sign
    k = max(1, n // 16)
    x[-k:] = rng.integers(0, 1 << 32, k, dtype=np.uint32).view(np.float32)
    return x


def _compare_checked(contenders: dict, src: np.ndarray, ref: np.ndarray, quick: bool) -> dict:
    """Time the contenders alternately; each entry also says whether its result is ref's bits
    (and for a differing one, how many elements and the first few: input bits, ref bits, its bits)."""
    inputs, ref = _bits(src).reshape(-1), ref.reshape(-1)
    if inputs.size != ref.size:  # unpacking: an element's input is half a byte; give its index instead
        inputs = np.arange(ref.size)
    out = {}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name, fn in contenders.items():
            got = _bits(fn()).reshape(-1)
            diff = np.flatnonzero(got != ref)
            # the first three differing elements of distinct inputs
            firsts = diff[np.sort(np.unique(inputs[diff], return_index=True)[1])[:3]]
            out[name] = {"same_bits": not diff.size, "differ": int(diff.size), "of": int(ref.size),
                         "examples": [(int(inputs[i]), int(ref[i]), int(got[i])) for i in firsts]}
        times = compare(contenders, quick=quick)
    for name, t in times.items():
        out[name].update(t)
    return out


def bench_dtype(name: str, label: str, quick: bool, log) -> list[dict]:
    import ml_dtypes

    torch = _torch()
    n = SIZES[label] // 4  # float32 elements: the size is the float32 side's bytes
    x = _sample(n, name)
    nd = np.dtype(getattr(ml_dtypes, name))
    with np.errstate(all="ignore"):
        y = x.astype(nd)
    tdt = getattr(torch, name, None)
    xt, yt = torch.from_numpy(x), torch.from_numpy(_bits(y)).view(tdt) if tdt is not None else None
    rows = []
    for direction, src, ref, contenders in (
            ("float32 -> dtype", x, _bits(y), {
                "to_dtype": lambda: kernels.to_dtype(x, name),
                "to_dtype, threads=1": lambda: kernels.to_dtype(x, name, threads=1),
                "ml_dtypes astype": lambda: x.astype(nd),
                **({"torch .to()": lambda: xt.to(tdt)} if tdt is not None else {})}),
            ("dtype -> float32", y, _bits(y.astype(np.float32)), {
                "to_float32": lambda: kernels.to_float32(y),
                "to_float32, threads=1": lambda: kernels.to_float32(y, threads=1),
                "ml_dtypes astype": lambda: y.astype(np.float32),
                **({"torch .to()": lambda: yt.to(torch.float32)} if yt is not None else {})})):
        r = _compare_checked(contenders, src, ref, quick)
        rows.append({"dtype": name, "direction": direction, "size": label, "elements": n, "times": r})
        log(f"  kernels {label} {name:>18} {direction:<16} "
            + "  ".join(f"{k} {v['best'] * 1e6:.1f} us{'' if v['same_bits'] else ' (differs)'}"
                        for k, v in r.items()))
    return rows


def bench_nibbles(label: str, quick: bool, log) -> list[dict]:
    """pack_nibbles of float4_e2m1fn values (one a byte, the size given) and unpack_nibbles of the
    packed bytes, against the numpy one-liners."""
    import ml_dtypes

    n = SIZES[label]
    u = np.random.default_rng(4).integers(0, 16, (n // 256, 256) if n >= 256 * 64 else (1, n), dtype=np.uint8)
    a = u.view(ml_dtypes.float4_e2m1fn)
    packed = (u[..., 1::2] << 4) | (u[..., 0::2] & 0xF)
    rows = []
    for what, src, ref, contenders in (
            ("pack_nibbles", u, packed, {"pack_nibbles": lambda: kernels.pack_nibbles(a),
                                      f"numpy: {PACK_BY_HAND}": lambda: (u[..., 1::2] << 4) | (u[..., 0::2] & 0xF)}),
            ("unpack_nibbles", packed, u, {"unpack_nibbles": lambda: kernels.unpack_nibbles(packed, "float4_e2m1fn"),
                                   f"numpy: {UNPACK_BY_HAND}": lambda: np.stack(
                                       [packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)})):
        r = _compare_checked(contenders, src, ref, quick)
        rows.append({"kernel": what, "size": label, "nibbles": u.size, "times": r})
        log(f"  kernels {label} {what:<14} " + "  ".join(
            f"{k.split(':')[0]} {v['best'] * 1e6:.1f} us{'' if v['same_bits'] else ' (differs)'}" for k, v in r.items()))
    return rows


def run(quick: bool, log=print) -> dict:
    torch = _torch()
    # torch's OpenMP threads spin after each call and fight the kernels' thread pool on a small
    # machine (1 MiB to fp8 took 10 ms on two threads, 0.2 ms on one): torch runs on one thread,
    # as ml_dtypes' astype does
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    rows, nibbles = [], []
    # ml_dtypes' astype is the reference and the contender: the dtypes it lacks here are left out, and
    # the nibbles (float4_e2m1fn values) with them where it has no fp4
    names, left_out = held_by_numpy(DTYPES, log)
    try:
        for label in sizes:
            for name in names:
                rows += bench_dtype(name, label, quick, log)
                gc.collect()
            if "float4_e2m1fn" in names:
                nibbles += bench_nibbles(label, quick, log)
    finally:
        torch.set_num_threads(threads)
    return {"mode": "quick" if quick else "full", "machine": machine(), "sizes": list(sizes),
            "threads": {"kernels default": max(1, min(os.cpu_count() or 1, 8)), "torch .to()": 1,
                        "ml_dtypes astype": 1},
            "rows": rows, "nibbles": nibbles, "left_out": left_out}
