"""Where the disagreements live: for an op run over every input value, the input
intervals in which a result's error against the reference exceeds the policy.

Each result is judged element by element against the float64 reference rounded to
the result's dtype (the correctly rounded answer), under the report's policy:

- ``exact``: any bit differs (-0 against +0, and NaN payloads: a NaN whose bits differ
  from the rounded reference's NaN counts with the NaN/inf mismatches); ``ulp(n)``: more
  than n ULPs apart (and -0 against +0 with ``signed_zeros``); ``allclose(rtol, atol)``:
  |x - ref| > atol + rtol |ref|, computed as the policy computes it (``torch``: in the
  result's dtype, as torch.isclose) (with ``equal_nan=False``, the ``torch`` policy, a NaN on
  either side too); ``reference(k)``: more than k ULPs apart (k rounded down);
- under every policy, NaN or infinity where the rounded reference has none (or the reverse);
  ``rounding(k)``: more than k roundings of the element's scale (its condition scale, else its
  magnitude), or a NaN/inf rounding does not explain (explain.py).

Without a reference (``find_pairs``), each pair of results is judged against each other the same
way (``rounding(k)``: 2k roundings), and a region names the pair.

Inputs are ordered by value and grouped by binade (sign and exponent, subnormals and
zero one group per sign); a region is a run of neighbouring binades each holding an
input that exceeds. Its interval spans the exceeding inputs; its representative is
the worst of them (non-finite first, then the largest ULP distance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bf16bridge.parity import explain, metrics
from bf16bridge.parity.policies import Policy

#: regions kept per result (the largest; the rest are counted in ``regions_total``)
K_REGIONS = 6


@dataclass(frozen=True)
class Region:
    """An input interval where one result's error against the reference exceeds the policy."""

    result: str
    lo: float  # the interval of inputs, lowest and highest that exceed
    hi: float
    exceeding: int  # inputs in [lo, hi] whose result exceeds the policy
    inputs: int  # inputs in [lo, hi]
    input: float  # the representative input: the worst in the interval
    values: tuple  # ((name, value), ...): every result at that input
    reference: float  # the float64 reference at that input
    ulps: float | None  # the result's distance there from the rounded reference; None: NaN/inf mismatch
    nonfinite: int  # of the exceeding inputs, those with NaN or infinity on one side only (exact: or NaNs' bits
    # differ; equal_nan=False: or NaN on both sides)
    regions_total: int  # regions of this result, shown or not


