"""Checking a cast (bb.parity.compare_outputs, check_cast, assert_outputs_close): metrics against
hand formulas, trees, every framework's tensors, and a real torch model cast by cast_module."""

from __future__ import annotations

import copy
import dataclasses
import math
import pathlib
import re
from collections import namedtuple

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from conftest import FRAMEWORKS, fw, make

F32 = np.float32


def _softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    return [v / sum(e) for v in e]


def _kl(r, c):
    """KL(softmax(r) || softmax(c)) by the textbook formula, in Python floats."""
    p, q = _softmax(r), _softmax(c)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


# -- metrics against hand formulas ---------------------------------------------------------------

def test_errors_cosine_and_relative_error_by_hand():
    r = np.array([1.0, -2.0, 4.0, 0.0], F32)
    c = np.array([1.0, -2.5, 4.0, 0.5], F32)
    rep = parity.compare_outputs(r, c)
    (leaf,) = rep.leaves
    assert leaf.path == "the root" and leaf.shape == (4,) and leaf.finite_compared == 4
    assert leaf.max_abs == 0.5
    # element-wise: |c - r| / max(|r|, 2**-126): the zero in the reference meets the floor
    assert leaf.max_rel == 0.5 / 2.0 ** -126
    assert leaf.rel_norm == pytest.approx(math.sqrt(0.5 / 21), rel=1e-15)
    assert leaf.cosine == pytest.approx(22 / math.sqrt(21 * 23.5), rel=1e-15)
    assert (rep.max_abs, rep.max_rel, rep.rel_norm, rep.cosine) == (leaf.max_abs, leaf.max_rel, leaf.rel_norm,
                                                                     leaf.cosine)
    assert rep.new_nonfinite == rep.nonfinite_mismatches == 0 and rep.top1 is None and rep.kl_mean is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.cosine = 1.0  # type: ignore[misc]
    same = parity.compare_outputs(r, r.copy())
    assert (same.max_abs, same.max_rel, same.rel_norm, same.cosine) == (0.0, 0.0, 0.0, 1.0)


def test_zero_outputs_have_a_defined_cosine():
    z = np.zeros(3, F32)
    assert parity.compare_outputs(z, z).cosine == 1.0
    assert parity.compare_outputs(z, np.ones(3, F32)).cosine == 0.0
    assert parity.compare_outputs(z, np.ones(3, F32)).rel_norm == math.inf
    assert parity.compare_outputs(np.array([1.0, 2.0], F32), np.array([-1.0, -2.0], F32)).cosine == -1.0


LOGITS_R = [[1.0, 2.0, 3.0], [3.0, 1.0, 0.0], [2.0, 2.0, 0.0], [1000.0, 1001.0, 1002.0]]
LOGITS_C = [[1.0, 2.0, 2.5], [1.0, 3.0, 0.0], [0.0, 2.0, 2.0], [1000.0, 1001.0, 1003.0]]


@pytest.mark.parametrize("axis", [-1, 1, True, 0])
def test_kl_and_top1_by_hand(axis):
    r, c = np.array(LOGITS_R), np.array(LOGITS_C)
    if axis == 0:  # the classes down the columns
        r, c = r.T.copy(), c.T.copy()
    rep = parity.compare_outputs(r, c, logits=axis)
    kls = [_kl(a, b) for a, b in zip(LOGITS_R, LOGITS_C)]
    # the last row overflows exp() done naively; the log-softmax is exact there
    assert kls[3] == pytest.approx(_kl([0.0, 1.0, 2.0], [0.0, 1.0, 3.0]), rel=1e-12)
    (leaf,) = rep.leaves
    assert leaf.rows == rep.rows == 4 and leaf.rows_skipped == 0
    assert leaf.kl_mean == pytest.approx(sum(kls) / 4, rel=1e-12)
    assert leaf.kl_max == pytest.approx(max(kls), rel=1e-12)
    assert (rep.kl_mean, rep.kl_max) == (leaf.kl_mean, leaf.kl_max)
    # row 1 disagrees (0 against 1); row 2: the reference ties classes 0 and 1, the candidate ties
    # 1 and 2 and its argmax (the first, 1) is one of the reference's maxima: it agrees
    assert leaf.top1 == rep.top1 == 0.75 and leaf.top1_disagree == 1
    assert (leaf.reference_ties, leaf.candidate_ties) == (1, 1)


