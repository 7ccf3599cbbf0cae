"""The checkpoint part's many-tensor rows (bf16bridge/bench/checkpoints.py's MANY_*): judged against
safetensors' open + first tensor into numpy and torch, and shown on the page from the saved JSON.
(The run itself is checked by the quick harness run, tests/project/test_benchmarks_smoke.py.)"""

from __future__ import annotations

from bf16bridge.bench import report_parts


def _part(many_results: dict | None) -> dict:
    many = None if many_results is None else {
        "tensors": 850, "shape": [64, 64], "dtype": "float32", "nbytes": 850 * 64 * 64 * 4,
        "file_bytes": 14_003_992, "repeat": 6, "results": many_results}
    return {"mode": "full", "machine": {"when": "today"}, "wall_s": 1.0, "writer": "safetensors", "layers": 70,
            "repeat": 2, "first_repeat": 6, "nbytes": 1 << 30, "zero_copy": [], "results": {},
            **({"many": many} if many else {})}


def _targets(part: dict) -> dict:
    return {what: (met, how) for what, met, how in report_parts.part_targets({"checkpoints": part})
            if "850-tensor" in what}


def test_the_many_tensor_targets_compare_with_safetensors_and_say_who_fails():
    got = _targets(_part({"bb.load numpy": {"first_s": 1e-3}, "safetensors.numpy": {"first_s": 2e-3},
                          "bb.load torch": {"first_s": 3e-3}, "safetensors.torch": {"first_s": 2e-3}}))
    assert got == {
        "checkpoint open + first tensor, 850-tensor header, into numpy: no slower than safetensors.numpy":
            (True, "1.00 ms vs 2.00 ms (0.50x)"),
        "checkpoint open + first tensor, 850-tensor header, into torch: no slower than safetensors.torch":
            (False, "3.00 ms vs 2.00 ms (1.50x)")}
    got = _targets(_part({"bb.load numpy": {"error": "E: ours"}, "safetensors.numpy": {"first_s": 2e-3},
                          "bb.load torch": {"first_s": 3e-3}, "safetensors.torch": {"error": "E: theirs"}}))
    assert list(got.values()) == [(False, "bb fails: E: ours"), (True, "3.00 ms; safetensors.torch fails: E: theirs")]
    assert _targets(_part(None)) == {}  # results saved before the rows: no target, no row


def test_the_many_tensor_table_is_on_the_page():
    lines = report_parts._checkpoints_markdown(_part({"bb.load numpy": {"first_s": 1e-3},
                                                     "safetensors.numpy": {"error": "E: theirs"}}))
    text = "\n".join(lines)
    assert "850 float32 tensors of 64x64" in text and "the best of 6 fresh processes" in text
    assert "| bb.load numpy | 1.00 ms |" in text and "| safetensors.numpy | fails: E: theirs |" in text
    assert "850" not in "\n".join(report_parts._checkpoints_markdown(_part(None)))
