"""device= moving data between devices, on this CPU-only machine: jax's host devices (``XLA_FLAGS``
``--xla_force_host_platform_device_count=4``: cpu, cpu:1, cpu:2, cpu:3) are devices of their own to
jax, so a move between them is a real one. ``XLA_FLAGS`` must be set before jax is imported: the
tests run in a pytest child (``test_jax_host_devices_in_a_child``). Bits are checked on every bf16
pattern; copies by the plan and by pointers."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, bits, ptr

CHILD = os.environ.get("BF16BRIDGE_DEVICE_MOVES_CHILD")
HERE = os.path.abspath(__file__)
TESTS = os.path.dirname(os.path.dirname(HERE))
#: the tests the child must pass (it fails here when fewer ran)
CHILD_TESTS = 10


@pytest.mark.frameworks("torch", "jax")
def test_jax_host_devices_in_a_child():
    env = dict(os.environ, BF16BRIDGE_DEVICE_MOVES_CHILD="1", XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), TESTS, os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_ADDOPTS", None)
    # every warning is an error, but one: tensorflow 2.16's import reads jax.xla_computation, which
    # jax 0.4.30 deprecates (a warning between the two frameworks, not ours; the suite's ini ignores it too)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
                          "-W", "ignore:jax.xla_computation is deprecated:DeprecationWarning",
                          "-k", "TestJaxHostDevices", HERE], capture_output=True, text=True, timeout=600, env=env,
                         cwd=TESTS)
    tail = (out.stdout + out.stderr)[-6000:]
    assert out.returncode == 0, tail
    assert f"{CHILD_TESTS} passed" in out.stdout and "skipped" not in out.stdout, tail


def _every_bf16():
    return np.arange(1 << 16, dtype=np.uint16).view(BF16)


def _where(y) -> str:
    (d,) = y.devices()
    return "cpu" if d.id == 0 else f"cpu:{d.id}"


if CHILD:
    class TestJaxHostDevices:
        def test_four_host_devices(self):
            import jax

            assert len(jax.devices("cpu")) == 4
            assert bb.plan(jax.device_put(np.zeros(2, np.float32), jax.devices("cpu")[2]), "numpy").device == "cpu:2"

        @pytest.mark.parametrize("src", ["numpy", "torch", "tensorflow"])
        def test_to_another_device_in_one_copy_bit_exact(self, src):
            from conftest import make

            x = make(src, _every_bf16())
            p = bb.plan(x, "jax", device="cpu:3")
            assert [s.kind for s in p.steps if s.copies] == ["place"], str(p)  # the move is the one copy
            assert p.steps[-1].kind == "place" and "device='cpu:3' asked" in p.steps[-1].reason
            assert p.to_device == "cpu:3" and p.copies and not p.shares_memory and p.alias is None
            assert "device: cpu:3 (asked; moved there)" in str(p)
            y = bb.convert(x, "jax", device="cpu:3")
            assert _where(y) == "cpu:3"
            np.testing.assert_array_equal(bits(y), bits(x))
            assert ptr(y) != ptr(x)
            # copy=True: the move is the copy it asks for (not a host copy before it)
            q = bb.plan(x, "jax", device="cpu:3", copy=True)
            assert [s.kind for s in q.steps if s.copies] == ["place"], str(q)
            np.testing.assert_array_equal(bits(bb.convert(x, "jax", device="cpu:3", copy=True)), bits(x))
            with pytest.raises(bb.CopyRequiredError, match=r"device='cpu:3' asks for a copy.*copy=None"):
                bb.convert(x, "jax", device="cpu:3", copy=False)

        def test_already_there_is_zero_copy_and_a_jax_device_names_it(self):
            import jax

            d3 = jax.devices("cpu")[3]
            x = jax.device_put(_every_bf16(), d3)
            for device in ("cpu:3", d3, "CPU:3", "/device:CPU:3"):
                p = bb.plan(x, "jax", device=device)
                assert p.steps == () and not p.copies and p.to_device == "cpu:3"
                assert bb.convert(x, "jax", device=device, copy=False) is x
            # between jax devices: a move, one copy
            y = bb.convert(x, "jax", device=jax.devices("cpu")[1])
            assert _where(y) == "cpu:1" and ptr(y) != ptr(x)
            np.testing.assert_array_equal(bits(y), bits(x))

        @pytest.mark.parametrize("dst", ["numpy", "torch"])
        def test_host_memory_of_any_jax_device_is_the_host_to_others(self, dst):
            import jax

            x = jax.device_put(_every_bf16(), jax.devices("cpu")[2])
            p = bb.plan(x, dst, device="cpu")
            assert not p.copies and p.to_device == "cpu"
            y = bb.convert(x, dst, device="cpu", copy=False, on_alias="allow")
            assert ptr(y) == ptr(x)

        def test_a_cached_plan_is_for_its_device_only(self):
            import torch

            t = torch.from_numpy(_every_bf16().view(np.int16)).view(torch.bfloat16)
            for _ in range(2):  # planned, then cached (no move: a plan kept)
                assert _where(bb.convert(t, "jax", device="cpu")) == "cpu"
            for _ in range(2):  # a move: planned each time, never the plan of "cpu"
                assert _where(bb.convert(t, "jax", device="cpu:2")) == "cpu:2"
            assert _where(bb.convert(t, "jax")) == "cpu"

        def test_a_tree_lands_on_the_device(self):
            import torch

            t = torch.arange(16, dtype=torch.bfloat16)
            out = bb.convert_tree({"a": t, "b": [t, 3]}, "jax", device="cpu:1")
            assert _where(out["a"]) == _where(out["b"][0]) == "cpu:1" and out["b"][1] == 3
            tp = bb.plan_tree({"a": t}, "jax", device="cpu:1")
            assert tp.plans[0].steps[-1].kind == "place"

        def test_a_checkpoint_lands_on_the_device_copied_once_from_the_map(self, tmp_path):
            from bf16bridge.checkpoints import load, load_for_target, open as bb_open, save

            path = str(tmp_path / "w.safetensors")
            save({"w": _every_bf16(), "i": np.arange(5, dtype=np.int32)}, path)
            with bb_open(path) as f:
                p = f.plan("w", "jax", device="cpu:2")
                assert [s.kind for s in p.steps if s.copies] == ["place"], str(p)
                y = f.get("w", "jax", device="cpu:2")
                assert _where(y) == "cpu:2"
                np.testing.assert_array_equal(bits(y), bits(_every_bf16()))
            out = load(path, "jax", device="cpu:3")
            assert {_where(v) for v in out.values()} == {"cpu:3"}
            got, report = load_for_target(path, "jax", device="cpu:1", dtype="bfloat16")
            assert {_where(v) for v in got.values()} == {"cpu:1"} and all(k.copied for k in report.keys)
            np.testing.assert_array_equal(bits(got["w"]), bits(_every_bf16()))