def test_kl_is_zero_for_the_same_logits_and_inf_for_a_masked_class_the_reference_wants():
    r = np.array([[0.5, -1.0, 2.0], [1.0, -np.inf, 0.0]])
    same = parity.compare_outputs(r, r.copy(), logits=-1)
    assert same.kl_mean == same.kl_max == 0.0 and same.top1 == 1.0 and same.rows == 2
    masked = r.copy()
    masked[0, 2] = -np.inf  # the candidate gives the reference's top class no probability
    rep = parity.compare_outputs(r, masked, logits=-1)
    assert rep.kl_max == math.inf and rep.top1 == 0.5
    assert rep.new_nonfinite == 1 and not rep.passed()


def test_nonfinite_counted_apart_and_rows_holding_nan_left_out():
    r = np.array([[1.0, np.nan, np.inf, 2.0], [1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 0.0], [0.0, np.inf, 0.0, 0.0]])
    c = np.array([[np.nan, np.nan, -np.inf, 2.0], [1.0, 2.0, 3.0, 4.0], [0.0, np.nan, 1.0, 0.0],
                  [0.0, np.inf, 0.0, 0.0]])
    rep = parity.compare_outputs(r, c, logits=-1)
    (leaf,) = rep.leaves
    # new: [0, 0] (finite -> NaN), [2, 1], and [0, 2] (+inf turned -inf: a non-finite value the
    # reference does not hold there); both NaN ([0, 1]) or the same infinity ([3, 1]): no
    assert leaf.new_nonfinite == 3 and leaf.nonfinite_mismatches == 3
    assert leaf.finite_compared == 11 and leaf.max_abs == 0.0
    # rows with a NaN or a +inf (no softmax) are left out, and counted
    assert leaf.rows == 1 and leaf.rows_skipped == 3 and leaf.kl_max == 0.0 and leaf.top1 == 1.0
    assert rep.failures(max_abs=1.0) == ("3 NaN/inf in the candidate where the reference holds another value",)
    # without thresholds, the policy judges too (rounding(8): NaN/inf on one side only is not explained)
    assert rep.failures()[1].startswith("the root: beyond rounding(8) (non-finite): 3 element(s) NaN or infinite "
                                        "where the other side is not (first at [0, 0])"), rep.failures()



def test_a_logits_threshold_where_no_row_had_finite_logits_says_so():
    """With logits= given and every row left out (NaN or +inf on a side), top1 and KL are not
    measured: a threshold on them fails, saying no row had finite logits, not that logits= was not
    given; without logits= it says that."""
    r = np.array([[1.0, np.inf, 0.0], [np.nan, 1.0, 2.0]], F32)
    c = np.array([[5.0, 0.0, 9.0], [1.0, 2.0, 3.0]], ml_dtypes.bfloat16)
    rep = parity.compare_outputs(r, c, logits=True)
    assert rep.top1 is None and rep.leaves[0].rows_skipped == 2
    assert rep.failures(top1_min=0.99, kl_max=0.1) == (
        "top1_min=0.99 asks for top1: no row had finite logits (2 skipped: NaN or +inf on either side, or no "
        "finite logit)",
        "kl_max=0.1 asks for kl_max: no row had finite logits (2 skipped: NaN or +inf on either side, or no "
        "finite logit)")
    assert parity.compare_outputs(r, c).failures(top1_min=0.99) == (
        "top1_min=0.99 asks for top1, measured only with logits= (none given)",)

# -- trees ---------------------------------------------------------------------------------------

Out = namedtuple("Out", "logits hidden")


def _tree(scale):
    return {"out": Out(np.array([[1.0, 2.0, 3.0]], F32) * scale, [np.array([1.0, 1.0], F32) * scale]),
            "aux": (np.array([0.5], F32), "a label, not a tensor")}


def test_trees_pair_leaves_by_path_and_aggregate():
    rep = parity.compare_outputs(_tree(1.0), _tree(1.5))
    assert [x.path for x in rep.leaves] == ["['out'][0]", "['out'][1][0]", "['aux'][0]"]
    assert [x.max_abs for x in rep.leaves] == [1.5, 0.5, 0.0]
    assert rep.max_abs == 1.5
    # over all elements together: (1, 2, 3, 1, 1, .5) against 1.5x all but the last
    r = np.array([1, 2, 3, 1, 1, 0.5])
    c = np.array([1.5, 3, 4.5, 1.5, 1.5, 0.5])
    assert rep.rel_norm == pytest.approx(np.linalg.norm(c - r) / np.linalg.norm(r), rel=1e-15)
    assert rep.cosine == pytest.approx(r @ c / np.linalg.norm(r) / np.linalg.norm(c), rel=1e-15)


