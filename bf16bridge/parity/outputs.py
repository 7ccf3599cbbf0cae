"""Check a cast: how far a model's outputs moved from the float32 model's, on the same inputs.

    ref = copy.deepcopy(model)
    model, rep = bb.cast_module(model, "bfloat16")
    print(bb.parity.check_cast(ref, model, x, logits=-1))
    bb.parity.assert_outputs_close(y_f32, y_bf16, logits=-1, cosine_min=0.999, top1_min=0.99)

``compare_outputs`` pairs the leaves of two output trees by path (any framework's tensors),
widens each exactly to float64 on the host and measures the candidate against the reference
(the float32 output): max absolute and relative error, the normwise relative error, the cosine
similarity, the NaN/inf that appeared or went, and for logits the KL divergence
KL(softmax(reference) || softmax(candidate)) and the top-1 agreement. Where ``compare`` judges
two frameworks' results in ULPs, this judges a model against its float32 self: the errors of
a cast model are many ULPs by design, so the measures are the ones people deploy by.
docs/casting.md ("Check the cast") and docs/parity.md say how to read them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from bf16bridge.adapters.hooks import CastHooks, NumericsHooks
from bf16bridge.core import registry
from bf16bridge.trees import walk as trees
from bf16bridge.errors import Bf16BridgeError, InvalidArgumentError, UnsupportedDtypeError
from bf16bridge.parity import explain, metrics
from bf16bridge.parity.policies import DEFAULT_POLICY, parse

#: the floor under |reference| in the element-wise relative error: float32's (and bf16's)
#: smallest normal number, so an exact zero in the reference does not divide by zero
TINY = 2.0 ** -126

#: the dtypes whose values are compared (integer and boolean outputs are refused: compare those for equality)
_FLOATING_KINDS = "f"

#: the thresholds ``passed``/``assert_outputs_close`` accept: name -> (report attribute, bound kind)
THRESHOLDS = {
    "max_abs": ("max_abs", "max"),
    "max_rel": ("max_rel", "max"),
    "rel_norm": ("rel_norm", "max"),
    "cosine_min": ("cosine", "min"),
    "kl_mean_max": ("kl_mean", "max"),
    "kl_max": ("kl_max", "max"),
    "top1_min": ("top1", "min"),
}


class OutputMismatchError(Bf16BridgeError, ValueError):
    """Two output trees that cannot be compared leaf by leaf (a leaf missing, extra, of another
    shape, not floating), or a logits axis a leaf does not have; names the leaf's path."""


class OutputsDifferError(Bf16BridgeError, AssertionError):
    """``assert_outputs_close``: the candidate's outputs are further from the reference's than
    the thresholds allow (the message holds the report)."""


@dataclass(frozen=True, kw_only=True)
class _Measures:
    """What a leaf and the whole report both measure (see LeafOutput and OutputReport)."""

    max_abs: float
    max_rel: float
    rel_norm: float
    cosine: float
    new_nonfinite: int
    nonfinite_mismatches: int
    rows: int = 0
    kl_mean: float | None = None
    kl_max: float | None = None
    top1: float | None = None


@dataclass(frozen=True, kw_only=True)
class LeafOutput(_Measures):
    """How one output leaf of the candidate differs from the reference's.

    ``max_rel``: max over elements of |c - r| / max(|r|, TINY); ``rel_norm``: ||c - r|| / ||r||
    (2-norms over the elements finite on both sides); ``cosine``: of the two flattened leaves
    over those elements. ``new_nonfinite``: NaN or infinite in the candidate where the reference
    holds another value (a finite one, or +inf where the candidate has -inf or NaN);
    ``nonfinite_mismatches``: every element where the two differ in being NaN or
    infinite, or in the infinity's sign (``new_nonfinite`` included). With logits (``axis`` not
    None): ``rows`` compared along the class axis (rows holding NaN or +inf on either side, or
    no finite logit, are left out and counted in ``rows_skipped``), ``kl_mean``/``kl_max``: KL
    divergence in nats; ``top1``: the fraction of rows where the candidate's argmax (the first
    maximal class) is one of the reference's maximal classes; ``reference_ties``/
    ``candidate_ties``: rows whose maximum is held by two classes or more."""

    path: str
    shape: tuple
    reference_dtype: str
    candidate_dtype: str
    size: int
    finite_compared: int
    axis: int | None = None
    rows_skipped: int = 0
    top1_disagree: int = 0
    reference_ties: int = 0
    candidate_ties: int = 0
    #: whether the leaf passes the report's policy, and under rounding(k) which measure decided and why
    passed: bool = True
    explained: explain.Explained | None = None


