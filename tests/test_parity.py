"""Parity validation: exact metrics, injected faults caught and located, policies, run, CLI."""

import json
import re
import subprocess
import sys
import warnings
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import metrics, render, runner
from bf16bridge.parity import rounding_multiple
from conftest import BF16
from strategies import numpy_holds

F32 = np.float32


def _rand(shape=(64, 64), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(ml_dtypes.bfloat16)


def test_ordered_mapping_is_monotonic_over_every_bf16_pattern(all_bf16):
    a = all_bf16.view(BF16)
    finite = metrics.classify(a)["finite"]
    vals = a[finite].astype(np.float64)
    keys = metrics.ordered(a)[finite]
    order = np.argsort(keys, kind="stable")
    assert np.all(np.diff(vals[order]) >= 0)
    # adjacent bf16 numbers are 1 ULP apart; +0 and -0 are 0 apart; max finite to inf is 1
    x = np.array([1.0, 0.0, 3.3895314e38], dtype=BF16)
    y = x.copy()
    y.view(np.uint16)[:] = [0x3F81, 0x8000, 0x7F80]
    assert metrics.ulp_distance(x, y).tolist() == [1, 0, 1]
    neg = np.array([-1.0], dtype=BF16)
    neg2 = neg.copy()
    neg2.view(np.uint16)[0] += 1  # one step away from zero
    assert metrics.ulp_distance(neg, neg2).tolist() == [1]
    assert metrics.ulp_distance(np.array([-1e-40], BF16), np.array([1e-40], BF16))[0] > 0


def test_one_element_off_by_one_ulp_is_found_at_its_index():
    a = _rand()
    b = a.copy()
    b.view(np.uint16)[17, 42] += 1
    rep = parity.compare(a, b, policy="exact")
    assert not rep.passed and rep.max_ulp == 1
    assert rep.identical_fraction == pytest.approx(1 - 1 / a.size)
    assert rep.worst[0].index == (17, 42) and rep.worst[0].ulp == 1
    assert rep.pairs[0].ulp_histogram["1"] == 1 and rep.pairs[0].ulp_histogram["0"] == a.size - 1
    assert parity.compare(a, b, policy=parity.ulp(1)).passed
    assert not parity.compare(a, b, policy="ulp(0)").passed
    assert "[17, 42]" in str(rep)


def test_nan_against_inf_is_counted_apart():
    a = _rand((100,))
    b = a.copy()
    a[7], b[7] = np.nan, np.inf
    rep = parity.compare({"x": a, "y": b}, policy="ulp(1000)")
    p = rep.pairs[0]
    # one element: in both breakdown columns, counted once in the total
    assert p.nan_mismatches == 1 and p.inf_mismatches == 1
    assert p.nonfinite_mismatches == 1 and rep.nonfinite_mismatches == 1
    assert not rep.passed, "no ULP tolerance excuses a NaN against an inf"
    assert p.max_ulp == 0 and p.finite_compared == 99
    assert rep.worst[0].index == (7,) and rep.worst[0].ulp is None
    assert rep.smallest["ulp"] is None


def test_signed_zero_only_matters_when_asked():
    a = np.zeros(10, BF16)
    b = a.copy()
    b[3] = -0.0
    assert not parity.compare(a, b, policy="exact").passed
    assert parity.compare(a, b, policy="ulp(0)").passed
    rep = parity.compare(a, b, policy=parity.ulp(0, signed_zeros=True))
    assert not rep.passed and rep.pairs[0].signed_zero_mismatches == 1


def test_flush_to_zero_shows_as_subnormal_mismatches():
    a = np.array([1e-39, 2e-39, 1.0], dtype=BF16)  # subnormal in bf16
    b = a.copy()
    b[:2] = 0
    p = parity.compare(a, b).pairs[0]
    assert p.subnormal_mismatches == 2


def test_truncating_rounding_is_caught_on_random_data_and_named():
    x = np.random.default_rng(3).standard_normal(1 << 16).astype(F32)
    rne = bb.kernels.to_bf16(x)
    trunc = (x.view(np.uint32) >> 16).astype(np.uint16).view(BF16)  # round toward zero
    rep = parity.compare({"rne": rne, "trunc": trunc}, reference=x.astype(np.float64), policy="reference(1.5)")
    assert not rep.passed
    assert rep.outlier == "trunc" and "RMS error" in rep.outlier_why
    assert {r.name: r.passed for r in rep.references} == {"rne": True, "trunc": False}
    assert 0.3 < rep.identical_fraction < 0.7 and rep.max_ulp == 1
    assert rep.references[0].max_ulps_of_reference <= 0.5  # nearest-even: within half an ULP


def test_transposed_result_is_caught():
    a = _rand((32, 32))
    rep = parity.compare(a, np.ascontiguousarray(a.T), policy="torch")
    assert not rep.passed and rep.max_ulp > 100
    i, j = rep.worst[0].index
    assert i != j
    rect = _rand((8, 16))
    rep = parity.compare(rect, np.ascontiguousarray(rect.T))
    assert not rep.passed and "shapes differ" in rep.pairs[0].shape_mismatch
    # two agreeing results and a third of another shape: no tolerance passes, none is claimed to
    rep = parity.compare(rect, rect.copy(), np.ascontiguousarray(rect.T))
    assert rep.smallest["ulp"] is None and "no ulp or allclose tolerance" in str(rep)


def _f64_steps(x: float, n: int) -> float:
    for _ in range(n):
        x = float(np.nextafter(x, np.inf))
    return x


@pytest.mark.parametrize("a, b, want", [
    (1.0, _f64_steps(1.0, 1), 1),  # the ordered integers near 2**62: float64 held them to within 2**10
    (1e300, _f64_steps(1e300, 3), 3),
    (-2.0, _f64_steps(-2.0, 5), 5),
    (-5e-324, 5e-324, 2),
    (-1.7976931348623157e308, 1.7976931348623157e308, 2 * 0x7FEFFFFFFFFFFFFF),  # past int64
])
def test_float64_ulp_distances_are_exact(a, b, want):
    x, y = np.array([a]), np.array([b])
    assert int(metrics.ulp_distance(x, y)[0]) == want
    rep = parity.compare(x, y, policy="ulp(0)")
    assert rep.max_ulp == want and not rep.passed, "values one ULP apart are not ulp(0)"
    assert parity.compare(x, y, policy=f"ulp({want})").passed


@pytest.mark.parametrize("bits32, identical", [
    (0x3F800000, True),  # 1.0: exactly the bf16 1.0
    (0x80000000, True),  # -0
    (0x3F800001, False),  # rounds to the bf16 1.0, is not it
    (0x3F80D1B7, False),  # 1.0064: rounds to 1.0078125
    (0x7FC00000, True),  # the NaN bf16 holds
    (0x7FC00001, False),  # a NaN payload bf16 cannot hold
])
def test_float32_against_bf16_is_identical_only_where_the_rounding_lost_nothing(bits32, identical):
    f32 = np.array([bits32], np.uint32).view(F32)
    b16 = bb.kernels.to_bf16(f32)
    for pair in ((f32, b16), (b16, f32)):
        rep = parity.compare(*pair, policy="exact")
        assert rep.passed is identical and rep.identical_fraction == float(identical)
        assert rep.pairs[0].note.startswith("float32 side rounded to bf16")
        assert parity.compare(*pair, policy="ulp(0)").passed, "in bf16 ULPs the rounded side is 0 away"


@pytest.mark.parametrize("fine, coarse", [(np.float64, np.float32), (np.float32, np.float16), (np.float64, np.float16)])
def test_wider_float_against_a_narrower_one_is_identical_only_where_the_rounding_lost_nothing(fine, coarse):
    # (wider than both are plain numpy floats, not the narrow kinds): 1 + 2**-40 rounds to the
    # float32 1.0 and is not it; 0.5 and -0 are held exactly
    x = np.array([1 + 2.0 ** -40, 0.5, -0.0], np.float64).astype(fine)
    if fine is np.float32:
        x[0] = np.float32(1 + 2.0 ** -20)  # rounds to float16's 1.0 (its step there: 2**-10)
    y = x.astype(coarse)
    assert y[0] == 1.0 and x[0] != 1.0
    for pair in ((x, y), (y, x)):
        rep = parity.compare(*pair, policy="exact")
        assert not rep.passed and rep.identical_fraction == pytest.approx(2 / 3)
        assert parity.compare(pair[0][1:], pair[1][1:], policy="exact").passed


def _nearest_bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> bf16 correctly rounded, by hand: of the bf16 numbers next to float32 rounding's,
    the nearest (|x - v| is exact in float64 there), ties to the even pattern."""
    t = x.astype(F32).astype(BF16).view(np.uint16).astype(np.int64)
    cands = np.stack([t - 1, t, t + 1])  # same sign: bits one step down and up in magnitude
    vals = cands.astype(np.uint16).view(BF16).astype(np.float64)
    dist = np.where(np.isfinite(vals), np.abs(vals - x), np.inf)
    best = dist.min(0)
    pick = np.where(dist == best, cands, 1 << 20)  # ties: both kept, the even pattern wins below
    even = np.where(pick % 2 == 0, pick, 1 << 20).min(0)
    return np.where(even < 1 << 20, even, pick.min(0)).astype(np.uint16).view(BF16)


@pytest.mark.parametrize("fine", ["float64", "float32", "float16"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_finer_float_against_bf16_is_compared_in_bf16_ulps_after_rounding(fine, seed):
    """bf16 against float64 or float16 was measured in float64/float32 ULPs, where a correctly rounded
    bf16 is thousands of ULPs away: it failed every ulp(n). The finer side is rounded to bf16 now, either
    argument order, float64 once (not through float32 twice)."""
    rng = np.random.default_rng(seed)
    top = 60000.0 if fine == "float16" else 1e38
    x = (rng.standard_normal(64) * np.exp2(rng.integers(-20, 20, 64))).clip(-top, top).astype(fine)
    c = _nearest_bf16(x.astype(np.float64))
    off = c.copy()
    off.view(np.uint16)[::3] += 1  # one bf16 ULP (in magnitude) off
    for pair, rounded_side in (((x, c), 0), ((c, x), 1)):
        rep = parity.compare(*pair, policy="ulp(0)")
        assert rep.passed, rep
        assert rep.pairs[0].note.startswith(f"{fine} side rounded to bf16 (nearest-even) to compare in bf16 ULPs")
        assert rep.pairs[0].dtype == "bfloat16"
    assert parity.compare(x, off, policy="ulp(1)").passed and not parity.compare(off, x, policy="ulp(0)").passed
    assert parity.compare(x, off, policy="ulp(0)").pairs[0].max_ulp == 1
    exact = x.astype(np.float64) == c.astype(np.float64)
    assert parity.compare(x, c, policy="exact").identical_fraction == exact.mean()


def test_float64_rounds_to_bf16_once_not_through_float32():
    """1 + 2**-8 + 2**-40 lies just above the tie between bf16's 1 and 1 + 2**-7: float32 rounds it onto
    the tie, and the tie then goes to the even 1.0. Correctly rounded it is 1 + 2**-7."""
    x = np.array([1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40)])
    up = np.array([0x3F81, 0xBF81], np.uint16).view(BF16)
    assert parity.compare(x, up, policy="ulp(0)").passed
    assert parity.compare(x, up.astype(F32).astype(np.float64).astype(F32).astype(BF16), policy="ulp(0)").passed
    twice = x.astype(F32).astype(BF16)
    assert twice.view(np.uint16).tolist() == [0x3F80, 0xBF80]
    assert parity.compare(x, twice, policy="ulp(1)").passed and not parity.compare(x, twice, policy="ulp(0)").passed
    assert metrics.round_to(x, BF16).tolist() == [1 + 2**-7, -(1 + 2**-7)]  # the reference, held correctly


@pytest.mark.parametrize("fine, coarse, note", [
    ("float64", "float32", "float64 side rounded to float32 (nearest-even) to compare in float32 ULPs"),
    ("float32", "float16", "float32 side rounded to float16 (nearest-even) to compare in float16 ULPs"),
    ("float16", "float8_e4m3fn", "float16 side rounded to float8_e4m3fn (nearest-even)"),
    ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fn side rounded to float8_e5m2 (nearest-even)"),
])
def test_any_two_float_dtypes_are_compared_in_the_coarsers_ulps(fine, coarse, note):
    x = np.array([1.0, 1.0 + 2**-12, 3.0, -0.375, 2.0**-5], np.float64)
    a = x.astype(F32).astype(getattr(ml_dtypes, fine, fine))
    b = a.astype(F32).astype(getattr(ml_dtypes, coarse, coarse))
    for pair in ((a, b), (b, a)):
        rep = parity.compare(*pair, policy="ulp(0)")
        assert rep.passed and rep.pairs[0].note.startswith(note) and rep.pairs[0].dtype == coarse, rep


def test_two_dtypes_of_as_many_mantissa_bits_are_compared_in_float32_and_say_so():
    a = np.array([1.0, 2.0], F32)
    rep = parity.compare(a.astype(ml_dtypes.float8_e4m3fn), a.astype(ml_dtypes.float8_e4m3fnuz), policy="ulp(0)")
    assert rep.passed and rep.pairs[0].note == "compared as float32"


def test_a_float32_value_beyond_bf16s_range_is_inf_there_and_the_report_says_so():
    """3.4e38 is finite in float32 and past bf16's largest (3.3895e38): it rounds to inf. Against a bf16
    inf that agrees (inf is what bf16 holds for it); against bf16's largest finite value it is a
    non-finite mismatch. Either way the note says the float32 value left bf16's range."""
    f = np.array([3.4e38, -3.4e38, 1.0], F32)
    inf = np.array([np.inf, -np.inf, 1.0], F32).astype(BF16)
    big = np.array([3.3895e38, -3.3895e38, 1.0], F32).astype(BF16)
    assert np.isfinite(big.astype(F32)).all()
    for pair in ((f, inf), (inf, f)):
        rep = parity.compare(*pair, policy="ulp(0)")
        assert rep.passed and "2 of its finite element(s) lie beyond bf16's range and became infinite" in str(rep)
        assert not parity.compare(*pair, policy="exact").passed
    rep = parity.compare(f, big, policy="ulp(1000)")
    assert not rep.passed and rep.nonfinite_mismatches == 2 and "beyond bf16's range" in rep.pairs[0].note


def test_a_reference_of_another_shape_is_refused_not_paired_out_of_order():
    y = _rand((2, 3))
    ref = y.astype(np.float64)
    for bad in (np.ascontiguousarray(ref.T), ref.reshape(-1), ref[:1]):  # same size or not: never by position
        with pytest.raises(bb.InvalidArgumentError, match=r"the reference has shape .* no result has it"):
            parity.compare(y, y.copy(), reference=bad)
    with pytest.raises(bb.InvalidArgumentError, match=r"condition= has shape \(6,\), the reference \(2, 3\)"):
        parity.compare(y, y.copy(), reference=ref, condition=np.ones(6))
    # one result of the reference's size in another shape: measured against nothing, and failed
    odd = np.ascontiguousarray(_rand((3, 2)))
    for policy in ("reference(2)", "ulp(1000)", "allclose(1, 1)"):
        rep = parity.compare({"a": y, "b": y.copy(), "odd": odd}, reference=ref, policy=policy)
        assert not rep.passed and rep.outlier == "odd"
        assert [r.shape_mismatch for r in rep.references] == [None, None, "shape (3, 2), the reference (2, 3)"]
        assert rep.smallest["reference_k"] is None and "no reference(k)" in str(rep)
        assert "shape (3, 2), the reference (2, 3)" in str(rep)
        for page in (render.markdown(rep), render.html(rep), render.summary([rep])):
            assert "odd: shape (3, 2), the reference (2, 3)" in page or "shape (3, 2), the reference (2, 3)" in page


@pytest.mark.parametrize("call, error, says", [
    (lambda: parity.compare({}, reference=np.ones(2)), bb.InvalidArgumentError, "got 0 result(s) and a reference"),
    (lambda: parity.compare(_rand(), _rand(), names=["a"]), bb.InvalidArgumentError, "1 name(s) (a) for 2 results"),
    (lambda: parity.compare(_rand(), _rand(), names=["a", "a"]), bb.InvalidArgumentError, "one distinct name"),
    (lambda: parity.compare({"x": _rand(), "y": _rand()}, names=["a", "b"]), bb.InvalidArgumentError,
     "leave names= out"),
    (lambda: parity.compare(np.arange(3), np.arange(3)), bb.UnsupportedDtypeError, "int64: compare integer"),
    (lambda: parity.compare(np.ones(3, bool), np.ones(3, bool)), bb.UnsupportedDtypeError, "bool: compare"),
    (lambda: parity.assert_parity(_rand(), _rand(), policy=""), parity.PolicyError, "policy '': unknown"),
    (lambda: parity.compare(_rand(), _rand(), k_worst=-1), bb.InvalidArgumentError, "whole number >= 0; got -1"),
    (lambda: parity.ulp(None), parity.PolicyError, "whole number n >= 0"),
    (lambda: parity.ulp("2"), parity.PolicyError, "whole number n >= 0"),
    (lambda: parity.allclose(float("inf")), parity.PolicyError, "finite numbers rtol >= 0"),
    (lambda: parity.allclose(0.1, None), parity.PolicyError, "atol=None"),
    (lambda: parity.allclose(True), parity.PolicyError, "rtol=True"),
    (lambda: parity.reference(None), parity.PolicyError, "finite number k >= 1"),
    (lambda: parity.reference(float("inf")), parity.PolicyError, "finite number k >= 1"),
    (lambda: parity.reference(2, cap=float("nan")), parity.PolicyError, "cap needs a finite number >= 1"),
    (lambda: parity.reference(2, cap="none"), parity.PolicyError, "or None (no absolute bound"),
])
def test_arguments_that_do_not_fit_are_our_errors(call, error, says):
    with pytest.raises(error) as err:
        call()
    assert isinstance(err.value, bb.Bf16BridgeError) and says in str(err.value), str(err.value)


@pytest.mark.parametrize("call, says", [
    (lambda a: parity.compare({"torch": {"logits": a}, "jax": {"logits": a}}),
     "result 1 ('torch') is a dict of 1 tensor(s) (['logits']), not one tensor"),
    (lambda a: parity.compare((a, a), (a, a)), "result 1 ('tuple') is a tuple of 2 tensor(s) ([0], [1])"),
    (lambda a: parity.compare(a, a, reference={"logits": a.astype(np.float64)}),
     "reference= is a dict of 1 tensor(s) (['logits'])"),
    (lambda a: parity.compare(a, a, reference=a.astype(np.float64), condition=[a, a, a, a, a]),
     "condition= is a list of 5 tensor(s) ([0], [1], [2], [3] and 1 more)"),
])
def test_a_tree_of_results_is_refused_naming_it_and_the_way_out(call, says):
    """A model's outputs (a dict, a tuple) are not one tensor: the error names the result (or the
    reference), what it holds, and the ways out, not "builtins.dict is not a tensor" (and, for a
    tuple, not numpy.asarray(x), which would stack the outputs into one array)."""
    with pytest.raises(bb.UnsupportedTypeError) as err:
        call(np.ones(3, BF16))
    msg = str(err.value)
    assert says in msg, msg
    assert "leaf by leaf" in msg and "parity.compare_outputs(reference, candidate)" in msg
    assert "numpy.asarray" not in msg
    # something holding no tensor is not a tree of results: the bridge's own error, its advice
    with pytest.raises(bb.UnsupportedTypeError, match="numpy.asarray"):
        parity.compare([1.0, 2.0], [1.0, 2.0])


@pytest.mark.frameworks("torch")
def test_a_result_that_requires_grad_is_compared_without_a_warning():
    """A comparison reads values: compare, like compare_outputs, takes a torch result that requires
    grad (the usual result of a model under test) detached, without warning that its gradient does
    not cross (warnings are errors here)."""
    import torch

    x = torch.randn(4, 4, dtype=torch.bfloat16, requires_grad=True)
    y = x * 2
    ref = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = parity.compare(y, y.detach().clone(), reference=ref, condition=ref.abs() + 1)
        out = parity.compare_outputs(ref, y)
    assert rep.identical_fraction == 1.0 and rep.pairs[0].passed and out.max_abs > 0
    assert y.requires_grad and y.grad_fn is not None  # the caller's tensor is as it was


def test_float64_results_near_the_top_of_the_range_compare_without_overflow():
    a = np.array([1e300, -1e300, 3e307])
    b = a * (1 + 2.0 ** -40)
    rep = parity.compare(a, b, reference=a.copy())  # warnings are errors: an overflow would raise
    p = rep.pairs[0]
    assert p.cosine == 1.0 and p.max_abs == float(np.max(np.abs(b - a)))
    want = float(np.sqrt(np.mean(((b - a) / 1e300) ** 2))) * 1e300
    assert p.rmse == pytest.approx(want, rel=1e-12)
    assert rep.references[0].rms_error == 0.0 and rep.references[1].rms_error == pytest.approx(want, rel=1e-12)
    assert parity.compare(a, -a).pairs[0].cosine == -1.0


def test_reference_with_condition_tames_cancellation():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 512)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((512, 16)).astype(ml_dtypes.bfloat16)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    y = (a64 @ b64).astype(np.float32).astype(ml_dtypes.bfloat16)
    rep = parity.compare({"y": y, "z": y.copy()}, reference=a64 @ b64, condition=np.abs(a64) @ np.abs(b64))
    r = rep.references[0]
    assert r.max_normalised is not None and r.max_normalised <= 1.0  # an error within bf16 rounding of |A||B|
    assert r.max_ulps_of_reference <= 0.5


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


