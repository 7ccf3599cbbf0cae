"""The shards part's target on the benchmark page (bf16bridge/bench/report_parts.py): convert_shards
at most 1.2x the hand torch.from_dlpack loop over the same shards, judged on the medians of one run."""

from __future__ import annotations

import pytest

from bf16bridge.bench import report_parts


def _part(ours: float, hand: float) -> dict:
    times = {"convert_shards": {"median": ours, "best": ours / 2}, "hand_loop": {"median": hand, "best": hand}}
    return {"times": times, "ratios": {"convert_shards / hand_loop": ours / hand}, "nbytes": 256 << 20,
            "devices": 8, "shards": 8}


@pytest.mark.parametrize("ours,met", [(48e-6, True), (49e-6, False)])
def test_convert_shards_is_judged_against_the_hand_loop(ours, met):
    (what, ok, how), = report_parts.shard_targets(_part(ours, 40e-6))
    assert what == ("convert_shards of 256.0 MiB over 8 host devices into torch: at most 1.2x a hand "
                    "torch.from_dlpack loop over the shards")
    assert ok is met
    assert how == f"{ours / 40e-6:.2f}x ({ours * 1e6:.1f} us vs 40.0 us, medians; 8 shards)"


def test_the_target_is_among_the_parts_targets():
    got = report_parts.part_targets({"shards": _part(44e-6, 40e-6)})
    assert [(w.split(":")[0], ok) for w, ok, _ in got] == [
        ("convert_shards of 256.0 MiB over 8 host devices into torch", True)]
