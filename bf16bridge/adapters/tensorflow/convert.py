"""The tensorflow adapter (``TensorflowAdapter``): what the planner reads of tensorflow, and the
primitives ``convert`` runs (describe, bit-cast, DLPack out and in, copy, cast).

Tensors are immutable; tensorflow's DLPack import takes only contiguous buffers, and only 64-byte
aligned ones safely; ``tf.bitcast`` is free, so bf16 crosses to and from numpy as uint16. What it
does with the low-precision rows, and how it exports, is found by the probe's trials on first need
(``probe.py``); a tensor leaves wrapped in an object with ``__dlpack__`` where this tensorflow's
tensors have none."""

from __future__ import annotations

import functools
import math

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core import fpenv
from bf16bridge.core.adapter import ALIGN, CONTIGUOUS, Adapter, Handoff, Source, StalePlan, parse_device
from bf16bridge.errors import UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.adapters import dlpack
from bf16bridge.adapters.trials import float_row
from bf16bridge.adapters.tensorflow import internals, probe
from bf16bridge.adapters.tensorflow.framework import bridge_name, device_name, tf, tf_dtype

#: a capsule to read a pointer from, one C call (what both ways of export end in): cheaper than
#: Tensor.__dlpack__, which checks its keywords first
_pointer_capsule = tf.experimental.dlpack.to_dlpack


class _Exported:
    """A tf tensor as a DLPack producer, for a tensorflow whose tensors have no ``__dlpack__``.

    It exports legacy (unversioned) capsules only, which the protocol allows
    when a consumer asks for ``max_version``.
    """

    __slots__ = ("_x",)

    def __init__(self, x):
        self._x = x

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("this tensorflow exports over DLPack without copying only; pass copy=None")
        capsule = probe.export().capsule(self._x)
        if dl_device is not None and tuple(dl_device) != dlpack.device(capsule):
            raise BufferError(f"the tf tensor lives on {self._x.device}, not on DLPack device {dl_device}")
        return capsule

    def __dlpack_device__(self):
        return dlpack.device(probe.export().capsule(self._x))


_from_capsule = tf.experimental.dlpack.from_dlpack


def _import_capsule(capsule):
    """tensorflow's import of a capsule; its refusal of strides a kept plan did not foresee (a jax array
    over a transposed buffer, after a row-major one of its kind) sends the input to the full path."""
    try:
        return _from_capsule(capsule)
    except tf.errors.InvalidArgumentError as err:
        if "strides" not in str(err):
            raise
        raise StalePlan(f"tf.experimental.dlpack.from_dlpack refused this buffer's strides ({err}); pass a "
                        "row-major (contiguous) tensor, or copy=None to let bf16bridge copy it") from err


def _numpy(x):
    # a 0-d tensor's .numpy() is a numpy scalar, which no next step takes as an array
    return np.asarray(x.numpy())


def _copies(layout, aligned):
    return "tensorflow has no bit-view or DLPack for this dtype: it copies from and to numpy"


def _recorded(x) -> bool:
    """Whether an active gradient tape or forward accumulator watches eager tensor ``x`` (its
    gradient, or tangent, would not cross). fast_key asks the same, inline."""
    return not internals.no_tape() and internals.gradient_types((x,)) != 0


def _unrecorded(op, x):
    """``op(x=x)``, which no tape records where one watches ``x``: DeepCopy has no registered
    gradient (a recorded one makes the tape's ``gradient`` raise); the copy's gradient is dropped,
    as plan's ``drops_grad`` says and ``convert`` warns."""
    if internals.no_tape():
        return op(x=x)
    with internals.stop_recording():
        return op(x=x)