@dataclass(frozen=True, kw_only=True)
class OutputReport(_Measures):
    """The candidate's outputs against the reference's, leaf by leaf and overall.

    Overall: ``max_abs``, ``max_rel``: the largest over leaves; ``rel_norm`` and ``cosine``:
    over all leaves' elements together; ``kl_mean``: over all rows of all logits leaves,
    ``kl_max``, ``top1``: likewise (None without logits). ``fed``: what each side was given,
    for ``check_cast``."""

    leaves: tuple
    fed: str | None = None
    #: the policy each leaf was judged by (``failures()`` without thresholds)
    policy: str = DEFAULT_POLICY

    def failures(self, **thresholds) -> tuple[str, ...]:
        """What breaks ``thresholds`` (names in ``THRESHOLDS``: max_abs, max_rel, rel_norm,
        cosine_min, kl_mean_max, kl_max, top1_min), one line each; with none given, the leaves
        the report's policy fails (the default: what rounding explains). NaN or infinity that
        appeared in the candidate always fails. A logits threshold without logits fails too.
        A threshold that is not a number, or is NaN (which no comparison breaks), is refused."""
        out = []
        if self.new_nonfinite:
            out.append(f"{self.new_nonfinite} NaN/inf in the candidate where the reference holds another value")
        if all(bound is None for bound in thresholds.values()):
            out += [f"{leaf.path}: beyond {self.policy}"
                    + (f" ({leaf.explained.decided_by}): {leaf.explained.why}" if leaf.explained else "")
                    for leaf in self.leaves if not leaf.passed]
        for name, bound in thresholds.items():
            if name not in THRESHOLDS:
                raise InvalidArgumentError(
                    f"unknown threshold {name!r}; the thresholds are {', '.join(THRESHOLDS)}")
            if bound is None:
                continue
            if not isinstance(bound, numbers.Real) or isinstance(bound, bool) or math.isnan(bound):
                raise InvalidArgumentError(f"threshold {name}={bound!r}: give a number (None to leave it out)")
            attr, kind = THRESHOLDS[name]
            value = getattr(self, attr)
            if value is None and any(leaf.axis is not None for leaf in self.leaves):
                skipped = sum(leaf.rows_skipped for leaf in self.leaves)
                out.append(f"{name}={bound:g} asks for {attr}: no row had finite logits ({skipped} skipped: NaN or "
                           "+inf on either side, or no finite logit)")
            elif value is None:
                out.append(f"{name}={bound:g} asks for {attr}, measured only with logits= (none given)")
            elif math.isnan(value) or (value > bound if kind == "max" else value < bound):
                out.append(f"{attr} {value:.6g} {'>' if kind == 'max' else '<'} {name}={bound:g}")
        return tuple(out)

    def passed(self, **thresholds) -> bool:
        """No failures under ``thresholds`` (see ``failures``)."""
        return not self.failures(**thresholds)

    def __str__(self) -> str:
        lines = []
        if self.fed:
            lines.append(f"fed: {self.fed}")
        head = (f"overall: max abs {self.max_abs:.4g}, max rel {self.max_rel:.4g}, rel norm {self.rel_norm:.4g}, "
                f"cosine {self.cosine:.6f}, new NaN/inf {self.new_nonfinite}")
        if self.top1 is not None:
            head += (f"; logits over {self.rows} rows: KL mean {self.kl_mean:.4g} max {self.kl_max:.4g} nats, "
                     f"top-1 agreement {self.top1:.4%}")
        lines.append(head)
        bad = sum(not leaf.passed for leaf in self.leaves)
        lines.append(f"policy {self.policy}: " + (f"{bad} of {len(self.leaves)} leaves fail" if bad else
                                                  f"every leaf passes ({len(self.leaves)})"))
        for leaf in self.leaves:
            dt = (leaf.candidate_dtype if leaf.candidate_dtype == leaf.reference_dtype
                  else f"{leaf.candidate_dtype} against {leaf.reference_dtype}")
            s = (f"  {leaf.path} {leaf.shape} {dt}: max abs {leaf.max_abs:.4g}, max rel {leaf.max_rel:.4g}, "
                 f"rel norm {leaf.rel_norm:.4g}, cosine {leaf.cosine:.6f}")
            if leaf.nonfinite_mismatches:
                s += f", NaN/inf differ at {leaf.nonfinite_mismatches} ({leaf.new_nonfinite} new)"
            if leaf.axis is not None:
                s += f"; axis {leaf.axis}, {leaf.rows} rows"
                if leaf.rows_skipped:
                    s += f" ({leaf.rows_skipped} with NaN/+inf left out)"
                if leaf.top1 is not None:
                    s += (f": KL mean {leaf.kl_mean:.4g} max {leaf.kl_max:.4g}, top-1 {leaf.top1:.4%} "
                          f"({leaf.top1_disagree} differ; ties: reference {leaf.reference_ties}, "
                          f"candidate {leaf.candidate_ties})")
            if leaf.explained is not None:
                s += f"; {'explained' if leaf.passed else 'NOT explained'} ({leaf.explained.why})"
            elif not leaf.passed:
                s += f"; beyond {self.policy}"
            lines.append(s)
        return "\n".join(lines)


