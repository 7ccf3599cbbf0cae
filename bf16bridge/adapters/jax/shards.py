"""What ``bb.convert_shards`` / ``bb.from_shards`` ask of jax: a sharded array's local shards, and a
sharded array built from shards (each moved by the ``convert`` passed in), laid out by a mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bf16bridge.adapters.hooks import ShardHooks
from bf16bridge.adapters.jax import internals, probe
from bf16bridge.adapters.jax.convert import DELETED
from bf16bridge.core import dtypes, formats, registry
from bf16bridge.core import sharding as shards
from bf16bridge.errors import (CopyRequiredError, DeviceError, InvalidArgumentError, UnsupportedDtypeError,
                               UnsupportedTypeError)


class JaxShards(ShardHooks):
    name = "jax"
    assembles = True

    def local_shards(self, x):
        if isinstance(x, internals.Tracer) or not isinstance(x, jax.Array):
            return None
        sharding, shape = x.sharding, tuple(x.shape)
        key = (type(sharding), sharding, shape)
        known = PLACES.get(key)
        if known is None and len(sharding.device_set) == 1 and not isinstance(sharding, jax.sharding.NamedSharding):
            return None  # one device, no mesh (a mesh of one device is a sharding all the same)
        if x.is_deleted():
            raise UnsupportedTypeError(DELETED)
        if known is None:
            known = _places(x, sharding, shape)
            if len(PLACES) < PLACES_LIMIT:
                PLACES[key] = known
        layout, places = known
        if places is None:  # unreduced values: jax has no shard indices for them
            return shape, layout, []
        pieces = []
        for s in x.addressable_shards:
            place = places.get(s.device)
            index, name, replica = place if place is not None else _place(s, shape)
            pieces.append((index, name, s.data, replica))
        return shape, layout, pieces

    def assemble(self, shape, pieces, sharding, layout, copy, on_alias, convert):
        sharding = _checked_sharding(sharding, layout, shape)
        try:
            wanted = sharding.addressable_devices_indices_map(shape)
        except ValueError as err:  # a dimension the sharding does not divide evenly
            raise InvalidArgumentError(f"jax cannot lay out a {shape} array as {sharding}: {err}") from err
        if pieces:  # (one dtype across the pieces: from_shards checked them)
            self._refuse_narrowed(pieces[0][2])
        held: dict = {}
        for index, device, t in pieces:
            held.setdefault(_span(index), []).append((device, t))
        arrays = []
        for dev, idx in wanted.items():
            index = shards.bounds(idx, shape)
            got = held.get(_span(index))
            if not got:
                raise InvalidArgumentError(
                    f"the sharding puts {_show(index)} on {_device_name(dev)}, but no shard given holds it "
                    f"(they hold {', '.join(sorted({_show(i) for i, _, _ in pieces})) or 'nothing'}); pass the "
                    "shards of this process, or the sharding they came from")
            arrays.append((dev, index, _onto(got, dev, copy, on_alias, index, convert)))
        _put_host(arrays, copy)
        return jax.make_array_from_single_device_arrays(shape, sharding, [a for _, _, a in arrays])

    def _refuse_narrowed(self, t) -> None:
        """jax without x64 would narrow int64 / float64 shards in device_put without a word: refused,
        as convert refuses them."""
        name = dtypes.in_values(*registry.get(registry.framework_of(t)).shape_dtype(t))[1]
        refused = registry.get(self.name).cannot_hold(name)
        if refused is not None:
            raise UnsupportedDtypeError(f"jax cannot hold these {name} shards bit for bit here ({refused}); "
                                        "or convert the shards to a dtype jax holds first")


def _checked_sharding(sharding, layout, shape):
    """``sharding``, or one built from ``layout`` where it is None; refused where it is no jax
    Sharding or has unreduced axes."""
    if sharding is None:
        if layout is None:
            raise InvalidArgumentError("these shards carry no mesh layout: pass sharding= (a jax Sharding)")
        sharding = _sharding(layout, shape)
    if not isinstance(sharding, jax.sharding.Sharding):
        raise InvalidArgumentError(
            f"sharding= for jax is a jax.sharding.Sharding (a NamedSharding); got {type(sharding).__name__}")
    own = _layout(sharding, len(shape))
    if own is not None and own.partial:  # jax has no shard indices for it (NotImplementedError)
        raise UnsupportedTypeError(
            f"sharding= has unreduced mesh axes {own.partial}: an array of partial sums, not one array laid out "
            "from shards; pass a sharding without unreduced axes (the shards are pieces of one array)")
    return sharding


def _put_host(arrays: list, copy) -> None:
    """The host buffers of ``arrays`` ((device, index, array) each) put onto their cpu devices in one
    call (one a shard costs twice as much), in place; CopyRequiredError under copy=False where jax copied."""
    host = [i for i, (_, _, a) in enumerate(arrays) if isinstance(a, np.ndarray)]
    if not host:
        return
    packed = probe.narrow_rows().put_copies
    for i in host:
        a = arrays[i][2]
        if a.dtype.name in packed:
            formats.refuse_changed_padding(a.view(np.uint8), a.dtype.name,
                                           f"the shard {_show(arrays[i][1])} ({a.dtype.name}: jax packs it)")
    put = jax.device_put([arrays[i][2] for i in host], [arrays[i][0] for i in host])
    for i, y in zip(host, put):
        dev, index, a = arrays[i]
        y.block_until_ready()
        if copy is False and a.size and a.__array_interface__["data"][0] != y.unsafe_buffer_pointer():
            raise CopyRequiredError(
                f"copy=False, but the shard {_show(index)} must be copied onto {_device_name(dev)} "
                "(its buffer is not 64-byte aligned, or not contiguous); pass copy=None to allow it")
        arrays[i] = (dev, index, y)


#: (type of sharding, sharding, global shape) -> (layout, {device: (index, device name, replica)}, or
#: None where the layout has unreduced axes): what local_shards reads of a sharded array besides its
#: buffers, which depends on these only (jax shardings are immutable, and hashable: jax keys its own
#: index cache by them); read once for each
PLACES: dict = {}
PLACES_LIMIT = 1024


def _places(x, sharding, shape) -> tuple:
    """What ``PLACES`` keeps for ``x`` (of ``sharding`` and ``shape``), read from it."""
    layout = _layout(sharding, len(shape))
    if layout is not None and layout.partial:
        return layout, None
    return layout, {s.device: _place(s, shape) for s in x.addressable_shards}


def _place(s, shape) -> tuple:
    """A jax Shard's (index with explicit bounds, device name, replica number)."""
    return shards.bounds(s.index, shape), _device_name(s.device), s.replica_id


