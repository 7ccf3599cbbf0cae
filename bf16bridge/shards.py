"""Sharded tensors, shard by shard: a sharded ``jax.Array`` or a torch ``DTensor`` crosses as the
shards this process holds, each through the ordinary routes (zero-copy where ``convert`` is), with
its global shape, each shard's global index, and the sharding as data (``Layout``).

A framework's shard hooks walk its own sharded type (``ShardHooks.local_shards``) and build one
from shards (``ShardHooks.assemble``). Nothing is gathered and no process talks to another: each
converts the shards it holds (docs/sharding.md says why the result is consistent).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np

from bf16bridge.adapters.hooks import ShardHooks
from bf16bridge.core.autograph import plain_python
from bf16bridge.core import dtypes
from bf16bridge import kernels
from bf16bridge.core import registry
from bf16bridge.core.sharding import Layout, bounds
from bf16bridge.core.convert import Fallback, OnAlias, OnGrad, check_keywords, convert, convert_into
from bf16bridge.core.warn import gathered, warn_gathered
from bf16bridge.errors import Bf16BridgeError, InvalidArgumentError, UnsupportedTypeError

#: which shards ``convert_shards`` returns: every shard this process holds, or one per global index
Replicas = Literal["all", "one"]
REPLICAS = ("all", "one")


@dataclass(frozen=True, eq=False, init=False)
class Shard:
    """One shard: ``tensor`` holds ``global_tensor[index]``.

    ``index``: a tuple of slices with explicit bounds, one per dimension (step None);
    ``device``: where the source held it, as the source names it (jax ``"cpu:3"``, torch ``"cuda:1"``);
    ``replica``: 0 for the first holder of this index, 1, 2, ... for the copies of it on other devices.
    """

    index: tuple[slice, ...]
    device: str
    tensor: Any
    replica: int = 0

    def __init__(self, index: tuple[slice, ...], device: str, tensor: Any, replica: int = 0) -> None:
        # the fields set in the instance's dict: a frozen dataclass's own __init__ (object.__setattr__
        # for each) costs several times as much, once for every shard of every call
        d = self.__dict__
        d["index"], d["device"], d["tensor"], d["replica"] = index, device, tensor, replica


@dataclass(frozen=True, eq=False)
class Shards(Sequence[Shard]):
    """What ``convert_shards`` returns: the shards this process holds, the global ``shape`` and
    ``dtype``, the ``layout`` (None where the sharding is no mesh), the framework the shards came
    from (``source``) and the one their tensors are in now (``framework``). Iterates over the
    shards; ``from_shards`` takes it back."""

    shards: tuple[Shard, ...]
    shape: tuple[int, ...]
    dtype: str | None
    layout: Layout | None
    source: str
    framework: str

    def __iter__(self) -> Iterator[Shard]:
        return iter(self.shards)

    def __len__(self) -> int:
        return len(self.shards)

    @overload
    def __getitem__(self, i: int) -> Shard: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Shard]: ...
    def __getitem__(self, i):
        return self.shards[i]

    def __repr__(self) -> str:
        where = ", ".join(f"{_show(s.index)}@{s.device}" + (f"#{s.replica}" if s.replica else "") for s in self.shards)
        return (f"Shards({len(self.shards)} of a {self.source} {self.dtype} {self.shape} as {self.framework}: "
                f"{where}; layout={self.layout})")


def _show(index: tuple[slice, ...]) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"


@plain_python
def convert_shards(x, to: str, *, replicas: Replicas = "all", as_dtensor: Any = None, copy: bool | None = None,
                   fallback: Fallback = "error", on_alias: OnAlias = "warn",
                   on_grad: OnGrad = "warn", compare_replicas: bool = True) -> Any:
    """The shards of sharded tensor ``x`` this process holds, each moved to framework ``to`` as
    ``convert`` moves a tensor (same keywords; zero-copy where its route is), with each shard's
    global index and device, the global shape and the layout: a ``Shards``.

    ``x``: a ``jax.Array`` over several devices, or a torch ``DTensor``. ``replicas="one"`` keeps
    one shard per global index (the replica-0 one) where the sharding replicates, after comparing
    the replicas it drops with it, bit for bit (``InvalidArgumentError`` naming the index and the
    devices where they disagree; ``compare_replicas=False`` skips the comparison, which reads every
    replica). ``as_dtensor=mesh`` (``to="torch"``): a torch ``DTensor`` over that ``DeviceMesh`` instead,
    built from this process's shard without a copy (``from_shards(..., sharding=mesh)``).

    Each process converts only the shards it holds; nothing is gathered or communicated. A
    sharding with partial sums (DTensor ``Partial``, jax unreduced axes) is refused: reduce first.
    """
    if replicas not in REPLICAS:
        raise InvalidArgumentError(f"replicas must be one of {', '.join(map(repr, REPLICAS))}; got {replicas!r}")
    _check_flag(compare_replicas)
    check_keywords(copy, fallback, False, on_alias, on_grad)
    source = registry.framework_of(x)
    target = registry.resolve(to)
    if as_dtensor is not None and target != "torch":
        raise InvalidArgumentError(f"as_dtensor makes a torch DTensor: pass to='torch' (got to={to!r})")
    shape, layout, pieces = _local_shards(x, source, to)
    if replicas == "one":
        if compare_replicas:  # the replicas dropped here must hold what the kept one holds
            _check_replicas(pieces, "Keeping one of them (replicas='one') would hide that: recompute the source "
                            "array so that its replicas agree (replicas='all' returns each, numbered); "
                            "compare_replicas=False keeps replica 0 without comparing")
        pieces = [p for p in pieces if p[3] == 0]
    out = _convert_pieces(pieces, target, copy, fallback, on_alias, on_grad)
    # the shards' dtype (a fallback may have widened it); with none here, the source's
    dtype = registry.get(target).shape_dtype(out[0].tensor)[1] if out else registry.get(source).shape_dtype(x)[1]
    result = Shards(tuple(out), tuple(shape), dtype, layout, source, target)
    if as_dtensor is not None:
        return from_shards(result, "torch", sharding=as_dtensor, copy=copy, on_alias=on_alias,
                           compare_replicas=compare_replicas)
    return result


def _local_shards(x, source: str, to: str) -> tuple:
    """(global shape, layout, pieces) of sharded tensor ``x`` (``ShardHooks.local_shards``), or our
    error for a tensor that is not sharded or holds partial sums."""
    got = registry.hooks(source, ShardHooks).local_shards(x)
    if got is None:
        raise UnsupportedTypeError(
            f"this {source} {type(x).__name__} is not sharded (it lives on one device); "
            f"use bb.convert(x, to={to!r}) for it (convert_shards takes a jax.Array over several devices "
            "or a torch DTensor)")
    shape, layout, pieces = got
    if layout is not None and layout.partial:
        raise UnsupportedTypeError(
            f"this {source} tensor holds partial sums over mesh axes {layout.partial} (a Partial placement, "
            "or unreduced axes): its shards are not pieces of one array; reduce first (DTensor: "
            "x.redistribute(placements=[Replicate() or Shard(d) ...]); jax: a reshard that reduces)")
    return shape, layout, pieces


def _convert_pieces(pieces, target: str, copy, fallback, on_alias, on_grad) -> list[Shard]:
    """Each piece's tensor moved to ``target`` as ``convert`` moves it (``convert_into``: the fast
    path's plans looked up once per tensor type for the call); what every shard would warn is said
    once, with the number of shards."""
    tensors: list = []
    with gathered() as pending:
        try:
            convert_into(tensors, [tensor for _, _, tensor, _ in pieces], target, copy, fallback, on_alias, on_grad)
        except Bf16BridgeError as err:
            index, device = pieces[len(tensors)][:2]
            raise type(err)(f"the shard {_show(index)} on {device}: {err}") from err
    warn_gathered(pending, lambda n: f"{n} shard{'' if n == 1 else 's'}: ")
    return [Shard(index, device, y, replica) for (index, device, _, replica), y in zip(pieces, tensors)]


@plain_python
def from_shards(shards: Shards | Iterable[Shard], to: str, *, sharding: Any = None, shape: Sequence[int] | None = None,
                copy: bool | None = None, on_alias: OnAlias = "warn", compare_replicas: bool = True) -> Any:
    """One sharded tensor of framework ``to`` from shards (a ``Shards``, or ``Shard``s of any
    framework): a ``jax.Array`` laid out as ``sharding`` (a jax ``Sharding``), or a torch
    ``DTensor`` over ``sharding`` (a ``DeviceMesh``), each device's shard taken without a copy
    where the route allows (``copy=False``: refused otherwise, checked by pointer).

    ``sharding=None`` builds the target's sharding from the shards' ``Layout`` where it can (jax:
    the mesh devices it names, or for a DTensor's ranks each process's one device). ``shape``: the
    global shape, where ``shards`` is no ``Shards`` (else it is read from the largest index bounds).
    Shards are matched to devices by global index, so replicas dropped with ``replicas="one"``
    are copied back where the sharding wants them (a copy ``copy=False`` refuses).

    Shards given for one global index (replicas) are compared bit for bit (NaN payloads and -0
    count; tensors over the same memory are not read): where they disagree, ``InvalidArgumentError``
    names the index and the devices, and nothing is built. ``compare_replicas=False`` skips the
    comparison (it reads every replica; on an accelerator, through host memory): each device then
    takes the shard that came from it, else the first, and the array's replicas may disagree.
    A layout with partial sums (``Layout.partial``) is refused: its shards are not pieces of one array.
    """
    _check_flag(compare_replicas)
    check_keywords(copy, "error", False, on_alias, "warn")
    target = registry.resolve(to)
    registry.get(target)  # (an unknown or missing framework: the registry's error, before the shards')
    layout, pieces, dtype, whole = _given(shards, shape)
    hooks = _assembler(target, layout)
    _check_pieces(pieces, whole, dtype)
    if compare_replicas:
        _check_replicas([(p.index, p.device, p.tensor, p.replica) for p in pieces],
                        "A sharded array holds one value for each element: give every device of that index the "
                        "same tensor (one replica's), or recompute the array so that its replicas agree; "
                        "compare_replicas=False builds it as given, each device with its own shard")
    return hooks.assemble(whole, [(p.index, p.device, p.tensor) for p in pieces], sharding, layout, copy,
                          on_alias, convert)


def _given(shards, shape) -> tuple[Layout | None, list[Shard], str | None, tuple[int, ...]]:
    """(layout, pieces, dtype, global shape) of what ``from_shards`` was given, each shard's index
    checked; the shape, where not given, read from the largest index bounds."""
    dtype = None
    if isinstance(shards, Shards):
        layout, pieces, dtype = shards.layout, list(shards.shards), shards.dtype
        shape = shards.shape if shape is None else shape
    else:
        layout, pieces = None, list(shards)
        for p in pieces:
            if not isinstance(p, Shard):
                raise UnsupportedTypeError(f"from_shards takes Shards or Shard objects; got a {type(p).__name__}")
    for p in pieces:
        _check_index(p)
    if shape is None:
        if not pieces:
            raise InvalidArgumentError("from_shards: no shards, and no shape= to say what they make")
        shape = tuple(max(p.index[d].stop for p in pieces) for d in range(len(pieces[0].index)))
    return layout, pieces, dtype, _check_shape(shape)


def _assembler(target: str, layout: Layout | None) -> ShardHooks:
    """The shard hooks of ``target`` that build its sharded type, or our error: it has none, or the
    layout holds partial sums."""
    hooks = registry.hooks(target, ShardHooks)
    if not hooks.assembles:
        raise UnsupportedTypeError(
            f"{target} has no sharded tensor type; from_shards builds a jax.Array or a torch DTensor. "
            f"For one {target} tensor of the whole array, gather it (which copies): e.g. "
            "np.asarray(jax_array), dtensor.full_tensor()")
    if layout is not None and layout.partial:
        raise UnsupportedTypeError(
            f"these shards hold partial sums over mesh axes {layout.partial} (their layout says so): they are not "
            "pieces of one array, and building them as replicas would be wrong; reduce first (DTensor: "
            "x.redistribute(placements=[Replicate() or Shard(d) ...])), or give a Layout without partial axes")
    return hooks


def _whole(n) -> int | None:
    """``n`` as an int where it is a whole number (no bool), else None."""
    if isinstance(n, bool):
        return None
    try:
        return operator.index(n)
    except TypeError:
        return None


def _check_shape(shape) -> tuple[int, ...]:
    try:
        dims = tuple(_whole(n) for n in shape)
    except TypeError:
        dims = (None,)
    if any(n is None or n < 0 for n in dims):
        raise InvalidArgumentError(f"from_shards: shape= is the global shape, whole numbers >= 0; got {shape!r}")
    return dims  # type: ignore[return-value]


def _check_index(p: Shard) -> None:
    """A shard's index: a tuple of slices with explicit whole bounds, start <= stop, step 1."""
    index = p.index
    if isinstance(index, tuple) and all(
            isinstance(s, slice) and s.step in (None, 1) and _whole(s.start) is not None
            and _whole(s.stop) is not None and 0 <= s.start <= s.stop for s in index):
        return
    raise InvalidArgumentError(
        f"the shard on {p.device} has index {index!r}; a shard's index is a tuple of slices, one per dimension, "
        "with explicit bounds 0 <= start <= stop and no step (bb.shards.bounds(index, shape) writes one)")


