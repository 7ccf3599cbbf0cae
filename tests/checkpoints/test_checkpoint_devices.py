"""device= of bb.load, bb.open(...).get and .plan, and load_for_target: the tensors land on the device
asked for, or our DeviceError listing the devices the target has, said before the file is read. On this
CPU-only machine, the host by its names; moves between jax's host devices run in
tests/core/test_device_moves.py, to a GPU in tests/device/."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from conftest import BF16, FRAMEWORKS, bits, ptr


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "w.safetensors")
    bb.save({"w": np.arange(1 << 16, dtype=np.uint16).view(BF16), "n": np.arange(6, dtype=np.int32)}, p)
    return p


def _host(dst):
    """The host as a device object of ``dst`` where it has one, else by name."""
    if dst == "torch":
        import torch

        return torch.device("cpu")
    if dst == "jax":
        import jax

        return jax.devices("cpu")[0]
    return "/CPU:0" if dst == "tensorflow" else "cpu"


@pytest.mark.parametrize("dst", FRAMEWORKS)
def test_the_host_as_asked_zero_copy_from_the_map_as_without_it(path, dst):
    with bb.open(path) as f:
        for device in ("cpu", _host(dst)):
            p = f.plan("w", dst, device=device)
            assert p.to_device == "cpu" and "place" not in [s.kind for s in p.steps]
            assert p.copies == f.plan("w", dst).copies
            y = f.get("w", dst, device=device)
            assert registry.get(dst).device_of(y) == "cpu"
            np.testing.assert_array_equal(bits(y), bits(f.array("w")))
            if not p.copies:
                assert ptr(y) == ptr(f.array("w"))
    out = bb.load(path, dst, device=_host(dst))
    assert {registry.get(dst).device_of(v) for v in out.values()} == {"cpu"}
    got, report = bb.load_for_target(path, dst, device=_host(dst))
    np.testing.assert_array_equal(bits(got["n"]), np.arange(6, dtype=np.uint32))
    assert report["w"].dtype_in == "bfloat16"


@pytest.mark.parametrize("dst", FRAMEWORKS)
@pytest.mark.parametrize("device", ["cuda:7", "banana", "/GPU:0"])
def test_a_device_the_target_lacks_is_refused_before_the_file_is_read(tmp_path, path, dst, device):
    missing = str(tmp_path / "no such file.safetensors")
    listing = r"device=.* is not a device .* has here.*has: 'cpu'"
    for call in (lambda: bb.load(missing, dst, device=device),
                 lambda: bb.load_for_target(missing, dst, device=device)):
        with pytest.raises(bb.DeviceError, match=listing):  # the device, not the missing file
            call()
    with bb.open(path) as f:
        with pytest.raises(bb.DeviceError, match=listing):
            f.get("w", dst, device=device)
        with pytest.raises(bb.DeviceError, match=listing):
            f.plan("w", dst, device=device)


@pytest.mark.frameworks("torch")
def test_load_for_target_decides_for_the_device_it_places_on(path):
    import torch

    got, report = bb.load_for_target(path, "torch", device=torch.device("cpu"), for_compute=True)
    assert got["w"].device == torch.device("cpu")
    # the decision was asked for the host (a torch.device is no string the probe reads): as device="cpu" decides
    assert report["w"].reason == bb.load_for_target(path, "torch", device="cpu", for_compute=True)[1]["w"].reason
    assert "CPU" in report["w"].reason
    with pytest.raises(bb.DeviceError, match="'cpu'"):  # no longer a string the probe has never heard of
        bb.load_for_target(path, "torch", device="cuda")
