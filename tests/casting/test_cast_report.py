"""What a cast reports (bf16bridge/casting/report.py): a row for every leaf with its action, dtypes
and bytes, a short str for a large model, bytes not known under a trace, and docs/casting.md showing
every rule, a real report and the NaN table the rounding tests measure."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.casting import DEFAULT_POLICY
from conftest import BF16, bits
from casting_cases import NAN_BITS


def test_report_lists_every_leaf_and_the_bytes():
    tree = {"ln_f": {"weight": np.ones(10, np.float32)}, "fc": {"weight": np.ones((10, 10), np.float32)},
            "emb": np.ones(5, BF16), "step": np.array(3, np.int64)}
    _, report = bb.cast_tree(tree, "bfloat16")
    assert [(r.path, r.action, r.before, r.after, r.nbytes_before, r.nbytes_after) for r in report.leaves] == [
        ("ln_f.weight", "kept", "float32", "float32", 40, 40),
        ("fc.weight", "cast", "float32", "bfloat16", 400, 200),
        ("emb", "unchanged", "bfloat16", "bfloat16", 10, 10),
        ("step", "skipped", "int64", "int64", 8, 8),
    ]
    assert report.bytes_before == 458 and report.bytes_after == 258
    assert [r.path for r in report.cast] == ["fc.weight"] and [r.path for r in report.skipped] == ["step"]
    text = str(report)
    assert text.splitlines()[0] == "cast to bfloat16: 4 leaves, 458 B -> 258 B"
    assert "ln_f.weight: kept float32 [norm-abbreviation]" in text
    assert "fc.weight: cast float32 -> bfloat16" in text and "step: skipped int64 (not floating)" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.dtype = "float16"  # type: ignore[misc]


def test_docs_show_every_rule_and_a_real_report():
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "casting.md").read_text(encoding="utf-8")
    for rule in DEFAULT_POLICY + bb.casting.HEAD_POLICY + bb.casting.DEFAULT_KEEP_TYPES:
        assert f"| `{rule.name}` |" in doc, rule.name
    tree = {"ln_f": {"weight": np.ones(10, np.float32)}, "fc": {"weight": np.ones((10, 10), np.float32)},
            "emb": np.ones(5, BF16), "step": np.array(3, np.int64)}
    # the page's own session (tests/project/test_docs_examples.py runs it) prints this report, to its last line
    assert '[1])\n' + str(bb.cast_tree(tree, "bfloat16")[1]) + "\n```" in doc
    for framework, by_n in NAN_BITS.items():  # the NaN table says what the test measures
        for n, pairs in by_n.items():
            assert any(f"{a:#06X}, {b:#06X}".replace("0X", "0x") in doc for a, b in pairs), (framework, n)


def test_report_str_stays_short_for_a_large_model():
    tree = {f"h.{i}.w": np.ones(1, np.float32) for i in range(100)}
    text = str(bb.cast_tree(tree, "bfloat16")[1])
    assert "... 60 more (report.leaves lists every one)" in text and len(text.splitlines()) < 50


@pytest.mark.frameworks("tensorflow")
def test_cast_tree_in_a_tf_function_with_an_unknown_dimension():
    """A tf.function traced with a None dimension: the byte count was a raw TypeError (int * None); the
    cast is made, and the report says its bytes are not known."""
    import tensorflow as tf

    reports = []

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def f(x):
        out, report = bb.cast_tree({"w": x}, "float64", policy=())
        reports.append(report)
        return out["w"]

    a = np.array([1e-39, -3e-39, 1.5], np.float32)
    np.testing.assert_array_equal(bits(f(tf.constant(a))), bits(a.astype(np.float64)))
    assert reports[0].leaves[0].action == "cast" and reports[0].bytes_before == 0
    assert reports[0].notes == ("1 leaves (w) have a dimension not known while traced (None): their bytes count 0",)
