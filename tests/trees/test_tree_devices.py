"""convert_tree and plan_tree with device=: every leaf lands there (moves between devices: the
jax host devices of tests/core/test_device_moves.py); a device the target lacks is the call's
error, never a leaf kept or skipped."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from conftest import bf16_ramp, bits, make, ptr


@pytest.mark.frameworks("torch", "jax", "tensorflow")
@pytest.mark.parametrize("dst", ["torch", "jax", "tensorflow", "numpy"])
def test_every_leaf_on_the_host_as_asked_zero_copy_where_the_route_is(dst):
    tree = {"n": make("numpy", bf16_ramp()), "t": [make("torch", bf16_ramp()), 7],
            "j": (make("jax", bf16_ramp()),), "f": make("tensorflow", bf16_ramp())}
    tp = bb.plan_tree(tree, dst, device="cpu")
    assert {p.to_device for p in tp.plans} == {"cpu"} and not tp.errors
    out = bb.convert_tree(tree, dst, device="cpu", on_alias="allow")
    leaves = [("n", out["n"], tree["n"]), ("t", out["t"][0], tree["t"][0]), ("j", out["j"][0], tree["j"][0]),
              ("f", out["f"], tree["f"])]
    assert out["t"][1] == 7
    for (where, y, x), p in zip(leaves, tp.plans):
        assert registry.get(dst).device_of(y) == "cpu", where
        np.testing.assert_array_equal(bits(y), bits(x))
        if not p.copies:
            assert ptr(y) == ptr(x), where


@pytest.mark.parametrize("on_unsupported", ["raise", "keep"])
def test_a_device_the_target_lacks_is_the_calls_error_not_a_leaf_kept(on_unsupported):
    tree = {"w": make("numpy", bf16_ramp())}
    with pytest.raises(bb.DeviceError, match="has: 'cpu'"):
        bb.convert_tree(tree, "numpy", device="cuda:0", on_unsupported=on_unsupported)
    with pytest.raises(bb.DeviceError, match="has: 'cpu'"):
        bb.plan_tree(tree, "numpy", device="banana")