#: tensorflow's objects that hold tensors but are not one (no single buffer to move), each with
#: what it is and the way out; the first that matches says it
_COMPOSITES: tuple = tuple((cls, way_out) for cls, way_out in (
    (tf.RaggedTensor, "ragged tensor (flat values and row partitions), not one tensor: pass rt.to_tensor() "
                      "(padded to a dense tensor), or its parts rt.flat_values and rt.nested_row_splits"),
    (tf.SparseTensor, "sparse tensor (indices, values and a shape), not one dense tensor: pass "
                      "tf.sparse.to_dense(sp), or its parts sp.indices and sp.values"),
    (tf.IndexedSlices, "IndexedSlices (a sparse gradient: indices and values), not one dense tensor: pass "
                       "tf.convert_to_tensor(x), or its parts x.indices and x.values"),
    (tf.TensorArray, "TensorArray (a list of tensors), not one tensor: pass ta.stack()"),
    (tf.data.Dataset, "dataset (a pipeline that yields elements), not a tensor: convert its elements as "
                      "they come (for x in ds: ...), or a batch of them (next(iter(ds.batch(n))))"),
    (internals.COMPOSITE_TENSOR, "composite tensor (several tensors), not one tensor: pass its "
                                 "components, tf.nest.flatten(x, expand_composites=True)"),
) if cls is not None)


