"""bb.parity.trace's report (text, JSON, Markdown, HTML with its plot), how layers are paired (by name, a
rename rule, by order, by hand; the unpaired listed), and its refusals of bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError

pytestmark = [pytest.mark.frameworks("torch", "jax"), pytest.mark.libraries("flax")]


@pytest.fixture(scope="module")
def tc():
    import trace_cases

    return trace_cases


@pytest.fixture(scope="module")
def mask_bug(tc):
    tm, fm, ids = tc.port(tc.Config(), ["mask_off_by_one"])
    return bb.parity.trace(tm, fm, ids, pairs=tc.PAIRS, grads=True)


def test_the_text_names_the_first_divergence_on_both_sides_and_what_changed(mask_bug):
    text = str(mask_bug)
    assert text.splitlines()[0].endswith("FAILED")
    assert "first divergence: blocks.0.attn / blocks_0.attn: normwise" in text
    assert "first seen at blocks.0.attn.o" in text and "index 0-6 differ, 7 agree" in text
    assert re.search(r"^6\s+blocks\.0\.attn\s+blocks_0\.attn\s+2x8x32\s.*BEYOND$", text, re.M), text
    assert "gradients:" in text and "gradient divergence" in text


def test_the_json_holds_every_row_and_reads_back(mask_bug):
    d = json.loads(mask_bug.to_json())
    assert d["passed"] is False and len(d["layers"]) == len(mask_bug.layers) == 26
    assert d["first_divergence"]["layer_a"] == "blocks.0.attn"
    assert d["first_divergence"]["first_seen"] == ["blocks.0.attn.o", "blocks_0.attn.o"]
    row = d["layers"][1]
    assert row["layer_a"] == "blocks.0.ln1" and row["passed"] is True and row["budget"] > row["error"] > 0
    assert d["layers"][0]["sqnr_db"] == "inf"  # the embedding lookup: identical, said as a string
    assert len(d["grads"]) == 35 and d["grad_divergence"] is not None


def test_markdown_is_a_table_of_every_row(mask_bug):
    md = mask_bug.markdown()
    table = md[:md.index("### gradients")]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and ln.endswith((" ok |", " BEYOND |"))]
    assert len(rows) == 26 and rows[6].startswith("| 6 | blocks.0.attn | blocks_0.attn | 2x8x32 |")
    assert md.startswith("## trace: model_a Model (torch) against model_b FModel (jax): FAILED")


def test_the_html_plots_each_layer_s_error_beside_its_budget(mask_bug):
    page = mask_bug.html()
    svg = page[page.index("<svg"):page.index("</svg>")]
    points = re.findall(r'<circle [^>]*r="4" fill="(#[0-9a-f]+)"', svg)
    assert len(points) == 26
    assert points.count("#d33") == sum(not r.passed for r in mask_bug.layers) > 0  # red: beyond the budget
    budget = re.search(r'<polyline points="([^"]+)"[^>]*stroke-dasharray', svg).group(1)
    assert len(budget.split()) == 26
    assert "1e0" in svg and "1e6" in svg  # decades: a log scale from rounding to the fault
    assert "<table>" in page and "blocks_0.attn" in page


def test_unpaired_layers_are_listed_and_do_not_fail_the_trace(tc):
    tm, fm, ids = tc.port()
    rep = bb.parity.trace(tm, fm, ids)  # no pairs=: the tied head has other names on each side
    assert rep.passed
    assert rep.unpaired_a == ("head",) and rep.unpaired_b == ("embed:attend",)
    assert "unpaired in model_a: head" in rep.text() and "unpaired in model_b: embed:attend" in rep.text()


def test_a_rename_rule_and_pairing_by_order(tc):
    tm, fm, ids = tc.port()
    rep = bb.parity.trace(tm, fm, ids, rename={r"^embed:attend$": "head"})
    assert rep.passed and rep.layer("head").layer_b == "embed:attend" and not rep.unpaired_a
    rep = bb.parity.trace(tm, fm, ids, rename=lambda n: n.replace("embed:attend", "head"))
    assert rep.layer("head").layer_b == "embed:attend"
    rep = bb.parity.trace(tm, fm, ids, pair_by="order")  # both make their layers in the same order
    assert rep.passed and [r.layer_b for r in rep.layers][24] == "embed:attend"


def test_pairing_by_name_pairs_what_the_names_say_not_what_the_order_says(tc):
    tm, fm, ids = tc.port()
    wrong = {"blocks.0.attn.q": "blocks_0.attn.k"}  # by hand, wrongly: the trace believes it, and says so
    rep = bb.parity.trace(tm, fm, ids, pairs={**tc.PAIRS, **wrong})
    d = rep.first_divergence
    assert (d.layer_a, d.layer_b) == ("blocks.0.attn.q", "blocks_0.attn.k")
    assert "blocks_0.attn.q" in rep.unpaired_b


@pytest.mark.parametrize("kwargs, error, says", [
    ({"pairs": {"nope": "embed"}}, InvalidArgumentError, "pairs= names 'nope', which is no layer of model_a"),
    ({"pairs": {"head": "nope"}}, InvalidArgumentError, "pairs= names 'nope', which is no layer of model_b"),
    ({"pair_by": "size"}, InvalidArgumentError, "pair_by must be 'name' or 'order'"),
    ({"reference": "c"}, InvalidArgumentError, "reference must be"),
    ({"reference": "b"}, InvalidArgumentError, "jax makes no float64 copy"),
    ({"k": 0.5}, InvalidArgumentError, "k is the roundings allowed"),
    ({"grads": 1}, InvalidArgumentError, "grads must be True or False"),
    ({"rename": 3}, InvalidArgumentError, "rename= must be a function"),
    ({"rename": {"(": "x"}}, InvalidArgumentError, "not a regular expression"),
    ({"loss": lambda y: y.sum(), "grads": True}, InvalidArgumentError, r"loss= is a pair \(loss_a, loss_b\)"),
    ({"frameworks": ("torch",)}, InvalidArgumentError, "frameworks= is a pair"),
])
def test_bad_arguments_get_our_error_naming_them(tc, kwargs, error, says):
    tm, fm, ids = tc.port()
    with pytest.raises(error, match=says):
        bb.parity.trace(tm, fm, ids, **kwargs)


def test_a_model_no_framework_owns_is_refused_naming_the_way_out(tc):
    tm, _, ids = tc.port()
    with pytest.raises(UnsupportedTypeError, match=r"model_b is a builtins\.function, not a model object.*"
                                                   r"say its framework: frameworks=\('torch', 'jax'\)"):
        bb.parity.trace(tm, lambda ids: ids, ids)
    with pytest.raises(UnsupportedTypeError, match=r"model_b is a dict, which is neither a model nor a function: "
                                                   r"pass a torch nn.Module"):
        bb.parity.trace(tm, {"w": 1}, ids)


def test_nothing_compared_never_passes():
    f = lambda x: x * 2  # noqa: E731  (no taps: no layer to pair)
    rep = bb.parity.trace(f, f, np.ones(3, np.float32), frameworks=("numpy", "numpy"))
    assert not rep.passed and rep.layers == ()
    assert "nothing was compared" in rep.text()