def _device_name(dev) -> str:
    return f"{dev.platform}:{dev.id}"


def _span(index) -> tuple:
    """A hashable form of an index with explicit bounds (slices are not hashable before Python 3.12)."""
    return tuple((s.start, s.stop) for s in index)


def _show(index) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"


def _layout(sharding, ndim):
    """A NamedSharding as a core.sharding.Layout; None for shardings that are no mesh."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec = sharding.spec
    parts = tuple(spec.partitions) if hasattr(spec, "partitions") else tuple(spec)  # (jax 0.4.30: a tuple)
    dims: list[tuple] = []
    for p in parts + (None,) * (ndim - len(parts)):
        if p is None:
            dims.append(())
        elif isinstance(p, str):
            dims.append((p,))
        elif isinstance(p, tuple):
            dims.append(tuple(p))
        else:  # P.UNCONSTRAINED: not a layout yet
            return None
    mesh = sharding.mesh
    names = tuple(mesh.axis_names)
    unreduced = set(getattr(spec, "unreduced", ()) or ())
    return shards.Layout(names, tuple(mesh.devices.shape), tuple(dims), tuple(a for a in names if a in unreduced),
                         tuple(_device_name(d) for d in mesh.devices.flat))


def _sharding(layout, shape):
    """A NamedSharding for a core.sharding.Layout, over the devices it names (a DTensor's ``rank:r``:
    the one device of jax process r)."""
    if not layout.devices:
        raise InvalidArgumentError("the shards' layout names no devices: pass sharding= (a jax Sharding)")
    for dim, (n, k) in enumerate(zip(shape, layout.splits())):
        if n % k:
            raise InvalidArgumentError(
                f"dimension {dim} of the {tuple(shape)} array has {n} elements, split {k} ways unevenly; "
                "a jax sharding splits evenly only: pad the array, or choose a mesh that divides it")
    devs = _mesh_devices(layout.devices)
    # the axis types jax.make_mesh gives by default (Explicit), where this jax has them
    kinds = getattr(jax.sharding, "AxisType", None)
    extra = {} if kinds is None else {"axis_types": (kinds.Explicit,) * len(layout.mesh_axes)}
    mesh = jax.sharding.Mesh(np.array(devs, dtype=object).reshape(layout.mesh_shape), layout.mesh_axes, **extra)
    spec = jax.sharding.PartitionSpec(*[None if not a else a[0] if len(a) == 1 else a for a in layout.spec])
    return jax.sharding.NamedSharding(mesh, spec)


def _mesh_devices(names) -> list:
    """The jax devices a layout names ("cpu:0", or a DTensor's "rank:r")."""
    everything = jax.devices()
    by_name = {_device_name(d): d for d in everything}
    devs = []
    for name in names:
        if name.startswith("rank:"):
            rank = int(name[len("rank:"):])
            mine = [d for d in everything if d.process_index == rank]
            if len(mine) != 1:
                raise DeviceError(
                    f"the shards' mesh names torch rank {rank}, and jax process {rank} has {len(mine)} devices: "
                    "which one holds that rank's shard is not known; pass sharding= (a jax NamedSharding)")
            devs.append(mine[0])
        elif name in by_name:
            devs.append(by_name[name])
        else:
            raise DeviceError(
                f"the shards' mesh holds device {name!r}, which jax does not have here ({', '.join(by_name)}); "
                "pass sharding= (a jax Sharding over devices it has)")
    return devs


def _onto(candidates, dev, copy, on_alias, index, convert):
    """One of ``candidates`` (tensors of one global index, any framework) for ``dev``: a jax array
    there, or, for a cpu device, a host numpy array for ``device_put`` to take (without a copy
    when aligned); CopyRequiredError under copy=False where it must copy."""
    for _, t in candidates:
        if isinstance(t, jax.Array) and t.sharding.device_set == {dev}:
            return jnp.array(t, copy=True) if copy else t  # a copy stays on t's device
    # the one that came from this device, else any (host memory is shared by all cpu devices)
    t = next((t for d, t in candidates if d == _device_name(dev)), candidates[0][1])
    if dev.platform == "cpu":
        return convert(t, "numpy", copy=copy, on_alias="allow")
    y = convert(t, "jax", copy=copy, on_alias=on_alias)  # DLPack keeps the device
    if y.sharding.device_set != {dev}:
        if copy is False:
            raise CopyRequiredError(f"copy=False, but the shard {_show(index)} must be copied onto "
                                    f"{_device_name(dev)} (it lives on another device); pass copy=None to allow it")
        y = jax.device_put(y, dev)
    return y


HOOKS = JaxShards()
