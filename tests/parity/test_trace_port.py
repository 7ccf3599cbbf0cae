"""bb.parity.trace on a torch transformer block ported to flax linen (tests/parity/trace_cases.py): the
faithful port passes, and each planted porting mistake is named at the layer it first touches, on both
sides, with what changed there."""

from __future__ import annotations

import dataclasses

import pytest

import bf16bridge as bb

pytestmark = [pytest.mark.frameworks("torch", "jax"), pytest.mark.libraries("flax")]


@pytest.fixture(scope="module")
def tc():
    import trace_cases

    return trace_cases


#: traces already made, by their arguments: several tests read one report (reports are frozen)
_MADE: dict = {}


def _trace(tc, bug=None, dtype="float32", **kw):
    want, extra = tc.BUGS[bug] if bug in tc.BUGS else tc.GRAD_BUGS.get(bug, (None, {}))
    key = (bug, dtype, tuple(sorted(kw.items())))
    if key not in _MADE:
        cfg = dataclasses.replace(tc.Config(dtype=dtype), **extra)
        tm, fm, ids = tc.port(cfg, [bug] if bug else [])
        _MADE[key] = bb.parity.trace(tm, fm, ids, pairs=tc.PAIRS, **kw)
    return _MADE[key], want


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_faithful_port_passes_every_layer_against_the_float64_run(tc, dtype):
    rep, _ = _trace(tc, dtype=dtype)
    assert rep.passed and rep.first_divergence is None, rep.text()
    assert "float64 run of model_a" in rep.reference
    assert len(rep.layers) == 26 and not rep.unpaired_a and not rep.unpaired_b
    assert rep.layer("head").layer_b == "embed:attend"  # paired by hand (pairs=)
    assert rep.layer("blocks.1.attn.q").layer_b == "blocks_1.attn.q"  # by name, blocks_1 read as blocks.1
    # within k roundings of the exact answer at every depth (not merely within the budget grown with depth),
    # so the reference side's own error was never asked for
    assert all(r.error <= 8 and r.verdict.own is None for r in rep.layers), rep.text()


@pytest.mark.parametrize("bug", ["eps", "gelu_tanh", "softmax_bf16", "untransposed", "mask_off_by_one",
                                 "rms_one_plus"])
@pytest.mark.parametrize("reference", ["auto", None])
def test_each_porting_mistake_is_named_at_the_first_layer_it_touches(tc, bug, reference):
    rep, want = _trace(tc, bug, **({} if reference == "auto" else {"reference": reference}))
    d = rep.first_divergence
    assert not rep.passed and d is not None, rep.text()
    assert (d.layer_a, d.layer_b) == want, str(d)
    # every layer before it in order passed: it is the first
    first = rep.layer(want[0])
    assert all(r.passed for r in rep.layers if r.index < first.index and not r.layer_a.startswith(want[0] + "."))


@pytest.mark.parametrize("bug, seen", [("gelu_tanh", "blocks.0.mlp.fc2"), ("softmax_bf16", "blocks.0.attn.o"),
                                       ("mask_off_by_one", "blocks.0.attn.o")])
def test_a_mistake_between_the_layers_of_a_module_names_the_module_not_the_layer_after_it(tc, bug, seen):
    # the first output that differs is a Linear's, but its input differed already: the module's own code is to blame
    d = _trace(tc, bug)[0].first_divergence
    assert d.first_seen is not None and d.first_seen[0] == seen
    assert "input already differed" in str(d)


def test_a_kernel_used_untransposed_is_named_at_its_layer_and_said_so(tc):
    d = _trace(tc, "untransposed")[0].first_divergence
    assert d.first_seen is None  # its input agreed: the layer itself
    assert any("weight transposed" in c for c in d.changes), d.changes


@pytest.mark.parametrize("bug, says", [("rms_one_plus", "a scale: about 1.9"), ("eps", "a scale: 1 + "),
                                       ("mask_off_by_one", "along axis 1 (size 8): index 0-6 differ, 7 agree"),
                                       ("softmax_bf16", "along axis 1 (size 8): index 1-7 differ, 0 agree")])
def test_what_changed_at_the_first_divergence(tc, bug, says):
    d = _trace(tc, bug)[0].first_divergence
    assert any(c.startswith(says) for c in d.changes), d.changes


@pytest.mark.parametrize("bug", ["untransposed", "mask_off_by_one", "rms_one_plus"])
def test_in_bf16_the_mistakes_beyond_its_rounding_are_named_too(tc, bug):
    rep, want = _trace(tc, bug, dtype="bfloat16")
    assert (rep.first_divergence.layer_a, rep.first_divergence.layer_b) == want


@pytest.mark.parametrize("bug", ["eps", "gelu_tanh", "softmax_bf16"])
def test_in_bf16_the_mistakes_within_its_rounding_pass_as_rounding(tc, bug):
    # in a bf16 model these change nothing beyond bf16 rounding here (eps: LayerNorm's output is the same bits)
    rep, _ = _trace(tc, bug, dtype="bfloat16")
    assert rep.passed, rep.text()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("reference", ["auto", None])
def test_the_faithful_port_s_gradients_pass(tc, dtype, reference):
    rep, _ = _trace(tc, dtype=dtype, grads=True, **({} if reference == "auto" else {"reference": reference}))
    assert rep.passed and rep.grad_divergence is None, rep.text()
    assert len(rep.grads) == 35 and not rep.grads_unpaired_a and not rep.grads_unpaired_b
    # paired by their values (the bridge moved them bit for bit), each kernel against its transposed weight
    q = next(g for g in rep.grads if g.name_a == "blocks.0.attn.q.weight")
    assert q.name_b == "blocks_0.attn.q.kernel" and q.transposed


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_mistake_only_the_backward_shows_is_named_at_the_first_parameter_it_reaches(tc, dtype):
    rep, want = _trace(tc, "rms_stop_gradient", dtype=dtype, grads=True)
    assert all(r.passed for r in rep.layers)  # the forward is the same
    g = rep.grad_divergence
    assert g is not None and (g.name_a, g.name_b) == want, rep.text()
    assert rep.layer("ln_f") and next(x for x in rep.grads if x.name_a == "ln_f.weight").passed
