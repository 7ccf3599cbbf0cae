"""bf16bridge matrix / demo, run as a user runs them."""

import json
import subprocess
import sys


def _cli(*args):
    out = subprocess.run([sys.executable, "-m", "bf16bridge", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_matrix_json_has_twelve_zero_copy_bit_exact_routes():
    rows = json.loads(_cli("matrix", "--format", "json"))
    assert len(rows) == 12
    assert len({(r["source"], r["target"]) for r in rows}) == 12
    for r in rows:
        assert r["bit_exact"] and not r["copies"] and r["shares_memory"], r
        assert r["writable"] == (r["target"] in ("numpy", "torch") and r["source"] not in ("jax", "tensorflow")
                                 or r["target"] == "torch")


def test_matrix_markdown():
    text = _cli("matrix", "--format", "markdown")
    assert text.startswith("| from | to | route |") and text.count("\n") >= 13


def test_demo_runs_and_says_all_pairs_are_bit_exact():
    text = _cli("demo", "--mib", "0.25", "--repeat", "1")
    assert "all 12 pairs bit-exact" in text
    assert text.count("zero-copy") >= 12