@pytest.mark.frameworks("torch")
def test_compare_takes_any_framework_and_names_them():
    import jax.numpy as jnp
    import torch

    a = _rand()
    t = torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    j = jnp.asarray(a)
    rep = parity.compare(t, j, policy="exact")
    assert rep.passed and rep.pairs[0].label == "torch vs jax"


def test_assert_parity():
    a = _rand()
    b = a.copy()
    b.view(np.uint16)[0, 0] += 2
    parity.assert_parity(a, b, ulp=2)
    with pytest.raises(AssertionError, match=r"beyond ulp\(1\)") as err:
        parity.assert_parity(a, b, ulp=1)
    assert "[0, 0]" in str(err.value)


def test_the_fixture_runs_per_installed_framework(bf16_framework):
    a = _rand((4, 4))
    x = bb.convert(a, bf16_framework)
    parity.assert_parity(x, a, policy="exact")


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # parity.run runs every registered framework
@pytest.mark.parametrize("op", sorted(parity.OPS))
def test_every_builtin_op_runs_in_every_framework(op):
    rep = parity.run(op)
    assert "not run" not in rep.settings, rep.settings.get("not run")
    assert len(rep.pairs) == 3 and len(rep.references) == 3
    assert rep.settings["cpu_bf16"] and "torch_threads" in rep.settings
    for r in rep.references:  # each framework is a sane bf16 implementation of the op
        if r.p99_normalised is not None:  # ops that cancel: errors against the condition scale
            assert r.p99_normalised < 4, (op, r)
        else:  # flushing subnormal results to zero is allowed here (XLA and tensorflow do): judged elsewhere
            assert _p99_ulps_where_normal(rep, r.name) < 8, (op, r)


