"""compare() and assert_parity(): the report of how far results from several frameworks differ."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import metrics, render
from bf16bridge.parity.policies import Policy, parse, rounding_multiple


@dataclass(frozen=True)
class Element:
    """One element where two results differ most."""

    index: tuple
    a: float
    b: float
    a_bits: str
    b_bits: str
    ulp: int | None  # None where one side is NaN or infinite
    abs_error: float


@dataclass(frozen=True)
class Pair:
    """How two results differ."""

    a: str
    b: str
    shape: tuple
    dtype: str
    size: int
    shape_mismatch: str | None = None
    note: str | None = None
    identical_fraction: float = 0.0
    finite_compared: int = 0
    ulp_histogram: dict = field(default_factory=dict)
    ulp_p50: float = 0.0
    ulp_p99: float = 0.0
    ulp_p999: float = 0.0
    max_ulp: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    rmse: float = 0.0
    cosine: float = 1.0
    nonfinite_mismatches: int = 0  # elements NaN or infinite on one side only (or infinities of opposite sign)
    nan_mismatches: int = 0  # of those, NaN on one side only
    inf_mismatches: int = 0  # of those, infinite on one side only or with opposite signs
    nan_both: int = 0  # elements NaN on both sides (agreeing, except under allclose's equal_nan=False: torch)
    signed_zero_mismatches: int = 0
    subnormal_mismatches: int = 0
    worst: tuple = ()
    smallest_rtol: float = 0.0  # allclose(rtol, 0) that would pass
    passed: bool | None = None

    @property
    def label(self) -> str:
        return f"{self.a} vs {self.b}"


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


@dataclass(frozen=True)
class Report:
    policy: str
    pairs: tuple
    references: tuple = ()
    outlier: str | None = None
    outlier_why: str | None = None
    smallest: dict = field(default_factory=dict)  # the smallest tolerance of each kind that passes
    passed: bool = False
    op: str | None = None
    settings: dict = field(default_factory=dict)
    #: what was asked for but not compared (a framework that did not run, fewer than two
    #: results); the report fails on it unless compare(..., allow_missing=True)
    not_compared: str | None = None
    #: for ops run over every input value: the input intervals where a result's error
    #: against the reference exceeds the policy (see regions.py)
    worst_regions: tuple = ()
    #: the results judged (packed), so a saved report can be judged again; not shown
    data: dict | None = field(default=None, repr=False, compare=False)

    @property
    def max_ulp(self) -> int:
        return max((p.max_ulp for p in self.pairs), default=0)

    @property
    def identical_fraction(self) -> float:
        return min((p.identical_fraction for p in self.pairs), default=1.0)

    @property
    def nonfinite_mismatches(self) -> int:
        return sum(p.nonfinite_mismatches for p in self.pairs)

    @property
    def worst(self) -> tuple:
        """The worst elements of the pair that differs most."""
        if not self.pairs:
            return ()
        return max(self.pairs, key=lambda p: (p.shape_mismatch is not None, p.nonfinite_mismatches, p.max_ulp)).worst

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("data")
        d.update(max_ulp=self.max_ulp, identical_fraction=self.identical_fraction,
                 nonfinite_mismatches=self.nonfinite_mismatches)
        return d

    def __str__(self) -> str:
        return render.text(self)


def _names(results, names):
    from bf16bridge.core.registry import framework_of

    if len(results) == 1 and isinstance(results[0], dict):
        if names is not None:
            raise InvalidArgumentError("compare: {name: result} names its results; leave names= out")
        return list(results[0].keys()), list(results[0].values())
    if names is not None:
        names = list(names)
        if len(names) != len(results) or len(set(names)) != len(names):
            raise InvalidArgumentError(f"compare: names= gives {len(names)} name(s) ({', '.join(map(str, names))}) for "
                                       f"{len(results)} results; give one distinct name per result, or pass "
                                       "{name: result} as the only argument")
        return names, list(results)
    out: list = []
    for r in results:
        try:
            n = framework_of(r)
        except Exception:  # noqa: BLE001 - a name is only a label
            n = type(r).__name__
        out.append(n if n not in out else f"{n}#{out.count(n) + 1}")
    return out, list(results)


def _one_tensor(what: str, x) -> np.ndarray:
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
            "its bf16 cast), parity.compare_outputs(reference, candidate)") from err


@dataclass(frozen=True)
class _Elements:
    """Two results of one shape, flattened element by element: what a Pair counts."""

    a: np.ndarray  # both in the dtype they are compared in (the coarser's)
    b: np.ndarray
    note: str | None
    ca: dict  # metrics.classify of each
    cb: dict
    ba: np.ndarray  # their bits
    bb: np.ndarray
    lost: np.ndarray  # not held in the compared dtype
    same: np.ndarray  # bit-identical, and nothing lost by rounding to the compared dtype
    both: np.ndarray  # finite on both sides, and held
    both_nan: np.ndarray  # NaN on both sides (payloads may differ: not a mismatch)
    d: np.ndarray  # ULP distance in the compared dtype
    xa: np.ndarray  # the values as given, in float64
    xb: np.ndarray
    diff: np.ndarray  # |xa - xb|


def _elements(a0: np.ndarray, b0: np.ndarray) -> _Elements:
    a, b, note, lost = metrics.same_dtype(a0, b0)
    ca, cb = metrics.classify(a), metrics.classify(b)
    ba, bb_ = metrics.bits(a).reshape(-1), metrics.bits(b).reshape(-1)
    lost = np.zeros(a.size, bool) if lost is None else lost.reshape(-1)
    same = ba == bb_
    for orig, now in ((a0, a), (b0, b)):
        if orig.dtype != now.dtype and (metrics.kind_of(now) in metrics.KERNEL_KINDS
                                        or now.dtype.itemsize < orig.dtype.itemsize):
            # a side rounded to the other's coarser dtype is identical only where the
            # rounding lost nothing: 1.0001 in float32 is not the bf16 1.0 it rounds to
            same &= metrics.held_exactly(orig, now).reshape(-1)
    both = ca["finite"].reshape(-1) & cb["finite"].reshape(-1) & ~lost
    # errors in value are of the results as given, not as rounded to the compared dtype:
    # only ULP distances are counted there
    xa, xb = metrics.to_float64(a0).reshape(-1), metrics.to_float64(b0).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: those elements are counted apart
        diff = np.abs(xa - xb)
    return _Elements(a, b, note, ca, cb, ba, bb_, lost, same, both, ca["nan"].reshape(-1) & cb["nan"].reshape(-1),
                     metrics.ulp_distance(a, b).reshape(-1), xa, xb, diff)


def _ulp_counts(e: _Elements) -> dict:
    """Identical elements, and the ULP distances of those finite on both sides."""
    df = e.d[e.both]
    pct = np.percentile(df, [50, 99, 99.9]) if df.size else np.zeros(3)
    n = e.a.size
    return dict(identical_fraction=int(np.count_nonzero(e.same)) / n if n else 1.0,
                finite_compared=int(e.both.sum()), ulp_histogram=metrics.histogram(df),
                ulp_p50=float(pct[0]), ulp_p99=float(pct[1]), ulp_p999=float(pct[2]),
                max_ulp=int(df.max()) if df.size else 0)


def _value_errors(e: _Elements) -> dict:
    """max_abs, max_rel, rmse, cosine and the smallest passing rtol, over elements finite on both sides."""
    diff_f, va, vb = e.diff[e.both], e.xa[e.both], e.xb[e.both]
    denom = np.maximum(np.abs(va), np.abs(vb))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(denom > 0, diff_f / denom, 0.0)
        rel_b = np.where(np.abs(vb) > 0, diff_f / np.abs(vb), np.where(diff_f > 0, np.inf, 0.0))
    return dict(max_abs=float(diff_f.max()) if diff_f.size else 0.0, max_rel=float(rel.max()) if rel.size else 0.0,
                rmse=_rms(diff_f), cosine=_cosine(va, vb), smallest_rtol=float(rel_b.max()) if rel_b.size else 0.0)


def _special_counts(e: _Elements) -> dict:
    """NaN, infinity, signed-zero and subnormal disagreements, counted apart from the finite ones."""
    ca, cb = e.ca, e.cb
    lost_nan = e.lost & (np.isnan(e.xa) | np.isnan(e.xb))  # a float NaN against an integer
    nan_differ = (ca["nan"] != cb["nan"]).reshape(-1) | lost_nan
    inf_a, inf_b = ca["inf"].reshape(-1), cb["inf"].reshape(-1)
    inf_differ = (inf_a != inf_b) | (inf_a & inf_b & (e.ba != e.bb)) | (e.lost & ~lost_nan)  # or beyond its range
    return dict(
        # an element inf on one side and NaN on the other is in both columns, counted once here
        nonfinite_mismatches=int(np.count_nonzero(nan_differ | inf_differ)),
        nan_mismatches=int(np.count_nonzero(nan_differ)),
        inf_mismatches=int(np.count_nonzero(inf_differ)),
        nan_both=int(np.count_nonzero(e.both_nan)),
        signed_zero_mismatches=int(np.count_nonzero(ca["zero"] & cb["zero"] & (ca["negzero"] != cb["negzero"]))),
        subnormal_mismatches=int(np.count_nonzero(ca["subnormal"] != cb["subnormal"])))


def _worst(e: _Elements, k_worst: int) -> tuple:
    """The ``k_worst`` elements that differ most: non-finite disagreements first, then the largest ULP distances."""
    nonfinite = (~e.both & ~e.both_nan & (e.ba != e.bb)) | e.lost
    score = np.where(e.both, e.d.astype(np.float64), -1.0)
    score = np.where(nonfinite, np.inf, score)
    order = np.argsort(-score, kind="stable")[:k_worst]
    return tuple(
        Element(tuple(int(i) for i in np.unravel_index(int(j), e.a.shape)), float(e.xa[j]), float(e.xb[j]),
                metrics.hexbits(e.a, j), metrics.hexbits(e.b, j), int(e.d[j]) if e.both[j] else None, float(e.diff[j]))
        for j in order if not e.same[j]
    )


def _notes(p: Pair, pol: Policy, a: np.ndarray, b: np.ndarray) -> str | None:
    """The pair's note, with what the policy adds: a framework's tolerances for these two dtypes,
    and why close values failed where NaN is on both sides."""
    notes = [p.note]
    if pol.by_dtype:
        kinds = a.dtype.name if a.dtype == b.dtype else f"{a.dtype.name} against {b.dtype.name}"
        rtol, atol = pol.tolerances(a.dtype.name, b.dtype.name)
        notes.append(f"{pol.name}'s tolerances for {kinds}: rtol={rtol:g}, atol={atol:g}")
    if p.nan_both and not pol.equal_nan:
        notes.append(f"{p.nan_both} element(s) NaN on both sides: {pol.name or 'this policy'} (equal_nan=false) "
                     "counts a NaN close to nothing")
    return "; ".join(filter(None, notes)) or p.note


def _pair(na, nb, a, b, k_worst, pol: Policy) -> Pair:
    """How two results differ, judged by ``pol``."""
    if a.shape != b.shape:
        return Pair(na, nb, tuple(a.shape), a.dtype.name, a.size, passed=False,
                    shape_mismatch=f"shapes differ: {tuple(a.shape)} against {tuple(b.shape)}")
    e = _elements(a, b)
    p = Pair(na, nb, tuple(e.a.shape), e.a.dtype.name, e.a.size, None, e.note, **_ulp_counts(e), **_value_errors(e),
             **_special_counts(e), worst=_worst(e, k_worst))
    p = replace(p, note=_notes(p, pol, a, b))
    return replace(p, passed=_judge(pol, p, a, b))


def _cosine(va: np.ndarray, vb: np.ndarray) -> float:
    """Cosine similarity, each vector scaled by its largest |value| first, so float64 results
    near 1e±154 and beyond neither overflow nor underflow (1 when both are zero, 0 when one is)."""
    sa = float(np.abs(va).max()) if va.size else 0.0
    sb = float(np.abs(vb).max()) if vb.size else 0.0
    if sa == 0 or sb == 0:
        return float(sa == sb)
    ua, ub = va / sa, vb / sb
    return float(np.clip(ua @ ub / np.sqrt((ua @ ua) * (ub @ ub)), -1.0, 1.0))


def _rms(e: np.ndarray) -> float:
    """Root mean square of non-negative errors, scaled by the largest (no overflow of its square)."""
    if not e.size:
        return 0.0
    s = float(e.max())
    if s == 0 or not np.isfinite(s):
        return s
    return s * float(np.sqrt(np.mean((e / s) ** 2)))


def _against_reference(labels, arrays, reference, condition) -> list:
    """Each result's error against the float64 ``reference`` (and its ``condition`` scale)."""
    ref_a = _one_tensor("reference=", reference)
    shape = tuple(ref_a.shape)
    if arrays and not any(tuple(c.shape) == shape for c in arrays):
        raise InvalidArgumentError(
            f"compare: the reference has shape {shape}, no result has it ("
            + ", ".join(f"{n} {tuple(c.shape)}" for n, c in zip(labels, arrays))
            + "); pass the reference of the same computation, in the results' shape (elements are paired "
              "by position, so a reshaped or transposed reference would measure the wrong ones)")
    ref = metrics.to_float64(ref_a).reshape(-1)
    cond = None
    if condition is not None:
        cond_a = _one_tensor("condition=", condition)
        if tuple(cond_a.shape) != shape:
            raise InvalidArgumentError(f"compare: condition= has shape {tuple(cond_a.shape)}, the reference "
                                       f"{shape}; pass the condition scale of each element of the reference")
        cond = metrics.to_float64(cond_a).reshape(-1)
    return [_against(name, c, ref, cond, shape) for name, c in zip(labels, arrays)]


