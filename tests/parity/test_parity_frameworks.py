"""The named policies ("torch", "jax", "tensorflow") give what that framework's own test helper says.

The helpers are called here on the same values: torch.testing.assert_close(check_dtype=False), jax's
JaxTestCase.assertAllClose(check_dtypes=False) (jax._src.test_util, with jax_enable_x64, the only
way jax holds float64) and tensorflow's TensorFlowTestCase.assertAllCloseAccordingToType. First the
tolerances and the dtypes each computes in, read off the call each helper makes (torch.isclose,
numpy.testing.assert_allclose, numpy.allclose) for every pair of dtypes it holds; then the verdicts,
at the tolerance's edge, on one dtype and on two, with NaN, infinities and signed zeros beside.
"""

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bf16bridge import parity
from bf16bridge.core import dtypes
from bf16bridge import kernels
from bf16bridge.errors import UnsupportedDtypeError
from bf16bridge.parity import metrics, regions, render
from conftest import BF16

FRAMEWORKS = ("torch", "jax", "tensorflow")
STANDARD = ("bfloat16", "float16", "float32", "float64")


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _held(framework: str) -> list[str]:
    """The dtypes parity compares that the framework has a dtype for (its helper's own ground) and
    this ml_dtypes holds (0.3 has no float8_e8m0fnu, which torch has)."""
    return [k for k in _theirs(framework) if dtypes.numpy_missing(k) is None]


def _theirs(framework: str) -> list[str]:
    if framework == "torch":
        import torch

        return [k for k in metrics.KINDS if isinstance(getattr(torch, k, None), torch.dtype)
                and getattr(torch, k).is_floating_point]
    if framework == "jax":  # (its table has no fp6, which jax.numpy has: the helper raises KeyError)
        from jax._src.public_test_util import default_tolerance

        return [k for k in metrics.KINDS if k in {d.name for d in default_tolerance()}]
    from tensorflow.python.framework import dtypes

    return [k for k in metrics.KINDS if isinstance(getattr(dtypes, k, None), dtypes.DType)]


def _torch(x: np.ndarray):
    import torch

    if x.dtype.name in ("float16", "float32", "float64"):
        return torch.from_numpy(x.copy())
    # (metrics.bits makes a 0-d array 1-d)
    return torch.from_numpy(metrics.bits(x).reshape(x.shape).copy()).view(getattr(torch, x.dtype.name))


@functools.cache
def _jax_case():
    from jax._src import test_util

    return test_util.JaxTestCase()


@functools.cache
def _tf_case():
    from tensorflow.python.framework import test_util

    return test_util.TensorFlowTestCase()


def _x64():
    import jax

    on = getattr(jax, "enable_x64", None)
    return on(True) if on is not None else jax.experimental.enable_x64()


def _helper(framework: str, a: np.ndarray, b: np.ndarray) -> None:
    """The framework's own helper on (actual a, expected b): returns, or raises AssertionError."""
    if framework == "torch":
        import torch

        torch.testing.assert_close(_torch(a), _torch(b), check_dtype=False)
    elif framework == "jax":
        with _x64():
            _jax_case().assertAllClose(a, b, check_dtypes=False)
    else:
        _tf_case().assertAllCloseAccordingToType(a, b)


def _says(framework: str, a: np.ndarray, b: np.ndarray) -> bool:
    try:
        with np.errstate(all="ignore"):  # (tensorflow's message computes inf - inf)
            _helper(framework, a, b)
        return True
    except AssertionError:
        return False


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_tolerances_and_arithmetic_dtypes_are_the_helpers_own_for_every_pair_of_dtypes(framework, monkeypatch):
    """Each helper's last call (torch.isclose; numpy.testing.assert_allclose after jax widens;
    numpy.allclose after tensorflow widens) is caught: its rtol, atol and the dtypes it is handed are
    the policy's, for every pair of dtypes the framework holds (bf16's tolerances for all, before)."""
    pol = parity.FRAMEWORK_DEFAULTS[framework]
    seen: list = []
    if framework == "torch":
        import torch

        def catch(x, y, rtol, atol, equal_nan):
            seen.append((x.dtype, y.dtype, rtol, atol, equal_nan))
            return torch.ones_like(x, dtype=torch.bool)

        monkeypatch.setattr(torch, "isclose", catch)
    else:
        def catch(x, y, rtol=1e-7, atol=0.0, equal_nan=True, **_):  # numpy.testing.assert_allclose's defaults
            seen.append((x.dtype, y.dtype, rtol, atol, equal_nan))
            return True

        monkeypatch.setattr(np.testing if framework == "jax" else np, "assert_allclose" if framework == "jax"
                            else "allclose", catch)
    names = _held(framework)
    assert set(STANDARD) <= set(names) and len(names) > len(STANDARD)  # and some narrow dtypes
    for da in names:
        for db in names:
            if framework == "torch" and da != db and kernels.FORMATS.get(da, kernels.FORMATS.get(db)):
                continue  # torch.promote_types has no rule for a narrow dtype and another (documented)
            seen.clear()
            _helper(framework, np.zeros(2, _dtype(da)), np.zeros(2, _dtype(db)))
            got = seen[-1]
            rtol, atol = pol.tolerances(da, db)
            if framework == "torch":
                import torch

                common = torch.promote_types(getattr(torch, da), getattr(torch, db))
                want = (common, common, rtol, atol, False)
                if rtol or atol:  # (with none, equal values: in the narrow dtype itself or in float32)
                    assert metrics._promoted_arithmetic(da, db)[0].name == str(common).removeprefix("torch."), (da, db)
                assert got == want, (da, db, got, want)
            else:  # (neither passes equal_nan there: what catch records is its own default)
                to = dict(pol.widen)
                want = (_dtype(to.get(da, da)), _dtype(to.get(db, db)), rtol, atol, True)
                assert got[:4] == want[:4], (da, db, got, want)


