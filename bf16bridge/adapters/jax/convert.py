"""JAX. Arrays are immutable; its DLPack import is zero-copy only for a
contiguous buffer on a 64-byte boundary (it copies silently otherwise), and
its bit-casts copy, so bf16 reaches numpy through ``numpy.asarray`` and comes
from numpy through ``jax.device_put``."""

from __future__ import annotations

import functools
import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.kernels import chunked as kernels
from bf16bridge.core import versions
from bf16bridge.errors import UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.adapters import dlpack as _dlpack
from bf16bridge.adapters.hooks import BridgeHooks, CastHooks, KernelHooks, NumericsHooks, ProbeHooks, ShardHooks
from bf16bridge.adapters.trials import cast_matches, float_row, rounds_as_ml_dtypes
from bf16bridge.core.adapter import ALIGN, CONTIGUOUS, Adapter, Handoff, Source, UnalignedImport

# for sharded arrays (bf16bridge.shards)
from bf16bridge.core import sharding as shards
from bf16bridge.core import registry
from bf16bridge.errors import CopyRequiredError, DeviceError, InvalidArgumentError

versions.require("jax", jax.__version__)

_WIDE = {"int64", "uint64", "float64", "complex128"}
#: a traced value's class, looked up once: read through jax.core's module __getattr__ each time, it
#: cost about as much as the isinstance itself, several times on every bridged call
_Tracer = jax.core.Tracer


def _narrow_rows():
    """What this jax does with each narrow row, found by trying once on a small aligned array:
    (held, why not held, exported over DLPack, imported, bit-viewed, device_put copies,
    numpy.asarray copies). XLA on CPU stores its sub-byte types packed, so its hand-offs
    with numpy copy them, and its bit-casts refuse them."""
    from bf16bridge.adapters import dlpack as _dlpack
    from bf16bridge.adapters.numpy import aligned_empty

    held, why, out, into, views, put_copies, asarray_copies = set(), {}, set(), set(), set(), set(), set()
    for name in dtypes.NARROW_DTYPES:
        if dtypes.numpy_missing(name) is not None:
            why[name] = f"jax takes it from numpy, and {dtypes.numpy_missing(name)}"
            continue
        row = dtypes.ROWS[name]
        a = aligned_empty((64,), name)
        a.view(dtypes.BITS_OF[name])[...] = 0
        try:
            # on the host: what is found here is about numpy's memory (a GPU default device would
            # make every row look copied, and the reason say packed)
            x = jax.device_put(a, jax.devices("cpu")[0])
            back = np.asarray(x)
        except Exception as err:  # noqa: BLE001 - whatever it raised, jax cannot hold it
            why[name] = f"jax {jax.__version__} cannot hold {name}: {type(err).__name__}: {str(err).splitlines()[0]}"
            continue
        held.add(name)
        x.block_until_ready()
        if x.unsafe_buffer_pointer() != a.ctypes.data:
            put_copies.add(name)
        if back.ctypes.data != x.unsafe_buffer_pointer():
            asarray_copies.add(name)
        try:
            got = _dlpack._tensor(x.__dlpack__()).dtype
            if (got.code, got.bits, got.lanes) == row.dlpack:
                out.add(name)
                if jnp.from_dlpack(x).dtype == x.dtype:
                    into.add(name)
        except Exception:  # noqa: BLE001 - no DLPack for it
            pass
        try:  # asked of the abstract shapes first: running a bit-cast compiles it (about 80 ms a dtype)
            u = jax.eval_shape(lambda v: jax.lax.bitcast_convert_type(v, np.dtype(row.carrier)), x)
            back = jax.eval_shape(lambda v: jax.lax.bitcast_convert_type(v, x.dtype), u)
            if u.shape == x.shape and back.shape == x.shape:
                views.add(name)
        except Exception:  # noqa: BLE001 - no bit-cast for it
            pass
    return (frozenset(held), why, frozenset(out), frozenset(into), frozenset(_lowers(views)),
            frozenset(put_copies), frozenset(asarray_copies))


def _bitcasts(names):
    """Lower (not compile) the bit-casts of ``names`` to their carriers and back, all in one
    program; raises what jax raises when any of them cannot be lowered."""
    specs = [jax.ShapeDtypeStruct((64,), dtypes.numpy_dtype(n)) for n in names]
    carriers = [np.dtype(dtypes.ROWS[n].carrier) for n in names]

    def f(xs):
        out = [jax.lax.bitcast_convert_type(x, c) for x, c in zip(xs, carriers)]
        return out, [jax.lax.bitcast_convert_type(u, x.dtype) for u, x in zip(out, xs)]

    jax.jit(f).lower(specs)


def _lowers(names):
    """The bit-casts whose shapes jax accepts that it can also lower: jax 0.4.30 gives an int4
    bit-cast to uint8 a shape, then refuses to lower it ("rank of smaller element type ...").
    One lowering for all (about 10 ms); one a row only when that fails."""
    names = sorted(names)
    try:
        _bitcasts(names)
        return set(names)
    except Exception:  # noqa: BLE001 - which one failed is found one by one
        pass
    ok = set()
    for n in names:
        try:
            _bitcasts([n])
            ok.add(n)
        except Exception:  # noqa: BLE001 - this jax cannot lower it: no bit-view for it
            pass
    return ok