def _against(name: str, c: np.ndarray, ref64: np.ndarray, cond, shape: tuple) -> Against:
    """One result's error against the float64 reference: infinite where the shapes differ."""
    kind = c.dtype.name
    if tuple(c.shape) != shape:
        inf = float("inf")
        return Against(name, inf, inf, inf, inf, None if cond is None else inf, None if cond is None else inf, 0,
                       passed=False, ulp_unit=kind, shape_mismatch=f"shape {tuple(c.shape)}, the reference {shape}")
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
    q = lambda v, p: float(np.percentile(v, p)) if v.size else 0.0  # noqa: E731
    return Against(
        name, _rms(err), float(err.max()) if err.size else 0.0,
        q(ulps, 99), float(ulps.max()) if ulps.size else 0.0,
        float(norm.max()) if norm is not None and norm.size else None,
        q(norm, 99) if norm is not None else None, nonfinite, ulp_unit=kind,
        rounding_rms=_rms(np.abs(held[ok] - ref64[ok])),
    )


def _judge(pol: Policy, p: Pair, a: np.ndarray, b: np.ndarray) -> bool | None:
    """Whether one pair passes the policy (None: the policy judges against the reference).
    ``a``, ``b``: the results as given (allclose judges their values, not as rounded to one dtype)."""
    if pol.kind == "reference":
        return None
    if pol.kind == "exact":
        return p.identical_fraction == 1.0
    if pol.kind == "allclose":  # b the expected side, as the frameworks take it
        return bool(np.all(metrics.policy_close(pol, a, b)))
    if p.nonfinite_mismatches or (pol.signed_zeros and p.signed_zero_mismatches) or (p.nan_both and not pol.equal_nan):
        return False
    return p.max_ulp <= pol.n  # ulp(n)


