"""What rounding explains (parity.explain, the default policy's measure): its scales, its rules for NaN,
infinity, underflow and flushed inputs, what compare() hands it (condition= without a reference, inputs=,
a reference that is a function of the inputs), and the worst regions of a user's own elementwise op."""

import json
import math
import re
import warnings

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import explain, metrics, runner
from conftest import BF16

BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
TINY = 2.0 ** -126


def _bf(*values):
    return np.array(values, dtype=np.float32).astype(BF16)


# -- the scale: next to zero against the tensor's, well away from it against the element's own ------


def test_a_sign_flip_next_to_zero_is_explained_a_flushed_element_away_from_zero_is_not():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1000).astype(BF16)
    near = int(np.argmin(np.abs(a.astype(np.float32))))
    flip = a.copy()
    flip[near] = -a[near]  # a sign flip next to zero: thousands of ULPs, nothing in the tensor's scale
    e = explain.pair(a, flip)
    assert e.passed and e.scale == "magnitude + RMS" and e.elementwise < 1, e
    assert parity.compare(a, flip, policy="ulp(1)").max_ulp > 1000
    far = int(np.argmax(np.abs(a.astype(np.float32))))
    zeroed = a.copy()
    zeroed[far] = 0
    e = explain.pair(a, zeroed)
    assert not e.passed and e.decided_by == "elementwise" and e.worst == (far,) and e.elementwise > 100, e
    # elementwise=True: each element against its own magnitude, so the flip fails
    assert not explain.pair(a, flip, elementwise=True).passed


def test_a_scale_error_spread_over_every_element_fails_normwise():
    a = np.random.default_rng(1).standard_normal(4096).astype(BF16)
    e = explain.pair(a, (a.astype(np.float32) * 1.08).astype(BF16))
    assert not e.passed and e.decided_by == "normwise" and 16 < e.normwise and e.elementwise <= 16, e
    assert "an error spread over many elements" in e.why
    assert explain.pair(a, (a.astype(np.float32) * 1.01).astype(BF16)).passed  # within 16 roundings: can't see it


