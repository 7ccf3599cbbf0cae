"""Helpers the shards tests of several files share: the child processes' environment, a jax sharding
over one device, and jax arrays laid out over the eight host devices of the ``jax8`` child."""

from __future__ import annotations

import os

import numpy as np

from conftest import BF16

#: set in the children the shards tests start: which part of them they run ("jax8": the
#: ``TestEightDevices`` classes of every shards test file; "dtensor": test_shards_dtensor.py as a script)
CHILD = os.environ.get("BF16BRIDGE_SHARDS_CHILD")
#: the tests folder (conftest, strategies: the two-process script imports them) and the repository
#: root (bf16bridge, whose bench package the jax8 child's test_benchmark_runs_quick imports)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]), **extra)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _one_device_sharding():
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.array(jax.devices()[:1]), ("x",)), PartitionSpec())


def _make_mesh(shape, axes, devices=None):
    """jax.make_mesh where this jax has it; jax 0.4.30 has not: a Mesh over the first devices."""
    import jax

    make = getattr(jax, "make_mesh", None)
    if make is not None:
        return make(tuple(shape), tuple(axes), **({} if devices is None else {"devices": devices}))
    devs = (jax.devices() if devices is None else devices)[:int(np.prod(shape))]
    return jax.sharding.Mesh(np.array(devs, dtype=object).reshape(tuple(shape)), tuple(axes))


def _sharded(u16: np.ndarray, mesh_shape, axes, spec):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = _make_mesh(mesh_shape, axes, devices=jax.devices()[:int(np.prod(mesh_shape))])
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in spec]
    return jax.device_put(u16.view(BF16), NamedSharding(mesh, PartitionSpec(*entries)))


def _disagreeing(mesh_shape, axes, spec, *, device, at):
    """A (64, 6) bf16 jax array laid out as ``spec`` whose shard on cpu:``device`` has one bit of
    element ``at`` flipped against the other replicas of its index; and that shard's bits."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    u16 = np.arange(64 * 6, dtype=np.uint16).reshape(64, 6)
    sharding = NamedSharding(_make_mesh(mesh_shape, axes), PartitionSpec(*spec))
    buffers = []
    for dev, idx in sharding.addressable_devices_indices_map(u16.shape).items():
        part = u16[idx].copy()
        if dev.id == device:
            part[at] ^= 1
            flipped = part.copy()
        buffers.append(jax.device_put(part.view(BF16), dev))
    return jax.make_array_from_single_device_arrays(u16.shape, sharding, buffers), flipped
