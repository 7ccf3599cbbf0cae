"""A sharded tensor's layout as plain data, in no framework's types, and shard indices made explicit.

The adapters describe their sharded types with these (``ShardHooks.local_shards``); ``bf16bridge.shards``
moves the shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError


@dataclass(frozen=True)
class Layout:
    """A mesh sharding as plain data, in no framework's types.

    ``mesh_axes``: the mesh's axis names, major first; ``mesh_shape``: their sizes.
    ``spec``: for each tensor dimension, the mesh axes it is split over (major first), ``()`` for
    none: jax's ``PartitionSpec`` with every entry a tuple.
    ``partial``: mesh axes over which the values are partial sums pending a reduction (a DTensor's
    ``Partial``, jax's unreduced axes); such a tensor does not cross.
    ``devices``: the mesh's devices in row-major mesh order, as the source names them
    (jax: ``"cpu:3"``, ``"gpu:0"``; a DTensor's mesh: ``"rank:1"``).
    """

    mesh_axes: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    spec: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.mesh_axes) != len(self.mesh_shape):
            raise InvalidArgumentError(f"Layout: {len(self.mesh_axes)} mesh axes {self.mesh_axes} but "
                                       f"{len(self.mesh_shape)} sizes {self.mesh_shape}")
        used = [a for axes in self.spec for a in axes] + list(self.partial)
        unknown = sorted(set(used) - set(self.mesh_axes))
        if unknown:
            raise InvalidArgumentError(f"Layout: spec {self.spec} names mesh axes {unknown} the mesh "
                                       f"{self.mesh_axes} does not have")
        if len(used) != len(set(used)):
            raise InvalidArgumentError(f"Layout: a mesh axis is used twice in spec {self.spec} "
                                       f"(partial {self.partial})")

    def splits(self) -> tuple[int, ...]:
        """How many pieces each tensor dimension is cut into."""
        size = dict(zip(self.mesh_axes, self.mesh_shape))
        out = []
        for axes in self.spec:
            n = 1
            for a in axes:
                n *= size[a]
            out.append(n)
        return tuple(out)

    def placements(self) -> tuple[tuple[str, int | None], ...]:
        """One entry per mesh axis, as a DTensor's placements are: ``("shard", dim)``,
        ``("replicate", None)`` or ``("partial", None)``.

        A DTensor splits a dimension over several mesh axes in mesh order only (major first);
        a spec that orders them otherwise (``P(("y", "x"))`` on a mesh ``("x", "y")``) has no
        such placements and is refused.
        """
        order = {a: i for i, a in enumerate(self.mesh_axes)}
        out: list[tuple[str, int | None]] = [("replicate", None)] * len(self.mesh_axes)
        for dim, axes in enumerate(self.spec):
            if [order[a] for a in axes] != sorted(order[a] for a in axes):
                raise UnsupportedTypeError(
                    f"dimension {dim} is split over mesh axes {axes} in an order other than the mesh's "
                    f"{self.mesh_axes}; DTensor's Shard placements split in mesh order only: reorder the "
                    "partition spec, or reshard first")
            for a in axes:
                out[order[a]] = ("shard", dim)
        for a in self.partial:
            out[order[a]] = ("partial", None)
        return tuple(out)

    @classmethod
    def from_placements(cls, mesh_axes: Sequence[str], mesh_shape: Sequence[int],
                        placements: Sequence[tuple[str, int | None]], ndim: int,
                        devices: Sequence[str] = ()) -> Layout:
        """The layout of DTensor-style placements (one per mesh axis; see ``placements``)."""
        if len(placements) != len(mesh_axes):
            raise InvalidArgumentError(f"{len(placements)} placements for a mesh of {len(mesh_axes)} axes: pass one "
                                       "per mesh axis (Shard(d) or Replicate())")
        spec: list[list[str]] = [[] for _ in range(ndim)]
        partial = []
        for axis, (kind, dim) in zip(mesh_axes, placements):
            if kind == "shard":
                if dim is None or not -ndim <= dim < ndim:
                    raise InvalidArgumentError(f"placement Shard({dim}) on mesh axis {axis!r} of a {ndim}-d tensor: "
                                               f"shard a dimension from {-ndim} to {ndim - 1}")
                spec[dim % ndim].append(axis)
            elif kind == "partial":
                partial.append(axis)
            elif kind != "replicate":
                raise InvalidArgumentError(f"placement kind {kind!r}; choose 'shard', 'replicate' or 'partial'")
        return cls(tuple(mesh_axes), tuple(mesh_shape), tuple(tuple(s) for s in spec), tuple(partial),
                   tuple(devices))


def bounds(index: Sequence[slice], shape: Sequence[int]) -> tuple[slice, ...]:
    """``index`` (slices, as frameworks write them: ``slice(None)`` for a whole dimension) with
    explicit bounds, so that two spellings of one region compare equal."""
    out = []
    for s, n in zip(index, shape):
        if s.step is None:  # the usual spellings, without slice.indices (this runs per shard per call)
            if s.start is None and s.stop is None:
                out.append(slice(0, n))
                continue
            if s.start is not None and s.stop is not None and 0 <= s.start <= s.stop <= n:
                out.append(s)
                continue
        start, stop, step = s.indices(n)
        if step != 1:
            raise InvalidArgumentError(f"a shard index with step {step} ({s}); shards are contiguous blocks")
        out.append(slice(start, max(start, stop)))
    return tuple(out)