def _check_pieces(pieces: list[Shard], shape: tuple[int, ...], dtype: str | None) -> None:
    """Every shard's tensor has its index's shape, within ``shape``, and one dtype across shards
    (the frameworks' own assembly would build a wrong tensor silently, or raise their own errors)."""
    dtype = dtypes.PACKED.get(dtype, dtype) if dtype is not None else None  # compared by the values held
    for p in pieces:
        where = f"the shard {_show(p.index)} on {p.device}"
        if len(p.index) != len(shape) or any(s.stop > n for s, n in zip(p.index, shape)):
            raise InvalidArgumentError(
                f"{where} does not lie in the global shape {shape}: its index must have {len(shape)} "
                "slices, each within its dimension; pass the shape= the shards were cut from")
        try:
            got_shape, got_dtype = registry.get(registry.framework_of(p.tensor)).shape_dtype(p.tensor)
        except Bf16BridgeError as err:
            raise type(err)(f"{where}: {err}") from err
        want = tuple(s.stop - s.start for s in p.index)
        got_shape, got_dtype = dtypes.in_values(got_shape, got_dtype)  # a packed type (two values a byte) in values
        if tuple(got_shape) != want:
            raise InvalidArgumentError(
                f"{where} holds a tensor of shape {tuple(got_shape)}; its index spans {want}: give each shard "
                "the tensor of its index (global_tensor[index])")
        if dtype is None:
            dtype = got_dtype
        elif got_dtype != dtype:
            raise InvalidArgumentError(
                f"{where} holds {got_dtype}, and the other shards {dtype}: a sharded tensor has one dtype; "
                "convert the odd shard first")


