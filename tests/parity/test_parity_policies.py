"""parity.policies: policy texts read and refused, the frameworks' defaults and torch's own verdicts
(NaN included, element for element what torch.isclose says), allclose, and reference(k): its floor
(no result held to less than its dtype's rounding) and its cap (a fault every result shares fails;
real rounding passes)."""

import re

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import metrics, render
from bf16bridge.parity import rounding_multiple
from conftest import BF16
from parity_cases import F32, _rand


@pytest.mark.parametrize("text,want", [
    ("exact", parity.exact()), ("exact()", parity.exact()),
    ("ulp(3)", parity.ulp(3)), ("ulp()", parity.ulp(1)), ("ulp(2.0)", parity.ulp(2)), ("ulp(n=2)", parity.ulp(2)),
    ("ulp(0, signed_zeros=true)", parity.ulp(0, signed_zeros=True)),
    ("allclose(1e-2, 1e-5)", parity.allclose(1e-2, 1e-5)), ("allclose(1e-2)", parity.allclose(1e-2, 0)),
    ("allclose(atol=0.1)", parity.allclose(0, 0.1)), ("allclose(rtol=0.1)", parity.allclose(0.1, 0)),
    ("allclose(atol=1e-3, rtol=0.02)", parity.allclose(0.02, 1e-3)),
    ("ALLCLOSE(1E-2, atol = 2)", parity.allclose(0.01, 2)),
    ("allclose(1e-2, 1e-5, equal_nan=false)", parity.allclose(1e-2, 1e-5, equal_nan=False)),
    ("allclose(0.1, 0, false)", parity.allclose(0.1, 0, equal_nan=False)),
    ("reference(2)", parity.reference(2)), ("reference(k=3)", parity.reference(3)),
    ("reference()", parity.reference(2)), ("reference(2, cap=none)", parity.reference(2, cap=None)),
    ("reference(k=3, cap=32)", parity.reference(3, cap=32)), ("reference(1.5, 20)", parity.reference(1.5, cap=20)),
    ("torch", parity.FRAMEWORK_DEFAULTS["torch"]), ("tf", parity.FRAMEWORK_DEFAULTS["tensorflow"]),
])
def test_policy_texts_mean_what_they_say(text, want):
    assert parity.parse(text) == want
    if not want.name:  # a policy's own text reads back (the frameworks' tables print their numbers)
        assert parity.parse(str(want)) == want


@pytest.mark.parametrize("text,why", [
    ("ulp(1.9)", "whole number"), ("ulp(-1)", ">= 0"), ("ulp(x)", "number"), ("ulp", "parentheses"),
    ("ulp(1, 2)", "true or false"), ("ulp(1,)", "empty"), ("ulp(inf)", "finite"), ("ulp(tol=1)", "not 'tol'"),
    ("allclose()", "needs rtol"), ("allclose(1, 2, 3)", "equal_nan takes true or false, not '3'"),
    ("allclose(1, 2, true, 4)", "at most 3"), ("allclose(tol=0.1)", "not 'tol'"),
    ("allclose(atol=0.1, 0.2)", "positional argument after"), ("allclose(rtol=1, rtol=2)", "given twice"),
    ("allclose(-1)", ">= 0"), ("allclose(nan)", "finite"), ("allclose(0.1", "unknown policy"),
    ("reference(0.5)", "k >= 1"), ("reference(2, cap=0.5)", "cap needs a finite number >= 1"),
    ("reference(2, cap=inf)", "finite"), ("reference(2, cap=x)", "number"), ("exact(1)", "at most 0"), ("close(1)", "unknown policy"), ("", "unknown policy"),
])
def test_policy_texts_that_do_not_fit_are_refused(text, why):
    with pytest.raises(parity.PolicyError, match=re.escape(why)) as err:
        parity.parse(text)
    assert isinstance(err.value, ValueError) and isinstance(err.value, bb.Bf16BridgeError)
    assert repr(text) in str(err.value) and "allclose(RTOL, ATOL)" in str(err.value)  # the input and the way out