@pytest.mark.parametrize("change, where", [
    (lambda t: t["out"][1].append(np.zeros(1, F32)), "['out'][1][1]"),
    (lambda t: t.pop("aux"), "['aux'][0]"),
    (lambda t: t.update(aux=(np.zeros(2, F32), "")), "['aux'][0] has shape (2,)"),
    (lambda t: t.update(aux=(np.zeros(1, np.int32), "")), "['aux'][0] is int32"),
])
def test_a_tree_that_does_not_match_names_the_leaf(change, where):
    cand = _tree(1.0)
    change(cand)
    with pytest.raises(parity.OutputMismatchError, match=re.escape(where)) as e:
        parity.compare_outputs(_tree(1.0), cand)
    assert isinstance(e.value, bb.Bf16BridgeError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("logits, error", [
    (2, parity.OutputMismatchError), (-3, parity.OutputMismatchError), ("last", bb.errors.InvalidArgumentError),
])
def test_a_bad_logits_axis_is_refused(logits, error):
    with pytest.raises(error, match="axis|logits"):
        parity.compare_outputs(np.ones((2, 3), F32), np.ones((2, 3), F32), logits=logits)


def _hf_outputs(scale):
    """A Hugging Face style output dict: logits (2 rows of 3 classes) beside hidden states."""
    logits = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 0.0]], F32)
    return {"logits": logits * np.array([[1], [scale]], F32), "hidden": np.array([[4.0, -4.0]], F32) * scale}


@pytest.mark.parametrize("logits", ["logits", "['logits']", {"logits": -1}, {"['logits']": 1}])
def test_logits_can_name_the_logits_leaf_of_an_output_dict(logits):
    """Only the named leaf is logits: KL and top-1 over its rows; the hidden states are compared
    as values, not as a softmax (logits=-1 would take them for 1 row of 2 classes)."""
    r, c = _hf_outputs(1.0), _hf_outputs(-1.0)  # row 2 of the logits flips sign: its top class moves
    rep = parity.compare_outputs(r, c, logits=logits)
    by = {leaf.path: leaf for leaf in rep.leaves}
    assert by["['hidden']"].axis is None and by["['hidden']"].top1 is None
    assert by["['logits']"].axis == (logits["['logits']"] if isinstance(logits, dict) and "['logits']" in logits
                                     else -1)
    assert by["['logits']"].rows == 2
    assert rep.rows == 2 and rep.top1 == 0.5 and rep.kl_mean > 0
    everything = parity.compare_outputs(r, c, logits=-1)
    assert everything.rows == 3 and everything.top1 == pytest.approx(1 / 3)  # the hidden row counted too


@pytest.mark.parametrize("logits, says", [
    ("scores", "logits= names 'scores', which is no leaf of the outputs; their leaves are ['logits'], ['hidden']"),
    ({"logits": "last"}, "the class axis is an int"),
    ({"logits": True}, "the class axis is an int"),
    ({0: -1}, "names leaves by their path (a str)"),
])
def test_a_logits_leaf_that_is_not_there_is_refused_naming_the_leaves(logits, says):
    with pytest.raises(bb.errors.InvalidArgumentError, match=re.escape(says)):
        parity.compare_outputs(_hf_outputs(1.0), _hf_outputs(1.0), logits=logits)


def test_nothing_to_compare_is_refused():
    with pytest.raises(parity.OutputMismatchError, match="reference holds no tensor"):
        parity.compare_outputs({"a": 1}, {"a": 1})


# -- every framework's tensors ---------------------------------------------------------------------

_R = np.random.default_rng(0).standard_normal((16, 10)).astype(F32)
_C = (_R + np.random.default_rng(1).standard_normal((16, 10)).astype(F32) * 0.1).astype(ml_dtypes.bfloat16)


def _fields(rep):
    return [(x.path, x.shape, x.candidate_dtype, x.max_abs, x.max_rel, x.rel_norm, x.cosine, x.kl_mean, x.kl_max,
             x.top1, x.top1_disagree) for x in rep.leaves]


@pytest.mark.parametrize("ref_fw", FRAMEWORKS)
@pytest.mark.parametrize("cand_fw", FRAMEWORKS)
def test_any_frameworks_tensors_give_the_numpy_answer(ref_fw, cand_fw):
    want = parity.compare_outputs(_R, _C, logits=-1)
    assert want.leaves[0].candidate_dtype == "bfloat16" and want.top1 < 1.0 and want.kl_max > 0
    got = parity.compare_outputs(make(ref_fw, _R), make(cand_fw, _C), logits=-1)
    assert _fields(got) == _fields(want)