def _leaves(tree, side: str) -> dict:
    out: dict = {}

    def take(x, path):
        out[trees.where(path)] = x
        return x

    trees.map_leaves(take, tree)
    if not out:
        raise OutputMismatchError(f"the {side} holds no tensor; pass a model's outputs (a tensor or a tree of them)")
    return out


def _host64(x, path: str, side: str) -> tuple[np.ndarray, str, np.ndarray]:
    """A leaf as float64 on the host, exactly (bf16/fp8 through their own widening), its dtype, and the
    leaf as numpy holds it (in that dtype, for the policy's judgement)."""
    from bf16bridge.core.convert import convert

    a = x if isinstance(x, np.ndarray) else convert(x, "numpy", fallback="float32", on_grad="drop",
                                                     on_alias="allow")
    name = a.dtype.name
    if a.dtype.kind not in _FLOATING_KINDS and name not in metrics.KERNEL_KINDS:
        raise OutputMismatchError(
            f"the {side}'s leaf at {path} is {name}: compare_outputs measures floating outputs; leave integer "
            "or boolean outputs out of the trees (compare them for equality)")
    try:
        return metrics.to_float64(np.asarray(a)), name, np.asarray(a)
    except TypeError as err:
        raise UnsupportedDtypeError(f"the {side}'s leaf at {path} ({name}) has no exact float64 widening") from err


def _axis(logits) -> int | None:
    """The class axis of ``logits=`` given for every leaf (False, True or an int)."""
    if logits is False or logits is None:
        return None
    if logits is True:
        return -1
    if isinstance(logits, (int, np.integer)):
        return int(logits)
    raise InvalidArgumentError(
        f"logits must be False, True (the last axis), a class axis (an int), the path of the logits leaf (a str, "
        f"as the report names it, or a top-level key), or a dict of such paths to class axes; got {logits!r}")


