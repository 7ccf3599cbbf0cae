"""torch's hooks for sharded tensors (``bb.convert_shards``, ``bb.from_shards``): a DTensor's local
shard and its place in the mesh, and a DTensor built from shards of any framework."""

from __future__ import annotations

import sys

import torch

from bf16bridge.adapters.hooks import ShardHooks
from bf16bridge.adapters.torch import internals, probe
from bf16bridge.adapters.torch.convert import row_major
from bf16bridge.core import dtypes, registry
from bf16bridge.core.sharding import Layout
from bf16bridge.errors import DeviceError, InvalidArgumentError, UnsupportedTypeError


class TorchShards(ShardHooks):
    """DTensor as the sharded tensor type of torch."""

    name = "torch"
    assembles = True

    def local_shards(self, x):
        dt = sys.modules.get("torch.distributed.tensor")  # a DTensor cannot exist before it is imported
        if dt is None or not isinstance(x, dt.DTensor):
            return None
        mesh = x.device_mesh
        kinds = tuple(_kind(p) for p in x.placements)
        shape = tuple(x.shape)
        layout = _dtensor_layout(mesh, kinds, len(shape))
        coord = mesh.get_coordinate()
        if coord is None:  # this rank is not in the tensor's mesh: it holds nothing
            return shape, layout, []
        local = x.to_local()
        device = local.device.type if local.device.type == "cpu" else str(local.device)
        index = _local_index(shape, tuple(mesh.shape), kinds, coord)
        name = probe.from_torch().get(x.dtype)
        k = _packing(name)
        if k > 1 and shape:  # fp4 x2: said in values, as its shards cross
            shape = dtypes.in_values(shape, probe.from_torch()[x.dtype])[0]
            index = (*index[:-1], slice(index[-1].start * k, index[-1].stop * k))
        return shape, layout, [(index, device, local, _replica(tuple(mesh.shape), kinds, coord))]

    def assemble(self, shape, pieces, sharding, layout, copy, on_alias, convert):
        from torch.distributed.tensor import DTensor

        mesh, placements = _mesh_and_placements(sharding, layout)
        kinds = tuple(_kind(p) for p in placements)
        # placements given by the caller: one per mesh axis, each Shard(d) within the tensor's dimensions
        axes = tuple(mesh.mesh_dim_names or map(str, range(mesh.ndim)))
        Layout.from_placements(axes, tuple(mesh.shape), kinds, len(shape))
        if any(k == "partial" for k, _ in kinds):
            raise UnsupportedTypeError("a Partial placement holds partial sums, not shards of one array: "
                                       "use Shard(d) or Replicate()")
        coord = mesh.get_coordinate()
        if coord is None:
            raise InvalidArgumentError("this process is not in the DeviceMesh: it holds no part of a DTensor over it")
        shape, index = _this_rank_part(tuple(shape), pieces, mesh, kinds, coord)
        mine = _piece_for(index, pieces, coord)
        t = convert(mine, "torch", copy=copy, on_alias=on_alias)
        if t.device.type != mesh.device_type:
            raise DeviceError(
                f"this rank's shard is on {t.device}, and the DeviceMesh is over {mesh.device_type!r} devices: "
                f"move the shards to {mesh.device_type} first, or build the mesh over {t.device.type!r}")
        return DTensor.from_local(t, mesh, placements, run_check=False, shape=torch.Size(shape),
                                  stride=row_major(shape))


def _mesh_and_placements(given, layout) -> tuple:
    """The DeviceMesh and placements ``assemble`` builds over: ``given`` (a mesh, or (mesh,
    placements)), the placements from the shards' ``layout`` where not given."""
    from torch.distributed.device_mesh import DeviceMesh

    mesh, placements = (given if isinstance(given, tuple) and len(given) == 2 else (given, None))
    if not isinstance(mesh, DeviceMesh):
        raise InvalidArgumentError(
            "a torch DTensor needs a torch DeviceMesh: pass sharding=mesh or sharding=(mesh, placements) "
            f"(convert_shards: as_dtensor=mesh); got {type(mesh).__name__}")
    if placements is None:
        if layout is None:
            raise InvalidArgumentError("these shards carry no mesh layout: pass sharding=(mesh, placements)")
        if tuple(mesh.shape) != tuple(layout.mesh_shape):
            raise InvalidArgumentError(
                f"the DeviceMesh has shape {tuple(mesh.shape)}; the shards' layout is over a mesh "
                f"{dict(zip(layout.mesh_axes, layout.mesh_shape))}: build a mesh of that shape")
        placements = tuple(_placement(kind, dim) for kind, dim in layout.placements())
    return mesh, placements


