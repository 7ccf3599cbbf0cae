"""device=: the result lands on the device asked for, as part of the route (a "place" step of the
plan where it moves; none where the data is there already), or our DeviceError listing the devices
the target framework has here; never a device accepted and ignored. On this CPU-only machine: the
host's names in every spelling, zero-copy where the data is there, and the refusals. Moves between
devices run in test_device_moves.py (jax's host devices) and tests/device/ (a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fastpath, registry
from bf16bridge.core.adapter import parse_device, same_device
from conftest import FRAMEWORKS, bf16_ramp, bits, make, ptr


def _jax_cpu():
    import jax

    return jax.devices("cpu")[0]


def _torch_cpu():
    import torch

    return torch.device("cpu")


def _tf_spec():
    import tensorflow as tf

    return tf.DeviceSpec.from_string("/CPU:0")


def _tf_logical():
    import tensorflow as tf

    return tf.config.list_logical_devices("CPU")[0]


#: the host, as each target framework's device= may name it (a callable: a device object of its own)
HOST_NAMES = {
    "numpy": ["cpu"],
    "torch": ["cpu", "cpu:0", "CPU", _torch_cpu],
    "jax": ["cpu", "cpu:0", _jax_cpu],
    "tensorflow": ["/CPU:0", "CPU:0", "cpu", "/job:localhost/replica:0/task:0/device:CPU:0", _tf_spec, _tf_logical],
}
#: what no framework has here (a GPU this machine lacks, no device at all, not a name), and a device object
#: of another framework
REFUSED = {
    "numpy": ["cuda:0", "banana", 0, _torch_cpu, _jax_cpu],
    "torch": ["cuda:7", "cuda", "gpu:0", "banana", "cpu:1", 0, _jax_cpu],
    "jax": ["cuda:0", "gpu:0", "/GPU:0", "banana", "cpu:5", 0, _torch_cpu],
    "tensorflow": ["/GPU:0", "cuda:7", "banana", "cpu:1", 0, _jax_cpu, _torch_cpu],
}


#: a device object's maker -> the framework it needs beyond the target (conftest deselects by marks)
_NEEDS = {"_torch_cpu": "torch", "_jax_cpu": "jax", "_tf_spec": "tensorflow", "_tf_logical": "tensorflow"}


def _cases(table):
    return [pytest.param(dst, name, id=f"{dst}-{getattr(name, '__name__', name)}",
                         marks=[pytest.mark.frameworks(_NEEDS[name.__name__])] if callable(name) else [])
            for dst, names in table.items() for name in names]


def _device(name):
    return name() if callable(name) else name


@pytest.mark.parametrize("src", FRAMEWORKS)
@pytest.mark.parametrize(("dst", "name"), _cases(HOST_NAMES))
def test_the_host_by_any_of_its_names_lands_there_zero_copy_where_the_route_is(src, dst, name):
    x = make(src, bf16_ramp())
    device = _device(name)
    p = bb.plan(x, dst, device=device)
    assert p.to_device == "cpu"
    assert "place" not in [s.kind for s in p.steps]  # already there: no move
    assert p.copies == bb.plan(x, dst).copies
    y = bb.convert(x, dst, device=device, on_alias="allow")
    assert registry.get(dst).device_of(y) == "cpu"
    np.testing.assert_array_equal(bits(y), bits(x))
    if not p.copies:  # zero-copy, by pointer, as without device=
        assert ptr(y) == ptr(x)
        assert bb.convert(x, dst, device=device, copy=False, on_alias="allow") is not None
    fresh = bb.convert(x, dst, device=device, copy=True)
    assert ptr(fresh) != ptr(x)
    np.testing.assert_array_equal(bits(fresh), bits(x))


@pytest.mark.parametrize(("dst", "name"), _cases(REFUSED))
def test_a_device_the_target_lacks_is_our_error_listing_those_it_has(dst, name):
    x = make("numpy", bf16_ramp())
    device = _device(name)
    calls = {
        "convert": lambda: bb.convert(x, dst, device=device),
        "plan": lambda: bb.plan(x, dst, device=device),
        "convert_tree": lambda: bb.convert_tree({"w": [x]}, dst, device=device),
        "plan_tree": lambda: bb.plan_tree({"w": x}, dst, device=device),
        f"to_{dst}": lambda: getattr(bb, f"to_{dst}")(x, device=device),
    }
    for how, call in calls.items():
        with pytest.raises(bb.DeviceError, match=r"device=.* is not a device .* has here.*has: 'cpu'") as got:
            call()
        assert isinstance(got.value, ValueError), how
        assert "device=None" in str(got.value), how
    # a tree's refusal is the call's, said before any leaf: no path in it
    with pytest.raises(bb.DeviceError) as got:
        bb.convert_tree({"w": x}, dst, device=device)
    assert "['w']" not in str(got.value)


@pytest.mark.frameworks("torch", "jax")
def test_the_plan_says_the_device_and_the_cache_keys_on_it():
    import torch

    t = torch.arange(8, dtype=torch.bfloat16)
    fastpath.clear()
    bb.convert(t, "jax")
    bb.convert(t, "jax", device="cpu")  # a cached plan without device= answers nothing about a device
    assert {k[-1] for k in fastpath.CACHE if k[0] is torch.Tensor} == {None, "cpu"}
    with pytest.raises(bb.DeviceError):  # not the cached plans of None or "cpu"
        bb.convert(t, "jax", device="cuda:7")
    p = bb.plan(t, "jax", device="cpu")
    assert "device: cpu (asked; already there: no move)" in str(p)
    assert p.to_dict()["to_device"] == "cpu" and bb.plan(t, "jax").to_dict()["to_device"] is None
    assert "device:" not in str(bb.plan(t, "jax"))


@pytest.mark.frameworks("torch")
def test_a_device_that_follows_the_current_one_keeps_no_plan(monkeypatch):
    import torch

    torch_adapter = registry.get("torch")
    assert torch_adapter.fixed_device("cuda:0") and torch_adapter.fixed_device(torch.device("cuda", 1))
    assert not torch_adapter.fixed_device("cuda") and not torch_adapter.fixed_device(torch.device("cuda"))
    assert torch_adapter.fixed_device("cpu") and torch_adapter.fixed_device(torch.device("cpu"))
    # "cuda" is the current device of the moment: planned each call, never kept (here the host stands in)
    monkeypatch.setattr(type(torch_adapter), "find_device", lambda self, device: "cpu")
    t = torch.arange(8, dtype=torch.bfloat16)
    fastpath.clear()
    for _ in range(2):
        bb.convert(t, "torch", device="cuda")
    assert not [k for k in fastpath.CACHE if k[-1] == "cuda"]
    bb.convert(t, "torch", device="cuda:0")
    assert [k for k in fastpath.CACHE if k[-1] == "cuda:0"]


@pytest.mark.parametrize(("name", "parsed"), [
    ("cpu", ("cpu", None)), ("CPU:0", ("cpu", 0)), ("/CPU:0", ("cpu", 0)), ("cuda", ("gpu", None)),
    ("cuda:1", ("gpu", 1)), ("gpu:0", ("gpu", 0)), ("/GPU:2", ("gpu", 2)),
    ("/job:localhost/replica:0/task:0/device:GPU:1", ("gpu", 1)), ("/physical_device:CPU:0", ("cpu", 0)),
    ("banana", None), ("cuda:x", None), ("", None), ("tpu:0", None),
])
def test_device_names_in_every_frameworks_spelling(name, parsed):
    assert parse_device(name) == parsed


def test_the_same_device_by_two_frameworks_names():
    assert same_device("cuda:0", "gpu:0") and same_device("cpu", "cpu:0") and same_device("gpu", "cuda:0")
    assert not same_device("cuda:0", "cuda:1") and not same_device("cpu", "gpu:0") and not same_device("cpu:1", "cpu")
    assert not same_device("banana", "banana:0")