def _axes(logits, paths) -> dict:
    """Each leaf's class axis (None: not logits) from ``logits=``: one for every leaf, or the
    leaves it names, by their path as the report prints it ("['logits']") or a top-level key."""
    if not isinstance(logits, (str, dict)):
        axis = _axis(logits)
        return {p: axis for p in paths}
    chosen = {logits: -1} if isinstance(logits, str) else logits
    out: dict = {p: None for p in paths}
    for key, axis in chosen.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(f"logits= names leaves by their path (a str); got the key {key!r}")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise InvalidArgumentError(f"logits={{{key!r}: {axis!r}}}: the class axis is an int (-1: the last)")
        path = key if key in out else f"[{key!r}]"
        if path not in out:
            raise InvalidArgumentError(
                f"logits= names {key!r}, which is no leaf of the outputs; their leaves are {', '.join(paths)}")
        out[path] = int(axis)
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """log softmax along the last axis, float64, rows with a finite maximum (no exp overflow)."""
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):  # -inf - m, or -1e308 - 1e308: -inf, fine
        z = x - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def _logits(r: np.ndarray, c: np.ndarray, axis: int, path: str) -> dict:
    if r.ndim == 0 or not -r.ndim <= axis < r.ndim:
        raise OutputMismatchError(f"logits axis {axis} is out of range for the leaf at {path} of shape {r.shape}")
    k = r.shape[axis]
    n_rows = r.size // k if k else math.prod(np.delete(np.array(r.shape), axis))  # reshape(-1, 0) fails
    r2 = np.moveaxis(r, axis, -1).reshape(n_rows, k)
    c2 = np.moveaxis(c, axis, -1).reshape(n_rows, k)
    ok = ~(np.isnan(r2).any(1) | np.isnan(c2).any(1) | (r2 == np.inf).any(1) | (c2 == np.inf).any(1))
    ok &= np.isfinite(r2).any(1) & np.isfinite(c2).any(1)  # a row of -inf has no softmax
    r2, c2 = r2[ok], c2[ok]
    n = len(r2)
    out: dict[str, Any] = dict(rows=n, rows_skipped=int(np.count_nonzero(~ok)))
    if n == 0 or k == 0:
        return out
    lr, lc = _log_softmax(r2), _log_softmax(c2)
    p = np.exp(lr)
    with np.errstate(invalid="ignore"):  # where p == 0 the term is 0, whatever log q is
        kl = np.sum(np.where(p > 0, p * (lr - lc), 0.0), axis=-1)
    kl = np.maximum(kl, 0.0)  # a few ULPs below zero for identical rows
    rmax = r2.max(1, keepdims=True)
    r_top = r2 == rmax
    c_first = np.argmax(c2, axis=1)
    agree = r_top[np.arange(n), c_first]
    out.update(kl_sum=float(kl.sum()), kl_mean=float(kl.mean()), kl_max=float(kl.max()),
               top1=float(agree.mean()), top1_disagree=int(np.count_nonzero(~agree)),
               reference_ties=int(np.count_nonzero(r_top.sum(1) > 1)),
               candidate_ties=int(np.count_nonzero((c2 == c2.max(1, keepdims=True)).sum(1) > 1)))
    return out


def _same_tree(ref: dict, cand: dict) -> None:
    """Refuse two output trees whose leaves' paths differ, naming what each lacks."""
    missing = [p for p in ref if p not in cand]
    extra = [p for p in cand if p not in ref]
    if missing or extra:
        raise OutputMismatchError(
            "the outputs are not the same tree: "
            + "; ".join(s for s in (f"the candidate lacks {', '.join(missing)}" if missing else "",
                                    f"the reference lacks {', '.join(extra)}" if extra else "") if s)
            + "; compare the same model's outputs (or pass the matching subtrees)")


def _measure_leaf(path: str, rx, cx, axis: int | None, pol) -> tuple[dict, _Sums]:
    """One leaf's LeafOutput fields (with ``kl_sum`` for logits), and its sums for the overall norms."""
    r, rname, r_held = _host64(rx, path, "reference")
    c, cname, c_held = _host64(cx, path, "candidate")
    if r.shape != c.shape:
        raise OutputMismatchError(f"the leaf at {path} has shape {c.shape} in the candidate, "
                                  f"{r.shape} in the reference")
    rf, cf = np.isfinite(r), np.isfinite(c)
    both = rf & cf
    with np.errstate(invalid="ignore"):  # inf == inf with NaN around
        differ = (rf != cf) | (~rf & ~cf & ~(np.isnan(r) & np.isnan(c)) & (r != c))
    vr, vc = r[both], c[both]
    with np.errstate(over="ignore"):  # a difference past float64's range: inf, as it is
        d = np.abs(vc - vr)
    own = _Sums.of(vr, vc)
    with np.errstate(over="ignore"):  # past float64's range (2**1000 against a zero): inf
        rel_each = d / np.maximum(np.abs(vr), TINY)
    leaf: dict[str, Any] = dict(
        path=path, shape=tuple(r.shape), reference_dtype=rname, candidate_dtype=cname, size=int(r.size),
        finite_compared=int(vr.size), max_abs=float(d.max()) if d.size else 0.0,
        max_rel=float(rel_each.max()) if d.size else 0.0,
        rel_norm=own.rel_norm(), cosine=own.cosine(),
        new_nonfinite=int(np.count_nonzero(~cf & differ)), nonfinite_mismatches=int(np.count_nonzero(differ)))
    if axis is not None:
        leaf["axis"] = axis
        leaf.update(_logits(r, c, axis, path))
    leaf.update(_judged(pol, c_held, r_held))
    return leaf, own