class TensorflowAdapter(Adapter):
    name = "tensorflow"
    immutable = True
    # a Variable's value read out (v.read_value(), tf.identity(v)) is its buffer until the next assign
    shared_with = "the live tf.Variable it was read from, if any"
    dlpack_accepts = CONTIGUOUS  # anything else: "Invalid strides array from DLPack"
    # it imports any buffer, but the first op on one not 64-byte aligned aborts the process: never hand it one
    dlpack_unaligned = "refuse"
    alignment_cheap = False  # (its pointer costs a DLPack capsule)
    label_bitview = "tf.bitcast({dtype})"
    label_import = "tf.experimental.dlpack.from_dlpack"
    label_copy = "copy into a new aligned tensor"
    # an unaligned tensor aborts the process in any tf kernel, DeepCopy and Cast included: such
    # tensors are copied in numpy
    kernels_unaligned = False

    grad_words = "is watched by an active gradient tape (tf.GradientTape, or tf.autodiff.ForwardAccumulator)"
    grad_stays_on_value = True
    grad_note = ("a gradient tape watches the input: its data crosses, its gradient does not cross "
                 "(tf.stop_gradient(x), or on_grad='drop', says that is meant)")

    # -- what the planner reads: found by the probe's trials on first access -------------------------
    @functools.cached_property
    def dlpack_export(self):  # type: ignore[override]
        return frozenset(dtypes.ALL) | probe.low_precision_rows().dlpack

    @functools.cached_property
    def dlpack_import(self):  # type: ignore[override]
        return frozenset(dtypes.ALL) | probe.low_precision_rows().dlpack

    @functools.cached_property
    def narrow_held(self):  # type: ignore[override]
        return probe.low_precision_rows().held

    @functools.cached_property
    def narrow_why(self):  # type: ignore[override]
        return probe.low_precision_rows().why

    @functools.cached_property
    def _by_numpy(self) -> frozenset:
        """Held rows with no bit-view and no DLPack: they cross from and to numpy by tensorflow's copies."""
        rows = probe.low_precision_rows()
        return rows.held - rows.views - rows.dlpack

    @functools.cached_property
    def _pointer(self) -> frozenset:
        """tf's dtype enums that DLPack exports, so that a data pointer can be read: an allow-list,
        because asking for a capsule of any other (tf.string, resource, variant) aborts the process."""
        return frozenset(tf_dtype(n).as_datatype_enum for n in (*dtypes.ALL, *probe.low_precision_rows().dlpack))

    def views_bits(self, dtype):
        return dtype == "bfloat16" or dtype in probe.low_precision_rows().views

    def can_copy(self, dtype):
        if dtype in self.narrow_held:
            return probe.copy_kernel(dtype)
        return self.holds(dtype)

    def casts(self, src, dst):
        return self.holds(src) and self.holds(dst) and probe.casts(src, dst)

    def handoffs(self):
        rows = self._by_numpy
        if not rows:
            return []
        return [Handoff("numpy", "tensorflow", "tf.constant", tf.constant, _copies, dtypes=rows),
                # numpy allocates the copy: not 64-byte aligned
                Handoff("tensorflow", "numpy", "Tensor.numpy", _numpy, _copies, dtypes=rows,
                        copies_aligned=False)]

    def not_a_tensor(self, x):
        t = x.__class__  # (a written TensorArray's type is tf's ShouldUseWrapper; its __class__ is TensorArray)
        what = f"{t.__module__}.{t.__qualname__}"
        for cls, way_out in _COMPOSITES:
            if isinstance(x, cls):
                return f"{what} is a tensorflow {way_out}"
        if isinstance(x, tf.Module) and x.variables:
            return (f"{what} is a tensorflow module object, not a tensor or a tree of tensors: pass its "
                    "variables (module.variables, or module.trainable_variables)")
        return None

    # -- devices: device= names one of these ------------------------------------------------------
    label_place = "tf.identity under tf.device({device!r})"
    device_objects = "tf.DeviceSpec or tf.config.LogicalDevice"

    def devices(self):
        return tuple(_devices())

    def find_device(self, device):
        if isinstance(device, (tf.config.LogicalDevice, tf.config.PhysicalDevice)):
            spec = device.name
        elif isinstance(device, tf.DeviceSpec):
            spec = device.to_string()
        elif isinstance(device, str):
            spec = device
        else:
            raise self.no_device(device, ": neither a device name nor a tensorflow device")
        parsed = parse_device(spec)
        if parsed is not None:
            kind, index = parsed
            name = "cpu" if kind == "cpu" and not index else f"{kind}:{index or 0}"
            if name in _devices():
                return name
        raise self.no_device(device)

    def device_of(self, x):
        return device_name(x.device)

    def place(self, x, device):
        if device_name(x.device) == device:
            return x
        with tf.device(_devices()[device]):
            return tf.identity(x)

    # -- the primitives convert runs -------------------------------------------------------------
    def describe(self, x, *, alignment: bool = True) -> Source:
        notes: tuple[str, ...] = ()
        owner = None
        if isinstance(x, tf.Variable):
            # read here, under the caller's tape: a tape that watches the Variable watches the read
            x = x.read_value()
            notes = ("a tf.Variable crosses as its current value (later assignments do not show)",)
            # the read is the Variable's own buffer (a zero-copy alias writes into the Variable)
            owner = "the live tf.Variable it was read from"
        if not hasattr(x, "numpy"):
            raise UnsupportedTypeError(
                "a symbolic tf.Tensor (inside tf.function or a graph) has no data; convert eagerly"
            )
        grad = _recorded(x)
        if grad:
            notes += (self.grad_note,)
        name = bridge_name(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"tf tensor of dtype {x.dtype.name} is not moved by bf16bridge; supported: "
                f"{', '.join(d for d in dtypes.NAMES if self.holds(d))}"
            )
        shape = tuple(x.shape)
        return Source(
            value=x, dtype=name, shape=shape, nbytes=math.prod(shape) * x.dtype.size, layout=CONTIGUOUS,
            # tf allocates on 64-byte boundaries, but a tensor imported zero-copy keeps its source's
            # alignment (an empty one too); reading it costs a DLPack capsule, so only when it matters
            aligned=(not alignment or internals.datatype_enum(x) not in self._pointer
                     or self.data_ptr(x) % ALIGN == 0),
            readonly=False, device=device_name(x.device), notes=notes, requires_grad=grad, owner=owner,
        )

    def fast_key(self, x, alignment, _no_tape=internals.no_tape, _gradient_types=internals.gradient_types,
                 _enum=internals.datatype_enum, _count=internals.num_elements, _capsule_ptr=dlpack.capsule_ptr):
        # only eager tensors get here with a plan (a tf.Variable is swapped for its read, a symbolic
        # tensor refused); the functions bound as defaults: no global lookup on the hot path
        enum = _enum(x)  # the dtype as tf's enum: an int, cheaper to read and hash than the DType
        if enum not in self._pointer:
            # no DLPack capsule to read a pointer from: the full path refuses the dtype or copies it
            return None
        # (an empty one's pointer too, as describe reads it)
        return (enum, x.device, _count(x) == 0, alignment and _capsule_ptr(_pointer_capsule(x)) % ALIGN == 0,
                # Source.requires_grad (_recorded): whether a tape watches it, asked per call
                not _no_tape() and _gradient_types((x,)) != 0)

    def data_ptr(self, x) -> int:
        if internals.datatype_enum(x) not in self._pointer:  # a capsule of it would abort the process
            raise UnsupportedDtypeError(
                f"a tf tensor of dtype {x.dtype.name} has no DLPack export, so no data pointer to read; "
                f"those that have one: {', '.join(sorted(tf.as_dtype(e).name for e in self._pointer))}")
        return dlpack.capsule_ptr(_pointer_capsule(x))

    def bitview(self, x, dtype):
        return tf.bitcast(x, tf_dtype(dtype))

    def bitview_to(self, dtype):
        return functools.partial(tf.bitcast, type=tf_dtype(dtype))

    def export(self, x, readonly):
        return x if probe.export().native else _Exported(x)

    def exporter(self, readonly):
        return None if probe.export().native else _Exported

    def capsule_exporter(self):
        return tf.experimental.dlpack.to_dlpack  # every tensorflow tested has it

    def capsule_importer(self):
        return _import_capsule

    def from_dlpack(self, obj):
        # a capsule: the one form every tensorflow tested takes (2.16 takes nothing else)
        return tf.experimental.dlpack.from_dlpack(obj.__dlpack__())

    def copy(self, x):
        # never reached with an unaligned tensor (kernels_unaligned is False: the planner copies
        # those in numpy, as plan() shows)
        return _unrecorded(tf.raw_ops.DeepCopy, x)

    def astype(self, x, dtype):
        src = bridge_name(x.dtype)
        if src == dtype or not (float_row(src) and float_row(dtype)) or probe.rounds_as_ml_dtypes(src, dtype):
            return tf.cast(x, tf_dtype(dtype))
        return _cast_in_numpy(x, dtype)

    def to_host(self, x):
        with tf.device("/CPU:0"):
            return _unrecorded(tf.raw_ops.DeepCopy, x)

    def shape_dtype(self, x):
        return tuple(x.shape), bridge_name(x.dtype) or x.dtype.name