def _edges():
    """Every (rtol, atol) the three policies name for one of the standard dtypes."""
    return sorted({p.tolerances(a, b) for p in parity.FRAMEWORK_DEFAULTS.values() for a in STANDARD for b in STANDARD})


@st.composite
def _near_the_edge(draw, framework):
    """(a, b): b's first element a value of one standard dtype; a's about atol + rtol * |b| away (a
    few steps of the finer dtype either side), for the policy's tolerances or another framework's;
    a second element of specials (NaN, infinities, signed zeros) on each side."""
    da, db = draw(st.sampled_from(STANDARD)), draw(st.sampled_from(STANDARD))
    own = parity.FRAMEWORK_DEFAULTS[framework].tolerances(da, db)
    rtol, atol = draw(st.one_of(st.just(own), st.sampled_from(_edges())))
    y = draw(st.floats(min_value=2.0 ** -20, max_value=6e4, allow_nan=False)) * draw(st.sampled_from([1, -1]))
    yb = float(metrics.to_float64(metrics.rounded(np.array([y]), db))[0])
    gap = (atol + rtol * abs(yb)) * (1 + draw(st.integers(-64, 64)) * 2.0 ** -12)
    x = yb + draw(st.sampled_from([1, -1])) * gap
    special = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0])
    sa = draw(special)
    sb = sa if draw(st.booleans()) else draw(special)
    a = metrics.rounded(np.array([x, sa]), da)
    b = metrics.rounded(np.array([yb, sb]), db)
    return a, b


@pytest.mark.parametrize("framework", FRAMEWORKS)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_each_policy_s_verdict_is_its_helper_s_at_the_edge(framework, data):
    """compare(policy=framework) passes exactly where the framework's helper does, on bf16, float16,
    float32 and float64 results and any two of them: the per-dtype tolerances (float32 judged with
    bf16's 1.6e-2 passed where torch fails) and the arithmetic (jax and tensorflow computed in
    float64; their helpers in numpy's float32 after widening bf16: 11.625 against 11.5 passed)."""
    a, b = data.draw(_near_the_edge(framework))
    want = _says(framework, a, b)
    assert parity.compare({"a": a, "b": b}, policy=framework).passed == want, (a, a.dtype, b, b.dtype)
    if a.dtype == b.dtype:  # worst_regions judge each element so too (b as the rounded reference)
        bad, _, _ = regions.exceeds(parity.FRAMEWORK_DEFAULTS[framework], a, b)
        assert [not _says(framework, a[i:i + 1], b[i:i + 1]) for i in range(2)] == bad.tolist()


