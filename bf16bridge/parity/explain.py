"""What rounding explains: the measure behind the default policy, ``rounding(k)``.

Two results of one computation (``pair``), or a result and its float64 reference
(``against``), differ by rounding when each element's difference is within a budget of
roundings of a scale that says how large that element's error can be, and the whole difference
is within the budget normwise. A rounding is u, the unit roundoff of the coarser dtype (2**-8 for
bf16), times the scale; the budget is k against a reference and 2k between two results (each k
from the exact answer). The scale of an element:

- with ``condition=`` (the computation's condition scale, |A|.|B| for a matmul): that scale, which
  grows with the accumulation length and with cancellation;
- ``elementwise=True`` (each element computed from its own input, as exp or gelu): its magnitude;
- otherwise: its magnitude plus the tensor's RMS magnitude, since an element made from many inputs
  (a dot product, a gradient) errs in proportion to them, not to itself: next to zero (where a sign
  may flip) it is judged against the tensor's scale, well away from zero against its own;

plus the dtype's smallest normal number, the most a subnormal result flushed to zero loses.
Normwise: the 2-norm of the differences over that of u times the magnitudes (the condition scale
where given), which an error spread over every element (a wrong constant) breaks first.

NaN and infinity: alike on both sides, they agree; an infinity where the other side's magnitude is
over half the dtype's largest value is an intermediate overflowing (x * (1 + erf) in GELU), which
rounding explains; against a reference, a result at a subnormal input that matches the reference
computed at that input flushed to zero (``flushed=``) is a framework flushing subnormal inputs, which
it explains too. Any other NaN or infinity on one side only is not explained.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import metrics
from bf16bridge.parity.policies import ROUNDING_K

#: the default budget: k roundings from the exact answer (2k between two results)
DEFAULT_K = ROUNDING_K


@dataclass(frozen=True)
class Explained:
    """How far one result is from another (or from the float64 reference), in roundings, and
    whether rounding explains it. ``why`` says which measure decided and why, in a line."""

    passed: bool
    #: "elementwise", "normwise" or "non-finite": what failed it, or what came closest to the budget
    decided_by: str
    why: str
    budget: float  # roundings allowed: k against a reference, 2k between two results
    unit: str  # the dtype whose unit roundoff counts (the coarser of the two)
    scale: str  # "condition", "magnitude" (elementwise) or "magnitude + RMS"
    elementwise: float  # the worst element's difference in roundings of its scale (inf: a NaN/inf unexplained)
    worst: tuple | None  # that element's index
    normwise: float  # ||difference|| / ||u * magnitude|| (or condition), in roundings
    cosine: float  # of the elements finite on both sides (reported, not judged)
    nonfinite: int  # NaN/inf on one side only that nothing explains
    overflowed: int  # infinities where the other side is over half the largest value: explained
    flushed_inputs: int  # results at subnormal inputs matching the reference at zero: explained
    underflowed: int  # elements within the budget only thanks to the smallest-normal floor


def _values(x) -> np.ndarray:
    """Any framework's tensor as numpy, bits kept (our error, naming its type, for what is none)."""
    return metrics.ensure_numpy(x)


def coarser(*kinds: str) -> str:
    """The coarser of the dtypes (fewer mantissa bits); an integer format wins (absolute steps)."""
    ints = [k for k in kinds if metrics.limits(k)[3]]
    return ints[0] if ints else min(kinds, key=metrics.mantissa_bits)


def _held(x64: np.ndarray, kind: str) -> np.ndarray:
    """``x64`` as ``kind`` holds it (rounded to nearest; beyond its range, infinite), in float64."""
    return metrics.to_float64(metrics.rounded(np.ascontiguousarray(x64), kind)).reshape(-1)


def _scaled_norm(v: np.ndarray) -> float:
    """The 2-norm, scaled by the largest |value| first (no overflow or underflow of the squares)."""
    s = float(np.max(np.abs(v))) if v.size else 0.0
    if s == 0 or not math.isfinite(s):
        return s
    w = v / s
    return s * float(np.sqrt(np.sum(w * w)))


@dataclass(frozen=True)
class Case:
    """What one comparison is judged by: the dtype whose unit roundoff counts, the budget in
    roundings, the kind of scale ("condition", "magnitude" or "magnitude + RMS"), and whether the
    second side is the float64 reference (then only the result's infinity can be an overflow)."""

    unit: str
    budget: float
    scale: str
    against_reference: bool