def _judged(pol, c: np.ndarray, r: np.ndarray) -> dict:
    """A leaf under the policy: the candidate and the reference output as two results of one
    computation (rounding(k): within 2k roundings; the others as compare() judges a pair)."""
    if pol.kind == "rounding":
        e = explain.pair(c, r, k=pol.n)
        return dict(passed=e.passed, explained=e)
    from bf16bridge.parity.compare import compare

    return dict(passed=compare(c, r, names=("candidate", "reference"), policy=pol, k_worst=0).passed)


def compare_outputs(reference, candidate, *, logits=False, policy=DEFAULT_POLICY) -> OutputReport:
    """The candidate's outputs against the reference's (the float32 model's), leaf by leaf.

    ``reference``, ``candidate``: tensors of any framework, or trees of them (dicts, lists,
    tuples, namedtuples, dataclasses, jax pytrees) with the same paths and shapes; a leaf
    missing, extra or of another shape raises OutputMismatchError naming it. Each leaf is
    widened exactly to float64 on the host (bf16 and fp8 candidates too). ``logits``: False,
    True (the class axis is the last) or the class axis: every leaf is then logits, and KL
    divergence and top-1 agreement are measured along that axis (float64 log-softmax). Or only
    some leaves are logits (a model's output dict): the path of one, as the report names it
    ("['logits']") or its top-level key ("logits"), class axis last; or a dict of such paths to
    class axes ({"logits": -1, "['aux'][0]": 1}). ``policy`` judges each leaf (``passed()`` and
    ``failures()`` without thresholds, ``assert_outputs_close`` without thresholds): the default,
    rounding(k), passes what bf16 rounding explains between two results of one computation (two
    frameworks' gradients, a model and its cast); ulp(n), exact, allclose and the framework
    policies as compare() judges a pair; reference(k), which needs a float64 reference, is refused."""
    pol = parse(policy)
    if pol.kind == "reference":
        raise InvalidArgumentError(f"compare_outputs: policy {pol} needs a float64 reference of each output; "
                                   "judge the two trees against each other: rounding(k) (the default), ulp(n), "
                                   "allclose(...) or a framework's policy")
    ref, cand = _leaves(reference, "reference"), _leaves(candidate, "candidate")
    axes = _axes(logits, list(ref))
    any_logits = any(a is not None for a in axes.values())
    _same_tree(ref, cand)
    rows_out = []
    tot: Counter[str] = Counter()
    sums = _Sums()  # over all leaves
    kl_sum = 0.0
    kl_max: float | None = None
    agree = rows = 0.0
    for path, rx in ref.items():
        leaf, own = _measure_leaf(path, rx, cand[path], axes[path], pol)
        sums.add(own)
        if "kl_sum" in leaf:
            kl_sum += leaf.pop("kl_sum")
            kl_max = leaf["kl_max"] if kl_max is None else max(kl_max, leaf["kl_max"])
            agree += leaf["top1"] * leaf["rows"]
        rows += leaf.get("rows", 0)
        rows_out.append(LeafOutput(**leaf))
        for k in ("new_nonfinite", "nonfinite_mismatches"):
            tot[k] += leaf[k]
    return OutputReport(
        leaves=tuple(rows_out), max_abs=max(x.max_abs for x in rows_out), max_rel=max(x.max_rel for x in rows_out),
        rel_norm=sums.rel_norm(), cosine=sums.cosine(), new_nonfinite=tot["new_nonfinite"],
        nonfinite_mismatches=tot["nonfinite_mismatches"], rows=int(rows),
        kl_mean=kl_sum / rows if any_logits and rows else None, kl_max=kl_max,
        top1=agree / rows if any_logits and rows else None, policy=str(pol))