def test_the_condition_scale_explains_errors_in_proportion_to_the_terms():
    """A dot product errs in proportion to its terms, not its result: condition= (|A|.|B|) carries that;
    judged against the results' own magnitudes instead, the same errors are beyond the budget."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((64, 8)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    cond = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    off = exact + 3 * 2.0 ** -8 * cond * np.where(np.arange(64).reshape(8, 8) % 2, 1, -1)
    y, z = exact.astype(np.float32).astype(BF16), off.astype(np.float32).astype(BF16)
    assert explain.pair(y, z, condition=cond).passed
    assert not explain.pair(y, z, elementwise=True).passed
    assert parity.compare(y, z, condition=cond).passed  # condition= without a reference: the rounding policy reads it
    with pytest.raises(bb.InvalidArgumentError, match="condition= scales errors against reference= or under the "
                                                      "rounding policy; ulp\\(1\\) reads neither"):
        parity.compare(y, z, condition=cond, policy="ulp(1)")


# -- NaN, infinity, underflow, flushed inputs ----------------------------------------------------


@pytest.mark.parametrize("a, b, explained, counted", [
    (3.0e38, math.inf, True, "overflowed"),  # over half the largest value: an intermediate overflowing
    (1.0e38, math.inf, False, None),
    (-3.0e38, math.inf, False, None),  # the other sign
    (math.nan, math.nan, True, None),
    (math.nan, 1.0, False, None),
    (math.inf, math.inf, True, None),
    (-math.inf, math.inf, False, None),
])
def test_nan_and_infinity_are_explained_only_where_rounding_explains_them(a, b, explained, counted):
    x, y = _bf(a, 1.0), _bf(b, 1.0)
    e = explain.pair(x, y)
    assert e.passed is explained and (e.nonfinite == 0) is explained, e
    if counted:
        assert getattr(e, counted) == 1 and "an intermediate overflows" in e.why
    if not explained:
        assert e.decided_by == "non-finite" and "no rounding explains it" in e.why


def test_against_a_reference_only_the_results_infinity_is_an_overflow():
    ref = np.array([2.0e38, 1.0e38, -math.inf])
    e = explain.against(_bf(math.inf, 1.0e38, -math.inf), ref)
    assert e.passed and e.overflowed == 1
    assert not explain.against(_bf(math.inf, math.inf, -math.inf), ref).passed
    assert not explain.against(_bf(2.0e38, 1.0e38, -3.0e38), ref).passed  # finite where the answer is -inf


def test_a_subnormal_result_flushed_to_zero_is_explained_a_normal_one_is_not():
    ref = np.array([1e-39, 2.0 ** -120, 1.0])
    e = explain.against(_bf(0.0, 2.0 ** -120, 1.0), ref, elementwise=True)
    assert e.passed and e.underflowed == 1 and "within bf16's smallest normal" in e.why, e
    assert not explain.against(_bf(1e-39, 0.0, 1.0), ref, elementwise=True).passed


def test_a_result_at_a_subnormal_input_matching_the_op_at_zero_is_explained_given_the_flushed_reference():
    x = _bf(1e-39, 1e-40, 1.0, 2.0)
    with np.errstate(divide="ignore"):
        flushed_result = np.log(np.where(metrics.classify(x)["subnormal"], 0.0, metrics.to_float64(x))).astype(
            np.float32).astype(BF16)  # what a framework flushing subnormal inputs returns: -inf
        ref = np.log(metrics.to_float64(x))
        flushed = np.log(np.where(metrics.classify(x)["subnormal"], 0.0, metrics.to_float64(x)))
    assert not explain.against(flushed_result, ref).passed
    e = explain.against(flushed_result, ref, flushed=flushed, inputs=x)
    assert e.passed and e.flushed_inputs == 2 and "inputs flushed" in e.why
    # compare() computes the flushed reference itself from a reference that is a function of inputs=
    rep = parity.compare({"daz": flushed_result}, inputs=x, reference=np.log, allow_missing=True)
    assert rep.passed and rep.references[0].explained.flushed_inputs == 2
    assert not parity.compare({"daz": flushed_result}, inputs=x, reference=ref, allow_missing=True).passed


def test_values_near_the_top_of_float64_give_no_warning():
    a = np.array([1e308, -1e308, 1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert explain.pair(a, a.copy()).passed
        assert not explain.pair(a, -a).passed


def test_results_of_two_dtypes_are_judged_in_the_coarser():
    x = np.random.default_rng(3).standard_normal(256)
    e = explain.pair(x.astype(np.float32), x.astype(np.float32).astype(BF16))
    assert e.passed and e.unit == "bfloat16" and e.elementwise <= 1
    assert not explain.pair(x.astype(np.float32), (x * (1 + 2 ** -16)).astype(np.float32), elementwise=True).passed


def test_the_smallest_passing_k_is_reported():
    a = np.random.default_rng(4).standard_normal(512).astype(BF16)
    b = (a.astype(np.float32) * 1.02).astype(BF16)
    rep = parity.compare(a, b)
    k = rep.smallest["rounding_k"]
    assert rep.passed and 1 < k < 8 and f"rounding({k:.3g})" in str(rep)
    assert not parity.compare(a, b, policy=f"rounding({k * 0.9})").passed and parity.compare(
        a, b, policy=f"rounding({k * 1.01})").passed


@pytest.mark.parametrize("text, why", [("rounding(0.5)", "k >= 1"), ("rounding(1, 2)", "at most 1 argument"),
                                       ("rounding(inf)", "must be finite"), ("rounding(k=x)", "must be a number")])
def test_a_rounding_policy_that_makes_no_sense_is_refused(text, why):
    with pytest.raises(parity.PolicyError, match=re.escape(why)):
        parity.parse(text)
    assert parity.parse("rounding") == parity.parse("rounding(8)") == parity.rounding(8)


@pytest.mark.parametrize("kwargs, says", [
    (dict(reference=np.exp), "reference= is a function; give inputs= too"),
    (dict(inputs=np.ones(3, BF16)), "inputs= has shape (3,), no result has it"),
    (dict(inputs=np.ones(4, BF16), reference=lambda v: v[:2]), "gave shape (2,) for inputs of shape (4,)"),
    (dict(inputs=np.ones(4, BF16), reference=lambda v: 1 / 0), "raised ZeroDivisionError on the inputs"),
])
def test_what_compare_cannot_use_is_our_error(kwargs, says):
    a = np.ones(4, BF16)
    with pytest.raises(bb.InvalidArgumentError) as err:
        parity.compare(a, a.copy(), **kwargs)
    assert says in str(err.value), str(err.value)


# -- worst regions of a user's own elementwise op (compare(..., inputs=)) ---------------------------


def _every_finite_bf16():
    a = bb.core.dtypes.all_bf16_patterns()
    return a[(a.view(np.uint16) & 0x7F80) != 0x7F80]


def _softplus64(v):
    return np.logaddexp(0.0, v)


def test_a_planted_fault_in_a_users_elementwise_op_is_found_by_input_region():
    """Every finite bf16 input of softplus, correctly rounded, against the same with a fault planted
    over [2, 4): without inputs= there are no regions (only the built-in ops had them); with inputs=,
    the pair's region, and with a reference (a function of the inputs) the faulty result's."""
    x = _every_finite_bf16()
    xs = metrics.to_float64(x)
    with np.errstate(over="ignore"):
        good = _softplus64(xs).astype(np.float32).astype(BF16)
    bad = good.copy()
    planted = (xs >= 2) & (xs < 4)
    bad[planted] = (good[planted].astype(np.float32) * 1.1).astype(BF16)
    assert parity.compare(good, bad).worst_regions == ()
    rep = parity.compare({"good": good, "bad": bad}, inputs=x)
    assert not rep.passed
    (g,) = rep.worst_regions
    assert (g.result, g.lo, g.hi, g.exceeding, g.inputs) == ("good vs bad", 2.0, float(xs[planted].max()),
                                                             int(planted.sum()), int(planted.sum()))
    assert "good vs bad: x in [2, 3.984375]" in str(rep) and "where two results differ beyond rounding(8)" in str(rep)
    with np.errstate(over="ignore"):
        rep = parity.compare({"good": good, "bad": bad}, inputs=x, reference=_softplus64)
    (g,) = rep.worst_regions
    assert g.result == "bad" and (g.lo, g.exceeding) == (2.0, int(planted.sum())) and not math.isnan(g.reference)
    assert [r.passed for r in rep.references] == [True, False]
    rep = parity.compare({"good": good, "bad": bad}, inputs=x, policy="ulp(3)")  # any policy: its own regions
    assert rep.worst_regions and rep.worst_regions[0].lo == 2.0


@pytest.mark.frameworks("torch", "jax")
def test_a_planted_fault_in_a_torch_op_over_every_bf16_input_is_found():
    import jax
    import torch

    x = _every_finite_bf16()
    y_jax = jax.nn.softplus(bb.to_jax(x))
    y_torch = torch.nn.functional.softplus(bb.to_torch(x))
    ok = parity.compare(y_torch, y_jax, inputs=x)
    assert ok.passed and ok.worst_regions == (), [str(g) for g in ok.worst_regions]
    xt = bb.to_torch(x)
    faulty = torch.where((xt > -3) & (xt < -1), y_torch * 0.9, y_torch)
    rep = parity.compare(faulty, y_jax, inputs=x)
    assert not rep.passed and [(g.result, g.lo, g.hi) for g in rep.worst_regions] == [
        ("torch vs jax", -2.984375, -1.0078125)], rep.worst_regions


@pytest.mark.frameworks("torch", "jax")
def test_recheck_keeps_what_the_flushed_reference_explains(tmp_path):
    """A saved elementwise run keeps the reference at its flushed inputs: judged again (running
    nothing), jax's -inf at the subnormal inputs of log is explained as it was."""
    rep = parity.run("log", frameworks=["torch", "jax"])
    assert rep.passed and rep.data["flushed"] and rep.references[1].explained.flushed_inputs == 127
    path = tmp_path / "r.json"
    path.write_text(runner.dumps([rep]))
    again = runner.recheck(path, parity.DEFAULT_POLICY)[0]
    assert again.passed and again.references == rep.references and again.worst_regions == ()
    strict = runner.recheck(path, "ulp(1)")[0]
    assert not strict.passed and strict.worst_regions
    saved = json.loads(path.read_text())
    del saved[0]["data"]["flushed"]  # results saved before the flushed reference was kept: judged without it
    path.write_text(json.dumps(saved))
    older = runner.recheck(path, parity.DEFAULT_POLICY)[0]
    assert not older.passed and older.references[1].explained.nonfinite == 127