@functools.cache
def _devices() -> dict:
    """name (as ``device_name`` gives it) -> tensorflow's name of the device, for every logical
    device of this process."""
    out: dict = {}
    for d in tf.config.list_logical_devices():
        out.setdefault(device_name(d.name), d.name)
    return out


def _cast_in_numpy(x, dtype: str):
    """``x`` cast to row ``dtype`` by ml_dtypes in numpy, where tf.cast gives other bits, with
    tf.cast's gradient (the cotangent cast back). Eagerly on this thread; inside a tf.function
    through a numpy_function, on tensorflow's threads, which flush subnormals: kept there (fpenv)."""
    to = dtypes.numpy_dtype(dtype)

    def host(a):
        with np.errstate(all="ignore"):  # NaN and overflow casts warn: the rounding defines them
            return a.astype(to)

    if tf.executing_eagerly():
        def run(t):
            with tf.device(t.device):
                return tf.constant(host(t.numpy()))
    else:
        if internals.compiled_by_xla():
            raise UnsupportedTypeError(
                f"tensorflow {tf.__version__} casts {bridge_name(x.dtype)} to {dtype} with other bits than "
                "ml_dtypes here (its CPU kernels flush subnormals to zero), and inside "
                "tf.function(jit_compile=True) the cast cannot go through numpy instead: cast outside the "
                "compiled function, or drop jit_compile")

        def kept(a):
            with fpenv.keeping():
                return host(a)

        def run(t):
            y = tf.numpy_function(kept, [t], tf_dtype(dtype), stateful=False)
            y.set_shape(t.shape)
            return y

    @tf.custom_gradient
    def cast(t):
        return run(t), lambda dy: tf.cast(dy, t.dtype)

    return cast(tf.convert_to_tensor(x))  # a Variable read here, under the caller's tape


ADAPTER = TensorflowAdapter()