class _Sums:
    """||r||^2, ||c||^2, ||c - r||^2 and r.c, each kept divided by its scale: the largest |r| (sr), the
    largest |c| (sc), max(sr, sc) for c - r, sr * sc for r.c. Outputs of any magnitude (float64
    values near 1e154 and past, whose squares overflow; or near 1e-154, whose squares underflow)
    then give rel_norm and cosine as plain sums would where those do not fail."""

    def __init__(self):
        self.sr = self.sc = 0.0
        self.nr = self.nc = self.nd = self.dot = 0.0

    @classmethod
    def of(cls, vr: np.ndarray, vc: np.ndarray) -> _Sums:
        out = cls()
        if not vr.size:
            return out
        out.sr, out.sc = float(np.abs(vr).max()), float(np.abs(vc).max())
        r = vr / out.sr if out.sr else vr
        c = vc / out.sc if out.sc else vc
        s = max(out.sr, out.sc)
        d = vc / s - vr / s if s else vc - vr
        out.nr, out.nc, out.nd, out.dot = float(np.dot(r, r)), float(np.dot(c, c)), float(np.dot(d, d)), \
            float(np.dot(r, c))
        return out

    def add(self, o: _Sums) -> None:
        """Take in another's sums, rescaled to the larger scales."""
        sr, sc = max(self.sr, o.sr), max(self.sc, o.sc)
        sd, od = max(self.sr, self.sc), max(o.sr, o.sc)
        s = max(sd, od)

        def f(a: float, b: float) -> float:  # a / b, 0 where b is (nothing summed at that scale)
            return a / b if b else 0.0

        self.nr = self.nr * f(self.sr, sr) ** 2 + o.nr * f(o.sr, sr) ** 2
        self.nc = self.nc * f(self.sc, sc) ** 2 + o.nc * f(o.sc, sc) ** 2
        self.nd = self.nd * f(sd, s) ** 2 + o.nd * f(od, s) ** 2
        self.dot = self.dot * f(self.sr, sr) * f(self.sc, sc) + o.dot * f(o.sr, sr) * f(o.sc, sc)
        self.sr, self.sc = sr, sc

    def rel_norm(self) -> float:
        """||c - r|| / ||r||; 0 where both are zero, inf where only r is."""
        if self.nr > 0:
            with np.errstate(over="ignore"):
                return float(np.float64(max(self.sr, self.sc)) / self.sr * math.sqrt(self.nd / self.nr))
        return 0.0 if self.nd == 0 else math.inf

    def cosine(self) -> float:
        if self.nr > 0 and self.nc > 0:
            return max(-1.0, min(1.0, self.dot / math.sqrt(self.nr * self.nc)))
        return 1.0 if self.nr == self.nc else 0.0  # both zero: the same direction (none); one zero: none shared


def assert_outputs_close(reference, candidate, *, logits=False, max_abs: float | None = None,
                         max_rel: float | None = None, rel_norm: float | None = None,
                         cosine_min: float | None = None, kl_mean_max: float | None = None,
                         kl_max: float | None = None, top1_min: float | None = None,
                         policy=DEFAULT_POLICY) -> OutputReport:
    """compare_outputs(...) and raise OutputsDifferError (an AssertionError too), with the
    report, when a threshold is broken (with none given: when a leaf fails ``policy``) or NaN/inf
    appeared in the candidate."""
    rep = compare_outputs(reference, candidate, logits=logits, policy=policy)
    bad = rep.failures(max_abs=max_abs, max_rel=max_rel, rel_norm=rel_norm, cosine_min=cosine_min,
                       kl_mean_max=kl_mean_max, kl_max=kl_max, top1_min=top1_min)
    if bad:
        raise OutputsDifferError("the candidate's outputs differ from the reference's beyond the thresholds: "
                                 + "; ".join(bad) + f"\n{rep}")
    return rep


# -- running both models ---------------------------------------------------------------------------