def _this_rank_part(shape: tuple, pieces, mesh, kinds, coord) -> tuple[tuple, tuple]:
    """(the DTensor's global shape as torch holds it, this rank's part in values as the pieces
    say theirs): torch holds fp4 two a byte, where shapes and indices count values."""
    k = _packing(_packed_here(pieces))
    if k > 1 and shape:
        if shape[-1] % k:
            raise InvalidArgumentError(
                f"a DTensor of {shape[-1]} values of fp4 in its last dimension: torch holds them packed {k} a "
                f"byte (float4_e2m1fn_x2), which needs a multiple of {k}; pad that dimension first")
        shape = (*shape[:-1], shape[-1] // k)
    index = _local_index(shape, tuple(mesh.shape), kinds, coord)
    if k > 1 and shape:
        index = (*index[:-1], slice(index[-1].start * k, index[-1].stop * k))
    return shape, index


def _span(index) -> tuple:
    return tuple((s.start, s.stop) for s in index)


def _piece_for(index, pieces, coord):
    """The tensor of ``pieces`` that holds this rank's part ``index``; our error where none or
    several parts are given."""
    held = {_span(i) for i, _, _ in pieces}
    if len(held) > 1:
        raise InvalidArgumentError(
            f"a DTensor holds one local tensor per rank; these shards hold {len(held)} different parts "
            f"({', '.join(sorted({_show(i) for i, _, _ in pieces}))}): one process must hold one part (a jax "
            "array over one device per process), or build one local tensor yourself (a copy)")
    if not pieces:
        raise InvalidArgumentError(
            f"this rank's place {tuple(coord)} in the mesh holds {_show(index)}, and no shard was given for it: "
            "a DTensor needs this rank's part (convert_shards(..., replicas='one') keeps replica 0 only, which "
            "another rank holds here): pass replicas='all', or give this rank's shard")
    mine = [t for i, _, t in pieces if _span(i) == _span(index)]
    if not mine:
        raise InvalidArgumentError(
            f"this rank's place {tuple(coord)} in the mesh holds {_show(index)}, but the shards given hold "
            f"{', '.join(sorted({_show(i) for i, _, _ in pieces})) or 'nothing'}: order the mesh's ranks as the "
            "source's devices are ordered")
    return mine[0]


def _kind(p) -> tuple[str, int | None]:
    """A DTensor placement as data: ("shard", dim), ("replicate", None) or ("partial", None)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    strided = internals.strided_shard()
    if strided is not None and isinstance(p, strided):
        raise UnsupportedTypeError(
            f"the DTensor placement {p!r} (a strided shard, as FSDP with tensor parallelism makes) has no "
            "jax sharding: redistribute to Shard(d) / Replicate() placements first")
    if strided is None and isinstance(p, Shard) and type(p) is not Shard:  # a strided shard not told apart
        raise internals.missing("torch.distributed.tensor.placement_types._StridedShard",
                                f"the Shard subclass {p!r} cannot be told from a strided shard; redistribute to "
                                "Shard(d) / Replicate() placements first")
    if isinstance(p, Shard):
        return "shard", p.dim
    if isinstance(p, Replicate):
        return "replicate", None
    if isinstance(p, Partial):
        return "partial", None
    raise UnsupportedTypeError(f"the DTensor placement {p!r} is not mapped; Shard(d), Replicate() and Partial() are")


def _placement(kind, dim):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Shard(dim) if kind == "shard" else Replicate() if kind == "replicate" else Partial()


def _dtensor_layout(mesh, kinds, ndim):
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    ranks = tuple(f"rank:{r}" for r in mesh.mesh.flatten().tolist())
    return Layout.from_placements(tuple(names), tuple(mesh.shape), kinds, ndim, ranks)


def _packing(name: str | None) -> int:
    """Values a byte of a dtype torch holds packed (fp4 x2: 2); 1 for any other."""
    return dtypes.ROWS[name].packing if name in dtypes.PACKED else 1


def _packed_here(pieces) -> str | None:
    """The packed dtype torch will hold the pieces' values in (fp4 from numpy or jax: x2), if any."""
    if not pieces:
        return None
    tensor = pieces[0][2]
    name = registry.get(registry.framework_of(tensor)).shape_dtype(tensor)[1]
    packed = name if name in dtypes.PACKED else dtypes.UNPACKED.get(name)
    return packed if packed in probe.to_torch() else None


def _local_index(shape, mesh_shape, kinds, coord) -> tuple:
    """The global slices the rank at mesh coordinate ``coord`` holds, as DTensor cuts them: each
    Shard(d), in mesh order, cuts what is left of dimension d into chunks of ceil(n / k), the
    last ones shorter or empty (torch.chunk); an empty part starts at the dimension's end, as
    torch's own offsets say."""
    start, size = [0] * len(shape), list(shape)
    for (kind, dim), k, c in zip(kinds, mesh_shape, coord):
        if kind != "shard" or dim is None:
            continue
        chunk = -(-size[dim] // k)
        lo = min(c * chunk, size[dim])
        hi = min(lo + chunk, size[dim])
        start[dim] += lo
        size[dim] = hi - lo
        if size[dim] == 0:
            start[dim] = shape[dim]
    return tuple(slice(s, s + n) for s, n in zip(start, size))


def _replica(mesh_shape, kinds, coord) -> int:
    """Which copy of its part this rank holds: its place along the mesh axes that do not shard."""
    r = 0
    for (kind, _), k, c in zip(kinds, mesh_shape, coord):
        if kind != "shard":
            r = r * k + c
    return r


def _show(index) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"


HOOKS = TorchShards()