@pytest.mark.frameworks("torch")
def test_a_fp8_candidate_is_widened_exactly():
    c8 = _R.astype(ml_dtypes.float8_e4m3fn)
    rep = parity.compare_outputs(_R, make("torch", c8))
    exact = np.abs(c8.astype(np.float64) - _R.astype(np.float64)).max()
    assert rep.leaves[0].candidate_dtype == "float8_e4m3fn" and rep.max_abs == exact > 0


# -- thresholds ------------------------------------------------------------------------------------

def test_assert_outputs_close_raises_with_the_report():
    r, c = np.array(LOGITS_R), np.array(LOGITS_C)
    rep = parity.assert_outputs_close(r, c, logits=-1, top1_min=0.75, cosine_min=0.99)
    assert rep.top1 == 0.75
    with pytest.raises(parity.OutputsDifferError, match=r"top1 0\.75 < top1_min=0\.9") as e:
        parity.assert_outputs_close(r, c, logits=-1, top1_min=0.9)
    assert isinstance(e.value, AssertionError) and isinstance(e.value, bb.Bf16BridgeError)
    assert "overall: max abs" in str(e.value)
    assert rep.failures(kl_max=1e-9, max_abs=0.1) == (f"kl_max {rep.kl_max:.6g} > kl_max=1e-09",
                                                      "max_abs 2 > max_abs=0.1")
    # a logits threshold without logits, or an unknown one, is not silently passed
    assert not parity.compare_outputs(r, c).passed(top1_min=0.5)
    with pytest.raises(bb.errors.InvalidArgumentError, match="top1_min"):
        rep.passed(top1=0.5)


@pytest.mark.parametrize("ref, cand, new, differ", [
    (np.inf, -np.inf, 1, 1),  # the sign of an infinity flipped
    (np.inf, np.nan, 1, 1),
    (np.nan, np.inf, 1, 1),
    (-np.inf, np.nan, 1, 1),
    (1.0, np.inf, 1, 1),
    (np.inf, np.inf, 0, 0),  # the same non-finite value on both sides: nothing appeared
    (np.nan, np.nan, 0, 0),
    (np.inf, 3.0, 0, 1),  # an infinity that went is counted in nonfinite_mismatches, not as new
])
def test_a_nonfinite_value_the_reference_does_not_hold_fails_the_check(ref, cand, new, differ):
    r, c = np.array([ref, 1.0], F32), np.array([cand, 1.0], F32)
    rep = parity.compare_outputs(r, c)
    assert rep.new_nonfinite == new and rep.nonfinite_mismatches == differ
    assert rep.passed(max_abs=1.0) is (new == 0)
    if new:
        with pytest.raises(parity.OutputsDifferError, match="1 NaN/inf in the candidate where the reference holds"):
            parity.assert_outputs_close(r, c)


@pytest.mark.parametrize("bad", [float("nan"), np.float64("nan"), "0.1", True, [0.1]])
@pytest.mark.parametrize("name", ["max_abs", "cosine_min", "top1_min"])
def test_a_threshold_that_is_not_a_number_is_refused_not_passed(name, bad):
    r, c = np.array(LOGITS_R), np.array(LOGITS_C)  # differ: max abs 2, top-1 0.75
    with pytest.raises(bb.errors.InvalidArgumentError, match=re.escape(f"threshold {name}={bad!r}: give a number")):
        parity.assert_outputs_close(r, c, logits=-1, **{name: bad})


# -- a real model: torch, cast by cast_module -------------------------------------------------------

def _mlp(seed=0):
    torch = fw("torch")
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(nn.Linear(32, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 128), nn.LayerNorm(128),
                         nn.GELU(), nn.Linear(128, 20)).eval()


def _x(n=512):
    torch = fw("torch")
    return torch.from_numpy(np.random.default_rng(2).standard_normal((n, 32)).astype(F32))


