"""Narrow dtypes beside bf16 (issue 10): fp8 and torch's packed fp4 through bb.convert.

For each fp8 dtype and ordered pair of frameworks, in one run and at each size (bytes of the
input): ``bb.convert`` of the fp8 tensor, ``bb.convert`` of a bf16 tensor of the same bytes for
the same pair, and the usual workaround (widen to float32 in the source, move the float32, narrow
in the target). The route and whether it copies come from ``bb.plan``. fp4: torch's packed
``float4_e2m1fn_x2`` to numpy and jax (one value a byte: the bridge unpacks, a copy), against the
hand unpacking people write (the bytes' low and high nibbles, interleaved), the two alternating call by
call; the target (``report_parts.FP4_RATIO``): the bridge at most
1.5x the hand unpacking (medians), at every size.
"""

from __future__ import annotations

import gc

import numpy as np

import bf16bridge as bb
from bf16bridge.core import registry

from .timing import compare
from .harness import SIZES, held_by_numpy, measure, sample

FP8 = ("float8_e4m3fn", "float8_e5m2")
QUICK_SIZES = FULL_SIZES = ("1 KiB", "32 MiB")


def _sample(nbytes: int, dtype: str) -> np.ndarray:
    """nbytes of random finite values of ``dtype`` (numpy, ml_dtypes)."""
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, dtype))
    u = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    a = u.view(dt)
    bad = ~np.isfinite(a.astype(np.float32))
    u[bad] = 0  # NaN and inf: zero, so the float32 round trip is defined in every framework
    return u.view(dt)


def _widen(fw: str):
    """(code, fn): the source framework's widening to float32."""
    if fw == "torch":
        import torch

        return "x.float()", lambda x: x.to(torch.float32)
    if fw == "jax":
        import jax.numpy as jnp

        return "x.astype(jnp.float32)", lambda x: x.astype(jnp.float32)
    if fw == "tensorflow":
        import tensorflow as tf

        return "tf.cast(x, tf.float32)", lambda x: tf.cast(x, tf.float32)
    return "x.astype(np.float32)", lambda x: x.astype(np.float32)


def _move_narrow(fw: str, dtype: str):
    """(code, fn): the float32 moved into ``fw`` (the framework's usual call) and narrowed there."""
    import ml_dtypes

    if fw == "torch":
        import torch

        t = getattr(torch, dtype)
        return (f"torch.from_numpy(np.asarray(w)).to(torch.{dtype})",
                lambda w: torch.from_numpy(np.asarray(w)).to(t))
    if fw == "jax":
        import jax.numpy as jnp

        j = getattr(jnp, dtype)
        return f"jnp.asarray(np.asarray(w)).astype(jnp.{dtype})", lambda w: jnp.asarray(np.asarray(w)).astype(j)
    if fw == "tensorflow":
        import tensorflow as tf

        d = tf.as_dtype(getattr(ml_dtypes, dtype))
        return (f"tf.cast(tf.constant(np.asarray(w)), tf.{dtype})",
                lambda w: tf.cast(tf.constant(np.asarray(w)), d))
    m = getattr(ml_dtypes, dtype)
    return f"np.asarray(w).astype(ml_dtypes.{dtype})", lambda w: np.asarray(w).astype(m)


def _row(x, d: str, log) -> dict:
    p = bb.plan(x, to=d)
    return {"route": " -> ".join(f"{st.framework}: {st.label}" for st in p.steps), "copies": p.copies,
            "reasons": [st.reason for st in p.steps if st.copies and st.reason],
            "bridge": measure(lambda: bb.convert(x, d, on_alias="allow"), min_repeat=3)}


