"""How ``bb.parity.trace`` judges one layer: the measure (``parity.explain``), the budget, and, at the
first layer beyond it, what changed there.

Against the float64 run of the reference side (``against``): a layer passes when its error, normwise and
element by element (roundings of its dtype, as ``explain.against`` counts them), is within the larger of
``k * growth(depth)`` roundings and ``OWN`` times the reference side's own error there (the same model in
its working dtype: how far rounding has carried it from the exact answer by that layer), and it has no
more NaN/inf the reference lacks than the reference side has. Without a reference (``between``): the two
sides against each other, within ``2 k * growth(depth)`` roundings (``explain.pair``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bf16bridge.errors import UnsupportedDtypeError
from bf16bridge.parity import explain, metrics

#: a layer may be this many times as far from the exact answer as the reference side is there
OWN = 4.0


def growth(depth: int) -> float:
    """How the budget grows with depth: rounding errors of ``depth`` layers, independent, add up as a
    random walk does (sqrt)."""
    return math.sqrt(max(depth, 1))


_FLOATS = frozenset(("float16", "float32", "float64", "bfloat16"))


def floating(x: np.ndarray) -> bool:
    """Whether parity compares this array as floating (an integer or boolean one is not compared)."""
    name = x.dtype.name
    if name in _FLOATS:
        return True
    try:
        return not metrics.limits(metrics.kind_of(x))[3]
    except UnsupportedDtypeError:
        return False


@dataclass(frozen=True)
class Verdict:
    """One side's result at one layer, judged."""

    passed: bool
    error: float  # normwise, in roundings of ``unit``
    elementwise: float  # the worst element, in roundings of ``unit`` (its scale: |value| + the tensor's RMS)
    budget: float  # the roundings allowed here (normwise and element by element)
    own: float | None  # the reference side's own error here, in roundings of ``unit`` (None: no reference)
    unit: str  # the dtype whose unit roundoff counts
    sqnr_db: float  # 10 log10(||reference||^2 / ||error||^2), inf where identical
    cosine: float
    nonfinite: int  # NaN/inf where the reference (or the other side) has a number
    why: str


def sqnr_db(x: np.ndarray, ref: np.ndarray) -> float:
    """Signal to quantisation noise, in dB, over the elements finite on both sides."""
    x, ref = x.reshape(-1), ref.reshape(-1)
    ok = np.isfinite(x) & np.isfinite(ref)
    with np.errstate(over="ignore", invalid="ignore"):
        noise = float(np.sum((x[ok] - ref[ok]) ** 2))
        signal = float(np.sum(ref[ok] ** 2))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


@dataclass(frozen=True)
class Measured:
    """One result against its float64 reference, as ``explain.against`` measures it (roundings of ``unit``,
    each element's scale its magnitude plus the tensor's RMS)."""

    normwise: float
    elementwise: float
    worst: tuple | None
    nonfinite: int  # NaN/inf where the reference has a number, not explained
    cosine: float
    unit: str
    sqnr_db: float


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.einsum("i,i", a, b))  # (not BLAS: no thread pool woken for a reduction this small)


def measure(x: np.ndarray, ref64: np.ndarray, k: float) -> Measured:
    """``x`` against the float64 reference ``ref64`` (of its shape). Where both are finite everywhere this is
    ``explain.against``'s arithmetic, done in place in three buffers (a layer is measured on every run: cheap
    matters); otherwise ``explain.against`` itself, which also says which NaN/inf rounding explains."""
    kind = metrics.kind_of(x)
    x64 = metrics.to_float64(x).reshape(-1)  # a copy of our own: overwritten below
    r = ref64.reshape(-1)
    if not (np.isfinite(x64).all() and np.isfinite(r).all()) or metrics.limits(kind)[3]:
        e = explain.against(x, ref64, k=k)
        return Measured(e.normwise, e.elementwise, e.worst, e.nonfinite, e.cosine, e.unit,
                        sqnr_db(metrics.to_float64(x), ref64))
    return _finite(x64, r, kind, x.shape)


def _finite(x64: np.ndarray, r: np.ndarray, kind: str, shape: tuple) -> Measured:
    """``measure`` of two flat float64 arrays finite everywhere (``x64`` overwritten), in roundings of ``kind``."""
    u, tiny, _, _ = metrics.limits(kind)
    xr, xx, rr = _dot(x64, r), _dot(x64, x64), _dot(r, r)
    diff = np.subtract(x64, r)
    mag = np.abs(r)
    np.maximum(mag, np.abs(x64, out=x64), out=mag)
    np.abs(diff, out=diff)
    top = float(mag.max()) if mag.size else 0.0
    s = top if top > 0 else 1.0
    mag /= s
    diff /= s
    rms = math.sqrt(_dot(mag, mag) / mag.size) if mag.size else 0.0
    noise = _dot(diff, diff)
    np.multiply(mag, u, out=x64)
    x64 += tiny / s
    den = math.sqrt(_dot(x64, x64))
    x64 += u * rms
    np.divide(diff, x64, out=diff)  # each element's difference in roundings of its scale
    at = int(np.argmax(diff)) if diff.size else 0
    worst = tuple(int(i) for i in np.unravel_index(at, shape)) if diff.size else None
    cos = float(np.clip(xr / math.sqrt(xx * rr), -1, 1)) if xx > 0 and rr > 0 else float(xx == rr)
    num = math.sqrt(noise)
    sq = math.inf if noise == 0 else (10 * math.log10(rr / (noise * s * s)) if rr > 0 else -math.inf)
    return Measured(num / den if den > 0 else (0.0 if num == 0 else math.inf), float(diff[at]) if diff.size else 0.0,
                    worst, 0, cos, kind, sq)


