"""JAX: the planner's facts and the conversion primitives. Arrays are immutable; its DLPack import is
zero-copy only for a dense buffer on a 64-byte boundary (it copies an unaligned one silently, and refuses
gaps), in another dimension order too where this jax computes on such an array (probe), and its
bit-casts copy, so bf16 reaches numpy through ``numpy.asarray`` and comes from numpy through
``jax.device_put``. What this jax holds and does is found by the trials of ``probe`` on first read."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bf16bridge.adapters import dlpack, trials
from bf16bridge.adapters.jax import internals, probe
from bf16bridge.core import dtypes, formats, registry, versions
from bf16bridge.core.adapter import (ALIGN, CONTIGUOUS, PERMUTED, Adapter, Handoff, Source, StalePlan,
                                     UnalignedImport, parse_device)
from bf16bridge.errors import UnsupportedDtypeError, UnsupportedTypeError

versions.require("jax", jax.__version__)

_Tracer = internals.Tracer

DELETED = ("this jax array was deleted (donated to a jit with donate_argnums, or .delete()); it has no data to "
           "move: convert the array the donating call returned, or convert (or copy) this one before donating it")

def _packs_copy(layout, aligned):
    return "jax stores sub-byte types packed: its hand-off with numpy converts (a copy)"


def _put_packed(a):
    """``jax.numpy.asarray`` of a sub-byte array (one value a byte in numpy; placed as ``jax.device_put``
    places it, with less Python on the way): jax packs it keeping each byte's low bits, so a byte
    ml_dtypes reads otherwise (a view of other bytes) is refused first."""
    formats.refuse_changed_padding(a.view(np.uint8), a.dtype.name, "jax.numpy.asarray (jax packs it)")
    return jnp.asarray(a)


def _device_put_copies(layout, aligned):
    if layout != CONTIGUOUS:
        return "jax.device_put copies a non-contiguous array"
    if not aligned:
        return "jax.device_put copies a buffer that is not 64-byte aligned"
    return None


def _row_major(x) -> bool:
    """Whether jax keeps ``x``'s buffer in row-major order. An array imported over DLPack keeps the
    exporter's order (a transpose; another stride on a size-1 dimension), which numpy.asarray copies
    and tensorflow's DLPack import refuses. A jax without ``Array.format`` (0.4.30) is taken at its
    word: it cannot compute on such an array either (no bit-cast, no copy), and convert's pointer
    check finds the copy numpy.asarray makes."""
    if x.ndim < 2:
        return True
    try:
        order = x.format.layout.major_to_minor
    except (AttributeError, RuntimeError):  # no Array.format, or no layout (a backend without one)
        return True
    return tuple(order) == tuple(range(x.ndim))


def _a_view(a) -> bool:
    """Whether numpy.asarray's result views the jax buffer (zero-copy, it has a base), not a copy."""
    return a.base is not None


def _capsule(x):
    """A legacy capsule, as ``Array.__dlpack__()`` gives one with no arguments (on the host: no stream)."""
    return x.__dlpack__()


def _import_aligned(obj):
    """``Adapter.importer_aligned``: jax's import, refusing to copy an unaligned buffer, and handing a
    buffer whose strides it refuses (one a kept plan took for a transpose) back to convert's full path."""
    try:
        return jnp.from_dlpack(obj, copy=False)
    except Exception as err:  # noqa: BLE001 - jax's refusal, whatever this jax calls its error type
        try:
            unaligned = dlpack.data_ptr(obj) % ALIGN != 0
        except Exception:  # noqa: BLE001 - no pointer to read: jax's own error stands
            unaligned = False
        if unaligned:
            raise UnalignedImport(
                "jax.numpy.from_dlpack would copy this buffer (not 64-byte aligned), which its source "
                "described as aligned; pass copy=True") from err
        if _beyond_permuted(obj):
            raise StalePlan("jax.numpy.from_dlpack takes no strides with gaps or repeats, which this input has; "
                            "pass copy=None") from err
        raise


def _beyond_permuted(obj) -> bool:
    """Whether a DLPack producer of a registered framework is less regular than dense in some order
    (described afresh: this runs only where jax's import refused it)."""
    try:
        source = registry.framework_of(obj)
        return registry.get(source).describe(obj).layout > PERMUTED
    except Exception:  # noqa: BLE001 - not a tensor we describe: jax's own error stands
        return False


def _device_name(d) -> str:
    """A jax device as ``Source.device`` names it: "cpu" (the first CPU device), "cpu:1", "gpu:0"."""
    return "cpu" if d.platform == "cpu" and d.id == 0 else f"{d.platform}:{d.id}"


