"""parity.regions: the worst regions over every input value (injected faults found with their interval
and values; exact compares bits, NaN payloads and signed zeros included; narrow floats grouped by their
own binades), printed and in json, markdown and html, and kept by parity.run and a recheck."""

import json
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import metrics, runner
from parity_cases import NARROW


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
    rep = parity.compare({"a": good, "b": bad}, reference=ref, op="identity [all]", policy="ulp(1)")
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
    rep = parity.run("log", policy="ulp(1)")  # (the default explains jax's and tensorflow's flushed inputs)
    assert rep.data["input"] and rep.worst_regions
    for g in rep.worst_regions:
        assert g.lo <= g.input <= g.hi and 0 < g.exceeding <= g.inputs
        assert g.ulps is None or g.ulps > 1  # the representative itself exceeds ulp(1)
    path = tmp_path / "r.json"
    path.write_text(runner.dumps([rep]))
    assert runner.recheck(path, rep.policy)[0].worst_regions == rep.worst_regions
    loose = runner.recheck(path, "ulp(100000)")[0].worst_regions
    assert loose and all(g.nonfinite == g.exceeding for g in loose), "no tolerance excuses NaN/inf"


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
