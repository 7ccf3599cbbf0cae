"""compare() and assert_parity(): the report of how far results from several frameworks differ."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import against, explain, metrics, regions, render
from bf16bridge.parity.against import Against  # noqa: F401 - a report's references; parity exports it from here
from bf16bridge.parity.policies import DEFAULT_POLICY, Policy, parse, rounding_multiple


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
    #: under the rounding policy: whether rounding explains how the two differ, and which measure decided
    explained: explain.Explained | None = None

    @property
    def label(self) -> str:
        return f"{self.a} vs {self.b}"


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
                rmse=against.rms(diff_f), cosine=_cosine(va, vb), smallest_rtol=float(rel_b.max()) if rel_b.size else 0.0)


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


def _pair(na, nb, a, b, k_worst, pol: Policy, g: against.Given) -> Pair:
    """How two results differ, judged by ``pol`` (the rounding policy: by the condition scale, or
    element by element where ``g`` holds the inputs of an elementwise op)."""
    if a.shape != b.shape:
        return Pair(na, nb, tuple(a.shape), a.dtype.name, a.size, passed=False,
                    shape_mismatch=f"shapes differ: {tuple(a.shape)} against {tuple(b.shape)}")
    e = _elements(a, b)
    p = Pair(na, nb, tuple(e.a.shape), e.a.dtype.name, e.a.size, None, e.note, **_ulp_counts(e), **_value_errors(e),
             **_special_counts(e), worst=_worst(e, k_worst))
    p = replace(p, note=_notes(p, pol, a, b))
    if pol.kind == "rounding":
        fits = g.shape == tuple(a.shape)
        p = replace(p, explained=explain.pair(a, b, k=pol.n, condition=g.condition.reshape(a.shape)
                                                if fits and g.condition is not None else None,
                                                elementwise=fits and g.inputs is not None))
    return replace(p, passed=_judge(pol, p, a, b))


def _cosine(va: np.ndarray, vb: np.ndarray) -> float:
    """Cosine similarity, each vector scaled by its largest |value| first, so float64 results
    near 1e±154 and beyond neither overflow nor underflow (1 when both are zero, 0 when one is)."""
    sa = float(np.abs(va).max()) if va.size else 0.0
    sb = float(np.abs(vb).max()) if vb.size else 0.0
    if sa == 0 or sb == 0:
        return float(sa == sb)
    ua, ub = va / sa, vb / sb  # (np.sum of products: BLAS's dot is many times slower on tiny values)
    return float(np.clip(np.sum(ua * ub) / np.sqrt(np.sum(ua * ua) * np.sum(ub * ub)), -1.0, 1.0))


def _judge(pol: Policy, p: Pair, a: np.ndarray, b: np.ndarray) -> bool | None:
    """Whether one pair passes the policy (None: the policy judges against the reference).
    ``a``, ``b``: the results as given (allclose judges their values, not as rounded to one dtype)."""
    if pol.kind == "reference":
        return None
    if pol.kind == "rounding":
        return p.explained.passed if p.explained else None
    if pol.kind == "exact":
        return p.identical_fraction == 1.0
    if pol.kind == "allclose":  # b the expected side, as the frameworks take it
        return bool(np.all(metrics.policy_close(pol, a, b)))
    if p.nonfinite_mismatches or (pol.signed_zeros and p.signed_zero_mismatches) or (p.nan_both and not pol.equal_nan):
        return False
    return p.max_ulp <= pol.n  # ulp(n)


def _verdict(pol: Policy, pairs: list, refs: list) -> tuple[list, list, bool]:
    """The pairs and references judged, and whether the report passes."""
    if pol.kind == "reference":
        best = max(min((r.rms_error for r in refs), default=0.0), 1e-300)
        refs = [replace(r, passed=(r.rms_error <= pol.n * max(best, r.rounding_rms) and not r.nonfinite_mismatches
                                   and not r.shape_mismatch
                                   and (pol.cap is None or rounding_multiple(r) <= pol.cap))) for r in refs]
        return pairs, refs, all(r.passed for r in refs) and not any(p.shape_mismatch for p in pairs)
    if pol.kind == "rounding" and refs:  # each result against the reference decides; pairs are shown
        refs = [replace(r, passed=not r.shape_mismatch and r.explained is not None and r.explained.passed)
                for r in refs]
        pairs = [replace(p, passed=False if p.shape_mismatch else None) for p in pairs]
        return pairs, refs, all(r.passed for r in refs) and not any(p.shape_mismatch for p in pairs)
    return pairs, refs, all(p.passed for p in pairs) and not any(r.shape_mismatch for r in refs)


def _not_compared(labels: list, not_run: dict | None) -> str | None:
    """What was asked for but not compared: results that did not come, fewer than two results."""
    missing = []
    if not_run:
        missing.append("not run: " + "; ".join(f"{k} ({v})" for k, v in not_run.items()))
    if len(labels) < 2:
        missing.append(f"only {len(labels)} result{'' if len(labels) == 1 else 's'} ({', '.join(labels) or 'none'}):"
                       " no pair of results to judge")
    return "; ".join(missing) or None


def compare(*results, reference=None, condition=None, inputs=None, policy=DEFAULT_POLICY, names=None,
            k_worst: int = 5, op: str | None = None, settings: dict | None = None, not_run: dict | None = None,
            allow_missing: bool = False) -> Report:
    """Compare results of the same computation from several frameworks.

    ``compare(y_torch, y_jax)`` or ``compare({"torch": y1, "jax": y2, ...})``; any
    framework's tensors (bf16, float16, float32, float64, and the narrow dtypes: the fp8 family,
    fp6, fp4, int4/int2, whose ULPs are steps of their own format). ``reference``: a float64
    result of the same computation, against which each result's error is measured (with
    ``inputs``, also a function of the float64 inputs); ``condition``: the operation's condition
    scale per element (for a matmul, |A|.|B|), so that cancellation near zero does not look like a
    huge error; ``inputs``: for an elementwise op, its input (the results' shape): each element is
    judged on its own, and ``report.worst_regions`` says in which input intervals the errors live.
    ``policy`` decides ``passed``: the default, "rounding(k)" (what rounding explains, see
    explain.py), "exact", "ulp(n)", "allclose(rtol, atol)", "torch"/"jax"/"tensorflow" (their test
    helpers' allclose, tolerances per dtype) or "reference(k)".

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
    _check_policy(pol, reference, condition)
    arrays = [against.one_tensor(f"result {i + 1} ({n!r})", v) for i, (n, v) in enumerate(zip(labels, values))]
    g = against.given(labels, arrays, reference, condition, inputs)
    pairs = [_pair(labels[i], labels[j], arrays[i], arrays[j], k_worst, pol, g)
             for i, j in itertools.combinations(range(len(arrays)), 2)]
    refs = against.measure(labels, arrays, g, pol) if g.reference is not None else []
    outlier, why = against.outlier(refs) if refs else (None, None)
    pairs, refs, passed = _verdict(pol, pairs, refs)
    not_compared = _not_compared(labels, not_run)
    if not_compared and not allow_missing:
        passed = False
    found = _regions(labels, arrays, g, pol) if g.inputs is not None else ()
    return Report(str(pol), tuple(pairs), tuple(refs), outlier, why, _smallest(pairs, refs), bool(passed), op,
                  settings or {}, not_compared, worst_regions=found)


def _check_policy(pol: Policy, reference, condition) -> None:
    """Refuse what the policy cannot use: reference(k) without a reference; a condition scale
    with neither a reference nor the rounding policy (nothing would read it)."""
    if reference is None and pol.kind == "reference":
        raise InvalidArgumentError("policy reference(k) needs reference=: the float64 result of the same "
                                   "computation (or judge the results against each other: rounding(k), ulp(n), "
                                   "allclose)")
    if reference is None and condition is not None and pol.kind != "rounding":
        raise InvalidArgumentError(f"compare: condition= scales errors against reference= or under the rounding "
                                   f"policy; {pol} reads neither: give reference= too, or policy='rounding(k)'")


def _regions(labels, arrays, g: against.Given, pol: Policy) -> tuple:
    """Where an elementwise op's errors live: each result's against the reference, or each pair's."""
    results = dict(zip(labels, arrays))
    assert g.inputs is not None
    if g.reference is not None:
        return regions.find(g.inputs, results, g.reference, pol, condition=g.condition, flushed=g.flushed)
    return regions.find_pairs(g.inputs, results, pol, condition=g.condition)


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
    judged = [r.explained for r in refs] if refs else [p.explained for p in pairs]
    if judged and all(e is not None for e in judged):  # the rounding policy: the smallest k that passes
        k = max(max(e.elementwise, e.normwise) / (1 if refs else 2) for e in judged)
        out["rounding_k"] = None if not np.isfinite(k) or any(p.shape_mismatch for p in pairs) else max(1.0, k)
    return out


def assert_parity(*results, ulp: int | None = None, policy=None, **kwargs) -> Report:
    """compare(...) and raise AssertionError, with the report, unless it passed.

    ``ulp=n`` is short for ``policy=f"ulp({n})"``.
    """
    if ulp is not None and policy is not None:
        raise InvalidArgumentError("assert_parity: pass ulp= or policy=, not both")
    pol = f"ulp({ulp})" if ulp is not None else (DEFAULT_POLICY if policy is None else policy)
    rep = compare(*results, policy=pol, **kwargs)
    if not rep.passed:
        raise AssertionError(f"results differ beyond {rep.policy}:\n{rep}")
    return rep