# evaluated at once where this module is first imported under a trace (a first bridged call or convert
# inside jax.jit): there device_put gave tracers, and every narrow row was taken as not held, for good
with jax.ensure_compile_time_eval():
    _HELD, _CANNOT, _DLPACK_OUT, _DLPACK_IN, _VIEWS, _PUT_COPIES, _ASARRAY_COPIES = _narrow_rows()
#: dtypes whose hand-offs with numpy are zero-copy as for any other (aligned, contiguous)
_SHARED = frozenset(dtypes.ALL) | (_HELD - _PUT_COPIES)


@functools.lru_cache(maxsize=None)
def _casts(src: str, dst: str) -> bool:
    """Whether astype keeps every src value in dst (XLA on CPU may flush subnormals), tried once."""
    return cast_matches(src, dst, lambda a: np.asarray(jax.device_put(a).astype(dtypes.numpy_dtype(dst))))


@functools.lru_cache(maxsize=None)
def _rounds_as_ml_dtypes(src: str, dst: str) -> bool:
    """Whether jax's astype from float row ``src`` to ``dst`` gives ml_dtypes' bits (a NaN: a NaN),
    tried once on the CPU. jax 0.4.30's flushes float32 subnormals to zero on the way to bf16 and
    rounds float32 to the fp8 types twice; jax 0.10's agrees from float32, not from float64 (with x64
    on, values just above 2**-150 round to 0), so those go through numpy."""
    to = dtypes.numpy_dtype(dst)
    cpu = jax.local_devices(backend="cpu")[0]
    # evaluated at once where the first cast comes under a trace (cast_tree inside jit)
    with jax.ensure_compile_time_eval():
        return rounds_as_ml_dtypes(src, dst, lambda a: np.asarray(jax.device_put(a, cpu).astype(to)))


@functools.lru_cache(maxsize=None)
def _host_cast(src_dtype: np.dtype, dst: str) -> bool:
    """Whether astype from numpy dtype ``src_dtype`` to row ``dst`` goes through ml_dtypes in numpy
    (this jax's own cast gives other bits), decided once per pair."""
    src = dtypes.name_of_numpy(src_dtype)
    return src != dst and float_row(src) and float_row(dst) and not _rounds_as_ml_dtypes(src, dst)


_DELETED = ("this jax array was deleted (donated to a jit with donate_argnums, or .delete()); it has no data to "
            "move: convert the array the donating call returned, or convert (or copy) this one before donating it")


def _packs_copy(layout, aligned):
    return "jax stores sub-byte types packed: its hand-off with numpy converts (a copy)"


def _put_packed(a):
    """``jax.device_put`` of a sub-byte array (one value a byte in numpy): jax packs it keeping each
    byte's low bits, so a byte ml_dtypes reads otherwise (a view of other bytes) is refused first."""
    kernels.refuse_changed_padding(a.view(np.uint8), a.dtype.name, f"jax.device_put of {a.dtype.name} (jax packs it)")
    return jax.device_put(a)


def _device_put_copies(layout, aligned):
    if layout != CONTIGUOUS:
        return "jax.device_put copies a non-contiguous array"
    if not aligned:
        return "jax.device_put copies a buffer that is not 64-byte aligned"
    return None


def _capsule(x):
    """A legacy capsule, as ``Array.__dlpack__()`` gives one with no arguments (on the host: no stream)."""
    return x.__dlpack__()


