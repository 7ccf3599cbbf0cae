"""The demo and the route matrix take their frameworks from the registry, not from a list of their own."""

import numpy as np
import pytest

from bf16bridge import demo, registry


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
