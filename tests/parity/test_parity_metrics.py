"""parity.metrics: the ordered mapping of bit patterns and ULP distances, exact in bf16, float64 and
every narrow dtype numpy holds (NaN/inf apart, signed zeros, fnuz NaN), and ulp_of, each format's own
spacing."""

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import metrics
from conftest import BF16
from parity_cases import NARROW, _patterns
from strategies import numpy_holds


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


# -- results in every narrow dtype: ULPs in the result's own format ------------------------


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
