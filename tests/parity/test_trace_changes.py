"""The pieces of bb.parity.trace that need no model: its per-layer measure (the default policy's, as
explain.against computes it), its budget, the diagnostics of what changed, and the name rules."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from bf16bridge.parity import explain
from bf16bridge.parity.tracing import judge
from bf16bridge.parity.tracing.changes import what_changed
from bf16bridge.parity.tracing.names import Pairing, ancestors, canonical, pair_params

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("dtype, scale", [(np.float32, 1e-30), (np.float32, 1.0), (np.float32, 1e30),
                                          (ml_dtypes.bfloat16, 1e-30), (ml_dtypes.bfloat16, 1.0),
                                          (ml_dtypes.bfloat16, 1e30), (np.float16, 1.0)])
def test_the_layer_measure_is_explain_against_s(dtype, scale):
    r = RNG.standard_normal((3, 5, 7)) * scale
    x = (r * (1 + 1e-3 * RNG.standard_normal(r.shape))).astype(dtype)
    mine, theirs = judge.measure(x, r, 8), explain.against(x, r, k=8)
    assert mine.normwise == pytest.approx(theirs.normwise, rel=1e-9)
    assert mine.elementwise == pytest.approx(theirs.elementwise, rel=1e-9)
    assert mine.worst == theirs.worst and mine.unit == theirs.unit
    assert mine.cosine == pytest.approx(theirs.cosine, abs=1e-12)
    assert mine.sqnr_db == pytest.approx(judge.sqnr_db(x.astype(np.float64), r), abs=1e-9)


def test_with_nan_the_measure_is_explain_against_itself():
    r = RNG.standard_normal(16)
    x = r.astype(np.float32)
    x[3] = np.nan
    m = judge.measure(x, r, 8)
    assert m.nonfinite == 1 and math.isinf(m.elementwise) and m.worst == (3,)


def test_the_budget_grows_with_depth_or_with_the_reference_side_s_own_error():
    r = RNG.standard_normal(64)
    off = (r * (1 + 30 * 2.0 ** -24)).astype(np.float32)  # about 30 roundings of float32 everywhere
    assert not judge.against(off, r, None, 1, 8).passed  # 8 roundings at depth 1
    assert judge.against(off, r, None, 16, 8).passed  # 8 * sqrt(16) = 32 at depth 16
    own = judge.measure((r * (1 + 10 * 2.0 ** -24)).astype(np.float32), r, 8)
    v = judge.against(off, r, own, 1, 8)
    assert v.passed and v.budget == pytest.approx(4 * own.normwise)  # 4 times the reference side's own
    assert "the reference side's own" in v.why


def _base():
    return RNG.standard_normal((2, 8, 8))


@pytest.mark.parametrize("change, says", [
    (lambda r: r * 1.5, "a scale: about 1.5 times the reference"),
    (lambda r: r * (1 + 2e-4), "a scale: 1 + 0.0002 times the reference"),
    (lambda r: -r, "the sign flipped: the reference negated"),
    (lambda r: r + 0.25, "a constant offset of 0.25"),
    (lambda r: r + np.linspace(-1, 1, 8), "an offset per feature (along the last axis, as a bias adds), up to 1"),
    (lambda r: np.swapaxes(r, 1, 2), "a transposition: the reference with axes 1 and 2 swapped"),
    (lambda r: np.where(np.arange(8)[None, :, None] == 2, np.nan, r), "16 NaN appear where the reference is finite"),
    (lambda r: np.where(np.arange(8)[None, :, None] < 7, r + RNG.standard_normal(r.shape), r),
     "along axis 1 (size 8): index 0-6 differ, 7 agree"),
])
def test_what_changed_says_the_pattern(change, says):
    r = _base()
    lines = what_changed(change(r), r, unit="float32", budget=8)
    assert any(line.startswith(says) for line in lines), lines


def test_what_changed_knows_a_layer_run_with_its_weight_transposed_and_a_permuted_shape():
    w, x = RNG.standard_normal((8, 8)), RNG.standard_normal((4, 8))
    ref, wrong = x @ w.T, x @ w
    lines = what_changed(wrong, ref, unit="float32", budget=8, variants={"weight transposed": x @ w})
    assert lines == ["matches the reference layer run with its weight transposed: a weight used untransposed "
                     "(flax's (in, out) kernel against torch's (out, in) weight)"]
    r = RNG.standard_normal((2, 3, 4))
    assert what_changed(np.transpose(r, (0, 2, 1)), r, unit="float32", budget=8) == [
        "the reference with its axes permuted (0, 2, 1): a transposition"]
    assert what_changed(RNG.standard_normal((2, 3)), r, unit="float32", budget=8)[0].startswith("shape (2, 3)")
    assert what_changed(np.sign(r) * np.abs(r) ** 1.5, r, unit="float32", budget=8) == [
        "no simple pattern: not a scale, an offset, a sign flip, a transposition or NaN/inf"]


def test_the_default_name_rule_and_ancestors():
    assert canonical("blocks_0/attn/q") == canonical("blocks.0.attn.q") == "blocks.0.attn.q"
    assert canonical("Layers_12.MLP") == "layers.12.mlp" and canonical("embed:attend") == "embed:attend"
    assert ancestors("blocks.0.attn") == ["blocks.0", "blocks", ""] and ancestors("") == []


def test_pairing_lists_what_it_cannot_pair_and_pairs_each_stored_row_once():
    p = Pairing(["embed", "blocks.0.ln1", "head", ""], pairs={"head": "embed:attend"}, rename=None, by="name",
                stored_is_a=True)
    got = [p.match(n) for n in ("embed", "blocks_0.ln1", "blocks_0.ln1", "embed:attend", "extra", "")]
    assert got == ["embed", "blocks.0.ln1", None, "head", None, ""]
    assert p.unpaired_streamed == ["blocks_0.ln1", "extra"] and p.unpaired_stored() == []


def test_parameters_pair_by_name_then_by_their_values_transposed_or_not():
    w = RNG.standard_normal((4, 4)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    a = [("fc.weight", w), ("fc.bias", b), ("other.weight", np.ones((2, 3), np.float32))]
    bside = [("fc.kernel", np.ascontiguousarray(w.T)), ("fc.bias", b), ("extra", np.zeros(5, np.float32))]
    pairs, ua, ub = pair_params(a, bside, pairs=None, rename=None)
    assert pairs == [("fc.weight", "fc.kernel", True), ("fc.bias", "fc.bias", False)]
    assert ua == ["other.weight"] and ub == ["extra"]
    # a bf16 copy pairs with the float32 weight it was rounded from
    pairs, _, _ = pair_params(a[:1], [("k", w.astype(ml_dtypes.bfloat16))], pairs=None, rename=None)
    assert pairs == [("fc.weight", "k", False)]


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float32, ml_dtypes.bfloat16)])
def test_without_a_reference_the_measure_is_explain_pair_s(dtypes):
    r = RNG.standard_normal((4, 9))
    a = r.astype(dtypes[0])
    b = (r * (1 + 1e-3 * RNG.standard_normal(r.shape))).astype(dtypes[1])
    for depth in (1, 50):
        v, e = judge.between(a, b, depth, 8), explain.pair(a, b, k=8 * math.sqrt(depth))
        assert (v.passed, v.budget, v.unit) == (e.passed, e.budget, e.unit)
        assert v.error == pytest.approx(e.normwise, rel=1e-9)
        assert v.elementwise == pytest.approx(e.elementwise, rel=1e-9)
