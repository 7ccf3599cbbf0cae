"""Each result against the float64 reference of its computation: what compare() reports of it (RMS and max
error, ULPs of the reference, errors in units of u * condition), the outlier, and under the rounding policy
whether rounding explains the result's error (explain.against). Also what compare() is given beside
the results (reference=, condition=, inputs=), checked and read once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import explain, metrics
from bf16bridge.parity.policies import Policy


@dataclass(frozen=True)
class Against:
    """One result's error against the float64 reference."""

    name: str
    rms_error: float
    max_abs_error: float
    p99_ulps_of_reference: float  # |c - ref| in ULPs of the result's dtype (ulp_unit) at ref, 99th percentile
    max_ulps_of_reference: float
    max_normalised: float | None  # |c - ref| / (u * condition), u the unit roundoff of ulp_unit (bf16: 2**-8)
    p99_normalised: float | None
    nonfinite_mismatches: int
    passed: bool | None = None
    #: the result's shape differs from the reference's: no element is measured (the errors are
    #: infinite) and the report fails
    shape_mismatch: str | None = None
    #: the dtype whose ULPs ``*_ulps_of_reference`` count (the result's own)
    ulp_unit: str = "bfloat16"
    #: the RMS error of the reference correctly rounded to the result's dtype: no result of that
    #: dtype can be closer, so reference(k) holds none to less than k times it
    rounding_rms: float = 0.0
    #: under the rounding policy: whether rounding explains this result's error, and which measure decided
    explained: explain.Explained | None = None


@dataclass(frozen=True)
class Given:
    """What compare() was given beside the results, read once (float64, flat): the reference (and, for
    an elementwise op whose reference is a function of ``inputs=``, the reference at the inputs with
    their subnormal elements flushed to zero, and where they were subnormal), the condition scale, and
    the inputs as given. ``shape``: the shape they share (None when none was given)."""

    shape: tuple | None = None
    reference: np.ndarray | None = None
    condition: np.ndarray | None = None
    inputs: np.ndarray | None = None
    flushed: np.ndarray | None = None
    subnormal: np.ndarray | None = None


def one_tensor(what: str, x) -> np.ndarray:
    """One result (or the reference) as a numpy array; a tree of tensors (a model's dict or tuple of
    outputs) is refused naming ``what`` and the way out, not as one tensor of no framework."""
    from bf16bridge.trees import walk as trees
    from bf16bridge.errors import UnsupportedTypeError

    try:
        return metrics.ensure_numpy(x)
    except UnsupportedTypeError as err:
        paths: list = []
        trees.map_leaves(lambda leaf, path: paths.append(trees.where(path)), x)
        if not paths:
            raise
        held = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
        raise UnsupportedTypeError(
            f"compare: {what} is a {type(x).__name__} of {len(paths)} tensor(s) ({held}), not one "
            "tensor; compare one output at a time, leaf by leaf (compare({'torch': y_torch['logits'], 'jax': "
            "y_jax['logits']})), or, to judge a whole tree of outputs against a reference's (a model against "
            "its bf16 cast, two frameworks' gradients), parity.compare_outputs(reference, candidate)") from err


def flush_subnormal(inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inputs in float64 with their subnormal elements flushed to zero (sign kept), and where
    they were: what a framework that flushes subnormal inputs (DAZ) computes from."""
    sub = metrics.classify(inputs)["subnormal"]
    x64 = metrics.to_float64(inputs)
    return np.where(sub, np.copysign(0.0, x64), x64), sub


def _called(fn, x64: np.ndarray, shape: tuple) -> np.ndarray:
    try:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # log(0) = -inf is an answer
            out = np.asarray(fn(x64), dtype=np.float64)
    except Exception as err:
        raise InvalidArgumentError(f"compare: reference={getattr(fn, '__name__', fn)!r} raised {type(err).__name__} "
                                   f"on the inputs ({err}); give a function of the float64 inputs returning the "
                                   "float64 results, or the reference's values") from err
    if out.shape != shape:
        raise InvalidArgumentError(f"compare: reference={getattr(fn, '__name__', fn)!r} gave shape {out.shape} for "
                                   f"inputs of shape {shape}; an elementwise op's reference keeps the shape")
    return out


def _shape_of(what: str, a: np.ndarray, labels, arrays, shape: tuple | None) -> tuple:
    """``a``'s shape, refused unless it is ``shape`` (the reference's, when given) or, where there is
    none, some result's."""
    got = tuple(a.shape)
    if shape is not None and got != shape:
        raise InvalidArgumentError(f"compare: {what} has shape {got}, the reference {shape}; pass the "
                                   f"{'condition scale' if what == 'condition=' else 'input'} of each element of "
                                   "the reference")
    if shape is None and arrays and not any(tuple(c.shape) == got for c in arrays):
        name = "the reference" if what == "reference=" else what
        raise InvalidArgumentError(
            f"compare: {name} has shape {got}, no result has it ("
            + ", ".join(f"{n} {tuple(c.shape)}" for n, c in zip(labels, arrays))
            + f"); pass {name} of the same computation, in the results' shape (elements are paired "
              f"by position, so a reshaped or transposed one would measure the wrong ones)")
    return got


