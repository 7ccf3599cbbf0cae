"""docs/probe.md states no measured result by hand: its generated blocks are what
bf16bridge.capabilities.summary makes of the saved results (probe-compute.json: this machine's compute
trials; arm-check.json: tools/arm_check.sh under emulated aarch64)."""

from __future__ import annotations

import json

import pytest

from bf16bridge.capabilities import summary

COMMAND = {"probe-compute.json": "compute", "arm-check.json": "arm"}


def saved(name: str) -> dict:
    path = summary.results_dir() / name
    assert path.is_file(), f"{path} is missing: run the command named in docs/probe.md beside its block"
    return json.loads(path.read_text())


@pytest.mark.parametrize("name,render", [("probe-compute.json", summary.compute_block),
                                         ("arm-check.json", summary.arm_block)])
def test_the_docs_blocks_are_what_the_saved_results_say(name, render):
    block = summary.block_in(summary.DOC.read_text(), name)
    assert block is not None, f"docs/probe.md has no generated block for {name}"
    assert block == render(saved(name)), f"regenerate: python -m bf16bridge.capabilities.summary {COMMAND[name]}"


def test_the_saved_compute_results_say_numpy_computes_bf16_in_float32_on_a_bf16_cpu():
    data = saved("probe-compute.json")
    numpy = data["frameworks"]["numpy"]
    assert data["cpu"]["bf16_compute"] and numpy["for_compute"] == "float32"
    assert numpy["trials"][0]["how"] == "read" and "np.matmul has no bf16 loop" in numpy["reason"]


def test_the_saved_arm_results_decide_as_the_cpus_features_say():
    data = saved("arm-check.json")
    assert set(data["cpus"]) == {"cortex-a72", "neoverse-n1", "max"}
    for cpu, c in data["cpus"].items():
        bf16 = cpu == "max"  # qemu's max has FEAT_BF16; cortex-a72 and neoverse-n1 (Graviton2) do not
        assert c["HWCAP2_BF16 (bit 14)"] is bf16 and c["probe cpu"]["bf16_compute"] is bf16, cpu
        assert c["decisions"]["numpy"]["for_compute"] == "float32", cpu  # numpy widens on any CPU
        if not bf16:
            assert all(d["for_compute"] == "float32" for d in c["decisions"].values() if isinstance(d, dict)), cpu


def test_a_block_renders_from_its_data_alone():
    """The renderers read nothing but the data: a changed value changes the block."""
    data = saved("probe-compute.json")
    changed = json.loads(json.dumps(data))
    changed["frameworks"]["numpy"]["for_compute"] = "bfloat16"
    assert summary.compute_block(changed) != summary.compute_block(data)