def test_framework_defaults_and_bad_policies():
    assert parity.parse("torch").rtol == 1.6e-2 and parity.parse("torch").atol == 1e-5
    assert parity.parse("jax").rtol == 1e-2 and parity.parse("tensorflow").atol == 1e-2
    with pytest.raises(parity.PolicyError, match="whole number"):
        parity.ulp(1.5)
    with pytest.raises(ValueError, match="reference="):
        parity.compare(_rand(), _rand(), policy="reference(2)")


def _torch_cases():
    """(actual, expected) bf16 pairs: NaN in the same place, NaN on one side, close and far values, infinities."""
    nan, inf = np.nan, np.inf
    rows = [([1.0, nan], [1.0, nan]), ([1.0, nan], [1.0, 2.0]), ([1.0, 2.0], [1.01, 2.0]), ([1.0, 2.0], [1.1, 2.0]),
            ([inf, -inf], [inf, -inf]), ([inf, 1.0], [-inf, 1.0]), ([0.0, -0.0], [-0.0, 0.0])]
    return [(np.array(a, F32).astype(BF16), np.array(b, F32).astype(BF16)) for a, b in rows]


@pytest.mark.frameworks("torch")
def test_the_torch_policy_gives_torch_testing_assert_close_verdicts_nan_included():
    """torch.testing.assert_close's default is equal_nan=False: NaN in the same place fails there. The torch
    policy once passed it; jax's and tensorflow's helpers (numpy's assert_allclose) take NaN as equal."""
    import torch

    def torch_says(a, b):
        t = lambda x: torch.from_numpy(x.view(np.uint16).copy()).view(torch.bfloat16)  # noqa: E731
        try:
            torch.testing.assert_close(t(a), t(b))
            return True
        except AssertionError:
            return False

    for a, b in _torch_cases():
        assert parity.compare(a, b, policy="torch").passed == torch_says(a, b), (a, b)
        both_nan = bool((np.isnan(a) & np.isnan(b)).any())
        for other in ("jax", "tensorflow"):  # numpy.testing.assert_allclose: equal_nan=True
            try:
                np.testing.assert_allclose(a.astype(F32), b.astype(F32), rtol=1e-2, atol=1e-2)
                numpy_says = True
            except AssertionError:
                numpy_says = False
            assert parity.compare(a, b, policy=other).passed == numpy_says, (other, a, b)
        if both_nan:
            rep = parity.compare(a, b, policy="torch")
            assert rep.pairs[0].nan_both == 1 and "NaN on both sides: torch (equal_nan=false)" in str(rep)
    nan_both = _torch_cases()[0]
    assert parity.compare(*nan_both, policy="allclose(1.6e-2, 1e-5)").passed  # equal_nan defaults to true
    assert not parity.compare(*nan_both, policy="allclose(1.6e-2, 1e-5, equal_nan=false)").passed


def test_allclose_policy_judges_elements():
    a = np.array([1.0, 100.0], dtype=np.float32)
    assert parity.compare(a, a * np.float32(1.001), policy="allclose(1e-2, 0)").passed
    assert not parity.compare(a, a * np.float32(1.1), policy="allclose(1e-2, 0)").passed


# -- verdicts at the edges: reference(k)'s floor, torch's own arithmetic --


def test_reference_k_holds_no_result_to_less_than_its_own_dtypes_rounding():
    """An exact float64 result has RMS error 0; a bf16 or float32 result correctly rounded cannot do
    better than its own rounding of the reference, so it passes reference(1) beside it (it failed every k).
    A result that truncates is still caught: its error is beyond k times that floor."""
    ref = np.random.default_rng(11).standard_normal(4096)
    bf = metrics.round_to(ref, BF16).astype(BF16)
    f32 = ref.astype(F32)
    trunc = (f32.view(np.uint32) >> 16).astype(np.uint16).view(BF16)
    rep = parity.compare({"f64": ref.copy(), "bf16": bf, "f32": f32}, reference=ref, policy="reference(1)")
    assert rep.passed, [(r.name, r.rms_error, r.rounding_rms) for r in rep.references]
    held = {"f64": ref, "bf16": bf.astype(np.float64), "f32": f32.astype(np.float64)}
    for r in rep.references:
        assert r.rounding_rms == pytest.approx(float(np.sqrt(np.mean((held[r.name] - ref) ** 2))), rel=1e-12)
    assert rep.smallest["reference_k"] == 1.0
    rep = parity.compare({"f64": ref.copy(), "bf16": bf, "trunc": trunc}, reference=ref, policy="reference(1.5)")
    assert [r.passed for r in rep.references] == [True, True, False]
    assert rep.smallest["reference_k"] == pytest.approx(rep.references[2].rms_error / rep.references[2].rounding_rms)


