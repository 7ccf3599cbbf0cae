"""JAX. Arrays are immutable; its DLPack import is zero-copy only for a
contiguous buffer on a 64-byte boundary (it copies silently otherwise), and
its bit-casts copy, so bf16 reaches numpy through ``numpy.asarray`` and comes
from numpy through ``jax.device_put``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import dtypes
from ..errors import UnsupportedDtypeError, UnsupportedTypeError
from ._base import CONTIGUOUS, Adapter, Handoff, Source

_WIDE = {"int64", "uint64", "float64", "complex128"}


def _device_put_copies(layout, aligned):
    if layout != CONTIGUOUS:
        return "jax.device_put copies a non-contiguous array"
    if not aligned:
        return "jax.device_put copies a buffer that is not 64-byte aligned"
    return None


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
    # jax.device_put / from_dlpack copy an unaligned buffer about 7x slower than a memcpy here
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

    def data_ptr(self, x) -> int:
        x.block_until_ready()  # a pointer asked of a pending result has hung a process here
        return x.unsafe_buffer_pointer()

    def bitview(self, x, dtype):
        return jax.lax.bitcast_convert_type(x, dtypes.numpy_dtype(dtype))

    def from_dlpack(self, obj):
        return jnp.from_dlpack(obj)

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


ADAPTER = JaxAdapter()
