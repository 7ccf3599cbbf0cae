"""TensorFlow. Tensors are immutable; its DLPack import takes only contiguous
buffers, of any alignment; ``tf.bitcast`` is free, so bf16 crosses to and
from numpy as uint16."""

from __future__ import annotations

import tensorflow as tf

from .. import dtypes
from ..errors import UnsupportedDtypeError, UnsupportedTypeError
from . import _dlpack
from ._base import ALIGN, CONTIGUOUS, Adapter, Source


def _tf_dtype(name: str):
    return tf.as_dtype(dtypes.numpy_dtype(name)) if name != "bfloat16" else tf.bfloat16


class TensorflowAdapter(Adapter):
    name = "tensorflow"
    immutable = True
    dlpack_accepts = CONTIGUOUS  # anything else: "Invalid strides array from DLPack"
    label_bitview = "tf.bitcast({dtype})"
    label_import = "tf.experimental.dlpack.from_dlpack"
    label_copy = "tf.raw_ops.DeepCopy"

    def describe(self, x) -> Source:
        notes = ()
        if isinstance(x, tf.Variable):
            x = x.read_value()
            notes = ("a tf.Variable crosses as its current value (later assignments do not show)",)
        if not hasattr(x, "numpy"):
            raise UnsupportedTypeError(
                "a symbolic tf.Tensor (inside tf.function or a graph) has no data; convert eagerly"
            )
        name = dtypes.name_of_numpy(x.dtype.as_numpy_dtype) if x.dtype.is_numpy_compatible else None
        if x.dtype == tf.bfloat16:
            name = "bfloat16"
        if name is None:
            raise UnsupportedDtypeError(
                f"tf tensor of dtype {x.dtype.name} is not moved by bf16bridge; supported: {', '.join(dtypes.ALL)}"
            )
        spec = tf.DeviceSpec.from_string(x.device)
        on_cpu = (spec.device_type or "CPU").upper() == "CPU"
        nbytes = x.shape.num_elements() * x.dtype.size
        return Source(
            value=x, dtype=name, shape=tuple(x.shape), nbytes=nbytes, layout=CONTIGUOUS,
            # a tensor imported zero-copy from numpy keeps numpy's alignment
            aligned=nbytes == 0 or _dlpack.data_ptr(x) % ALIGN == 0,
            readonly=False, device="cpu" if on_cpu else f"{spec.device_type.lower()}:{spec.device_index or 0}",
            notes=notes,
        )

    def data_ptr(self, x) -> int:
        return _dlpack.data_ptr(x)

    def bitview(self, x, dtype):
        return tf.bitcast(x, _tf_dtype(dtype))

    def from_dlpack(self, obj):
        return tf.experimental.dlpack.from_dlpack(obj.__dlpack__())

    def copy(self, x):
        return tf.raw_ops.DeepCopy(x=x)

    def astype(self, x, dtype):
        return tf.cast(x, _tf_dtype(dtype))

    def to_host(self, x):
        with tf.device("/CPU:0"):
            return tf.raw_ops.DeepCopy(x=x)

    def devices(self):
        out = []
        for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            cap = tf.config.experimental.get_device_details(gpu).get("compute_capability")
            if cap is None:
                out.append((f"gpu:{i}", None, "tensorflow does not say"))
            else:
                out.append((f"gpu:{i}", tuple(cap) >= (8, 0),
                            f"compute capability {cap[0]}.{cap[1]} (bf16 arithmetic from 8.0)"))
        return out


ADAPTER = TensorflowAdapter()
