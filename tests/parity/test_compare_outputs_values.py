"""parity.compare_outputs (what check_cast measures a cast model by) on adversarial values and trees:
rel_norm and cosine right at any scale with NaN and inf around (against an exact oracle), logits
with no class or no row, logits far apart, and mismatched trees refused naming the path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import bf16bridge as bb
import strategies  # noqa: F401 - loads the derandomized hypothesis profile


_SPECIAL = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0])


_FINITE = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def _output_pairs(draw):
    """A reference and a candidate leaf of the same shape: moderate values with NaN, inf and zeros
    sprinkled in, and a power of two to scale both by (exact in float64 while nothing overflows)."""
    n = draw(st.integers(1, 12))
    r = np.array(draw(st.lists(st.one_of(_FINITE, _FINITE, _FINITE, _SPECIAL), min_size=n, max_size=n)))
    c = np.array(draw(st.lists(st.one_of(_FINITE, _FINITE, _FINITE, _SPECIAL), min_size=n, max_size=n)))
    return r, c, draw(st.sampled_from([600, 1000, -600, -1000]))


def _oracle(r: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """rel_norm and cosine over the elements finite on both sides, by math.hypot and math.fsum
    (no overflow: hypot scales, and the dot product is summed of scaled terms)."""
    both = np.isfinite(r) & np.isfinite(c)
    vr, vc = r[both].tolist(), c[both].tolist()
    nr, nc = math.hypot(*vr), math.hypot(*vc)  # hypot scales: no overflow, no underflow
    nd = math.hypot(*(b - a for a, b in zip(vr, vc)))  # |values| <= 2**1000 * 1e3: no overflow
    rel = (nd / nr) if nr else (0.0 if nd == 0 else math.inf)
    if not (nr and nc):
        return rel, (1.0 if nr == nc else 0.0)
    return rel, max(-1.0, min(1.0, math.fsum((a / nr) * (b / nc) for a, b in zip(vr, vc))))


@given(st.lists(_output_pairs(), min_size=1, max_size=3))
@example([(np.array([0.0, 0.0, 2.0]), np.array([0.0, 0.0, 5e-324]), 600)])  # vectors 1e300 apart in size
def test_compare_outputs_is_right_at_any_scale_with_nan_and_inf_around(pairs):
    """Leaves scaled to 2**1000 (float64 outputs; squares past float64's range) once overflowed the
    sums of squares (a RuntimeWarning, then rel_norm and cosine NaN); at 2**-1000 they underflowed."""
    ref = {f"o{i}": r * 2.0 ** k for i, (r, c, k) in enumerate(pairs)}
    cand = {f"o{i}": c * 2.0 ** k for i, (r, c, k) in enumerate(pairs)}
    rep = bb.parity.compare_outputs(ref, cand)  # warnings are errors: none may escape
    for leaf, r, c in zip(rep.leaves, ref.values(), cand.values()):
        rel, cos = _oracle(r, c)
        assert leaf.rel_norm == pytest.approx(rel, rel=1e-9, abs=1e-12), leaf.path
        assert leaf.cosine == pytest.approx(cos, rel=1e-9, abs=1e-12), leaf.path
        both = np.isfinite(r) & np.isfinite(c)
        assert leaf.finite_compared == int(both.sum())
        with np.errstate(invalid="ignore"):
            held = (np.isnan(r) & np.isnan(c)) | (r == c)  # the same NaN/inf on both sides
        assert leaf.new_nonfinite == int((~np.isfinite(c) & ~held).sum())
    rel, cos = _oracle(np.concatenate(list(ref.values())), np.concatenate(list(cand.values())))
    assert rep.rel_norm == pytest.approx(rel, rel=1e-9, abs=1e-12)
    assert rep.cosine == pytest.approx(cos, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("shape, axis, rows, skipped", [((2, 0), -1, 0, 2), ((0, 3), -1, 0, 0), ((3, 0, 2), 1, 0, 6),
                                                         ((2, 1), -1, 2, 0)])
def test_logits_with_no_class_or_no_row(shape, axis, rows, skipped):
    """A class axis of length 0 once raised numpy's ValueError (reshape(-1, 0)): its rows have no
    finite logit and are left out, as a row of -inf is."""
    a = np.ones(shape)
    rep = bb.parity.compare_outputs(a, a, logits=axis)
    assert (rep.rows, rep.leaves[0].rows_skipped, rep.kl_mean) == (rows, skipped, 0.0 if rows else None)


def test_logits_far_apart_give_defined_kl_without_warnings():
    r, c = np.array([[1e308, -1e308]]), np.array([[1e308, 1e308]])
    rep = bb.parity.compare_outputs(r, c, logits=True)
    assert rep.kl_mean == pytest.approx(math.log(2)) and rep.top1 == 1.0
    assert rep.rel_norm == pytest.approx(math.sqrt(2)) and rep.cosine == 0.0


@pytest.mark.parametrize("ref, cand, says", [
    ({"a": np.ones(2), "b": [np.ones(2)]}, {"a": np.ones(2), "b": [np.ones(3)]}, r"\['b'\]\[0\] has shape \(3,\)"),
    ({"a": np.ones(2)}, {"a": np.ones(2), "z": np.ones(1)}, r"the reference lacks \['z'\]"),
    ({"a": np.ones(2), "i": np.arange(2)}, {"a": np.ones(2), "i": np.arange(2)}, r"leaf at \['i'\] is int64"),
    ({"c": np.ones(2, np.complex64)}, {"c": np.ones(2, np.complex64)}, r"\['c'\] is complex64"),
    ([np.ones(2)], (np.ones(2), np.ones(2)), r"the reference lacks \[1\]"),
    (np.ones(()), np.ones(()), "logits axis -1 is out of range for the leaf at the root of shape"),
])
def test_compare_outputs_mismatches_are_our_error_naming_the_path(ref, cand, says):
    from bf16bridge.parity.outputs import OutputMismatchError

    with pytest.raises(OutputMismatchError, match=says):
        bb.parity.compare_outputs(ref, cand, logits=True if says.startswith("logits") else False)