def given(labels, arrays, reference, condition, inputs) -> Given:
    """Check and read what compare() was given beside the results. ``reference`` may be a function
    of the float64 inputs when ``inputs`` is given: it is called at them, and at them flushed."""
    shape = None
    ref = flushed = sub = x = None
    if inputs is not None:
        x = one_tensor("inputs=", inputs)
        metrics.kind_of(x)  # a floating input, or our error
    if reference is not None and callable(reference) and not hasattr(reference, "shape"):
        if x is None:
            raise InvalidArgumentError("compare: reference= is a function; give inputs= too (the elementwise op's "
                                       "input, in the results' shape), or pass the reference's values")
        shape = _shape_of("inputs=", x, labels, arrays, None)
        x_flushed, sub = flush_subnormal(x)
        ref = _called(reference, metrics.to_float64(x), shape).reshape(-1)
        flushed = _called(reference, x_flushed, shape).reshape(-1) if sub.any() else None
        sub = sub.reshape(-1)
    elif reference is not None:
        ref_a = one_tensor("reference=", reference)
        shape = _shape_of("reference=", ref_a, labels, arrays, None)
        ref = metrics.to_float64(ref_a).reshape(-1)
    cond = None
    if condition is not None:
        cond_a = one_tensor("condition=", condition)
        shape = _shape_of("condition=", cond_a, labels, arrays, shape)
        cond = metrics.to_float64(cond_a).reshape(-1)
    if x is not None:
        shape = _shape_of("inputs=", x, labels, arrays, shape)
    return Given(shape, ref, cond, x, flushed, sub)


def measure(labels, arrays, g: Given, pol: Policy) -> list:
    """Each result's error against the float64 reference (and its condition scale); under the
    rounding policy, whether rounding explains it."""
    return [_against(name, c, g, pol) for name, c in zip(labels, arrays)]


def _against(name: str, c: np.ndarray, g: Given, pol: Policy) -> Against:
    """One result's error against the float64 reference: infinite where the shapes differ."""
    kind, ref64, cond, shape = c.dtype.name, g.reference, g.condition, g.shape
    if tuple(c.shape) != shape:
        inf = float("inf")
        return Against(name, inf, inf, inf, inf, None if cond is None else inf, None if cond is None else inf, 0,
                       passed=False, ulp_unit=kind, shape_mismatch=f"shape {tuple(c.shape)}, the reference {shape}")
    assert ref64 is not None
    held = metrics.round_to(ref64, c.dtype)  # the reference as the result's dtype holds it: beyond its range, infinite
    x = metrics.to_float64(c).reshape(-1)
    xf, hf = np.isfinite(x), np.isfinite(held)
    nonfinite = int(np.count_nonzero((xf != hf) | (~xf & ~hf & ~(np.isnan(x) & np.isnan(held)) & (x != held))))
    ok = xf & hf & np.isfinite(ref64)
    err = np.abs(x[ok] - ref64[ok])
    ulps = err / metrics.ulp_of(ref64[ok], kind)
    norm = None
    if cond is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            c_ok = cond[ok]
            u = 2.0 ** -(metrics.mantissa_bits(kind) + 1)  # the result dtype's unit roundoff: bf16 2**-8
            norm = np.where(c_ok > 0, err / (u * c_ok), np.where(err > 0, np.inf, 0.0))
    explained = None
    if pol.kind == "rounding":
        explained = explain.against(c, ref64.reshape(c.shape), k=pol.n, condition=cond,
                                             elementwise=g.inputs is not None, flushed=g.flushed, inputs=g.inputs)
    q = lambda v, p: float(np.percentile(v, p)) if v.size else 0.0  # noqa: E731
    return Against(
        name, rms(err), float(err.max()) if err.size else 0.0,
        q(ulps, 99), float(ulps.max()) if ulps.size else 0.0,
        float(norm.max()) if norm is not None and norm.size else None,
        q(norm, 99) if norm is not None else None, nonfinite, ulp_unit=kind,
        rounding_rms=rms(np.abs(held[ok] - ref64[ok])), explained=explained,
    )


def rms(e: np.ndarray) -> float:
    """Root mean square of non-negative errors, scaled by the largest (no overflow of its square)."""
    if not e.size:
        return 0.0
    s = float(e.max())
    if s == 0 or not np.isfinite(s):
        return s
    return s * float(np.sqrt(np.mean((e / s) ** 2)))


#: a result whose RMS error against the reference is this many times the others' is named
OUTLIER_RATIO = 1.5


def outlier(refs):
    """The result that stands out against the reference, and why (None, and why none does)."""
    if len(refs) < 2:
        return None, None
    odd = [r for r in refs if r.shape_mismatch]
    if odd:
        return ", ".join(r.name for r in odd), "; ".join(f"{r.name}: {r.shape_mismatch}" for r in odd)
    bad = [r for r in refs if r.nonfinite_mismatches]
    if bad and len(bad) < len(refs):
        return ", ".join(r.name for r in bad), (
            "NaN or infinite where the float64 reference (as the result dtype holds it) is finite, or the reverse: "
            + ", ".join(f"{r.name} {r.nonfinite_mismatches}" for r in bad) + "; the others none")
    errs = sorted((r.rms_error, r.name) for r in refs)
    best, worst = errs[0][0], errs[-1]
    others = [e for e, n in errs if n != worst[1]]
    typical = float(np.median(others))
    if worst[0] > OUTLIER_RATIO * max(typical, 1e-300) and worst[0] > 0:
        return worst[1], (f"its RMS error against the float64 reference is {worst[0] / max(typical, 1e-300):.1f}x "
                          f"the others' ({worst[0]:.3g} against {typical:.3g})")
    return None, f"no result stands out: RMS errors against the reference within {worst[0] / max(best, 1e-300):.2f}x"