def _refuses_unaligned() -> bool:
    """Whether ``jnp.from_dlpack(x, copy=False)`` refuses a buffer not ALIGN-aligned (a ValueError,
    as jax 0.10 does) and takes an aligned one without copying, tried once on a numpy byte buffer
    (jax 0.4.30 takes an unaligned one as it is: no aligned importer there, the key reads alignment)."""
    buf = np.zeros(4 * ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    try:
        aligned = jnp.from_dlpack(buf[start:start + ALIGN], copy=False)
        if aligned.unsafe_buffer_pointer() != buf.ctypes.data + start:
            return False
        jnp.from_dlpack(buf[start + 1:start + 1 + ALIGN], copy=False)
    except ValueError:
        return True
    except Exception:  # noqa: BLE001 - no copy keyword, no DLPack from numpy: no aligned importer
        return False
    return False


def _import_aligned(obj):
    """``Adapter.importer_aligned``: jax's import, refusing to copy an unaligned buffer."""
    try:
        return jnp.from_dlpack(obj, copy=False)
    except ValueError as err:
        try:
            unaligned = _dlpack.data_ptr(obj) % ALIGN != 0
        except Exception:  # noqa: BLE001 - no pointer to read: jax's own error stands
            unaligned = False
        if unaligned:
            raise UnalignedImport(
                "jax.numpy.from_dlpack would copy this buffer (not 64-byte aligned), which its source "
                "described as aligned; pass copy=True") from err
        raise


_REFUSES_UNALIGNED = _refuses_unaligned()


def _allocates_aligned() -> bool:
    """Whether every jax array starts on an ALIGN boundary, tried once: jax 0.10 copies an unaligned
    numpy buffer into one it allocates, 64-byte aligned; jax 0.4.30 on CPU takes it as it is and
    allocates its own buffers 16-byte aligned (16, 32 or 48 past a boundary), which tensorflow's
    kernels abort on when such a buffer is imported zero-copy. Tried by ``device_put`` of unaligned
    numpy slices (no compile: about a millisecond), evaluated at once even where the first call
    comes under a trace (jit, grad, vmap)."""
    base = np.zeros(4099 + 2 * ALIGN, np.uint8)
    start = (1 - base.ctypes.data) % ALIGN  # an address 1 past a boundary: never taken as it is
    with jax.ensure_compile_time_eval(), jax.default_device(jax.local_devices(backend="cpu")[0]):
        for n in (1, 3, 24, 100, 4099):
            for _ in range(2):
                y = jax.device_put(base[start:start + n])
                y.block_until_ready()  # a pointer asked of a pending result has hung a process here
                if y.unsafe_buffer_pointer() % ALIGN:
                    return False
    return True


_ALIGNED = _allocates_aligned()


def _key(entry):
    """A jax key-path entry as the plain key an error message shows."""
    for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey / FlattenedIndexKey, SequenceKey
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


_HLO_DEF = re.compile(r"%([\w.\-]+) = ([a-z0-9]+)\[")
_HLO_PARAM = re.compile(r"([\w.\-]+): ([a-z0-9]+)\[")
_HLO_MATMUL = re.compile(r"= [a-z0-9]+\[[^\]]*\]\S* (dot|custom-call)\(([^)]*)\)")
# an operand: "%name", or "f32[16,16]{1,0} %name" (older XLA prints its type inline)
_HLO_OPERAND = re.compile(r"(?:([a-z0-9]+)\[[^\]]*\](?:\{[^}]*\})?\s+)?%([\w.\-]+)")


def _narrow_dot(np_dtype, device) -> tuple[str, str]:
    """jnp.dot on ``np_dtype`` inputs, float32 out, compiled for ``device``: 'native' when a dot or
    library call in the compiled program takes the narrow operands, 'emulated' when XLA converts
    them to a wider type first."""
    name = np.dtype(np_dtype).name
    try:
        x = jax.device_put(np.ones((16, 16), dtype=np_dtype), device)
        compiled = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32)).lower(x, x).compile()
        out = np.asarray(compiled(x, x))
        if out[0, 0] != 16.0:
            return "no", f"jnp.dot ran but gave {out[0, 0]} for 16"
        text = compiled.as_text()
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        return "no", f"jnp.dot: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    types = {m.group(1): m.group(2) for m in _HLO_DEF.finditer(text)}
    types.update((m.group(1), m.group(2)) for m in _HLO_PARAM.finditer(text))
    narrow = name.replace("float", "f").split("_")[0]  # f8 (XLA's f8e4m3fn, f8e5m2, ...)
    ops = [(m.group(1), [o.group(1) or types.get(o.group(2), "?") for o in _HLO_OPERAND.finditer(m.group(2))])
           for m in _HLO_MATMUL.finditer(text)]
    if any(t.startswith(narrow) for _, ts in ops for t in ts):
        return "native", f"the compiled program's {ops[0][0]} takes the {name} operands as they are"
    if ops:
        return "emulated", f"XLA converts the {name} operands to {ops[0][1][0]} before its {ops[0][0]} (the compiled program)"
    return "unknown", "jnp.dot runs; no dot found in the compiled program"