# -- reference(k)'s cap: a fault every result shares fails --------------------------------------

def _shared_faults() -> tuple:
    ref = np.random.default_rng(0).standard_normal(1000)
    off = (ref * 1.1).astype(BF16)  # 10% off: some 26 bf16 ULPs, the same in both results
    zero = np.zeros(1000, BF16)
    return ref, {"equally wrong": {"torch": off, "jax": off.copy()}, "all zero": {"torch": zero, "jax": zero.copy()}}


@pytest.mark.parametrize("scaled", [False, True], ids=["no condition", "condition"])
@pytest.mark.parametrize("case", ["equally wrong", "all zero"])
def test_a_fault_every_result_shares_fails_reference_k(case, scaled):
    """reference(k) ranks each result against the best one, so two results as wrong as each other
    passed it, "yes" printed beside a 26-ULP error. Its cap fails them: each is far more than its
    dtype's rounding allows (RMS error over the rounding floor; with condition=, the largest error
    over u * condition), and the report says what passing means and why they failed."""
    ref, cases = _shared_faults()
    cond = np.abs(ref) if scaled else None
    rep = parity.compare(cases[case], reference=ref, condition=cond, policy="reference(2)")
    assert not rep.passed and [r.passed for r in rep.references] == [False, False]
    x = cases[case]["torch"].astype(np.float64)
    if scaled:  # by hand: max |x - ref| / (2**-8 |ref|)
        want = float(np.max(np.abs(x - ref) / (2.0 ** -8 * np.abs(ref))))
    else:  # RMS error over the RMS error of the reference correctly rounded to bf16
        floor = np.sqrt(np.mean((metrics.round_to(ref, BF16) - ref) ** 2))
        want = float(np.sqrt(np.mean((x - ref) ** 2)) / floor)
    assert want > parity.policies.REFERENCE_CAP
    for r in rep.references:
        assert rounding_multiple(r) == pytest.approx(want, rel=1e-9)
    assert rep.smallest["reference_cap"] == pytest.approx(want, rel=1e-9)
    text = str(rep)
    assert "passed means: RMS error at most 2x the best result's" in text
    assert f"at most 16x what its dtype's rounding allows" in text and "a fault those results share" in text
    assert f"reference(1, cap={want:.3g})" in text  # the smallest that passes
    for page in (render.markdown(rep), render.html(rep)):
        assert "a fault those results share" in page
    # a cap above it passes them; without a cap they pass, and the report says what that pass means
    assert parity.compare(cases[case], reference=ref, condition=cond, policy=parity.reference(2, cap=want * 1.01)).passed
    loose = parity.compare(cases[case], reference=ref, condition=cond, policy="reference(2, cap=none)")
    assert loose.passed and loose.policy == "reference(2, cap=none)"
    assert "relative to the best result only (cap=none), so an error every result shares passes" in str(loose)
    # one result alone, allowed to stand alone, is judged by the cap too
    alone = parity.compare({"torch": cases[case]["torch"]}, reference=ref, condition=cond, policy="reference(2)",
                           allow_missing=True)
    assert not alone.passed


