"""The probe on the device machine: it reports the GPU and its bf16 compute support, and the
frameworks this machine lacks are said, not skipped silently."""

from __future__ import annotations

from importlib import metadata

import pytest

import bf16bridge as bb
from devicehelp import DEVICE

#: every framework the bridge has an adapter for, and the distributions that provide it
FRAMEWORKS = {"torch": ("torch",), "jax": ("jax",), "tensorflow": ("tensorflow", "tensorflow-cpu")}


def _installed(dists) -> str | None:
    for d in dists:
        try:
            return f"{d} {metadata.version(d)}"
        except metadata.PackageNotFoundError:
            pass
    return None


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_framework_present(framework, record_property):
    found = _installed(FRAMEWORKS[framework])
    if found is None:
        record_property("installed", "no")
        pytest.skip(f"{framework} is not installed on this machine: none of its routes were checked here")
    record_property("installed", found)
    if framework in ("torch", "jax"):
        __import__(framework)


def test_probe_reports_the_device(torch_device, jax_device, record_property):
    caps = bb.probe(frameworks=["torch", "jax"], refresh=True)
    devices = {name: caps.frameworks[name].devices for name in ("torch", "jax")}
    for name, devs in devices.items():
        record_property(f"{name}_devices", "; ".join(f"{d.name}: bf16 compute {d.bf16_compute} ({d.why})"
                                                     for d in devs) or "none")
    if DEVICE == "cpu":
        assert devices == {"torch": (), "jax": ()}
        record_property("cpu_bf16_compute", f"{caps.cpu.bf16_compute} ({caps.cpu.why})")
        return
    import torch

    cap = torch.cuda.get_device_capability(torch_device)
    record_property("compute_capability", f"{cap[0]}.{cap[1]}")
    # fp8 arithmetic (tensor cores) from compute capability 8.9; the probe has no fp8 field yet
    record_property("fp8_compute_by_capability", cap >= (8, 9))
    record_property("probe_fp8_field", any("fp8" in f or "float8" in f for f in caps.frameworks["torch"].facts))
    index = torch_device.index
    t = [d for d in devices["torch"] if d.name.split(" ")[0] == f"cuda:{index}"]
    j = [d for d in devices["jax"] if d.name.split(" ")[0].split(":")[1] == str(index)]
    assert t and j, f"the probe did not list the GPU: {devices}"
    assert t[0].bf16_compute is (cap >= (8, 0)) and j[0].bf16_compute is (cap >= (8, 0))
    for target, device in (("torch", f"cuda:{index}"), ("jax", j[0].name.split(" ")[0])):
        d = caps.decide(target, for_compute=True, device=device)
        record_property(f"decide_{target}_{device}", str(d))
        assert d.dtype == ("bfloat16" if cap >= (8, 0) else "float32")
