"""JAX. Arrays are immutable; its DLPack import is zero-copy only for a
contiguous buffer on a 64-byte boundary (it copies silently otherwise), and
its bit-casts copy, so bf16 reaches numpy through ``numpy.asarray`` and comes
from numpy through ``jax.device_put``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes, versions
from ..errors import UnsupportedDtypeError, UnsupportedTypeError
from ._base import CONTIGUOUS, Adapter, Handoff, Source

versions.require("jax", jax.__version__)

_WIDE = {"int64", "uint64", "float64", "complex128"}


def _device_put_copies(layout, aligned):
    if layout != CONTIGUOUS:
        return "jax.device_put copies a non-contiguous array"
    if not aligned:
        return "jax.device_put copies a buffer that is not 64-byte aligned"
    return None


def _capsule(x):
    """A legacy capsule, as ``Array.__dlpack__()`` gives one with no arguments (on the host: no stream)."""
    return x.__dlpack__()


def _key(entry):
    """A jax key-path entry as the plain key an error message shows."""
    for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey / FlattenedIndexKey, SequenceKey
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


class JaxAdapter(Adapter):
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

    def cannot_hold(self, dtype):
        if dtype in _WIDE and not jax.config.jax_enable_x64:
            return (f"jax narrows {dtype} unless 64-bit mode is on: "
                    "jax.config.update('jax_enable_x64', True)")
        return super().cannot_hold(dtype)

    def handoffs(self):
        return [
            Handoff("numpy", "jax", "jax.device_put", jax.device_put, _device_put_copies, verify=True),
            # zero-copy as a rule, but numpy decides (a jax array over foreign strides is copied)
            Handoff("jax", "numpy", "numpy.asarray", np.asarray, lambda layout, aligned: None, verify=True),
        ]

    def state(self):
        return jax.config.jax_enable_x64

    def describe(self, x, *, alignment: bool = True) -> Source:
        if isinstance(x, jax.core.Tracer):
            raise UnsupportedTypeError(
                "a traced jax value (inside jit, grad or vmap) has no data yet; convert outside the transform"
            )
        if x.is_deleted():
            raise UnsupportedTypeError("this jax array was deleted (donated); it has no data to move")
        devices = x.sharding.device_set
        if len(devices) != 1:
            raise UnsupportedTypeError(
                f"this jax array is sharded over {len(devices)} devices; convert each of x.addressable_shards"
            )
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
            raise UnsupportedDtypeError(
                f"jax array of dtype {x.dtype} (a PRNG key or another extended dtype) has no plain bits "
                "to move; pass jax.random.key_data(key) for a key's raw uint32 data"
            )
        name = dtypes.name_of_numpy(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"jax array of dtype {x.dtype} is not moved by bf16bridge; supported: {', '.join(dtypes.ALL)}"
            )
        (dev,) = devices
        return Source(
            value=x, dtype=name, shape=tuple(x.shape), nbytes=x.nbytes,
            # jax buffers are dense, row-major and 64-byte aligned (XLA allocates them so, and
            # imports anything else by copying)
            layout=CONTIGUOUS, aligned=True, readonly=False,
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
        if isinstance(x, jax.core.Tracer) or x.is_deleted():
            return None
        return (x.dtype, x.sharding, 0 in x.shape)  # jax buffers are dense and aligned

    def data_ptr(self, x) -> int:
        x.block_until_ready()  # a pointer asked of a pending result has hung a process here
        return x.unsafe_buffer_pointer()

    def bitview(self, x, dtype):
        return jax.lax.bitcast_convert_type(x, dtypes.numpy_dtype(dtype))

    def from_dlpack(self, obj):
        return jnp.from_dlpack(obj)

    def importer(self):
        return jnp.from_dlpack

    def capsule_exporter(self):
        return _capsule

    def copy(self, x):
        return jnp.array(x, copy=True)

    def astype(self, x, dtype):
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
        return {"x64": (bool(jax.config.jax_enable_x64),
                        "jax_enable_x64 is on" if jax.config.jax_enable_x64 else
                        "jax_enable_x64 is off: 64-bit dtypes are refused rather than narrowed")}

    computes = True

    def numerics(self):
        import os

        return {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
                "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}

    # -- functions across frameworks -----------------------------------------------
    differentiates = True

    def differentiable(self, x):
        # concrete arrays have no transformation watching them; tracers of inexact dtype may
        return isinstance(x, jax.core.Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)

    def traced(self, leaves):
        return any(isinstance(x, jax.core.Tracer) for x in leaves)

    def call_foreign(self, call, leaves):
        if not self.traced(leaves):
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

        return outs, pullback


def _foreign_fn(call, leaves, shape_dtype):
    """A jax function of the input leaves that runs ``call`` in callbacks, with its vjp."""
    out_avals = [jax.ShapeDtypeStruct(s, dtypes.numpy_dtype(d)) for s, d in call.specs(leaves, shape_dtype)]
    in_avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    wanted = [i for i, d in enumerate(call.diff) if d]
    inexact = [i for i, a in enumerate(out_avals) if jnp.issubdtype(a.dtype, jnp.inexact)]
    callback = functools.partial(_callback, call.vmap_method)
    n = len(leaves)

    def fwd_cb(*xs):
        return call.forward(list(xs), False, "numpy")[0]

    def bwd_cb(*a):
        given = dict(zip(inexact, a[n:]))
        grads = call.recompute_backward(list(a[:n]), [given.get(i) for i in range(len(out_avals))], "numpy")
        return [np.zeros(in_avals[i].shape, in_avals[i].dtype) if grads[i] is None else grads[i] for i in wanted]

    @jax.custom_vjp
    def f(*xs):
        return callback(fwd_cb, out_avals, *xs)

    def f_fwd(*xs):
        return f(*xs), xs

    def f_bwd(xs, cts):
        got = callback(bwd_cb, [in_avals[i] for i in wanted], *xs, *[cts[i] for i in inexact]) if wanted else []
        full: list = [None] * n
        for i, g in zip(wanted, got):
            full[i] = g
        return tuple(full)

    f.defvjp(f_fwd, f_bwd)
    return f


def _callback(vmap_method, fn, avals, *args):
    kw = {} if vmap_method is None else {"vmap_method": vmap_method}
    try:
        return jax.pure_callback(fn, avals, *args, **kw)
    except NotImplementedError as err:
        if "vmap" not in str(err):
            raise
        raise UnsupportedTypeError(
            "a bridged function called from jax under vmap needs a batching rule: "
            "bb.bridge(..., vmap_method='sequential') runs it once per batch element "
            "(see jax.pure_callback's vmap_method)"
        ) from err


ADAPTER = JaxAdapter()