@functools.cache
def _devices() -> dict:
    """name -> jax device, for every device of this process: the CPU ones, then the default backend's."""
    found = [*jax.devices("cpu"), *(d for d in jax.devices() if d.platform != "cpu")]
    return {_device_name(d): d for d in found}


#: jax's platform names of a GPU (parse_device's "gpu")
_GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def _key(entry):
    """A jax key-path entry as the plain key an error message shows."""
    for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey / FlattenedIndexKey, SequenceKey
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


class JaxAdapter(Adapter):
    name = "jax"
    immutable = True
    # device memory in another order is untried (a GPU import may refuse it): copied row-major first
    dlpack_accepts_device = CONTIGUOUS
    kept_layout_note = ("a jax array in another dimension order than row-major (as jax.numpy.from_dlpack gives), "
                        "which jax computes on (jax.jit too), numpy.asarray copies, and a function compiled ahead "
                        "of time (jax.jit(f).lower(...).compile()) refuses")
    dlpack_unaligned = "copies"
    bitview_free = False  # lax.bitcast_convert_type makes a new buffer
    # jax.device_put of an unaligned buffer against an aligned copy and a zero-copy device_put (docs/benchmarks.md)
    import_copy_cost = 4.0
    label_bitview = "lax.bitcast_convert_type({dtype})"
    label_import = "jax.numpy.from_dlpack"
    label_copy = "jax.numpy.array(copy=True)"

    # what jax holds, speaks and allocates, tried on first need (probe), then kept on the instance
    @trials.kept_property
    def copies_aligned(self) -> bool:
        return probe.allocates_aligned()

    @property
    def dlpack_accepts(self) -> int:  # type: ignore[override]
        # a transpose kept as it is where this jax computes on it, by trying on the host (probe)
        return PERMUTED if probe.takes_permuted() else CONTIGUOUS

    @trials.kept_property
    def dlpack_export(self) -> frozenset:
        return frozenset(dtypes.ALL) | probe.narrow_rows().dlpack_out

    @trials.kept_property
    def dlpack_import(self) -> frozenset:
        return frozenset(dtypes.ALL) | probe.narrow_rows().dlpack_in

    @trials.kept_property
    def narrow_held(self) -> frozenset:
        return probe.narrow_rows().held

    @trials.kept_property
    def narrow_why(self) -> dict:
        return probe.narrow_rows().why

    def cannot_hold(self, dtype):
        if dtype in probe.WIDE and not jax.config.jax_enable_x64:
            return (f"jax narrows {dtype} unless 64-bit mode is on: "
                    "jax.config.update('jax_enable_x64', True)")
        return super().cannot_hold(dtype)

    def views_bits(self, dtype):
        return dtype == "bfloat16" or dtype in probe.narrow_rows().views

    def casts(self, src, dst):
        return self.holds(src) and self.holds(dst) and probe.casts(src, dst)

    def handoffs(self):
        rows, shared, aligned = probe.narrow_rows(), probe.shared(), self.copies_aligned
        out = [
            Handoff("numpy", "jax", "jax.device_put", jax.device_put, _device_put_copies, dtypes=shared,
                    verify=True, copies_aligned=aligned),
            # zero-copy for a row-major buffer (it copies any other, read-only: the planner copies in jax
            # first), but numpy decides: checked
            Handoff("jax", "numpy", "numpy.asarray", np.asarray, lambda layout, aligned: None,
                    dtypes=shared - rows.asarray_copies, verify=True, layouts=CONTIGUOUS, shares=_a_view),
        ]
        if rows.put_copies or rows.asarray_copies:
            out += [Handoff("numpy", "jax", "jax.numpy.asarray (packs)", _put_packed, _packs_copy,
                            dtypes=rows.put_copies, copies_aligned=aligned, copies_by_dtype=True),
                    # numpy.array: its own writable copy (numpy.asarray's would be read-only)
                    Handoff("jax", "numpy", "numpy.array (unpacks)", np.array, _packs_copy,
                            dtypes=rows.put_copies | rows.asarray_copies, copies_aligned=False, copies_by_dtype=True)]
        return out

    def state(self):
        # x64 narrows 64-bit dtypes; a trial's answer landing after a conservative one (asked inside a
        # callback: probe) changes what this adapter declares
        return jax.config.jax_enable_x64, trials.revision()

    def no_data(self, x):
        return DELETED if not isinstance(x, _Tracer) and x.is_deleted() else None

    def describe(self, x, *, alignment: bool = True) -> Source:
        if isinstance(x, _Tracer):
            raise UnsupportedTypeError(
                "a traced jax value (inside jit, grad or vmap) has no data yet; convert outside the transform"
            )
        if x.is_deleted():
            raise UnsupportedTypeError(DELETED)
        devices = x.sharding.device_set
        if len(devices) != 1:
            raise UnsupportedTypeError(
                f"this jax array is sharded over {len(devices)} devices; "
                "bb.convert_shards(x, to=...) moves it shard by shard"
            )
        name = self._dtype_name(x)
        (dev,) = devices
        return Source(
            value=x, dtype=name, shape=tuple(x.shape), nbytes=x.nbytes,
            # dense, in row-major order unless imported over DLPack in another, and 64-byte aligned where
            # this jax allocates so (copies_aligned; it imports anything else by copying); else the
            # pointer says, where it matters
            layout=CONTIGUOUS if _row_major(x) else PERMUTED, aligned=self.copies_aligned or not alignment or self.data_ptr(x) % ALIGN == 0,
            readonly=False, device=_device_name(dev),
        )

    def _dtype_name(self, x) -> str:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
            raise UnsupportedDtypeError(
                f"jax array of dtype {x.dtype} (a PRNG key or another extended dtype) has no plain bits "
                "to move; pass jax.random.key_data(key) for a key's raw uint32 data"
            )
        name = dtypes.name_of_numpy(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"jax array of dtype {x.dtype} is not moved by bf16bridge; supported: "
                f"{', '.join(d for d in dtypes.NAMES if self.holds(d))}"
            )
        return name

    label_place = "jax.device_put(device={device!r})"
    device_objects = "jax.Device"

    def devices(self):
        return tuple(_devices())

    def find_device(self, device):
        found = _devices()
        if isinstance(device, jax.Device):
            name = _device_name(device)
            if found.get(name) is device:
                return name
            raise self.no_device(device, ": not one of this process's devices")
        if not isinstance(device, str):
            raise self.no_device(device, ": neither a device name nor a jax.Device")
        if device in found:
            return device
        parsed = parse_device(device)
        if parsed is not None:
            kind, index = parsed
            for name, d in found.items():
                if ((d.platform == "cpu") if kind == "cpu" else (d.platform in _GPU_PLATFORMS)) and (
                        index is None or d.id == index):
                    return name
        raise self.no_device(device)

    def device_of(self, x):
        names = sorted(_device_name(d) for d in x.sharding.device_set)
        return names[0] if len(names) == 1 else f"{len(names)} devices ({', '.join(names)})"

    def place(self, x, device):
        dev = _devices()[device]
        here = x.sharding.device_set
        return x if len(here) == 1 and dev in here else jax.device_put(x, dev)

    def tree_children(self, node):
        tu = jax.tree_util
        paths, treedef = tu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
        if tu.treedef_is_leaf(treedef):
            return None
        keys = [_key(path[0]) if path else "?" for path, _ in paths]
        return keys, [leaf for _, leaf in paths], treedef.unflatten

    def fast_key(self, x, alignment):
        if isinstance(x, _Tracer) or x.is_deleted():
            return None
        if self.copies_aligned or not alignment:
            return (x.dtype, x.sharding, 0 in x.shape)  # jax buffers are dense (and aligned: copies_aligned)
        return (x.dtype, x.sharding, 0 in x.shape, self.data_ptr(x) % ALIGN == 0)

    def data_ptr(self, x) -> int:
        x.block_until_ready()  # a pointer asked of a pending result can hang
        return x.unsafe_buffer_pointer()

    def bitview(self, x, dtype):
        return jax.lax.bitcast_convert_type(x, dtypes.numpy_dtype(dtype))

    def from_dlpack(self, obj):
        return jnp.from_dlpack(obj)

    def importer(self):
        return jnp.from_dlpack

    def importer_aligned(self):
        return _import_aligned if probe.refuses_unaligned() else None

    def capsule_exporter(self):
        return _capsule

    def copy(self, x):
        return jnp.array(x, copy=True)

    def astype(self, x, dtype):
        if probe.host_cast(x.dtype, dtype):
            # this jax rounds to other bits than ml_dtypes here: ml_dtypes' cast in numpy, put back
            # where x was (a copy through the host)
            if isinstance(x, _Tracer):
                raise UnsupportedTypeError(
                    f"jax {jax.__version__} casts {x.dtype} to {dtype} with other bits than ml_dtypes here "
                    "(XLA:CPU flushes subnormals or rounds twice), and under a trace (jit, grad, vmap) the cast "
                    "cannot go through numpy instead: cast outside the traced function, or upgrade jax "
                    "(0.10 casts float32 as ml_dtypes does)")
            with np.errstate(all="ignore"):  # NaN and overflow casts warn: the rounding defines them
                return jax.device_put(np.asarray(x).astype(dtypes.numpy_dtype(dtype)), x.sharding)
        return x.astype(dtypes.numpy_dtype(dtype))

    def to_host(self, x):
        return jax.device_put(x, jax.devices("cpu")[0])


ADAPTER = JaxAdapter()
