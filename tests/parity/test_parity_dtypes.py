"""parity.compare of results in two dtypes: the finer side rounded once to the coarser (bf16, float16,
fp8, an int) and measured in its ULPs, identical only where the rounding lost nothing; values beyond
the coarser's range; errors against a reference in each result's own ULPs; allclose on the values as
given."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import metrics
from conftest import BF16
from parity_cases import F32, _patterns


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