def multiples(a64: np.ndarray, b64: np.ndarray, case: Case, condition=None, flushed=None,
              subnormal=None, measures: bool = True) -> tuple[np.ndarray, dict]:
    """Per element (all flat, float64): ``a`` against ``b`` in roundings of its scale (0 where NaN/inf
    agree or are explained, inf where a NaN/inf is not), and (``measures``) the counts and norms
    ``verdict`` needs. ``flushed``, ``subnormal``: the reference at the inputs flushed to zero, and
    where they were subnormal."""
    u, tiny, largest, integer = metrics.limits(case.unit)
    ha, hb = _held(a64, case.unit), _held(b64, case.unit)
    both = np.isfinite(a64) & np.isfinite(b64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # in units of the largest magnitude, so that values near float64's range neither overflow nor underflow
        top = float(np.max(np.abs(np.where(both, np.maximum(np.abs(a64), np.abs(b64)), 0.0)), initial=0.0))
        s = top if top > 0 and not integer else 1.0
        sa, sb = np.where(both, a64 / s, 0.0), np.where(both, b64 / s, 0.0)
        mag = np.maximum(np.abs(sa), np.abs(sb))
        if integer:
            base = np.ones_like(mag)
        elif condition is not None:
            base = np.where(both, np.abs(condition) / s, 0.0)
        else:
            base = mag
        rms = _scaled_norm(mag[both]) / math.sqrt(max(int(both.sum()), 1))
        scale = base + (rms if case.scale == "magnitude + RMS" and not integer else 0.0)
        diff = np.abs(sa - sb)
        m = np.where(both, diff / (u * scale + tiny / s), 0.0)
        plain = np.where(both, diff / np.maximum(u * scale, 1e-300), 0.0)
        agree = (np.isnan(ha) & np.isnan(hb)) | (np.isinf(ha) & (ha == hb))
        over = ~both & ~agree & _overflow(ha, hb, a64, b64, largest, case.against_reference)
    m = np.where(~both & ~agree & ~over, np.inf, m)
    flushed_ok = np.zeros(m.shape, bool)
    if flushed is not None and subnormal is not None:
        fm, _ = multiples(a64, flushed, Case(case.unit, case.budget, "magnitude", True), measures=False)
        flushed_ok = subnormal & (m > case.budget) & (fm <= case.budget)
        m = np.where(flushed_ok, fm, m)
    if not measures:
        return m, {}
    num, den = _scaled_norm(diff[both]), _scaled_norm((u * base + tiny / s)[both])
    return m, dict(overflowed=int(over.sum()), flushed_inputs=int(flushed_ok.sum()),
                   underflowed=int(np.count_nonzero(both & (plain > case.budget) & (m <= case.budget))),
                   normwise=num / den if den > 0 else (0.0 if num == 0 else math.inf),
                   cosine=_cosine(a64[both], b64[both]))


def _overflow(ha, hb, a64, b64, largest: float, against_reference: bool) -> np.ndarray:
    """Where one side is an infinity and the other a value of that sign over half the largest
    finite one: an intermediate twice the result overflowing. Against a reference, only the
    result (``a``) may be the infinity."""
    near = lambda v: np.isfinite(v) & (np.abs(v) > largest / 2)  # noqa: E731
    a_inf = np.isinf(ha) & near(b64) & (np.sign(ha) == np.sign(b64))
    if against_reference:
        return a_inf
    return a_inf | (np.isinf(hb) & near(a64) & (np.sign(hb) == np.sign(a64)))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity, each vector scaled by its largest |value| (1 when both are zero)."""
    sa = float(np.max(np.abs(a))) if a.size else 0.0
    sb = float(np.max(np.abs(b))) if b.size else 0.0
    if sa == 0 or sb == 0:
        return float(sa == sb)
    ua, ub = a / sa, b / sb  # (np.sum of products: BLAS's dot is many times slower on tiny values)
    return float(np.clip(np.sum(ua * ub) / np.sqrt(np.sum(ua * ua) * np.sum(ub * ub)), -1.0, 1.0))


def verdict(m: np.ndarray, counts: dict, case: Case, shape: tuple) -> Explained:
    """The judgement of the per-element multiples ``m`` and ``counts`` (from ``multiples``)."""
    nonfinite = int(np.count_nonzero(np.isinf(m)))
    finite_m = np.where(np.isinf(m), -1.0, m)
    elementwise = float(m.max()) if m.size else 0.0
    worst = float(finite_m.max()) if m.size else 0.0
    normwise = float(counts["normwise"])
    if nonfinite:
        decided = "non-finite"
    elif elementwise >= normwise:  # the measure furthest beyond the budget, or closest to it
        decided = "elementwise"
    else:
        decided = "normwise"
    passed = not nonfinite and elementwise <= case.budget and normwise <= case.budget
    at = int(np.argmax(m)) if nonfinite else int(np.argmax(finite_m)) if m.size else 0
    idx = tuple(int(i) for i in np.unravel_index(at, shape)) if m.size else None
    e = Explained(passed, decided, "", case.budget, case.unit, case.scale, elementwise, idx, normwise,
                  counts["cosine"], nonfinite, counts["overflowed"], counts["flushed_inputs"], counts["underflowed"])
    return replace(e, why=_why(e, worst))


_SCALE_TEXT = {"condition": "u * condition", "magnitude": "u * |value|",
               "magnitude + RMS": "u * (|value| + the tensor's RMS)"}


def _why(e: Explained, worst: float) -> str:
    """Which measure decided, and why, in a line."""
    unit = "bf16" if e.unit == "bfloat16" else e.unit
    limit = f"{e.budget:g} roundings of {unit}"
    at = list(e.worst or ())
    norm = "u * condition" if e.scale == "condition" else "u * |value|"
    if e.decided_by == "non-finite":
        why = (f"{e.nonfinite} element(s) NaN or infinite where the other side is not (first at {at}): no "
               "rounding explains it")
    elif e.decided_by == "elementwise":
        why = (f"worst element {at}: {worst:.3g} roundings ({_SCALE_TEXT[e.scale]}), "
               f"{'within' if e.passed else 'beyond'} {limit}; normwise {e.normwise:.3g}")
    elif e.passed:
        why = (f"normwise {e.normwise:.3g} roundings (||difference|| / ||{norm}||), within {limit}; worst element "
               f"{worst:.3g}")
    else:
        why = (f"normwise {e.normwise:.3g} roundings (||difference|| / ||{norm}||), beyond {limit}: an error spread "
               f"over many elements (as a wrong constant makes), though the worst element is {worst:.3g}")
    extra = [s for s in (
        f"{e.overflowed} infinite where the other side is over half {unit}'s largest value (an intermediate "
        "overflows)" if e.overflowed else "",
        f"{e.flushed_inputs} at subnormal inputs match the reference at zero (inputs flushed)" if e.flushed_inputs
        else "",
        f"{e.underflowed} within {unit}'s smallest normal (underflow: subnormal, or flushed to zero)"
        if e.underflowed else "") if s]
    return why + ("; explained: " + "; ".join(extra) if extra else "")


def _scale_name(condition, elementwise: bool) -> str:
    return "condition" if condition is not None else ("magnitude" if elementwise else "magnitude + RMS")


def _budget(k: float) -> float:
    if isinstance(k, bool) or not isinstance(k, numbers.Real) or not math.isfinite(k) or k < 1:
        raise InvalidArgumentError(f"parity.explain: k is the roundings allowed from the exact answer, a finite number "
                                   f">= 1 (1: as close as correct rounding); got {k!r}")
    return float(k)


def _shape_check(what: str, x: np.ndarray, shape: tuple) -> None:
    if tuple(x.shape) != shape:
        raise InvalidArgumentError(f"parity.explain: {what} has shape {tuple(x.shape)}, the results {shape}; elements "
                                   "are paired by position: pass one of the results' shape")


def pair(a, b, *, k: float = DEFAULT_K, condition=None, elementwise: bool = False) -> Explained:
    """Two results of the same computation (any frameworks' tensors, of one shape) against each other:
    passed when every element is within 2k roundings of its scale and the difference within 2k normwise
    (see the module's docstring). ``condition``: the computation's condition scale per element (float64,
    of the results' shape), e.g. |A|.|B|; ``elementwise``: each element computed from its own input."""
    budget = 2 * _budget(k)
    xa, xb = _values(a), _values(b)
    _shape_check("the second result", xb, tuple(xa.shape))
    case = Case(coarser(metrics.kind_of(xa), metrics.kind_of(xb)), budget, _scale_name(condition, elementwise), False)
    cond = None
    if condition is not None:
        c = _values(condition)
        _shape_check("condition=", c, tuple(xa.shape))
        cond = metrics.to_float64(c).reshape(-1)
    m, counts = multiples(metrics.to_float64(xa).reshape(-1), metrics.to_float64(xb).reshape(-1), case, cond)
    return verdict(m, counts, case, tuple(xa.shape))


def against(result, reference, *, k: float = DEFAULT_K, condition=None, elementwise: bool = False,
            flushed=None, inputs=None) -> Explained:
    """One result against the float64 reference of its computation: passed when every element is within k
    roundings of its scale and the error within k normwise. ``flushed``: the reference computed from the
    inputs with their subnormal elements flushed to zero; with ``inputs`` (the elementwise op's input, of
    the result's shape) a result matching it at a subnormal input is explained (see the module)."""
    x = _values(result)
    shape = tuple(x.shape)
    ref = metrics.to_float64(_values(reference)).reshape(-1)
    if ref.size != x.size:
        raise InvalidArgumentError(f"parity.explain: the reference has {ref.size} elements, the result {shape}; "
                                   "pass the reference of each element of the result")
    case = Case(metrics.kind_of(x), _budget(k), _scale_name(condition, elementwise), True)
    cond = None if condition is None else metrics.to_float64(_values(condition)).reshape(-1)
    sub = fl = None
    if flushed is not None and inputs is not None:
        x_in = _values(inputs)
        sub = metrics.classify(x_in)["subnormal"].reshape(-1)
        fl = metrics.to_float64(_values(flushed)).reshape(-1)
    m, counts = multiples(metrics.to_float64(x).reshape(-1), ref, case, cond, fl, sub)
    return verdict(m, counts, case, shape)