def bench_fp8(sizes, log) -> list[dict]:
    names = registry.names()
    pairs = [(s, d) for s in names for d in names if s != d]
    rows = []
    for label in sizes:
        nbytes = SIZES[label]
        bf16 = {}
        base = sample(nbytes)
        for s, d in pairs:
            xb = bb.convert(base, s, copy=True)
            bf16[(s, d)] = measure(lambda: bb.convert(xb, d, on_alias="allow"), min_repeat=3)
        for dtype in FP8:
            host = _sample(nbytes, dtype)
            for s, d in pairs:
                x = bb.convert(host, s, copy=True)
                row = {"dtype": dtype, "size": label, "nbytes": nbytes, "source": s, "target": d,
                       **_row(x, d, log), "bf16": bf16[(s, d)]}
                (wc, wf), (nc, nf) = _widen(s), _move_narrow(d, dtype)
                code = f"w = {wc}; {nc}"
                try:
                    y = nf(wf(x))
                    same = np.array_equal(np.asarray(bb.convert(y, "numpy", on_alias="allow")).view(np.uint8),
                                          host.view(np.uint8))
                    row["workaround"] = {"code": code, "same_bits": bool(same),
                                         **measure(lambda: nf(wf(x)), min_repeat=3)}
                except Exception as err:  # noqa: BLE001 - a workaround that fails is a result
                    row["workaround"] = {"code": code, "error": f"{type(err).__name__}: {str(err)[:160]}"}
                rows.append(row)
                w = row["workaround"]
                log(f"  {label} {dtype:>14} {s:>10} -> {d:<10} bridge {row['bridge']['median'] * 1e6:9.1f} us"
                    f"  bf16 {row['bf16']['median'] * 1e6:9.1f} us  workaround "
                    + (f"{w['median'] * 1e6:11.1f} us" if "median" in w else w["error"][:60]))
            del host, x
            gc.collect()
        del base
        gc.collect()
    return rows


def _unpack_by_hand(u: np.ndarray) -> np.ndarray:
    """The hand unpacking of packed fp4: low nibble first, then high, one value a byte."""
    import ml_dtypes

    out = np.empty(u.shape[:-1] + (2 * u.shape[-1],), np.uint8)
    np.bitwise_and(u, 0x0F, out=out[..., 0::2])
    np.right_shift(u, 4, out=out[..., 1::2])
    return out.view(ml_dtypes.float4_e2m1fn)


def bench_fp4(sizes, log, quick: bool = False) -> list[dict]:
    import jax.numpy as jnp
    import torch

    hand = {"numpy": ("_unpack(x.view(torch.uint8).numpy())  # low nibble, then high",
                      lambda x: _unpack_by_hand(x.view(torch.uint8).numpy())),
            "jax": ("jnp.asarray(_unpack(x.view(torch.uint8).numpy()))",
                    lambda x: jnp.asarray(_unpack_by_hand(x.view(torch.uint8).numpy())))}
    rows = []
    for label in sizes:
        nbytes = SIZES[label]
        cols = 256 if nbytes >= 256 * 64 else 16
        u = np.random.default_rng(2).integers(0, 256, (nbytes // cols, cols), dtype=np.uint8)
        x = torch.from_numpy(u).view(torch.float4_e2m1fn_x2)
        xb = bb.convert(sample(nbytes), "torch", copy=True)
        for d, (code, fn) in hand.items():
            p = bb.plan(x, to=d)
            same = np.array_equal(np.asarray(bb.convert(x, d)).view(np.uint8), np.asarray(fn(x)).view(np.uint8))
            # the two alternate call by call: other load on this shared machine hits each alike
            t = compare({"bridge": lambda: bb.convert(x, d, on_alias="allow"), "hand": lambda: fn(x)}, quick=quick)
            row = {"dtype": "float4_e2m1fn_x2", "size": label, "nbytes": nbytes, "source": "torch", "target": d,
                   "route": " -> ".join(f"{st.framework}: {st.label}" for st in p.steps), "copies": p.copies,
                   "reasons": [st.reason for st in p.steps if st.copies and st.reason], "bridge": t["bridge"],
                   "bf16": measure(lambda: bb.convert(xb, d, on_alias="allow"), min_repeat=3),
                   "workaround": {"code": code, "same_bits": bool(same), **t["hand"]}}
            rows.append(row)
            log(f"  {label} float4_e2m1fn_x2 torch -> {d:<6} bridge {row['bridge']['median'] * 1e6:9.1f} us"
                f"  bf16 {row['bf16']['median'] * 1e6:9.1f} us  hand unpacking "
                f"{row['workaround']['median'] * 1e6:9.1f} us (same bits: {same})")
        del x, xb, u
        gc.collect()
    return rows


def run(quick: bool, log=print) -> dict:
    from .harness import machine

    import warnings

    # torch.from_numpy of a read-only array (jax's, in the workaround) warns once; the timing is the same
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    for name in registry.names():  # import every framework before timing anything
        registry.get(name)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    # torch's packed fp4 reaches numpy and jax unpacked, one value a byte: only where ml_dtypes has that row
    _, left_out = held_by_numpy(("float4_e2m1fn_x2",), log)
    return {"mode": "quick" if quick else "full", "machine": machine(), "sizes": list(sizes),
            "rows": bench_fp8(sizes, log) + ([] if left_out else bench_fp4(sizes, log, quick)),
            "left_out": left_out}