def _check_flag(compare_replicas) -> None:
    # True or False only: a None or 0 must not skip the comparison silently
    if compare_replicas is not True and compare_replicas is not False:
        raise InvalidArgumentError(f"compare_replicas must be True or False; got {compare_replicas!r}")


def _check_replicas(pieces: Sequence[tuple], way_out: str) -> None:
    """The pieces (``(index, device, tensor, replica)``) that hold one global index hold the same
    bits, or our error naming the index, the devices that disagree and ``way_out``. Each is read
    through numpy (zero-copy from host memory); tensors over the same memory are not read (the
    same data by their adapter's ``same_data``, or host memory both numpy views alias)."""
    groups: dict[tuple, list[tuple]] = {}
    for p in pieces:
        groups.setdefault(tuple((s.start, s.stop) for s in p[0]), []).append(p)
    for group in groups.values():
        if len(group) < 2:
            continue
        ref = min(group, key=lambda p: p[3])  # replica 0 where this process holds it, else the first given
        ref_bits = None
        differ = []
        for p in group:
            if p is ref or _same_memory(ref[2], p[2]):
                continue
            if ref_bits is None:
                ref_bits, codes = _bits(ref)
            other = _bits(p)[0]
            if _same_view(ref_bits, other):  # host memory both views alias (replicas put from one buffer)
                continue
            at = _first_difference(ref_bits, other, codes)
            if at is not None:
                differ.append((p, at[:len(ref[0])]))  # an element, not a byte of it
        if differ:
            def who(p):
                return f"{p[1]} (replica {p[3]})"

            index = _show(ref[0])
            where = "; ".join(f"{who(p)} differs first at element {at}" for p, at in differ)
            what = f"the replicas of shard {index} disagree: {where}, against {who(ref)}"
            err = InvalidArgumentError(f"{what}. {way_out}")
            err.disagreement = what  # for a caller with a way out of its own (bb.save)
            raise err