@pytest.mark.frameworks("torch")
def test_a_bf16_cast_mlp_is_close_to_its_float32_self():
    model = _mlp()
    ref = copy.deepcopy(model)
    model, cast = bb.cast_module(model, "bfloat16")
    assert {r.action for r in cast.leaves} == {"cast", "kept"}
    rep = parity.check_cast(ref, model, _x(), logits=-1)
    assert rep.fed == ("reference the inputs as given (its parameters are float32); "
                       "candidate 1 floating input(s) cast to bfloat16")
    assert rep.leaves[0].candidate_dtype == "bfloat16" and rep.leaves[0].reference_dtype == "float32"
    assert rep.cosine > 0.999 and rep.top1 >= 0.97 and rep.kl_mean < 1e-4 and rep.new_nonfinite == 0
    # docs/casting.md states these thresholds: keep them in step
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "casting.md").read_text(encoding="utf-8")
    assert "asserts cosine > 0.999, top-1 >= 0.97 and mean KL < 1e-4" in " ".join(doc.split())
    assert rep.max_abs > 0  # bf16 did change something: the check is not comparing a model with itself
    parity.assert_outputs_close(*(m(_x()).detach() for m in (ref, ref)), logits=-1, max_abs=0.0)
    assert "logits over 512 rows" in str(rep) and "top-1 agreement" in str(rep)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("break_it", ["zero a weight", "no input cast"])
def test_a_broken_cast_is_caught(break_it):
    torch = fw("torch")
    model = _mlp()
    ref = copy.deepcopy(model)
    model, _ = bb.cast_module(model, "bfloat16")
    if break_it == "zero a weight":
        with torch.no_grad():
            model[3].weight.zero_()
        rep = parity.check_cast(ref, model, _x(), logits=-1)
        assert rep.cosine < 0.9 and rep.top1 < 0.5 and rep.kl_mean > 0.01
        assert not rep.passed(cosine_min=0.999, top1_min=0.97)
        with torch.no_grad(), pytest.raises(parity.OutputsDifferError, match="cosine .* < cosine_min=0.999"):
            parity.assert_outputs_close(ref(_x()), model(_x().bfloat16()), logits=-1, cosine_min=0.999,
                                        top1_min=0.97)
    else:  # feeding the bf16 model float32 inputs is what cast_inputs=True spares the caller
        with pytest.raises(RuntimeError, match="dtype"):
            parity.check_cast(ref, model, _x(), cast_inputs=False)


@pytest.mark.frameworks("torch")
def test_a_half_precision_buffer_does_not_make_a_float32_model_narrow():
    """check_cast chose a model's input dtype from its parameters and buffers: a float32 model
    with a small float16 buffer was fed float16 inputs and failed in torch (mat1 and mat2 must
    have the same dtype). Buffers decide only where a model has no parameters."""
    torch = fw("torch")

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 32)
            self.register_buffer("mask", torch.ones(4, dtype=torch.float16))

        def forward(self, x):
            return self.fc(x)

    model = Masked()
    rep = parity.check_cast(model, copy.deepcopy(model), _x())
    assert rep.max_abs == 0.0
    only_buffers = torch.nn.Module()
    only_buffers.register_buffer("b", torch.ones(4, dtype=torch.bfloat16))
    from bf16bridge.parity.outputs import _model_dtype
    assert _model_dtype(only_buffers) == "bfloat16" and _model_dtype(model) == "float32"


@pytest.mark.frameworks("torch")
def test_check_cast_runs_plain_functions_of_any_framework_on_the_inputs_as_given():
    jnp = fw("jax").numpy
    w = np.random.default_rng(3).standard_normal((32, 20)).astype(F32)
    ref = lambda x, scale=1.0: jnp.dot(x, jnp.asarray(w)) * scale  # noqa: E731
    cand = lambda x, scale=1.0: jnp.dot(x.astype(jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)) * scale  # noqa: E731
    x = make("jax", _x().numpy())
    rep = parity.check_cast(ref, cand, (x,), kwargs={"scale": 2.0}, logits=True)
    assert rep.fed == "reference the inputs as given; candidate the inputs as given"
    assert rep.leaves[0].candidate_dtype == "bfloat16" and 0.99 < rep.cosine < 1.0 and rep.top1 > 0.9
    with pytest.raises(bb.errors.InvalidArgumentError, match="compare_outputs"):
        parity.check_cast(ref(x), cand, x)


@pytest.mark.frameworks("torch")
def test_check_cast_runs_both_sides_under_each_adapters_no_grad_hook():
    torch = fw("torch")
    seen = []

    def model(x):
        seen.append(torch.is_grad_enabled())
        return x * 2

    parity.check_cast(model, model, torch.ones(3, requires_grad=True))
    assert seen == [False, False] and torch.is_grad_enabled()