def _model_dtype(model) -> str | None:
    """The dtype a model object's floating inputs should have: bf16 or float16 where any of its
    parameters has one (what its cast layers compute in; cast_module's kept layers cast their
    inputs up in their hooks, so a model that is mostly kept norms still takes the cast dtype),
    else the floating dtype holding most of its parameters' elements (of its buffers' where it has
    no parameters); the one holding more elements where both narrow ones are there. Buffers do not
    make a float32 model narrow: a half-precision mask is not what its layers compute in. None for
    a plain function or a model with no floating leaves."""
    params: Counter = Counter()
    buffers: Counter = Counter()
    for adapter in registry.imported():
        subs = registry.hooks(adapter.name, CastHooks).submodules(model)
        if subs is None:
            continue
        seen: set = set()
        for s in subs:
            for i, (_, t) in enumerate(s.leaves):
                if id(t) in seen:
                    continue
                seen.add(id(t))
                shape, name = adapter.shape_dtype(t)
                if name in _INPUT_DTYPES:
                    (params if i < s.parameters else buffers)[name] += math.prod(shape)
        break
    count = params or buffers
    narrow = Counter({name: n for name, n in count.items() if name in _HALF_WIDTH})
    return (narrow or count).most_common(1)[0][0] if count else None


#: the dtypes check_cast casts floating inputs between, narrowest first
_INPUT_DTYPES = ("bfloat16", "float16", "float32", "float64")
#: the 16-bit floating dtypes: a model holding either computes in it
_HALF_WIDTH = ("bfloat16", "float16")


def _feed(args: tuple, kwargs: dict, dtype: str | None) -> tuple[tuple, dict, int]:
    """The inputs with floating leaves cast to ``dtype`` in their own framework (none cast for None)."""
    cast = 0

    def one(x, path):
        nonlocal cast
        if dtype is None:
            return x
        adapter = registry.get(registry.framework_of(x))
        _, name = adapter.shape_dtype(x)
        if name in _INPUT_DTYPES and name != dtype:
            cast += 1
            return adapter.astype(x, dtype)
        return x

    a, k = trees.map_leaves(one, (args, kwargs))
    return a, k, cast


@contextlib.contextmanager
def _no_grad():
    """Every imported framework's no-gradient context, where its adapter offers one (``no_grad``)."""
    with contextlib.ExitStack() as stack:
        for adapter in registry.imported():
            stack.enter_context(registry.hooks(adapter.name, NumericsHooks).no_grad())
        yield


def check_cast(reference, candidate, inputs, *, logits=False, kwargs: dict | None = None,
               cast_inputs: bool = True) -> OutputReport:
    """Run the float32 model (``reference``) and the cast one (``candidate``) on the same inputs
    and compare their outputs (``compare_outputs``; the float32 output is the reference).

    ``inputs``: one tensor (or tree) passed as the single argument, or a tuple of positional
    arguments; ``kwargs``: keyword arguments. ``cast_inputs=True``: each side gets the floating
    input leaves cast to bf16 or float16 where its parameters have it, else to the dtype most of
    them have (a model object of an imported framework, a torch ``nn.Module``: a bf16 cast model
    gets bf16 inputs, its float32 original float32 ones, both rounded from the same values, however
    many of the cast model's layers were kept in float32); a plain function gets the inputs
    as they are. ``cast_inputs=False``: both get the inputs as they are. Both run under each
    imported framework's no-gradient context where its adapter has one. Put a model with
    dropout in evaluation mode first (torch: ``model.eval()``): a random layer differs anyway.
    ``report.fed`` says what each side got."""
    if not isinstance(cast_inputs, bool):
        raise InvalidArgumentError(f"check_cast: cast_inputs must be True or False; got {cast_inputs!r}")
    if not callable(reference) or not callable(candidate):
        bad = "reference" if not callable(reference) else "candidate"
        raise InvalidArgumentError(f"check_cast: the {bad} must be a model or a function to call on the inputs; "
                                   "to compare outputs you already have, use compare_outputs")
    args = inputs if type(inputs) is tuple else (inputs,)
    kw = dict(kwargs or {})
    outs, fed = [], []
    for side, model in (("reference", reference), ("candidate", candidate)):
        dtype = _model_dtype(model) if cast_inputs else None
        a, k, n = _feed(args, kw, dtype)
        with _no_grad():
            outs.append(model(*a, **k))
        fed.append(f"{side} {n} floating input(s) cast to {dtype}" if n
                   else f"{side} the inputs as given" + (f" (its parameters are {dtype})" if dtype else ""))
    rep = compare_outputs(outs[0], outs[1], logits=logits)
    return dataclasses.replace(rep, fed="; ".join(fed))