def _same_memory(a, b) -> bool:
    """Whether two tensors are the same data (so the same bits) without reading them."""
    if a is b:
        return True
    fa, fb = registry.framework_of(a), registry.framework_of(b)
    if fa != fb:
        return False
    adapter = registry.get(fa)
    return bool(adapter.same_data(a) == adapter.same_data(b))


def _same_view(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two numpy arrays view the same memory the same way (so hold the same bits)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.size > 0
            and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype)


def _bits(piece: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """A tensor's elements through numpy (zero-copy from host memory; torch's packed fp4 one value
    a byte) as unsigned integers of their width (bytes on a last axis of their own for a wider
    element), for comparing bits; and, for a type held one value a byte in fewer bits, the pattern
    each byte holds as ml_dtypes reads it (kernels.byte_codes: the unused high bits may differ between
    holders, and ml_dtypes reads them as the sign in fp4 and fp6), else None."""
    try:
        a = np.asarray(convert(piece[2], "numpy", on_alias="allow", on_grad="drop"))
    except Bf16BridgeError as err:
        what = f"the shard {_show(piece[0])} on {piece[1]}, read to compare it with its replicas"
        raised = type(err)(f"{what} (compare_replicas=False skips that): {err}")
        raised.unreadable = f"{what}: {err}"  # for a caller without that keyword (bb.save)
        raise raised from err
    n = a.dtype.itemsize
    u = a.view(f"u{n}") if n in (1, 2, 4, 8) else np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (n,))
    name = dtypes.name_of_numpy(a.dtype)
    row = dtypes.ROWS.get(name) if name is not None else None
    if name is not None and row is not None and row.packing == 1 and row.bits < 8 * row.itemsize:
        return u, kernels.byte_codes(kernels.FORMATS[name]).astype(np.uint8)
    return u, None


