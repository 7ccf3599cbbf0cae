"""parity.compare and assert_parity: injected faults caught and located (one ULP, NaN against inf,
signed zeros, flushed subnormals, truncation, a transpose), results against a reference and its
condition, the arguments and trees refused with our errors, results of any framework, and nothing
compared never passing silently."""

import warnings

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import render
from conftest import BF16
from parity_cases import F32, _rand


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
        rep = parity.compare(y, y.detach().clone(), reference=ref, condition=ref.abs() + 1, policy="ulp(1)")
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
