"""bb.parity.trace_cast: a torch model against its bf16 cast (bb.cast_module), layer by layer: SQNR per
layer, the layer that loses the most, and whether keeping it in float32 fixes the end result."""

from __future__ import annotations

import math

import pytest

import bf16bridge as bb

pytestmark = pytest.mark.frameworks("torch")


@pytest.fixture(scope="module")
def tc():
    import trace_cases

    return trace_cases


@pytest.fixture(scope="module")
def casts(tc):
    """The block cast to bf16 with its norms kept in float32 (the default), and with everything cast."""
    m, ids = tc.torch_model(), tc.token_ids()
    return {"kept": bb.parity.trace_cast(m, ids), "cast": bb.parity.trace_cast(m, ids, keep_types=())}


def test_a_cast_of_a_well_conditioned_block_passes_and_says_its_sqnr_per_layer(casts):
    for rep in casts.values():
        assert rep.passed, rep.text()
        assert all(40 < r.sqnr_db < 60 for r in rep.layers[1:]), [r.sqnr_db for r in rep.layers]
        assert rep.layers[0].layer_a == "embed" and rep.layers[0].input_sqnr_db is None  # ids: nothing to lose
        assert all(r.input_sqnr_db is not None for r in rep.layers[1:] if r.layer_a)  # (the model: ids again)
        assert rep.cast is not None and rep.cast.end_passed and not rep.cast.fixes


def test_with_norms_cast_a_norm_loses_the_most_and_more_than_when_kept_in_float32(casts):
    cast, kept = casts["cast"], casts["kept"]
    assert cast.loses_most.layer_a == "blocks.0.ln1", [(r.layer_a, r.loss_db) for r in cast.layers]
    for norm in ("blocks.0.ln1", "blocks.0.ln2"):
        assert cast.layer(norm).loss_db > kept.layer(norm).loss_db + 1, (cast.layer(norm), kept.layer(norm))
    assert kept.loses_most.layer_a != "blocks.0.ln1"


def test_the_layer_that_loses_the_most_is_kept_in_float32_and_that_fixes_the_end_result(tc):
    rep = bb.parity.trace_cast(tc.fragile_model(), tc.token_ids())
    assert not rep.passed
    assert rep.loses_most.layer_a == "fragile" and rep.loses_most.loss_db > 20
    assert (rep.first_divergence.layer_a, rep.first_divergence.layer_b) == ("fragile", "fragile")
    fix = rep.cast
    assert fix.layer == "fragile" and fix.kept == r"keep='^fragile\\.'"
    assert not fix.end_passed and fix.end_passed_kept and fix.fixes
    assert fix.end_sqnr_kept_db > fix.end_sqnr_db + 20
    assert "loses the most: fragile" in rep.text()


def test_trace_cast_without_the_fix_and_its_refusals(tc):
    rep = bb.parity.trace_cast(tc.fragile_model(), tc.token_ids(), fix=False)
    assert rep.cast.end_sqnr_kept_db is None and rep.cast.kept.startswith("not tried")
    assert math.isfinite(rep.cast.end_sqnr_db)
    with pytest.raises(bb.errors.InvalidArgumentError, match="inplace"):
        bb.parity.trace_cast(tc.fragile_model(), tc.token_ids(), inplace=True)
    with pytest.raises(bb.errors.InvalidArgumentError, match="fix must be True or False"):
        bb.parity.trace_cast(tc.fragile_model(), tc.token_ids(), fix="yes")


def test_a_layer_the_original_loses_as_much_in_is_excused_by_the_original_s_own_error(tc):
    import copy

    import torch

    m = tc.fragile_model().to(torch.bfloat16)  # both sides bf16: fragile is far from exact in each, alike
    rep = bb.parity.trace(m, copy.deepcopy(m), tc.token_ids())
    row = rep.layer("fragile")
    assert row.error > 8 * math.sqrt(row.depth)  # beyond what depth alone allows ...
    assert row.verdict.own == pytest.approx(row.error, rel=0.01)  # ... as far as the original is
    assert rep.passed, rep.text()
    assert "the reference side's own" in row.verdict.why