def _p99_ulps_where_normal(rep, name):
    ref = runner._unpack(rep.data["reference"]).reshape(-1)
    x = metrics.to_float64(runner._unpack(rep.data["results"][name])).reshape(-1)
    normal = np.isfinite(ref) & np.isfinite(x) & (np.abs(ref) >= 2.0 ** -126)
    return float(np.percentile(np.abs(x[normal] - ref[normal]) / metrics.ulp_of(ref[normal], "bfloat16"), 99))


def test_ties_inputs_put_exact_results_half_way_between_bf16_numbers():
    from bf16bridge.parity.ops import OPS

    o = OPS["matmul"]
    x = o.inputs(np.random.default_rng(0), "ties", o.params)
    a, b = (metrics.to_float64(x[k]) for k in ("a", "b"))
    exact = a @ b  # integers, exact in float64 (and in float32)
    assert np.all(exact == np.round(exact))
    rne = bb.kernels.to_bf16(exact.astype(np.float32))  # nearest, ties to even
    gap = np.abs(exact - metrics.to_float64(rne))
    ties = (gap > 0) & (gap == metrics.ulp_of(exact, "bfloat16") / 2)
    assert ties.sum() > 100, "the inputs must put many results exactly half-way"
    rep = parity.run("matmul", inputs=x, policy="exact")
    for name, packed in rep.data["results"].items():  # every framework rounds every tie to even
        got = runner._unpack(packed)
        np.testing.assert_array_equal(got.view(np.uint16), rne.view(np.uint16), err_msg=name)


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_matmul_agrees_with_the_reference_within_bf16_rounding():
    rep = parity.run("matmul", k=256, policy="reference(2)")
    assert rep.passed
    for r in rep.references:
        assert r.max_normalised <= 1.0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bf16bridge", "parity", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_cli_json_then_recheck_under_other_policies(tmp_path):
    path = tmp_path / "r.json"
    out = _cli("--ops", "softmax", "--format", "json", "--output", str(path))
    saved = json.loads(path.read_text())
    assert len(saved) == 2 and all(d["data"]["results"] for d in saved)
    assert out.returncode == (0 if all(d["passed"] for d in saved) else 1)
    n = max(d["smallest"]["ulp"] for d in saved)
    assert _cli("--recheck", str(path), "--policy", f"ulp({n})").returncode == 0
    assert n > 0, "jax's softmax differs from the others here (docs/parity.md): a recheck needs a gap to close"
    bad = _cli("--recheck", str(path), "--policy", f"ulp({n - 1})")
    assert bad.returncode == 1 and "FAILED" in bad.stdout


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_cli_html_and_markdown(tmp_path):
    # sums agree bit for bit here (docs/parity.md); exp does not (XLA and tensorflow flush subnormals)
    out = _cli("--ops", "sum", "--set", "cols=64", "--format", "html", "--output", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "ULP histogram" in page
    assert out.returncode == 0 and page.count("PASSED") == 3 and "FAILED" not in page
    md = _cli("--ops", "exp", "--format", "markdown")
    assert md.returncode == 1 and "FAILED" in md.stdout
    assert "| pair | 0 | 1 | 2 | 3 | 4-7 |" in md.stdout and "Worst regions" in md.stdout


# -- nothing compared never passes silently ------------------------------------------


@pytest.mark.parametrize("policy", ["ulp(1)", "exact", "allclose(0.1)", "torch", "reference(2, cap=none)"])
def test_one_result_and_a_reference_is_not_a_comparison(policy):
    ref = np.linspace(1, 2, 16)
    off = (ref + 4.0).astype(BF16)  # off by 4.0 everywhere
    rep = parity.compare({"torch": off}, reference=ref, policy=policy)
    assert not rep.passed and rep.pairs == ()
    assert "only 1 result (torch)" in rep.not_compared and "not compared" in str(rep)
    allowed = parity.compare({"torch": off}, reference=ref, policy=policy, allow_missing=True)
    assert allowed.passed and allowed.not_compared == rep.not_compared  # allowed, still said
    with pytest.raises(AssertionError, match="only 1 result"):
        parity.assert_parity({"torch": off}, reference=ref, policy=policy)


def _op_failing_in(broken: str):
    from bf16bridge.parity.ops import Op

    def boom(x, **p):
        raise RuntimeError("this framework cannot")

    return Op("twice", "2x", lambda rng, kind, p: {"x": _rand((8, 8))}, lambda x, **p: 2 * x,
              {"numpy": lambda x, **p: x * np.asarray(2, x.dtype), "torch": lambda x, **p: x * 2, broken: boom})


@pytest.mark.parametrize("frameworks,missing", [
    pytest.param(["numpy", "torch", "jax"], "jax (RuntimeError: this framework cannot)",  # raised inside run()
                 marks=pytest.mark.frameworks("torch", "jax")),
    pytest.param(["numpy", "torch", "tensorflow"], "tensorflow (no definition of this op)",
                 marks=pytest.mark.frameworks("torch", "tensorflow")),
])
def test_run_with_a_framework_that_did_not_run_fails_unless_allowed(frameworks, missing):
    op = _op_failing_in("jax")
    rep = parity.run(op, frameworks=frameworks)
    assert rep.pairs and all(p.passed for p in rep.pairs), "the two that ran agree"
    assert not rep.passed and missing in rep.not_compared and missing.split(" (")[0] in rep.settings["not run"]
    assert parity.run(op, frameworks=frameworks, allow_missing=True).passed


@pytest.mark.frameworks("jax", "tensorflow")
def test_a_case_no_framework_ran_is_a_failing_report_not_an_error():
    rep = parity.run(_op_failing_in("jax"), frameworks=["jax", "tensorflow"])
    assert not rep.passed and rep.pairs == () and rep.references == ()
    assert "jax (RuntimeError: this framework cannot)" in rep.not_compared and "only 0 results" in rep.not_compared


@pytest.mark.parametrize("kwargs, says", [
    (dict(op="nosuch"), "unknown op 'nosuch'; built-in ops: matmul"),
    (dict(op="matmul", kind="weird"), "matmul takes the input kinds normal, wide, cancel, ties; got 'weird'"),
    (dict(op="exp", kind="normal"), "exp takes the input kinds all; got 'normal'"),
    (dict(op="matmul", inputs={"x": np.ones((2, 2), BF16)}), "matmul takes the inputs a, b"),
    (dict(op="sum", kk=3), "no op of this run has the size kk; the sizes each op takes: sum rows, cols"),
    (dict(op="sum", cols=0), "a size is a whole number >= 1; got cols=0"),
    (dict(op="sum", cols=2.5), "a size is a whole number >= 1; got cols=2.5"),
    (dict(op="sum", frameworks=[]), "run sum: no frameworks to run it in"),
])
def test_run_arguments_that_do_not_fit_are_our_errors_before_anything_runs(monkeypatch, kwargs, says):
    monkeypatch.setattr(runner, "convert", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(bb.InvalidArgumentError) as err:
        parity.run(**{"frameworks": ["torch", "jax"], **kwargs})
    assert says in str(err.value), str(err.value)


def test_recheck_keeps_what_did_not_run(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(runner.dumps([parity.run(_op_failing_in("jax"), frameworks=["numpy", "torch", "jax"])]))
    again = runner.recheck(path, "ulp(3)")[0]
    assert not again.passed and "jax (RuntimeError" in again.not_compared
    assert runner.recheck(path, "ulp(3)", allow_missing=True)[0].passed


def test_unknown_framework_is_our_error():
    with pytest.raises(bb.UnknownFrameworkError, match="choose one of"):
        parity.run("sum", frameworks=["torch", "mxnet"])


# -- frameworks and their settings come from the registry ----------------------------


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # the registered ones
def test_default_frameworks_are_the_registered_ones_that_compute(monkeypatch):
    from bf16bridge.core import registry
    from bf16bridge.core.adapter import Adapter

    from bf16bridge.adapters.hooks import NumericsHooks

    want = [n for n in registry.names() if registry.hooks(n, NumericsHooks).computes]
    assert runner.default_frameworks() == want and "numpy" not in want and len(want) >= 3

    class Fake(Adapter):
        name = "fake"
        computes = True

    names, hooks = registry.names, registry.hooks
    monkeypatch.setattr(registry, "names", lambda: names() + ["fake"])
    monkeypatch.setattr(registry, "hooks", lambda n, kind: Fake() if n == "fake" else hooks(n, kind))
    assert runner.default_frameworks() == want + ["fake"]


@pytest.mark.frameworks("torch")
def test_settings_ask_each_imported_framework_its_numerics():
    import torch  # imported: its numerics are asked

    from bf16bridge.core import registry

    s = runner.settings(["torch"])
    from bf16bridge.adapters.hooks import NumericsHooks

    for k, v in registry.hooks("torch", NumericsHooks).numerics().items():
        assert s[k] == v
    assert s["torch_threads"] == torch.get_num_threads()


# -- where the errors live: worst regions over every input value ----------------------


def _every_bf16():
    from bf16bridge.parity.ops import _every_bf16 as every

    return every()


def test_worst_regions_find_injected_faults_with_their_interval_and_values():
    from bf16bridge.parity import regions

    x = _every_bf16()
    ref = metrics.to_float64(x) * 0.5  # an op: x / 2 (the reference is exact)
    good = metrics.round_to(ref, x.dtype).astype(x.dtype)
    bad = good.copy()
    xs = metrics.to_float64(x)
    band = (xs >= 2.0) & (xs < 4.0)  # one binade of inputs: 2 ULPs off
    bad.view(np.uint16)[band] += 2
    top = xs > 1e38  # overflow to inf near the top of the range
    bad[top] = np.inf
    found = regions.find(x, {"good": good, "bad": bad}, ref, parity.parse("ulp(1)"))
    assert {g.result for g in found} == {"bad"}, "a correctly rounded result has no region"
    by_lo = sorted(found, key=lambda g: g.lo)
    assert len(by_lo) == 2
    mid, hi = by_lo
    assert (mid.lo, mid.hi, mid.exceeding, mid.inputs, mid.nonfinite) == (2.0, float(xs[band].max()), 128, 128, 0)
    assert mid.ulps == 2 and 2.0 <= mid.input < 4.0
    assert dict(mid.values)["good"] == pytest.approx(0.5 * mid.input, rel=2 ** -8)
    assert mid.reference == 0.5 * mid.input
    assert hi.nonfinite == hi.exceeding == int(top.sum()) and hi.ulps is None and dict(hi.values)["bad"] == np.inf
    assert hi.lo == float(xs[top].min()) and hi.hi == float(xs.max())
    # a policy that allows 2 ULPs keeps only the overflow
    assert [g.nonfinite > 0 for g in regions.find(x, {"bad": bad}, ref, parity.parse("ulp(2)"))] == [True]


def test_worst_regions_under_exact_compare_bits_nan_payloads_and_signed_zeros_included():
    """exact is bits, in regions as in compare: a NaN whose payload (or sign) differs from the rounded
    reference's NaN once passed, and so did the region it was in."""
    from bf16bridge.parity import regions

    x = _every_bf16()
    xs = metrics.to_float64(x)
    band = (xs >= 8.0) & (xs < 16.0)
    ref = np.where(band, np.nan, xs)  # an op whose answer is NaN over one binade of inputs
    good = metrics.round_to(ref, x.dtype).astype(x.dtype)
    assert set(good.view(np.uint16)[band]) == {0x7FC0}
    bad = good.copy()
    u = bad.view(np.uint16)
    idx = np.flatnonzero(band)
    u[idx[::2]] = 0x7FC1  # another payload
    u[idx[1::2]] = 0xFFC0  # the sign bit set (torch's vectorised code writes 0xFFFF)
    assert regions.find(x, {"good": good}, ref, parity.parse("exact")) == ()
    (g,) = regions.find(x, {"bad": bad}, ref, parity.parse("exact"))
    assert (g.lo, g.hi, g.exceeding, g.nonfinite, g.ulps) == (8.0, float(xs[band].max()), idx.size, idx.size, None)
    # NaN in the same places passes every policy but exact, and compare agrees on both
    assert regions.find(x, {"bad": bad}, ref, parity.parse("ulp(0)")) == ()
    assert not parity.compare(good, bad, policy="exact").passed
    assert parity.compare(good, bad, policy="ulp(0)").passed
    # -0 against +0: exact flags it, ulp(0) does not
    zeros = bad.copy()
    zeros.view(np.uint16)[band] = 0x7FC0
    zeros.view(np.uint16)[xs == 0] ^= 0x8000
    (z,) = regions.find(x, {"zeros": zeros}, ref, parity.parse("exact"))
    assert (z.lo, z.hi, z.exceeding, z.nonfinite, z.ulps) == (0.0, 0.0, 2, 0, 0.0)
    assert regions.find(x, {"zeros": zeros}, ref, parity.parse("ulp(0)")) == ()
    # the torch policy (equal_nan=false) counts a NaN close to nothing, even the reference's own
    (t,) = regions.find(x, {"good": good}, ref, parity.parse("torch"))
    assert (t.lo, t.exceeding, t.nonfinite) == (8.0, idx.size, idx.size)
    assert regions.find(x, {"good": good}, ref, parity.parse("jax")) == ()


def _with_regions():
    from bf16bridge.parity import regions

    x = _every_bf16()
    ref = metrics.to_float64(x)
    good = x.copy()
    bad = good.copy()
    bad.view(np.uint16)[(ref > 1) & (ref < 2)] += 3
    rep = parity.compare({"a": good, "b": bad}, reference=ref, op="identity [all]")
    return replace(rep, worst_regions=regions.find(x, {"a": good, "b": bad}, ref, parity.parse(rep.policy)))


def test_worst_regions_are_printed_and_in_json_markdown_html():
    from bf16bridge.parity import render

    rep = _with_regions()
    (g,) = rep.worst_regions
    assert g.result == "b" and g.exceeding == 127 and g.ulps == 3
    text = str(rep)
    assert "exceeds ulp(1)" in text and "b: x in [1.0078125, 1.9921875]: 127 of 127 inputs exceed" in text
    d = json.loads(runner.dumps([rep]))[0]
    assert d["worst_regions"][0]["lo"] == 1.0078125 and d["worst_regions"][0]["values"] == [["a", g.input],
                                                                                          ["b", g.values[1][1]]]
    assert "| b | 1.01 | 1.99 | 127 | 127 |" in render.markdown(rep)
    assert "<td>1.99</td><td>127</td>" in render.html(rep)
    assert "b: [1.01, 1.99] 127/127" in render.summary([rep])


def test_run_over_every_input_value_reports_regions_and_recheck_keeps_them(tmp_path):
    rep = parity.run("log")
    assert rep.data["input"] and rep.worst_regions
    for g in rep.worst_regions:
        assert g.lo <= g.input <= g.hi and 0 < g.exceeding <= g.inputs
        assert g.ulps is None or g.ulps > 1  # the representative itself exceeds ulp(1)
    path = tmp_path / "r.json"
    path.write_text(runner.dumps([rep]))
    assert runner.recheck(path, rep.policy)[0].worst_regions == rep.worst_regions
    loose = runner.recheck(path, "ulp(100000)")[0].worst_regions
    assert loose and all(g.nonfinite == g.exceeding for g in loose), "no tolerance excuses NaN/inf"


# -- results in every narrow dtype: ULPs in the result's own format ------------------------

#: the narrow dtypes numpy holds here: parity compares arrays, and an ml_dtypes without a row (0.3.1: fp6,
#: fp4, int2, e8m0...) has none of it (test_dtypes.py asserts our error naming the ml_dtypes that has it)
NARROW = [n for n in bb.kernels.KERNEL_DTYPES if n != "bfloat16" and numpy_holds(n)]

# (a bits, b bits, ULP distance in the dtype's own format; None: a NaN/inf disagreement)
KNOWN_ULPS = {
    "float8_e4m3fn": [(0x38, 0x39, 1), (0x01, 0x81, 2), (0x00, 0x80, 0), (0x7E, 0x7B, 3), (0xFE, 0x7E, 252),
                      (0x7F, 0x7E, None)],
    "float8_e5m2": [(0x3C, 0x3D, 1), (0x01, 0x81, 2), (0x00, 0x80, 0), (0x7B, 0x78, 3), (0xFB, 0x7B, 246),
                    (0x7C, 0x7B, None)],
    "float8_e4m3fnuz": [(0x40, 0x41, 1), (0x01, 0x81, 2), (0x7F, 0x7C, 3), (0xFF, 0x7F, 254), (0x80, 0x00, None)],
    "float8_e5m2fnuz": [(0x40, 0x41, 1), (0x01, 0x81, 2), (0x7F, 0x7C, 3), (0xFF, 0x7F, 254), (0x80, 0x00, None)],
    "float8_e8m0fnu": [(0x7F, 0x80, 1), (0x00, 0xFE, 254), (0xFF, 0x7F, None)],
    "float8_e4m3": [(0x38, 0x39, 1), (0x01, 0x81, 2), (0x00, 0x80, 0), (0x77, 0x74, 3), (0xF7, 0x77, 238),
                    (0x78, 0x77, None)],
    "float8_e3m4": [(0x30, 0x31, 1), (0x01, 0x81, 2), (0x00, 0x80, 0), (0x6F, 0x6C, 3), (0xEF, 0x6F, 222),
                    (0x70, 0x6F, None)],
    "float8_e4m3b11fnuz": [(0x58, 0x59, 1), (0x01, 0x81, 2), (0x7F, 0x7C, 3), (0xFF, 0x7F, 254), (0x80, 0x00, None)],
    "float6_e2m3fn": [(0x08, 0x09, 1), (0x01, 0x21, 2), (0x00, 0x20, 0), (0x1F, 0x1C, 3), (0x3F, 0x1F, 62)],
    "float6_e3m2fn": [(0x0C, 0x0D, 1), (0x01, 0x21, 2), (0x00, 0x20, 0), (0x1F, 0x1C, 3), (0x3F, 0x1F, 62)],
    "float4_e2m1fn": [(0x2, 0x3, 1), (0x1, 0x9, 2), (0x0, 0x8, 0), (0x7, 0x4, 3), (0xF, 0x7, 14)],
    "int4": [(0x8, 0x7, 15), (0xF, 0x1, 2), (0x0, 0x0, 0), (0xE, 0xF, 1)],
    "uint4": [(0x0, 0xF, 15), (0x7, 0x8, 1)],
    "int2": [(0x2, 0x1, 3), (0x3, 0x0, 1)],
    "uint2": [(0x0, 0x3, 3), (0x1, 0x2, 1)],
}


def _patterns(name, codes):
    return np.array(codes, dtype=np.uint8).view(getattr(ml_dtypes, name))


@pytest.mark.parametrize("name", NARROW)
def test_ordered_mapping_steps_one_value_at_a_time_in_every_narrow_dtype(name):
    """Over every pattern: sorted by key, values never decrease, equal keys are equal values
    (+0 and -0 share 0), and neighbouring values are exactly one step apart."""
    bits = bb.kernels.FORMATS[name].bits
    a = _patterns(name, np.arange(1 << bits))
    finite = metrics.classify(a)["finite"]
    vals, keys = a[finite].astype(np.float64), metrics.ordered(a)[finite]
    assert np.array_equal(np.isfinite(a.astype(np.float64)), finite)
    order = np.argsort(keys, kind="stable")
    assert np.all(np.diff(vals[order]) >= 0)
    uk, first = np.unique(keys, return_index=True)
    assert np.all(np.diff(uk) == 1), "neighbouring values are one ULP apart"
    assert np.unique(vals).size == uk.size, "one key per value"


@pytest.mark.parametrize("name", NARROW)
def test_known_ulp_distances_in_each_narrow_dtype(name):
    rows = KNOWN_ULPS[name]
    a = _patterns(name, [r[0] for r in rows])
    b = _patterns(name, [r[1] for r in rows])
    finite = metrics.classify(a)["finite"] & metrics.classify(b)["finite"]
    d = metrics.ulp_distance(a, b)
    assert [int(x) if f else None for x, f in zip(d, finite)] == [r[2] for r in rows]
    p = parity.compare({"a": a, "b": b}, policy="ulp(1000)").pairs[0]
    want = [r[2] for r in rows]
    assert p.max_ulp == max(w for w in want if w is not None)
    assert p.nonfinite_mismatches == want.count(None) and p.dtype == name


@pytest.mark.parametrize("name, negzero_pattern, is_nan", [c for c in [
    ("float8_e4m3fn", 0x80, False), ("float8_e4m3fnuz", 0x80, True), ("float8_e5m2fnuz", 0x80, True),
    ("float4_e2m1fn", 0x8, False), ("float6_e3m2fn", 0x20, False),
] if numpy_holds(c[0])])
def test_fnuz_nan_is_not_a_negative_zero(name, negzero_pattern, is_nan):
    a, b = _patterns(name, [0]), _patterns(name, [negzero_pattern])
    p = parity.compare(a, b, policy=parity.ulp(0, signed_zeros=True)).pairs[0]
    assert (p.nan_mismatches, p.signed_zero_mismatches) == ((1, 0) if is_nan else (0, 1))
    assert not parity.compare(a, b, policy=parity.ulp(0, signed_zeros=True)).passed


def test_float32_against_fp8_is_rounded_to_fp8_and_measured_in_its_ulps():
    f = np.array([1.0, 1.0, 448.0, -3.0], dtype=F32)
    q = _patterns("float8_e4m3fn", [0x38, 0x3A, 0x7E, 0xC4])  # 1.0, 1.25, 448, -3.0 in e4m3fn
    rep = parity.compare({"f32": f, "fp8": q}, policy="ulp(2)")
    p = rep.pairs[0]
    assert p.note == "float32 side rounded to float8_e4m3fn (nearest-even) to compare in float8_e4m3fn ULPs"
    assert p.dtype == "float8_e4m3fn" and p.max_ulp == 2 and rep.passed
    assert not parity.compare({"f32": f, "fp8": q}, policy="ulp(1)").passed


def test_fp8_results_against_a_float64_reference():
    x = np.array([1.0, 2.0, 500.0, 0.1], dtype=np.float64)  # 500 is past e4m3fn's 448: held as NaN
    q = bb.kernels.to_dtype(x.astype(F32), "float8_e4m3fn")
    rep = parity.compare({"a": q, "b": q.copy()}, reference=x, policy="reference(1.5)")
    assert [r.nonfinite_mismatches for r in rep.references] == [0, 0]
    assert rep.passed and rep.max_ulp == 0


@pytest.mark.parametrize("name", [n for n in NARROW if not bb.kernels.FORMATS[n].integer])
def test_worst_regions_over_every_pattern_of_a_narrow_float(name):
    """regions.find takes narrow-float inputs and groups them by the format's own binades (its
    mantissa bits): the lowest and highest inputs of [1, 2) one pattern off are one region over
    that binade; the lowest of [4, 8), past a clean binade, is a second region."""
    from bf16bridge.parity import regions

    x = np.arange(1 << bb.kernels.FORMATS[name].bits, dtype=np.uint8).view(getattr(ml_dtypes, name))
    xs = metrics.to_float64(x)
    ones = np.flatnonzero((xs >= 1.0) & (xs < 2.0))
    fours = np.flatnonzero((xs >= 4.0) & (xs < 8.0))
    one_hi = ones[np.argmax(xs[ones])]
    # the identity, correctly rounded: NaN inputs of any payload give the format's own NaN (under
    # exact, a NaN's bits count: an input's payload echoed back differs from the rounded reference's)
    good = metrics.round_to(xs, x.dtype).astype(x.dtype)
    bad = good.copy()
    bad.view(np.uint8)[[np.flatnonzero(xs == 1.0)[0], one_hi, np.flatnonzero(xs == 4.0)[0]]] += 1  # the next value up
    found = regions.find(x, {"good": good, "bad": bad}, xs, parity.parse("exact"))
    assert [(g.result, g.lo, g.hi, g.exceeding, g.inputs, g.ulps, g.nonfinite) for g in found] == [
        ("bad", 1.0, float(xs[one_hi]), len({1.0, float(xs[one_hi])}), ones.size, 1, 0),
        ("bad", 4.0, 4.0, 1, 1, 1, 0)], [(g.lo, g.hi, g.exceeding, g.inputs) for g in found]
    # and the groups are the binades: for the normal values, one key per sign and exponent
    fmt = bb.kernels.FORMATS[name]
    normal = np.isfinite(xs) & (np.abs(xs) >= 2.0 ** (1 - fmt.bias))
    keys = regions._binade(x)[normal]
    binades = np.signbit(xs[normal]) * 1000 + np.frexp(xs[normal])[1]
    pairs = set(zip(keys.tolist(), binades.tolist()))
    assert len(pairs) == len(set(keys.tolist())) == len(set(binades.tolist())) >= 4


# -- verdicts at the edges: reference(k)'s floor, torch's own arithmetic, units, integers, mixed dtypes --

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


@pytest.mark.parametrize("name,half_max", [("float32", 0.5), ("float16", 0.5), ("bfloat16", 0.5),
                                           ("float8_e4m3fn", 0.5), ("float8_e5m2", 0.5)])
def test_errors_against_the_reference_are_in_the_results_own_ulps(name, half_max):
    """A result correctly rounded to its dtype is within half an ULP of the reference in that dtype's
    ULPs (they were bf16 ULPs for every dtype: a float32 result read 8e-6), and within u * condition
    with u its own unit roundoff; the report names the unit."""
    ref = np.random.default_rng(12).uniform(0.5, 100, 4096) * np.random.default_rng(13).choice([1, -1], 4096)
    dt = np.dtype(getattr(ml_dtypes, name, None) or name)
    x = metrics.round_to(ref, dt).astype(dt)
    rep = parity.compare({"a": x, "b": x.copy()}, reference=ref, condition=np.abs(ref), policy="ulp(0)")
    r = rep.references[0]
    assert r.ulp_unit == name
    assert half_max * 0.9 < r.max_ulps_of_reference <= half_max, r.max_ulps_of_reference
    assert 0.45 < r.max_normalised <= 1.0, r.max_normalised
    assert "ulps of" in str(rep) and f" {name} " in str(rep).split("ulps of", 1)[1]


def test_float32_against_an_int_is_rounded_to_nearest_and_what_int_cannot_hold_is_a_mismatch():
    """A quantised int is the float rounded to nearest (ties to even): 2.9999 against 3 is 0 steps, not 1
    (truncation); 100, NaN and inf, which int4 cannot hold (astype wraps 100 to 4 and NaN to 0), are
    NaN/inf mismatches, not small distances."""
    f = np.array([2.9999, 3.5, 2.5, -2.6, 7.4, -8.4, 0.49], F32)
    q = np.array([3, 4, 2, -3, 7, -8, 0], ml_dtypes.int4)
    p = parity.compare({"f": f, "q": q}, policy="ulp(0)").pairs[0]
    assert (p.max_ulp, p.nonfinite_mismatches) == (0, 0) and "nearest, ties to even" in p.note
    assert parity.compare({"f": f, "q": q}, policy="ulp(0)").passed
    assert not parity.compare({"f": f + np.float32(0.6), "q": q}, policy="ulp(0)").passed  # a step off
    f = np.array([100.0, np.nan, np.inf, -9.0, 1.0], F32)
    q = np.array([7, 0, 7, -8, 1], ml_dtypes.int4)
    rep = parity.compare({"f": f, "q": q}, policy="ulp(15)")
    p = rep.pairs[0]
    assert (p.nonfinite_mismatches, p.nan_mismatches, p.inf_mismatches, p.finite_compared) == (4, 1, 3, 1)
    assert "4 of its element(s) are NaN, infinite or beyond int4's range [-8, 7]" in p.note and not rep.passed
    assert [e.index for e in p.worst[:4]] == [(0,), (1,), (2,), (3,)] and p.worst[0].a == 100.0
    # a float64 reference is held in an int result's dtype the same way (the nearest it holds, saturated),
    # so its NaN/inf count and reference(k)'s floor are not astype's wrapped values (100 was int4's 4)
    held = metrics.rounded(np.array([2.9999, 100.0, -100.0, 2.5, np.inf]), "int4")
    assert held.astype(int).tolist() == [3, 7, -8, 2, 7]
    rep = parity.compare({"a": q, "b": q.copy()}, reference=f.astype(np.float64), policy="reference(1)")
    assert rep.references[0].rounding_rms == rep.references[0].rms_error > 0


def test_allclose_judges_mixed_dtypes_on_their_values_not_rounded_to_one():
    """A float32 1.0039 rounds to bf16 1.0: allclose(1e-3) passed it against a bf16 1.0, whose values
    are 0.39% apart. allclose takes each result as given (float32 3.4e38 against bf16's largest,
    3.39e38, is close though it rounds to inf); ULPs stay in the coarser dtype."""
    one = np.array([1.0], BF16)
    rep = parity.compare({"f32": np.array([1.0039], F32), "bf16": one}, policy="allclose(1e-3)")
    assert not rep.passed and rep.pairs[0].max_abs == pytest.approx(0.0039, rel=1e-4)
    assert rep.pairs[0].max_ulp == 0  # in bf16 ULPs: it rounds to 1.0
    assert parity.compare({"f32": np.array([1.0004], F32), "bf16": one}, policy="allclose(1e-3)").passed
    top = np.array([ml_dtypes.finfo(BF16).max], BF16)
    big = np.array([3.4e38], F32)
    assert parity.compare({"f32": big, "bf16": top}, policy="allclose(1.6e-2)").passed
    assert not parity.compare({"f32": big, "bf16": top}, policy="ulp(1)").passed  # inf in bf16


@pytest.mark.parametrize("kind", ["bfloat16", "float16", *(k for k, f in bb.kernels.FORMATS.items()
                                                           if not f.integer and numpy_holds(k))])
def test_ulp_of_is_each_format_s_own_spacing_at_every_value(kind):
    # every positive finite value of the format, against the gap to the next one (e8m0, with no
    # subnormals, has a number at its exponent field 0: its spacing there was taken as twice that)
    bits = (1 << bb.kernels.FORMATS[kind].bits) if kind in bb.kernels.FORMATS else 1 << 16
    dt = np.dtype(getattr(ml_dtypes, kind, None) or kind)
    raw = np.arange(bits, dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    with np.errstate(invalid="ignore"):  # (the NaN patterns)
        v = np.unique(raw.view(dt).astype(np.float64))
    v = v[np.isfinite(v) & (v > 0)]
    np.testing.assert_array_equal(metrics.ulp_of(v[:-1], kind), np.diff(v))