def _first_difference(a: np.ndarray, b: np.ndarray, codes: np.ndarray | None = None) -> tuple[int, ...] | None:
    """The first element (row-major) where two arrays of bits of one shape differ (the patterns
    ``codes`` reads in each byte, where given); None where none does. Compared a block of rows at a
    time (no reshape, which would copy a strided view): a temporary of a few MiB, not one bool for
    every element."""
    def unequal(x, y):
        return x != y if codes is None else codes[x] != codes[y]

    if a.ndim == 0:
        return () if unequal(a, b) else None
    row = max(1, int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize)
    step = max(1, (4 << 20) // row)
    for start in range(0, a.shape[0], step):
        ne = unequal(a[start:start + step], b[start:start + step])
        if ne.any():
            at = np.unravel_index(int(np.flatnonzero(ne)[0]), ne.shape)
            return (start + int(at[0]),) + tuple(int(i) for i in at[1:])
    return None


def layout_of(x) -> Layout | None:
    """The ``Layout`` of a sharded tensor (None where its sharding is no mesh); our error for a
    tensor that is not sharded."""
    source = registry.framework_of(x)
    got = registry.hooks(source, ShardHooks).local_shards(x)
    if got is None:
        raise UnsupportedTypeError(f"this {source} {type(x).__name__} is not sharded (it lives on one device)")
    return got[1]