def _matmul(fw: str, a, b):
    if fw == "numpy":  # ml_dtypes' bf16 matmul gives float32: rounded back to the inputs' dtype
        return (a @ b).astype(a.dtype)
    return bb.convert(a, fw) @ bb.convert(b, fw)


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.parametrize("kind", ["normal", "wide", "cancel"])
@pytest.mark.parametrize("k", [16, 256, 4096])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_real_rounding_passes_reference_k_and_its_cap(dtype, k, kind):
    """Correct results of matmuls of random data in torch, jax and numpy (bf16 ones accumulated in
    float32 and rounded once; float32 ones accumulated in float32) pass reference(k)'s cap with room
    to spare: with condition=, every one; without it, the bf16 ones (a float32 result of a long dot
    product may be many float32 rounding floors off: docs/parity.md says to give condition=)."""
    from bf16bridge.parity import ops

    rng = np.random.default_rng(k)
    a, b = ops._values(rng, (32, k), kind), ops._values(rng, (k, 32), kind)
    if dtype == "float32":
        a, b = a.astype(F32), b.astype(F32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref, cond = a64 @ b64, np.abs(a64) @ np.abs(b64)
    res = {fw: _matmul(fw, a, b) for fw in ("torch", "jax", "numpy")}
    scaled = parity.compare(res, reference=ref, condition=cond, policy="reference(2)")
    plain = parity.compare(res, reference=ref, policy="reference(2)")
    for r in scaled.references + (plain.references if dtype == "bfloat16" else ()):
        # bf16 results rounded once from float32 sums: near 1; float32 ones: a few units, more with k
        room = 0.25 if dtype == "bfloat16" else 1.0
        assert rounding_multiple(r) <= parity.policies.REFERENCE_CAP * room, (r.name, rounding_multiple(r))
        assert str(r.ulp_unit) == dtype
    for fw, y in res.items():  # a result beside itself: only the cap can fail it
        for c in (cond, None) if dtype == "bfloat16" else (cond,):
            assert parity.compare({fw: y, "again": y}, reference=ref, condition=c, policy="reference(2)").passed
    if dtype == "bfloat16":  # torch and jax round their float32 sums once: reference(2) in full, both ways
        pair = {n: res[n] for n in ("torch", "jax")}
        for c in (cond, None):
            assert parity.compare(pair, reference=ref, condition=c, policy="reference(2)").passed


def _torch_isclose_says(a, b, rtol=1.6e-2, atol=1e-5):
    """a and b as torch tensors, and torch.isclose's answer after promoting them as assert_close does."""
    import torch

    t = lambda x: (torch.from_numpy(x.view(np.uint16).copy()).view(torch.bfloat16)  # noqa: E731
                   if x.dtype == BF16 else torch.from_numpy(x.copy()))
    ta, tb = t(a), t(b)
    common = torch.promote_types(ta.dtype, tb.dtype)
    return ta, tb, torch.isclose(ta.to(common), tb.to(common), rtol=rtol, atol=atol).numpy()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
def test_the_torch_arithmetic_is_torch_isclose_on_every_pattern_near_the_edge(dtype):
    """Every finite pattern b against the patterns 1..8 steps away, both signs: element for element what
    torch.isclose says (float64 arithmetic differed on a few hundred bf16 pairs, e.g. 0.0146 vs 0.01459)."""
    from bf16bridge.parity import regions

    bits = np.arange(0, int(metrics.bits(np.array([np.inf], dtype)).item()), dtype=np.int64)
    b = bits.astype(np.uint16).view(dtype)
    for step in (-8, -5, -3, -1, 1, 2, 3, 4, 6, 8):
        a = np.clip(bits + step, 0, bits[-1]).astype(np.uint16).view(dtype)
        for x, y in ((a, b), (-a, b), (b, a)):
            rtol, atol = parity.parse("torch").tolerances(dtype.name, dtype.name)  # torch's own: test_parity_frameworks
            *_, want = _torch_isclose_says(x, y, rtol, atol)
            got = metrics.isclose(x, y, rtol, atol, False, "promoted")
            assert np.array_equal(got, want), (step, x[got != want][:3], y[got != want][:3])
            bad, _, _ = regions.exceeds(parity.parse("torch"), x, y)  # worst_regions judge so too (all finite)
            assert np.array_equal(bad, ~want)