def _neighbours(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every pattern of a narrow dtype against those 1 and 2 steps above it (wrapping)."""
    fmt = kernels.FORMATS[name]
    n = 1 << fmt.bits
    code = np.arange(n)
    dt = _dtype(name)
    as_dtype = lambda c: np.asarray(c % n, np.uint8).view(dt)  # noqa: E731
    return (np.concatenate([as_dtype(code)] * 2), np.concatenate([as_dtype(code + 1), as_dtype(code + 2)]))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_policy_on_narrow_dtypes_is_its_helper_on_every_pattern(framework):
    """Each narrow dtype the framework holds (torch's fp8s: equal values only; jax's fp8, fp4, e8m0
    and int4/int2: its own tolerances, widened; tensorflow's fp8s and int4), every pattern against its
    neighbours and against float32 values near it (not torch, which refuses that promotion), element by
    element: the policy's verdict is the helper's."""
    pol = parity.FRAMEWORK_DEFAULTS[framework]
    narrow = [k for k in _held(framework) if k in kernels.FORMATS]
    assert narrow
    rng = np.random.default_rng(5)
    for name in narrow:
        a, b = _neighbours(name)
        pairs = [(a, b), (b, a)]
        if framework != "torch":
            with np.errstate(invalid="ignore"):
                v = metrics.to_float64(a)
            near = (v * (1 + rng.choice([-1, 1], v.size) * rng.uniform(0, 0.3, v.size))).astype(np.float32)
            pairs += [(a, near), (near, a)]
        for x, y in pairs:
            try:
                _says(framework, x[:1], y[:1])
            except TypeError:  # numpy < 2 cannot promote int4 with float16: the helper raises, so do we
                with pytest.raises(UnsupportedDtypeError, match="cannot compare .* as this policy's framework does"):
                    metrics.policy_close(pol, x, y)
                continue
            got = metrics.policy_close(pol, x, y)
            want = [_says(framework, x[i:i + 1], y[i:i + 1]) for i in range(x.size)]
            assert got.tolist() == want, (name, x.dtype, y.dtype, x[got != want][:4], y[got != want][:4])
            assert parity.compare({"x": x, "y": y}, policy=framework).passed == all(want)


def test_the_docs_table_of_the_framework_policies_is_the_one_they_hold():
    """docs/parity.md's table of tolerances per dtype is render.framework_policies(), every dtype
    parity compares a row, read back to the policies' own numbers."""
    import pathlib

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "parity.md").read_text()
    tab = render.framework_policies()
    assert tab in page
    rows = [r.strip("| ").split(" | ") for r in tab.splitlines()[2:]]
    assert [r[0] for r in rows] == list(metrics.KINDS)
    for r in rows:
        for cell, pol in zip(r[1:], parity.FRAMEWORK_DEFAULTS.values()):
            rtol, atol = (float(t) for t in cell.split(" (")[0].split(" / "))
            assert (rtol, atol) == pol.tolerances(r[0], r[0])


def test_named_policies_read_their_tolerances_per_dtype_and_take_the_larger_of_two():
    torch, jax, tf = (parity.parse(n) for n in ("torch", "jax", "tf"))
    assert torch.tolerances("float32", "float32") == (1.3e-6, 1e-5)
    assert torch.tolerances("float32", "bfloat16") == torch.tolerances("bfloat16", "float32") == (1.6e-2, 1e-5)
    assert torch.tolerances("float8_e4m3fn", "float8_e4m3fn") == (0.0, 0.0)
    assert jax.tolerances("float64", "float64") == (1e-15, 1e-15) and jax.tolerances("int4", "float32") == (1e-6, 1e-6)
    assert tf.tolerances("float64", "float16") == (1e-3, 1e-3)
    assert tf.tolerances("float8_e5m2", "float32") == (1e-6, 1e-6)
    assert parity.allclose(0.1, 0.2).tolerances("float64", "int4") == (0.1, 0.2)  # one pair for every dtype
    f32 = np.array([1.0], np.float32)
    for pol in (torch, jax, tf):  # 1% apart: bf16 results pass, float32 ones fail (they passed before)
        assert parity.compare({"a": f32.astype(BF16), "b": (f32 * 1.01).astype(BF16)}, policy=pol).passed
        rep = parity.compare({"a": f32, "b": f32 * np.float32(1.01)}, policy=pol)
        assert not rep.passed
        rtol, atol = pol.tolerances("float32", "float32")  # the report says which tolerances judged it
        assert f"{pol.name}'s tolerances for float32: rtol={rtol:g}, atol={atol:g}" in rep.pairs[0].note
    mixed = parity.compare({"a": f32.astype(BF16), "b": f32}, policy=torch).pairs[0].note
    assert "torch's tolerances for bfloat16 against float32: rtol=0.016, atol=1e-05" in mixed


def test_the_policies_narrow_dtypes_are_the_kernels_formats():
    """policies.py names the narrow dtypes itself (it imports no kernels: the pytest plugin loads it
    in environments without ml_dtypes); they must be every format the kernels know."""
    from bf16bridge.parity import policies

    assert set(policies._NARROW_FLOATS) == {n for n, f in kernels.FORMATS.items() if not f.integer}
    assert set(policies._NARROW_INTS) == {n for n, f in kernels.FORMATS.items() if f.integer}
