"""What changed at a layer beyond rounding: a few cheap diagnostics of a result against its reference
(a scale, a sign flip, NaN/inf appearing, a constant or per-feature offset, a transposition, the
positions where it differs), each said in a line; for ``bb.parity.trace``'s first divergence."""

from __future__ import annotations

import itertools
import math

import numpy as np

from bf16bridge.parity import metrics

#: a pattern explains a difference when what it leaves is at most this share of it (in 2-norm)
EXPLAINS = 0.3


def _norm(v: np.ndarray) -> float:
    s = float(np.max(np.abs(v))) if v.size else 0.0
    if s == 0 or not math.isfinite(s):
        return s
    return s * float(np.sqrt(np.sum((v / s) ** 2)))


def _ranges(idx) -> str:
    """0, 1, 2, 5 as "0-2, 5"."""
    out, idx = [], sorted(int(i) for i in idx)
    for _, grp in itertools.groupby(enumerate(idx), lambda p: p[1] - p[0]):
        g = [v for _, v in grp]
        out.append(f"{g[0]}" if len(g) == 1 else f"{g[0]}-{g[-1]}")
    return ", ".join(out)


def what_changed(x, ref, *, unit: str, budget: float, variants: dict | None = None) -> list[str]:
    """Lines saying how ``x`` differs from ``ref`` (any frameworks' tensors or numpy): the patterns
    that explain most of the difference. ``unit``: the dtype whose rounding counts; ``budget``: the
    roundings allowed per element; ``variants``: {what: the layer run so} to match ``x`` against."""
    x64 = metrics.to_float64(metrics.ensure_numpy(x))
    r64 = metrics.to_float64(metrics.ensure_numpy(ref))
    if x64.shape != r64.shape:
        return _reshaped(x64, r64)
    out = _nonfinite(x64, r64)
    ok = np.isfinite(x64) & np.isfinite(r64)
    x0, r0 = np.where(ok, x64, 0.0), np.where(ok, r64, 0.0)
    d = x0 - r0
    nd = _norm(d)
    if nd == 0:
        return out
    for what, v in (variants or {}).items():
        v64 = metrics.to_float64(metrics.ensure_numpy(v))
        if v64.shape == x64.shape and _norm(np.where(ok, x64 - v64, 0.0)) <= 0.1 * nd:
            return out + [f"matches the reference layer run with its {what}: a weight used untransposed "
                          "(flax's (in, out) kernel against torch's (out, in) weight)"]
    out += _scale_offset(x0, r0, d, nd)
    out += _transposed(x0, r0, nd)
    out += _signs(x0, r0, out)
    out += _where(d, r0, ok, unit, budget)
    if not out:
        out.append("no simple pattern: not a scale, an offset, a sign flip, a transposition or NaN/inf")
    return out


def _reshaped(x64: np.ndarray, r64: np.ndarray) -> list[str]:
    if x64.size != r64.size:
        return [f"shape {x64.shape} against {r64.shape}: other sizes"]
    nr = _norm(np.nan_to_num(r64))
    if r64.ndim <= 6:
        for perm in itertools.permutations(range(r64.ndim)):
            t = np.transpose(r64, perm)
            if t.shape == x64.shape and _norm(np.nan_to_num(x64 - t)) <= 0.05 * nr:
                return [f"the reference with its axes permuted {perm}: a transposition"]
    if _norm(np.nan_to_num(x64.reshape(-1) - r64.reshape(-1))) <= 0.05 * nr:
        return [f"the same values in another shape, {x64.shape} against {r64.shape}"]
    return [f"shape {x64.shape} against {r64.shape}, and no permutation of the axes matches"]


def _nonfinite(x64: np.ndarray, r64: np.ndarray) -> list[str]:
    out = []
    for what, test in (("NaN", np.isnan), ("infinities", np.isinf)):
        new = test(x64) & np.isfinite(r64)
        if new.any():
            first = tuple(int(i) for i in np.unravel_index(int(np.argmax(new)), x64.shape))
            out.append(f"{int(new.sum())} {what} appear where the reference is finite (first at {list(first)})")
    return out


def _scale_offset(x0, r0, d, nd) -> list[str]:
    out = []
    rr = float(np.sum(r0 * r0))
    if rr > 0:
        s = float(np.sum(x0 * r0)) / rr
        if _norm(x0 - s * r0) <= EXPLAINS * nd:
            out.append("the sign flipped: the reference negated" if abs(s + 1) < 0.05 else
                       f"a scale: 1 {'+' if s > 1 else '-'} {abs(s - 1):.3g} times the reference" if abs(s - 1) < 1e-3
                       else f"a scale: about {s:.4g} times the reference")
    c = float(np.mean(d))
    if not out and _norm(d - c) <= EXPLAINS * nd:
        out.append(f"a constant offset of {c:.3g}")
    elif not out and d.ndim >= 2:
        per = np.mean(d.reshape(-1, d.shape[-1]), axis=0)
        if _norm(d - per) <= EXPLAINS * nd:
            top = float(np.max(np.abs(per)))
            out.append(f"an offset per feature (along the last axis, as a bias adds), up to {top:.3g}")
    return out


def _transposed(x0, r0, nd) -> list[str]:
    for i, j in itertools.combinations(range(r0.ndim), 2):
        if r0.shape[i] == r0.shape[j] and r0.shape[i] > 1 and _norm(x0 - np.swapaxes(r0, i, j)) <= EXPLAINS * nd:
            return [f"a transposition: the reference with axes {i} and {j} swapped"]
    return []


def _signs(x0, r0, found: list[str]) -> list[str]:
    if any("sign" in f for f in found):
        return []
    rms = math.sqrt(float(np.mean(r0 * r0))) if r0.size else 0.0
    big = np.abs(r0) > 0.1 * rms
    flips = big & (np.sign(x0) != np.sign(r0))
    if big.any() and flips.any():
        return [f"the sign differs at {float(flips.sum() / big.sum()):.1%} of the elements not near zero"]
    return []


def _where(d, r0, ok, unit: str, budget: float) -> list[str]:
    """Along each axis, the indices where the difference is beyond ``budget`` roundings, when others agree."""
    u = metrics.limits(unit)[0] if unit else 2.0 ** -8
    rms = math.sqrt(float(np.mean(r0 * r0))) if r0.size else 0.0
    bad = (np.abs(d) > budget * u * (np.abs(r0) + rms)) | ~ok
    if not bad.any() or bad.all():
        return []
    out = []
    for ax in range(bad.ndim):
        n = bad.shape[ax]
        if n < 2:
            continue
        hit = np.any(np.moveaxis(bad, ax, 0).reshape(n, -1), axis=1)
        if hit.any() and not hit.all():
            out.append(f"along axis {ax} (size {n}): index {_ranges(np.flatnonzero(hit))} differ, "
                       f"{_ranges(np.flatnonzero(~hit))} agree")
    return out[:2]
