"""Parity validation: exact metrics, injected faults caught and located, policies, run, CLI."""

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import metrics, runner
from conftest import BF16

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
    assert p.nan_mismatches == 1 and p.inf_mismatches == 1 and rep.nonfinite_mismatches == 2
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


@pytest.mark.parametrize("text,kind", [("exact", "exact"), ("ulp(3)", "ulp"), ("allclose(1e-2, 1e-5)", "allclose"),
                                       ("reference(2)", "reference"), ("torch", "allclose"), ("tf", "allclose")])
def test_policy_texts(text, kind):
    assert parity.parse(text).kind == kind


def test_framework_defaults_and_bad_policies():
    assert parity.parse("torch").rtol == 1.6e-2 and parity.parse("torch").atol == 1e-5
    assert parity.parse("jax").rtol == 1e-2 and parity.parse("tensorflow").atol == 1e-2
    for bad in ("ulp", "close(1)", "ulp(x)", "reference(0.5)"):
        with pytest.raises(ValueError):
            parity.parse(bad)
    with pytest.raises(ValueError, match="reference="):
        parity.compare(_rand(), _rand(), policy="reference(2)")


def test_allclose_policy_judges_elements():
    a = np.array([1.0, 100.0], dtype=np.float32)
    assert parity.compare(a, a * np.float32(1.001), policy="allclose(1e-2, 0)").passed
    assert not parity.compare(a, a * np.float32(1.1), policy="allclose(1e-2, 0)").passed


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


@pytest.mark.parametrize("op", sorted(parity.OPS))
def test_every_builtin_op_runs_in_every_framework(op):
    rep = parity.run(op)
    assert "not run" not in rep.settings, rep.settings.get("not run")
    assert len(rep.pairs) == 3 and len(rep.references) == 3
    assert rep.settings["cpu_bf16"] and "torch_threads" in rep.settings
    for r in rep.references:  # each framework is a sane bf16 implementation of the op
        if r.p99_normalised is not None:  # ops that cancel: errors against the condition scale
            assert r.p99_normalised < 4, (op, r)
        else:
            assert r.p99_ulps_of_reference < 8, (op, r)


def test_ties_inputs_put_exact_results_half_way_between_bf16_numbers():
    from bf16bridge.parity.ops import OPS

    o = OPS["matmul"]
    x = o.inputs(np.random.default_rng(0), "ties", o.params)
    a, b = (metrics.to_float64(x[k]) for k in ("a", "b"))
    exact = a @ b  # integers, exact in float64 (and in float32)
    assert np.all(exact == np.round(exact))
    rne = bb.kernels.to_bf16(exact.astype(np.float32))  # nearest, ties to even
    gap = np.abs(exact - metrics.to_float64(rne))
    ties = (gap > 0) & (gap == metrics.bf16_ulp(exact) / 2)
    assert ties.sum() > 100, "the inputs must put many results exactly half-way"
    rep = parity.run("matmul", inputs=x, policy="exact")
    for name, packed in rep.data["results"].items():  # every framework rounds every tie to even
        got = runner._unpack(packed)
        np.testing.assert_array_equal(got.view(np.uint16), rne.view(np.uint16), err_msg=name)


def test_matmul_agrees_with_the_reference_within_bf16_rounding():
    rep = parity.run("matmul", k=256, policy="reference(2)")
    assert rep.passed
    for r in rep.references:
        assert r.max_normalised <= 1.0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bf16bridge", "parity", *args], capture_output=True, text=True,
                          timeout=600)


def test_cli_json_then_recheck_under_other_policies(tmp_path):
    path = tmp_path / "r.json"
    out = _cli("--ops", "softmax", "--format", "json", "--output", str(path))
    saved = json.loads(path.read_text())
    assert len(saved) == 2 and all(d["data"]["results"] for d in saved)
    assert out.returncode == (0 if all(d["passed"] for d in saved) else 1)
    n = max(d["smallest"]["ulp"] for d in saved)
    assert _cli("--recheck", str(path), "--policy", f"ulp({n})").returncode == 0
    if n > 0:
        bad = _cli("--recheck", str(path), "--policy", f"ulp({n - 1})")
        assert bad.returncode == 1 and "FAILED" in bad.stdout


def test_cli_html_and_markdown(tmp_path):
    out = _cli("--ops", "sum", "--set", "cols=64", "--format", "html", "--output", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "ULP histogram" in page and out.returncode in (0, 1)
    md = _cli("--ops", "exp", "--format", "markdown").stdout
    assert "| pair | 0 | 1 | 2 | 3 | 4-7 |" in md