def over_base(e: Measured, depth: int, k: float) -> bool:
    """Whether ``e`` is beyond what depth alone allows (``k * growth(depth)`` roundings, no NaN/inf): only
    then is the reference side's own error there asked for (it may still excuse it)."""
    base = k * growth(depth)
    return bool(e.nonfinite) or e.normwise > base or e.elementwise > base


def decide(e: Measured, own: Measured | None, depth: int, k: float) -> Verdict:
    """The verdict on a result measured against the float64 reference, the reference side's own error there
    ``own`` the yardstick (None: not measured, where depth alone allowed the result)."""
    u = metrics.limits(e.unit)[0]
    base = k * growth(depth)
    own_n = own_e = 0.0
    own_bad = 0
    if own is not None:
        ratio = metrics.limits(own.unit)[0] / u  # the reference side's roundings, in this side's
        own_n, own_e, own_bad = own.normwise * ratio, own.elementwise * ratio, own.nonfinite
    budget_n, budget_e = max(base, OWN * own_n), max(base, OWN * own_e)
    passed = e.nonfinite <= own_bad and e.normwise <= budget_n and e.elementwise <= budget_e
    verdict = Verdict(passed, e.normwise, e.elementwise, budget_n, own_n if own is not None else None, e.unit,
                      e.sqnr_db, e.cosine, e.nonfinite, "")
    return _with_why(verdict, budget_e, own is not None, e.worst, reference=True)


def against(x: np.ndarray, ref64: np.ndarray, own: Measured | None, depth: int, k: float) -> Verdict:
    """``x`` against the float64 reference, the reference side's own error there ``own`` the yardstick."""
    return decide(measure(x, ref64, k), own, depth, k)


def between(a: np.ndarray, b: np.ndarray, depth: int, k: float, floor: float = 0.0) -> Verdict:
    """The two sides against each other (no float64 reference): within 2k roundings, grown with depth
    (``explain.pair``'s measure; its arithmetic done at once where both are finite). ``floor``: a scale no
    element's is below (a gradient that cancels to rounding noise is judged against the scale of the
    model's gradients, not its own noise)."""
    g = growth(depth)
    a64, b64 = metrics.to_float64(a), metrics.to_float64(b)
    if floor <= 0 and np.isfinite(a64).all() and np.isfinite(b64).all() and not \
            (metrics.limits(metrics.kind_of(a))[3] or metrics.limits(metrics.kind_of(b))[3]):
        e = _finite(b64.reshape(-1), a64.reshape(-1), explain.coarser(metrics.kind_of(a), metrics.kind_of(b)),
                    tuple(np.shape(b)))
        budget = 2 * k * g
        verdict = Verdict(e.normwise <= budget and e.elementwise <= budget, e.normwise, e.elementwise, budget, None,
                          e.unit, e.sqnr_db, e.cosine, 0, "")
        return _with_why(verdict, budget, False, e.worst)
    condition = None
    if floor > 0:
        mag = np.where(np.isfinite(a64) & np.isfinite(b64), np.maximum(np.abs(a64), np.abs(b64)), 0.0)
        condition = mag + max(float(np.sqrt(np.mean(mag * mag))) if mag.size else 0.0, floor)
    p = explain.pair(a, b, k=k * g, condition=condition)
    verdict = Verdict(p.passed, p.normwise, p.elementwise, p.budget, None, p.unit, sqnr_db(b64, a64), p.cosine,
                      p.nonfinite, "")
    return _with_why(verdict, p.budget, False, p.worst)


def _with_why(v: Verdict, budget_e: float, with_own: bool, worst: tuple | None, reference: bool = False) -> Verdict:
    unit = "bf16" if v.unit == "bfloat16" else v.unit
    what = "against the float64 run" if reference else "against the other side"
    if v.nonfinite and not v.passed:
        why = f"{v.nonfinite} NaN/inf where {'the reference' if reference else 'the other side'} has a number"
    elif v.error > v.budget:
        why = f"normwise {v.error:.3g} roundings of {unit} {what}, beyond {v.budget:.3g}"
    elif v.elementwise > budget_e:
        why = (f"worst element {list(worst or ())}: {v.elementwise:.3g} roundings of {unit} {what}, "
               f"beyond {budget_e:.3g}")
    else:
        why = (f"normwise {v.error:.3g}, worst element {v.elementwise:.3g} roundings of {unit} {what}, "
               f"within {v.budget:.3g}")
    if with_own and v.own is not None:
        why += f" (the reference side's own: {v.own:.3g})"
    return Verdict(**{**v.__dict__, "why": why})


def mismatched(shape_x: tuple, shape_r: tuple) -> Verdict:
    """A layer whose two sides' shapes differ: nothing to measure, and no rounding explains it."""
    return Verdict(False, math.inf, math.inf, 0.0, None, "", -math.inf, math.nan, 0,
                   f"shapes differ: {shape_x} against {shape_r}")