def _verdict(pol: Policy, pairs: list, refs: list) -> tuple[list, bool]:
    """The references judged (under reference(k)), and whether the report passes."""
    if pol.kind == "reference":
        best = max(min((r.rms_error for r in refs), default=0.0), 1e-300)
        refs = [replace(r, passed=(r.rms_error <= pol.n * max(best, r.rounding_rms) and not r.nonfinite_mismatches
                                   and not r.shape_mismatch
                                   and (pol.cap is None or rounding_multiple(r) <= pol.cap))) for r in refs]
        return refs, all(r.passed for r in refs) and not any(p.shape_mismatch for p in pairs)
    return refs, all(p.passed for p in pairs) and not any(r.shape_mismatch for r in refs)


def _not_compared(labels: list, not_run: dict | None) -> str | None:
    """What was asked for but not compared: results that did not come, fewer than two results."""
    missing = []
    if not_run:
        missing.append("not run: " + "; ".join(f"{k} ({v})" for k, v in not_run.items()))
    if len(labels) < 2:
        missing.append(f"only {len(labels)} result{'' if len(labels) == 1 else 's'} ({', '.join(labels) or 'none'}):"
                       " no pair of results to judge")
    return "; ".join(missing) or None


def compare(*results, reference=None, condition=None, policy="ulp(1)", names=None, k_worst: int = 5,
            op: str | None = None, settings: dict | None = None, not_run: dict | None = None,
            allow_missing: bool = False) -> Report:
    """Compare results of the same computation from several frameworks.

    ``compare(y_torch, y_jax)`` or ``compare({"torch": y1, "jax": y2, ...})``; any
    framework's tensors (bf16, float16, float32, float64, and the narrow dtypes: the fp8 family,
    fp6, fp4, int4/int2, whose ULPs are steps of their own format). ``reference``: a float64
    result of the same computation, against which each result's error is measured;
    ``condition``: the operation's condition scale per element (for a matmul,
    |A|.|B|), so that cancellation near zero does not look like a huge error.
    ``policy`` decides ``passed``: "exact", "ulp(n)", "allclose(rtol, atol)",
    "torch"/"jax"/"tensorflow" (their test helpers' allclose, tolerances per dtype) or "reference(k)".

    A report with nothing compared never passes silently: fewer than two results
    (one and a reference judges no pair, and reference(k) has nothing to rank), or
    ``not_run`` ({name: why} of results asked for that did not come), fail the
    report unless ``allow_missing=True``.
    """
    pol = parse(policy)
    if isinstance(k_worst, bool) or not isinstance(k_worst, int) or k_worst < 0:
        raise InvalidArgumentError(f"compare: k_worst is how many worst elements to keep, a whole number >= 0; "
                                   f"got {k_worst!r}")
    labels, values = _names(results, names)
    if len(values) < 2 and reference is None or not values and not not_run:  # not_run: the report says why
        raise InvalidArgumentError(f"compare needs two results or more, or one and a reference; got {len(values)} "
                                   "result(s)" + (" and a reference" if reference is not None else ""))
    arrays = [_one_tensor(f"result {i + 1} ({n!r})", v) for i, (n, v) in enumerate(zip(labels, values))]
    pairs = [_pair(labels[i], labels[j], arrays[i], arrays[j], k_worst, pol)
             for i, j in itertools.combinations(range(len(arrays)), 2)]
    refs: list = []
    outlier, why = None, None
    if reference is not None:
        refs = _against_reference(labels, arrays, reference, condition)
        outlier, why = _outlier(refs)
    elif pol.kind == "reference":
        raise InvalidArgumentError("policy reference(k) needs reference=: the float64 result of the same "
                                   "computation (or judge the results against each other: ulp(n), allclose)")
    refs, passed = _verdict(pol, pairs, refs)
    not_compared = _not_compared(labels, not_run)
    if not_compared and not allow_missing:
        passed = False
    return Report(str(pol), tuple(pairs), tuple(refs), outlier, why, _smallest(pairs, refs), bool(passed), op,
                  settings or {}, not_compared)


