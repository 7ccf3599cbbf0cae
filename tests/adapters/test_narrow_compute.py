"""The fp8 compute trial (Adapter.narrow_compute) next to a user's own torch profiler: torch keeps
one profiling session at a time, so the trial must not start its own inside the user's."""

from __future__ import annotations

import pytest
from conftest import fw

from bf16bridge.adapters.hooks import ProbeHooks
from bf16bridge.core import registry


@pytest.mark.frameworks("torch")
def test_a_running_torch_profiler_is_left_alone():
    torch = fw("torch")
    from torch.profiler import ProfilerActivity, profile

    adapter = registry.hooks("torch", ProbeHooks)
    with profile(activities=[ProfilerActivity.CPU]) as outer:
        torch.ones(3).add_(1)
        found = adapter.narrow_compute("float8_e4m3fn")
        torch.ones(3).mul_(2)
    names = {e.name for e in outer.events()}
    assert "aten::add_" in names and "aten::mul_" in names, "the user's profiler lost its session"
    assert found and all(how == "unknown" and "profiler is already running" in why for _, how, why in found)


@pytest.mark.frameworks("torch")
def test_without_a_profiler_the_trial_reads_its_own_trace():
    adapter = registry.hooks("torch", ProbeHooks)
    found = dict((d, how) for d, how, _ in adapter.narrow_compute("float8_e4m3fn"))
    assert found["cpu"] in ("emulated", "native")