class JaxAdapter(Adapter, BridgeHooks, CastHooks, KernelHooks, NumericsHooks, ProbeHooks, ShardHooks):
    def narrow_compute(self, dtype):
        if not self.holds(dtype):
            return ()
        one_each = {d.platform: d for d in (*jax.devices("cpu"), *jax.devices())}  # a device per platform
        return tuple(("cpu" if p == "cpu" else f"{p}:{d.id}", *_narrow_dot(dtypes.numpy_dtype(dtype), d))
                     for p, d in one_each.items())

    name = "jax"
    immutable = True
    dlpack_accepts = CONTIGUOUS
    dlpack_unaligned = "copies"
    bitview_free = False  # lax.bitcast_convert_type makes a new buffer
    # jax.device_put of an unaligned buffer against our aligned copy + zero-copy device_put:
    # 2.9-4.2x here (docs/benchmarks.md)
    import_copy_cost = 4.0
    label_bitview = "lax.bitcast_convert_type({dtype})"
    label_import = "jax.numpy.from_dlpack"
    label_copy = "jax.numpy.array(copy=True)"
    copies_aligned = _ALIGNED

    dlpack_export = frozenset(dtypes.ALL) | _DLPACK_OUT
    dlpack_import = frozenset(dtypes.ALL) | _DLPACK_IN
    narrow_held, narrow_why = _HELD, _CANNOT

    def cannot_hold(self, dtype):
        if dtype in _WIDE and not jax.config.jax_enable_x64:
            return (f"jax narrows {dtype} unless 64-bit mode is on: "
                    "jax.config.update('jax_enable_x64', True)")
        return super().cannot_hold(dtype)

    def views_bits(self, dtype):
        return dtype in _VIEWS or dtype == "bfloat16"

    def casts(self, src, dst):
        return self.holds(src) and self.holds(dst) and _casts(src, dst)

    def handoffs(self):
        out = [
            Handoff("numpy", "jax", "jax.device_put", jax.device_put, _device_put_copies, dtypes=_SHARED,
                    verify=True, copies_aligned=_ALIGNED),
            # zero-copy as a rule, but numpy decides (a jax array over foreign strides is copied)
            Handoff("jax", "numpy", "numpy.asarray", np.asarray, lambda layout, aligned: None,
                    dtypes=_SHARED - _ASARRAY_COPIES, verify=True),
        ]
        if _PUT_COPIES or _ASARRAY_COPIES:
            out += [Handoff("numpy", "jax", "jax.device_put (packs)", _put_packed, _packs_copy,
                            dtypes=_PUT_COPIES, copies_aligned=_ALIGNED),
                    # numpy.array: its own writable copy (numpy.asarray's would be read-only)
                    Handoff("jax", "numpy", "numpy.array (unpacks)", np.array, _packs_copy,
                            dtypes=_PUT_COPIES | _ASARRAY_COPIES, copies_aligned=False)]
        return out

    def state(self):
        return jax.config.jax_enable_x64

    def no_data(self, x):
        return _DELETED if not isinstance(x, _Tracer) and x.is_deleted() else None

    def describe(self, x, *, alignment: bool = True) -> Source:
        if isinstance(x, _Tracer):
            raise UnsupportedTypeError(
                "a traced jax value (inside jit, grad or vmap) has no data yet; convert outside the transform"
            )
        if x.is_deleted():
            raise UnsupportedTypeError(_DELETED)
        devices = x.sharding.device_set
        if len(devices) != 1:
            raise UnsupportedTypeError(
                f"this jax array is sharded over {len(devices)} devices; "
                "bb.convert_shards(x, to=...) moves it shard by shard"
            )
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
        (dev,) = devices
        return Source(
            value=x, dtype=name, shape=tuple(x.shape), nbytes=x.nbytes,
            # jax buffers are dense and row-major, and 64-byte aligned where this jax allocates them so
            # (_ALIGNED; it imports anything else by copying); else the pointer says, where it matters
            layout=CONTIGUOUS, aligned=_ALIGNED or not alignment or self.data_ptr(x) % ALIGN == 0, readonly=False,
            device="cpu" if dev.platform == "cpu" else f"{dev.platform}:{dev.id}",
        )

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
        if _ALIGNED or not alignment:
            return (x.dtype, x.sharding, 0 in x.shape)  # jax buffers are dense (and aligned: _ALIGNED)
        return (x.dtype, x.sharding, 0 in x.shape, self.data_ptr(x) % ALIGN == 0)

    def data_ptr(self, x) -> int:
        x.block_until_ready()  # a pointer asked of a pending result has hung a process here
        return x.unsafe_buffer_pointer()

    def bitview(self, x, dtype):
        return jax.lax.bitcast_convert_type(x, dtypes.numpy_dtype(dtype))

    def from_dlpack(self, obj):
        return jnp.from_dlpack(obj)

    def importer(self):
        return jnp.from_dlpack

    def importer_aligned(self):
        return _import_aligned if _REFUSES_UNALIGNED else None

    def capsule_exporter(self):
        return _capsule

    def copy(self, x):
        return jnp.array(x, copy=True)

    def astype(self, x, dtype):
        if _host_cast(x.dtype, dtype):
            # this jax rounds to other bits than ml_dtypes here (jax 0.4.30: float32 subnormals
            # flushed on the way to bf16, float32 rounded twice on the way to fp8): ml_dtypes'
            # cast in numpy, put back where x was (a copy through the host)
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

    def devices(self):
        out: list[tuple[str, bool | None, str]] = []
        for d in jax.devices():
            if d.platform == "cpu":
                continue
            cap = getattr(d, "compute_capability", None)
            if d.platform == "tpu":
                out.append((f"{d.platform}:{d.id} {d.device_kind}", True, "TPUs compute in bf16"))
            elif cap is not None:
                major = int(str(cap).split(".")[0])
                out.append((f"{d.platform}:{d.id} {d.device_kind}", major >= 8,
                            f"compute capability {cap} (bf16 arithmetic from 8.0)"))
            else:
                out.append((f"{d.platform}:{d.id} {d.device_kind}", None, "jax does not say"))
        return out

    def facts(self):
        buffers = _buffers_here("cpu")
        return {"x64": (bool(jax.config.jax_enable_x64),
                        "jax_enable_x64 is on" if jax.config.jax_enable_x64 else
                        "jax_enable_x64 is off: 64-bit dtypes are refused rather than narrowed"),
                "aligned import": (_REFUSES_UNALIGNED, (
                    "jax.numpy.from_dlpack(copy=False) refuses a buffer not 64-byte aligned: zero-copy "
                    "routes into jax run it, and convert's hot path reads no input's alignment for them"
                    if _REFUSES_UNALIGNED else
                    "jax.numpy.from_dlpack(copy=False) took a buffer not 64-byte aligned: convert's hot "
                    "path reads each input's alignment for routes into jax")),
                "pure_callback vmap_method": (_VMAP_METHOD, (
                    "jax.pure_callback takes vmap_method: a bridged function under vmap needs one"
                    if _VMAP_METHOD else
                    f"jax {jax.__version__}'s pure_callback has no vmap_method: under vmap a bridged function "
                    "runs once per batch element (as vmap_method='sequential'), the only method it takes")),
                "buffer_callback": (buffers, (
                    "under a jax transformation a bridged callee on the CPU runs in "
                    "jax.experimental.buffer_callback, on copies of jax's input buffers and writing into its result "
                    "buffers (no host round trip); on one CUDA GPU too, "
                    "for a callee that queues its work on jax's stream (torch with CUDA); elsewhere in "
                    "jax.pure_callback, on host copies" if buffers else
                    f"jax {jax.__version__} has no buffer_callback the bridge uses (from 0.8.1)" if not BUFFER_CALLBACK
                    else f"{len(jax.devices('cpu'))} CPU devices (a buffer_callback would run on each)")
                    + ("" if buffers else ": under a jax transformation a bridged callee runs in "
                       "jax.pure_callback, on host copies of its inputs and results")),
                "aligned buffers": (_ALIGNED, (
                    "jax allocates its buffers 64-byte aligned: a jax array is aligned, read without a pointer"
                    if _ALIGNED else
                    "jax allocates buffers not 64-byte aligned: a jax array's pointer is read where a route "
                    "depends on it (tensorflow takes only aligned ones)"))}

    computes = True

    def numerics(self):
        import os

        return {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
                "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}

    # -- functions across frameworks -----------------------------------------------
    differentiates = True

    def differentiable(self, x):
        # concrete arrays have no transformation watching them; tracers of inexact dtype may
        return isinstance(x, _Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)

    def differentiable_leaves(self, leaves, traced):
        # concrete arrays (an eager call, asked on every one): no question per leaf
        if not traced:
            return [False] * len(leaves)
        return [self.differentiable(x) for x in leaves]

    def traced(self, leaves):
        for x in leaves:  # (a loop: a generator in any() costs more than the question, per call)
            if isinstance(x, _Tracer):
                return True
        return False

    def call_foreign(self, call, leaves):
        if not call.traced:
            return call.forward(leaves, False, self.name)[0]
        # Under a transformation (grad, jit, ...) the callee runs in a callback when jax runs
        # the computation; results are declared first, and the backward recomputes the forward
        # (a callback cannot hand a Python object to the next one).
        # The custom_vjp function and its callbacks are built once per signature and kept (call.memo):
        # jax caches a pure_callback's compiled computation by the callback's identity, so fresh
        # closures on every call cost two XLA compilations a call (about 25 ms here).
        f = call.memo.get("jax") if call.memo is not None else None
        if f is None:
            f = _foreign_fn(call, leaves, self.shape_dtype)
            if call.memo is not None:
                call.memo["jax"] = f
        return list(f(*leaves))

    def vjp(self, fn, leaves, diff):
        wanted = [i for i, d in enumerate(diff) if d]

        def g(*chosen):
            full = list(leaves)
            for i, v in zip(wanted, chosen):
                full[i] = v
            return fn(*full)

        outs, vjp_fn = jax.vjp(g, *[leaves[i] for i in wanted])

        def pullback(cts):
            cts = [c if c is not None else
                   (jnp.zeros_like(o) if jnp.issubdtype(o.dtype, jnp.inexact) else np.zeros(o.shape, jax.dtypes.float0))
                   for o, c in zip(outs, cts)]
            grads = iter(vjp_fn(list(cts)))
            return [next(grads) if d else None for d in diff]

        pullback.residuals = vjp_fn  # type: ignore[attr-defined]  # for Adapter.kept: jax's residuals (exp(x)'s result)
        return outs, pullback

    # -- sharded arrays, for bf16bridge.shards ------------------------------------------------------
    assembles = True

    def local_shards(self, x):
        if isinstance(x, _Tracer) or not isinstance(x, jax.Array):
            return None
        if len(x.sharding.device_set) == 1 and not isinstance(x.sharding, jax.sharding.NamedSharding):
            return None  # one device, no mesh (a mesh of one device is a sharding all the same)
        if x.is_deleted():
            raise UnsupportedTypeError(_DELETED)
        shape = tuple(x.shape)
        layout = _layout(x.sharding, x.ndim)
        if layout is not None and layout.partial:  # jax has no shard indices for unreduced values
            return shape, layout, []
        pieces = [(shards.bounds(s.index, shape), _device_name(s.device), s.data, s.replica_id)
                  for s in x.addressable_shards]
        return shape, layout, pieces

    def assemble(self, shape, pieces, sharding, layout, copy, on_alias, convert):
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
        try:
            wanted = sharding.addressable_devices_indices_map(shape)
        except ValueError as err:  # a dimension the sharding does not divide evenly
            raise InvalidArgumentError(f"jax cannot lay out a {shape} array as {sharding}: {err}") from err
        if pieces:  # (one dtype across the pieces: from_shards checked) jax without x64 would narrow
            # int64 / float64 shards in device_put without a word: refused, as convert refuses them
            t = pieces[0][2]
            name = dtypes.in_values(*registry.get(registry.framework_of(t)).shape_dtype(t))[1]
            refused = self.cannot_hold(name)
            if refused is not None:
                raise UnsupportedDtypeError(f"jax cannot hold these {name} shards bit for bit here ({refused}); "
                                            "or convert the shards to a dtype jax holds first")
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
        # host buffers go onto their cpu devices in one call (one per shard costs twice as much)
        host = [i for i, (_, _, a) in enumerate(arrays) if isinstance(a, np.ndarray)]
        if host:
            for i in host:
                a = arrays[i][2]
                if a.dtype.name in _PUT_COPIES:
                    kernels.refuse_changed_padding(a.view(np.uint8), a.dtype.name,
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
        return jax.make_array_from_single_device_arrays(shape, sharding, [a for _, _, a in arrays])


def _foreign_fn(call, leaves, shape_dtype):
    """A jax function of the input leaves that runs ``call`` in callbacks, with its vjp."""
    out_avals = [jax.ShapeDtypeStruct(s, dtypes.numpy_dtype(d)) for s, d in call.specs(leaves, shape_dtype)]
    if not any(math.prod(a.shape) for a in out_avals) and any(math.prod(x.shape) for x in leaves):
        # jax runs no callback whose results are all empty (or none): the function would never run, and
        # x[x > 1], empty on zeros and on ones, came back [] for [1, 2, 3], unchecked
        raise UnsupportedTypeError(
            f"the bridged {call.callee} function {getattr(call.fn, '__qualname__', call.fn)!r} gives no tensor result "
            "with any element when its results are declared (on zeros of the inputs' shapes, and on ones), and under "
            "a jax transformation jax then never runs it: neither the function (its side effects) nor a check that "
            "its results stay empty for these inputs would run. Call it eagerly, or return a non-empty tensor too")
    in_avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    wanted = [i for i, d in enumerate(call.diff) if d]
    inexact = [i for i, a in enumerate(out_avals) if jnp.issubdtype(a.dtype, jnp.inexact)]
    n = len(leaves)

    # results batched by vmap (the other vmap methods) are jax's to check
    unbatched = call.vmap_method in (None, "sequential")

    # each callback takes its inputs as tensors of ``to`` and gives its results as them: numpy on the
    # host, the callee's own on a device whose buffers it takes (_HostCall); ``borrowed``: the inputs
    # view jax's buffers ("jax": a write into one is our error), or None: they are the callback's own
    # copies. A gradient jax wants that the callee has not is zeros (of the input as it came: batched
    # under vmap), or None on a device, where the writer zeroes jax's buffer
    def fwd_cb(to, borrowed, *xs):
        outs = call.forward(list(xs), False, to, borrowed)[0]
        if unbatched:
            call.check_declared(outs, to)
        return outs

    def bwd_cb(to, borrowed, *a):
        given = dict(zip(inexact, a[n:]))
        grads = call.recompute_backward(list(a[:n]), [given.get(i) for i in range(len(out_avals))], to,
                                        borrowed=borrowed)
        return [grads[i] if grads[i] is not None else np.zeros(np.shape(a[i]), np.dtype(a[i].dtype))
                if to == "numpy" else None for i in wanted]

    forward = _HostCall(call, call.vmap_method, fwd_cb, out_avals, in_avals)
    # the backward's callback: under expand_dims (and legacy_vectorized) an input that vmap does not
    # batch comes in with a size-1 batch dimension, and its gradient must too; computed from a
    # cotangent with the full batch it came out full (torch's and jax's raw shape errors). Broadcast,
    # every gradient is the batch's, which vmap's own transpose then sums for unbatched inputs; a
    # callee that takes size-1 dimensions (what those methods ask of it) takes full ones
    backward = _HostCall(call, "broadcast_all" if call.vmap_method in ("expand_dims", "legacy_vectorized")
                         else call.vmap_method, bwd_cb, [in_avals[i] for i in wanted], in_avals + out_avals)

    @jax.custom_vjp
    def f(*xs):
        return forward(*xs)

    def f_fwd(*xs):
        return f(*xs), xs

    # the backward's callback under a rule that refuses to be differentiated, with our error
    # (jax's own says only that a pure_callback has no JVP)
    @jax.custom_jvp
    def bwd(*a):
        return tuple(backward(*a))

    @bwd.defjvp
    def bwd_jvp(primals, tangents):
        from bf16bridge.adapters.hooks import second_order_refused

        raise second_order_refused("jax", call.fn)

    def f_bwd(xs, cts):
        got = bwd(*xs, *[cts[i] for i in inexact]) if wanted else []
        full: list = [None] * n
        for i, g in zip(wanted, got):
            full[i] = g
        return tuple(full)

    f.defvjp(f_fwd, f_bwd)
    return f


#: whether jax.pure_callback takes vmap_method; jax 0.4.30's has none (its ``vectorized=False``
#: default runs the callback once per batch element, as vmap_method="sequential"; any other
#: keyword it hands to the callback, which failed as "not a valid JAX type")
_VMAP_METHOD = "vmap_method" in inspect.signature(jax.pure_callback).parameters


try:  # jax >= 0.6.1; from 0.8.1 (a failing callback left the runtime's host-callback state unbalanced before)
    from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:  # pragma: no cover - jax 0.4.30 (the oldest tested)
    _buffer_callback = None
#: whether a callback on the CPU runs on jax's own buffers (buffer_callback): pure_callback copies
#: every input and result through host arrays of its own, about 100 us a call here, more than a small
#: callee takes
BUFFER_CALLBACK = _buffer_callback is not None and versions.release(jax.__version__) >= (0, 8, 1)


@functools.cache
def _buffers_here(platform: str) -> bool:
    """Whether bridged callbacks on ``platform`` ("cpu", "cuda") take buffer_callback here: jax has it,
    and one device of that platform (over several, a computation with sharded inputs runs a
    buffer_callback once on every device, each with the whole array: the callee ran N times a call;
    pure_callback runs once, on one device)."""
    if not BUFFER_CALLBACK:
        return False
    try:
        return len(jax.devices(platform)) == 1
    except RuntimeError:  # no such backend here
        return False


class _HostCall:
    """One callback of a bridged call (its forward, or its backward): ``fn(to, borrowed, *inputs)``
    takes tensors of ``to`` and gives results of ``avals``' shapes and dtypes as tensors of ``to``
    (None: zeros), and runs when jax runs the computation.

    On the CPU (jax >= 0.8.1, one CPU device) it runs in a ``buffer_callback``: the callee gets
    copies of jax's input buffers of its own (plain copies, without pure_callback's host round trip and
    its cost; jax's buffers are valid only during the callback, and a callee may keep its input),
    read-only for a numpy callee as eagerly, and
    each result is written into jax's result buffer once it has been checked to be exactly the
    declared shape and dtype (a copy into it would broadcast or cast, silently). On one CUDA GPU, for a
    callee that can queue its work on jax's stream (``Adapter.device_streams``: torch), likewise on the
    device: device copies of jax's buffers, the callee's work queued on the computation's stream, in
    order with it. Elsewhere (an older jax, several devices, another callee, a type jax stores packed)
    it runs in ``pure_callback``, which hands it host copies. The branches are built once and kept: jax
    caches traced branches and compiled callbacks by their identity, and new ones on every call would
    compile every call."""

    def __init__(self, call, vmap_method, fn, avals, in_avals):
        self.call, self.vmap_method, self.fn, self.avals = call, vmap_method, fn, avals
        self.kw = self._vmap_keywords()
        self.callee = registry.get(call.callee)
        self.callee_hooks = registry.hooks(call.callee, BridgeHooks)
        self.readonly = self.callee.marks_readonly
        #: the callee's DLPack import copies or refuses a buffer not 64-byte aligned (tensorflow): its
        #: inputs' copies are made so aligned
        self.aligned = self.callee.dlpack_unaligned != "ok"
        #: an input or result of a type jax stores packed (int4, fp4: two values a byte), whose buffer a
        #: numpy or DLPack view reads as one value a byte: wrong values, and results written past the
        #: buffer's end. pure_callback unpacks them
        names = (dtypes.name_of_numpy(np.dtype(a.dtype)) for a in (*in_avals, *avals))
        self.packed: list[str] = sorted({n for n in names if n is not None and n in _PUT_COPIES})
        self._pure = functools.partial(self._pure_callback)
        self._on_host = functools.partial(self._buffer_callback, self._fill)
        self._on_gpu = functools.partial(self._buffer_callback, self._fill_device)

    def _vmap_keywords(self):
        vmap_method = self.vmap_method
        if _VMAP_METHOD:
            return {} if vmap_method is None else {"vmap_method": vmap_method}
        if vmap_method in (None, "sequential"):
            return {}  # this jax's one batching rule: once per batch element
        return None  # refused when called (under the trace, as before)

    def __call__(self, *args):
        if self.kw is None:
            raise UnsupportedTypeError(
                f"vmap_method={self.vmap_method!r}: jax {jax.__version__}'s pure_callback has no vmap_method; its "
                "one batching rule runs the function once per batch element: pass vmap_method='sequential', or "
                "upgrade jax (pip install -U jax) for the others")
        if self.packed and not _callback_takes_packed():
            raise UnsupportedDtypeError(
                f"the bridged {self.call.callee} function {getattr(self.call.fn, '__qualname__', self.call.fn)!r} "
                f"takes or gives {', '.join(self.packed)} under a jax transformation, and jax {jax.__version__}'s "
                "callbacks cannot carry them (its XLA takes sub-byte types only in convert instructions): call the "
                "function eagerly, or upgrade jax (pip install -U jax)")
        branches = {}
        if not self.packed:
            if _buffers_here("cpu"):
                branches["cpu"] = self._on_host
            if "cuda" in self.callee_hooks.device_streams() and _buffers_here("cuda"):
                branches["cuda"] = self._on_gpu
        try:
            if branches:
                return jax.lax.platform_dependent(*args, **branches, default=self._pure)
            return self._pure(*args)
        except NotImplementedError as err:
            if "vmap" not in str(err):
                raise
            raise UnsupportedTypeError(
                "a bridged function called from jax under vmap needs a batching rule: "
                "bb.bridge(..., vmap_method='sequential') runs it once per batch element "
                "(see jax.pure_callback's vmap_method)"
            ) from err

    def _pure_callback(self, *args):
        return jax.pure_callback(self._host_results, self.avals, *args, **self.kw)

    def _host_results(self, *xs):
        return self.fn("numpy", "jax", *xs)

    def _buffer_callback(self, fill, *args):
        assert _buffer_callback is not None
        return _buffer_callback(fill, self.avals, **self.kw)(*args)

    def _fill(self, ctx, out, *buffers):
        """buffer_callback's callback on the CPU: ``fn`` on copies of jax's input buffers, its results
        into jax's result buffers."""
        # jax's buffers are valid only during the callback (XLA reuses them after): a view of one that the
        # callee keeps (an activation a hook saves) would change under it, and be read after it is freed.
        # So the callee gets copies of its own (64-byte aligned for a callee whose import needs it, tensorflow:
        # no second copy there), read-only for a callee whose tensors can say so (numpy's, as eagerly)
        inputs = []
        for b in buffers:
            a = np.asarray(b)
            if self.call.copy_inputs:  # the call copies each input itself (ForeignCall._inputs): not twice
                mine = a
            elif self.aligned:
                mine = _aligned_empty(a.shape, a.dtype)
                np.copyto(mine, a)
            else:
                mine = a.copy()  # (numpy's own allocation, a tenth of the time for a small array)
            if self.readonly:
                mine.flags.writeable = False
            inputs.append(mine)
        results = self.fn("numpy", None, *inputs)
        self._write(results, [np.asarray(o) for o in out], registry.get("numpy"), _copy_into)

    def _fill_device(self, ctx, out, *buffers):
        """buffer_callback's callback on a GPU: the callee on device copies of jax's input buffers (as
        ``_fill``), its work queued on the computation's stream, its results copied into jax's result
        buffers on that stream."""
        callee = self.callee
        take = callee.importer()
        index = (buffers[0] if buffers else out[0]).__dlpack_device__()[1]
        hooks = self.callee_hooks
        with hooks.on_device_stream("cuda", index, ctx.stream):
            copy = (lambda t: t) if self.call.copy_inputs else callee.copy  # (as _fill)
            results = self.fn(callee.name, None, *[copy(take(b)) for b in buffers])
            self._write(results, [take(o) for o in out], callee, hooks.write_into)

    def _write(self, results, dsts, adapter, write) -> None:
        """Each result into its buffer ``dsts[i]`` (a tensor of ``adapter``'s) by ``write``, once checked
        to be exactly the buffer's shape and dtype; a result None (a gradient the callee has not): zeros."""
        if len(results) != len(dsts):  # (the results' tree is checked before: a guard, never left unwritten)
            i = min(len(results), len(dsts))
            raise self.call._not_declared(
                i, adapter.shape_dtype(results[i]) if i < len(results) and results[i] is not None else None,
                adapter.shape_dtype(dsts[i]) if i < len(dsts) else None, "here")
        for i, (dst, r) in enumerate(zip(dsts, results)):
            if r is None:  # (a gradient the callee has not, on a device)
                write(dst, None)
                continue
            want = adapter.shape_dtype(dst)
            got = adapter.shape_dtype(r)
            if got != want:  # (batched by vmap: not checked before)
                if tuple(want[0]) != tuple(self.avals[i].shape):  # a batch's result
                    raise self.call.not_batched(i, got, want)
                raise self.call._not_declared(i, got, want, "here")
            write(dst, r)


@functools.cache
def _callback_takes_packed() -> bool:
    """Whether this jax's pure_callback carries a type it stores packed (int4) under jit: jax 0.4.30's
    XLA refuses it ("s4 is currently only supported in convert instructions"). Asked once, by trying."""
    aval = jax.ShapeDtypeStruct((2,), jnp.int4)
    try:
        jax.jit(lambda x: jax.pure_callback(lambda a: a, aval, x)).lower(aval).compile()
    except Exception as err:  # noqa: BLE001 - XLA's refusal, whatever this jax calls its error type
        # only that refusal counts: any other failure says nothing of int4, and the call itself will say
        return "only supported in convert instructions" not in str(err)
    return True


def _aligned_empty(shape, dtype) -> np.ndarray:
    from bf16bridge.adapters.numpy import aligned_empty  # (the numpy adapter imports this one's module: not at import time)

    return aligned_empty(shape, dtype)


def _copy_into(dst: np.ndarray, src) -> None:
    if src is None:
        dst[...] = 0
    else:
        np.copyto(dst, src, casting="no")


def _device_name(dev) -> str:
    return f"{dev.platform}:{dev.id}"


def _span(index) -> tuple:
    """A hashable form of an index with explicit bounds (slices are not hashable before Python 3.12)."""
    return tuple((s.start, s.stop) for s in index)


def _show(index) -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"


def _layout(sharding, ndim):
    """A NamedSharding as a shards.Layout; None for shardings that are no mesh."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec = sharding.spec
    parts = tuple(spec.partitions) if hasattr(spec, "partitions") else tuple(spec)
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
    """A NamedSharding for a shards.Layout, over the devices it names (a DTensor's ``rank:r``:
    the one device of jax process r)."""
    if not layout.devices:
        raise InvalidArgumentError("the shards' layout names no devices: pass sharding= (a jax Sharding)")
    for dim, (n, k) in enumerate(zip(shape, layout.splits())):
        if n % k:
            raise InvalidArgumentError(
                f"dimension {dim} of the {tuple(shape)} array has {n} elements, split {k} ways unevenly; "
                "a jax sharding splits evenly only: pad the array, or choose a mesh that divides it")
    everything = jax.devices()
    by_name = {_device_name(d): d for d in everything}
    devs = []
    for name in layout.devices:
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
    # the axis types jax.make_mesh gives by default (Explicit), where this jax has them
    kinds = getattr(jax.sharding, "AxisType", None)
    extra = {} if kinds is None else {"axis_types": (kinds.Explicit,) * len(layout.mesh_axes)}
    mesh = jax.sharding.Mesh(np.array(devs, dtype=object).reshape(layout.mesh_shape), layout.mesh_axes, **extra)
    spec = jax.sharding.PartitionSpec(*[None if not a else a[0] if len(a) == 1 else a for a in layout.spec])
    return jax.sharding.NamedSharding(mesh, spec)


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


ADAPTER = JaxAdapter()