#: a result whose RMS error against the reference is this many times the others' is named
OUTLIER_RATIO = 1.5


def _outlier(refs):
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


def _smallest(pairs, refs) -> dict:
    ok = [p for p in pairs if not p.shape_mismatch]
    out = {}
    # results of different shapes pass no tolerance
    if ok and len(ok) == len(pairs) and not any(p.nonfinite_mismatches for p in ok):
        out["ulp"] = max(p.max_ulp for p in ok)
        out["allclose_rtol_at_atol_0"] = max(p.smallest_rtol for p in ok)
        out["allclose_atol_at_rtol_0"] = max(p.max_abs for p in ok)
    else:
        out["ulp"] = out["allclose_rtol_at_atol_0"] = out["allclose_atol_at_rtol_0"] = None
    if refs:
        best = max(min(r.rms_error for r in refs), 1e-300)
        odd = any(r.shape_mismatch for r in refs)
        out["reference_k"] = None if odd else max(1.0, max(r.rms_error / max(best, r.rounding_rms) for r in refs))
        out["reference_cap"] = None if odd else max(1.0, max(rounding_multiple(r) for r in refs))
    return out


def assert_parity(*results, ulp: int | None = None, policy=None, **kwargs) -> Report:
    """compare(...) and raise AssertionError, with the report, unless it passed.

    ``ulp=n`` is short for ``policy=f"ulp({n})"``.
    """
    if ulp is not None and policy is not None:
        raise InvalidArgumentError("assert_parity: pass ulp= or policy=, not both")
    pol = f"ulp({ulp})" if ulp is not None else ("ulp(1)" if policy is None else policy)
    rep = compare(*results, policy=pol, **kwargs)
    if not rep.passed:
        raise AssertionError(f"results differ beyond {rep.policy}:\n{rep}")
    return rep
