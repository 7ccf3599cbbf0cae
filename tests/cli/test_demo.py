"""The demo and the route matrix take their frameworks from the registry, not from a list of their own."""

import numpy as np
import pytest

from bf16bridge.cli import demo
from bf16bridge.core import registry


@pytest.mark.frameworks("tensorflow", "torch")
@pytest.mark.parametrize("names, pairs", [
    (["numpy", "torch"], {("numpy", "torch"), ("torch", "numpy")}),
    (["numpy", "jax", "tensorflow"], {(s, d) for s in ("numpy", "jax", "tensorflow")
                                      for d in ("numpy", "jax", "tensorflow") if s != d}),
])
def test_matrix_rows_follow_the_registry(monkeypatch, names, pairs):
    monkeypatch.setattr(registry, "names", lambda: list(names))
    rows = demo.matrix_rows(n=64)
    assert {(r["source"], r["target"]) for r in rows} == pairs and len(rows) == len(pairs)
    assert all(r["bit_exact"] for r in rows)


@pytest.mark.frameworks("torch")
def test_demo_counts_the_pairs_it_ran(monkeypatch):
    monkeypatch.setattr(registry, "names", lambda: ["numpy", "torch"])
    text, ok = demo.demo(mib=0.01, repeat=1)
    assert ok and text.endswith("all 2 pairs bit-exact")
    assert "every ordered pair of numpy, torch" in text and "jax" not in text


def test_sample_is_aligned_and_covers_bit_patterns():
    a = demo.sample(4096)
    assert a.ctypes.data % 64 == 0 and np.unique(a.view(np.uint16)).size > 3000


def test_matrix_refuses_an_unknown_format():
    from bf16bridge.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="fmt must be one of text, markdown, json; got 'html'"):
        demo.matrix("html")


# what plan() does with each common input here (torch 2.13, jax 0.10.2, tensorflow 2.21)
COMMON = {
    ("default numpy allocation", "torch"): (False, ""),
    ("default numpy allocation", "jax"): (True, "not 64-byte aligned"),
    ("default numpy allocation", "tensorflow"): (True, "not 64-byte aligned"),
    ("read-only numpy array", "torch"): (True, "the input is read-only"),
    ("read-only numpy array", "jax"): (False, ""),
    ("read-only numpy array", "tensorflow"): (False, ""),
    ("transposed 2-D torch tensor", "numpy"): (False, ""),
    ("transposed 2-D torch tensor", "tensorflow"): (True, "the input is strided"),
}


#: transposes into jax: kept as they are where jax's import was found to keep a permuted layout (its
#: probe fact "permuted import": jax 0.10), else made row-major first; bf16 numpy crosses by its uint16
#: view and jax's bit-cast, which copies either way
TRANSPOSED_INTO_JAX = {
    True: {("transposed 2-D numpy tensor", "jax"): (True, "bit-view copies"),
           ("transposed 2-D torch tensor", "jax"): (False, "")},
    False: {("transposed 2-D numpy tensor", "jax"): (True, "the input is strided"),
            ("transposed 2-D torch tensor", "jax"): (True, "the input is strided")},
}


@pytest.mark.frameworks("torch", "jax")
def test_common_inputs_copy_where_the_planner_says():
    from bf16bridge.adapters.jax import probe

    rows = demo.common_input_rows()
    found = {}
    expect = {**COMMON, **TRANSPOSED_INTO_JAX[probe.takes_permuted()]}
    for r in rows:
        for (label, target), expected in expect.items():
            if r["input"].startswith(label) and r["target"] == target:
                found[label, target] = r
                assert r["copies"] == expected[0] and expected[1] in r["why"] and bool(r["why"]) == r["copies"], r
    assert set(found) == set(expect)
    unaligned = next(r["input"] for r in rows if r["input"].startswith("default numpy allocation"))
    assert "address 0 mod 64" not in unaligned  # a default allocation that is not aligned was found


@pytest.mark.frameworks("torch")
def test_common_inputs_follow_the_registry(monkeypatch):
    monkeypatch.setattr(registry, "names", lambda: ["numpy", "torch"])
    rows = demo.common_input_rows(n=1024)
    assert {(r["source"], r["target"]) for r in rows} == {("numpy", "torch"), ("torch", "numpy")}


@pytest.mark.frameworks("torch")
def test_matrix_text_states_its_assumptions_and_markdown_is_the_table_alone():
    text, markdown = demo.matrix("text"), demo.matrix("markdown")
    assert f"assumes: {demo.MATRIX_ASSUMES}" in text and "common inputs outside that assumption" in text
    assert markdown.startswith("| from |") and "assumes" not in markdown and len(markdown.splitlines()) == 14


def test_demo_does_not_warn_about_its_own_aliases():
    import warnings

    from bf16bridge.errors import Bf16BridgeWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", Bf16BridgeWarning)
        text, ok = demo.demo(mib=0.01, repeat=1)
    assert ok