def exceeds(pol: Policy, x: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per element of ``x``: whether it exceeds ``pol`` against ``held`` (the reference in x's
    dtype), whether that is a NaN/inf mismatch, and the ULP distance (inf where non-finite)."""
    cx, ch = metrics.classify(x), metrics.classify(held)
    bx, bh = metrics.bits(x).reshape(-1), metrics.bits(held).reshape(-1)
    fx, fh = cx["finite"].reshape(-1), ch["finite"].reshape(-1)
    inf_x, inf_h = cx["inf"].reshape(-1), ch["inf"].reshape(-1)
    nonfinite = (cx["nan"] != ch["nan"]).reshape(-1) | (inf_x != inf_h) | (inf_x & inf_h & (bx != bh))
    if pol.kind == "exact":  # bits, as compare's exact: NaNs whose payloads or signs differ too
        nonfinite |= ~fx & ~fh & (bx != bh)
    if not pol.equal_nan:  # allclose(equal_nan=false), the torch policy: a NaN is close to nothing
        nonfinite |= (cx["nan"] | ch["nan"]).reshape(-1)
    both = fx & fh
    d = np.where(both, metrics.ulp_distance(x, held).reshape(-1).astype(np.float64), 0.0)
    if pol.kind == "exact":
        bad = both & (bx != bh)  # -0 against +0 included
    elif pol.kind == "allclose":
        bad = both & ~metrics.policy_close(pol, x, held).reshape(-1)
    else:  # ulp(n); reference(k) judges k ULPs per element
        bad = both & (d > np.floor(pol.n))
        if pol.signed_zeros:
            bad |= both & (cx["zero"] & ch["zero"] & (cx["negzero"] != ch["negzero"])).reshape(-1)
    d = np.where(nonfinite, np.inf, d)
    return bad | nonfinite, nonfinite, d


def _binade(x: np.ndarray) -> np.ndarray:
    """A key per input that is equal within a binade and ordered as the values are."""
    o = metrics.ordered(x)  # signed magnitude order of the bit patterns
    mag = np.abs(o) >> metrics.mantissa_bits(metrics.kind_of(x))  # the exponent field (0: zero and subnormals)
    return np.where(o < 0, -mag - 1, mag)  # negatives below positives, -0 with +0's group


def find(x: np.ndarray, results: dict, reference: np.ndarray, pol: Policy, k: int = K_REGIONS, *,
         condition=None, flushed=None) -> tuple:
    """The regions of every result in ``results`` ({name: array shaped like x}), judged against
    ``reference`` (float64) under ``pol``. ``x``: the input each element was computed from. The
    rounding policy also reads ``condition`` (float64, the op's condition scale) and ``flushed``
    (the reference at the inputs with their subnormal elements flushed to zero)."""
    x = np.asarray(x).reshape(-1)
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    sub = metrics.classify(x)["subnormal"].reshape(-1) if flushed is not None else None
    cond = None if condition is None else np.asarray(condition, dtype=np.float64).reshape(-1)
    out: list = []
    for name, r in results.items():
        r = np.asarray(r).reshape(-1)
        if r.size != x.size:
            continue
        held = metrics.round_to(ref, r.dtype).astype(r.dtype)
        if pol.kind == "rounding":
            case = explain.Case(r.dtype.name, pol.n, "condition" if cond is not None else "magnitude", True)
            m, _ = explain.multiples(metrics.to_float64(r).reshape(-1), ref, case, cond,
                                      None if flushed is None else np.asarray(flushed, np.float64).reshape(-1), sub,
                                      measures=False)
            judged = _from_multiples(m, case.budget, r, held)
        else:
            judged = exceeds(pol, r, held)
        out += _regions(name, x, judged, results, ref, k)
    return tuple(out)


def find_pairs(x: np.ndarray, results: dict, pol: Policy, k: int = K_REGIONS, *, condition=None) -> tuple:
    """Without a reference: the regions of every pair of ``results`` ({name: array shaped like x}), where
    the two differ beyond ``pol`` (the rounding policy: beyond 2k roundings of the element, or of its
    ``condition``); each region is named "a vs b" and its reference is NaN (there is none)."""
    import itertools

    x = np.asarray(x).reshape(-1)
    cond = None if condition is None else np.asarray(condition, dtype=np.float64).reshape(-1)
    flat = {n: np.asarray(v).reshape(-1) for n, v in results.items() if np.asarray(v).size == x.size}
    out: list = []
    for na, nb in itertools.combinations(flat, 2):
        a, b, _, _ = metrics.same_dtype(flat[na], flat[nb])
        if pol.kind == "rounding":
            unit = explain.coarser(flat[na].dtype.name, flat[nb].dtype.name)
            case = explain.Case(unit, 2 * pol.n, "condition" if cond is not None else "magnitude", False)
            m, _ = explain.multiples(metrics.to_float64(flat[na]), metrics.to_float64(flat[nb]), case, cond,
                                     measures=False)
            judged = _from_multiples(m, case.budget, a, b)
        else:
            judged = exceeds(pol, a, b)
        out += _regions(f"{na} vs {nb}", x, judged, flat, np.full(x.size, np.nan), k)
    return tuple(out)


def _from_multiples(m: np.ndarray, budget: float, r: np.ndarray, held: np.ndarray) -> tuple:
    """exceeds()'s answer from the rounding policy's per-element multiples: beyond the budget, a
    NaN/inf it does not explain, and the ULP distance to ``held`` (inf where non-finite)."""
    nonfinite = np.isinf(m)
    both = metrics.classify(r)["finite"].reshape(-1) & metrics.classify(held)["finite"].reshape(-1)
    d = np.where(both, metrics.ulp_distance(r, held).reshape(-1).astype(np.float64), 0.0)
    return (m > budget) | nonfinite, nonfinite, np.where(nonfinite, np.inf, d)


def _regions(name: str, x: np.ndarray, judged: tuple, results: dict, ref: np.ndarray, k: int) -> list:
    """One result's (or pair's) regions: runs of neighbouring binades of ``x`` each holding an input
    that ``judged`` (exceeds, non-finite, distance; per element) says exceeds; the ``k`` largest."""
    order = np.argsort(metrics.to_float64(x), kind="stable")
    xs = metrics.to_float64(x)[order]
    keys = _binade(x)[order]
    bad, nonfinite, dist = (a[order] for a in judged)
    if not bad.any():
        return []
    wide = {n: metrics.to_float64(np.asarray(v)).reshape(-1)[order] for n, v in results.items()}
    ukeys, first = np.unique(keys, return_index=True)
    has_bad = np.logical_or.reduceat(bad, first)
    runs, start = [], None
    for i, flag in enumerate(has_bad):
        if flag and start is None:
            start = i
        if start is not None and (not flag or i == len(has_bad) - 1):
            runs.append((start, i if flag else i - 1))
            start = None
    found = []
    for a, b in runs:
        lo_i = first[a]
        hi_i = first[b + 1] if b + 1 < len(first) else len(xs)
        idx = np.flatnonzero(bad[lo_i:hi_i]) + lo_i
        worst = int(idx[np.argmax(dist[idx])])
        found.append(Region(
            name, float(xs[idx[0]]), float(xs[idx[-1]]), int(idx.size), int(idx[-1] - idx[0] + 1),
            float(xs[worst]), tuple((n, float(v[worst])) for n, v in wide.items()), float(ref[int(order[worst])]),
            None if nonfinite[worst] else float(dist[worst]), int(np.count_nonzero(nonfinite[idx])), len(runs),
        ))
    found.sort(key=lambda g: (g.nonfinite > 0, g.exceeding, g.ulps or 0.0), reverse=True)
    return sorted(found[:k], key=lambda g: g.lo)
