"""TensorFlow. Tensors are immutable; its DLPack import takes only contiguous
buffers, and only 64-byte aligned ones safely; ``tf.bitcast`` is free, so bf16
crosses to and from numpy as uint16.

Tensors have ``__dlpack__`` only in newer releases; older ones (2.16 here)
export through ``tf.experimental.dlpack.to_dlpack``. Which one this
tensorflow has is found once, by trying, and a tensor leaves wrapped in an
object with ``__dlpack__`` where consumers (torch, jax, numpy) need one."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import warnings

import numpy as np

# tensorflow 2.16's import (tf.lite's util) reads jax.xla_computation where jax is installed, which jax
# 0.4.30 warns is deprecated: tensorflow's business, not the caller's, and under warnings as errors (-W error,
# warnings.simplefilter("error")) the first conversion to tensorflow raised it. The filter names
# tensorflow's modules, and only it is taken out afterwards: catch_warnings would put back the whole list it
# found, losing a filter another thread adds during the import (seconds long)
_QUIET_IMPORT = ("ignore", re.compile(r"jax\.xla_computation is deprecated", re.I), DeprecationWarning,
                 re.compile(r"tensorflow\."), 0)
warnings.filterwarnings("ignore", _QUIET_IMPORT[1].pattern, DeprecationWarning, _QUIET_IMPORT[3].pattern)
try:
    import tensorflow as tf
finally:
    with contextlib.suppress(ValueError):  # a warnings.resetwarnings() during the import took it already
        # (no cached decision to undo: an ignored warning is not recorded in __warningregistry__)
        warnings.filters.remove(_QUIET_IMPORT)  # type: ignore[attr-defined]

from bf16bridge.core import dtypes
from bf16bridge.core import fpenv
from bf16bridge.core import versions
from bf16bridge.errors import FrameworkNotInstalledError, UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.adapters import dlpack as _dlpack
from bf16bridge.adapters.hooks import BridgeHooks, CastHooks, KernelHooks, NumericsHooks, ProbeHooks, ShardHooks
from bf16bridge.adapters.trials import cast_matches, float_row, rounds_as_ml_dtypes
from bf16bridge.core.adapter import ALIGN, CONTIGUOUS, Adapter, Handoff, Source
from bf16bridge.adapters.quiet import without_native_lines

versions.require("tensorflow", tf.__version__)

try:
    # how tensorflow itself decides whether to record an op (eager/record.py could_possibly_record,
    # execute.py record_gradient): no active tape or accumulator on this thread (stop_recording
    # included), else which of the inputs one watches, backward (GradientTape, a Variable read
    # under it included) or forward (ForwardAccumulator); both C calls, the same in 2.16 and 2.21
    from tensorflow.python import pywrap_tfe as _tfe

    _no_tape, _gradient_types = _tfe.TFE_Py_TapeSetIsEmpty, _tfe.TFE_Py_TapeSetPossibleGradientTypes
    _TAPE_FACT = (True, "pywrap_tfe.TFE_Py_TapeSetPossibleGradientTypes says whether a tape watches an input")
except (ImportError, AttributeError) as _err:  # pragma: no cover - every tensorflow tested has them
    def _no_tape() -> bool:
        return True

    _gradient_types = None
    _TAPE_FACT = (False, f"{_err}: whether a gradient tape watches a tf input is not known, and not said")


def _recorded(x) -> bool:
    """Whether an active gradient tape or forward accumulator watches eager tensor ``x`` (its
    gradient, or tangent, would not cross). fast_key asks the same, inline."""
    return not _no_tape() and _gradient_types((x,)) != 0


def _find_export():
    """How this tensorflow hands a tensor out over DLPack, tried once: (capsule maker, fact)."""
    with tf.init_scope():  # eagerly, even when first loaded inside a tf.function's trace
        sample = tf.zeros([1], tf.uint8)
    try:
        sample.__dlpack__()
        return (lambda x: x.__dlpack__()), (True, "Tensor.__dlpack__() works")
    except AttributeError as err:
        try:
            tf.experimental.dlpack.to_dlpack(sample)  # the older entry point
        except Exception as older:  # noqa: BLE001 - neither works: no route out of tensorflow
            raise FrameworkNotInstalledError(
                f"tensorflow {tf.__version__} exports nothing over DLPack ({err}; {older}); bf16bridge is "
                f"tested with tensorflow {versions.tested_range('tensorflow')}") from older
        return tf.experimental.dlpack.to_dlpack, (False, (
            f"{err}; tensors leave through tf.experimental.dlpack.to_dlpack, wrapped in an object with "
            "__dlpack__ for consumers that want one"))


_capsule, _EXPORT_FACT = _find_export()
#: a capsule to read a pointer from, one C call (what both exports above end in; every tensorflow tested
#: has it): cheaper than _capsule's Tensor.__dlpack__, which checks its keywords first
_pointer_capsule = tf.experimental.dlpack.to_dlpack
with tf.init_scope():
    #: the type of an eager tensor (ops.EagerTensor, named nowhere public): not a tf.Variable
    _EAGER_TENSOR = type(tf.zeros([0], tf.uint8))
_NATIVE_EXPORT = _EXPORT_FACT[0]


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
        capsule = _capsule(self._x)
        if dl_device is not None and tuple(dl_device) != _dlpack.device(capsule):
            raise BufferError(f"the tf tensor lives on {self._x.device}, not on DLPack device {dl_device}")
        return capsule

    def __dlpack_device__(self):
        return _dlpack.device(_capsule(self._x))


@functools.lru_cache(maxsize=64)
def _device(name: str) -> str:
    """"cpu", or "gpu:0" and the like, from a tf device string."""
    spec = tf.DeviceSpec.from_string(name)
    kind = (spec.device_type or "CPU").lower()
    return "cpu" if kind == "cpu" else f"{kind}:{spec.device_index or 0}"


@functools.lru_cache(maxsize=64)
def _name(dtype) -> str | None:
    """The bridge name of a tf dtype, or None if we do not carry it."""
    if dtype == tf.bfloat16:
        return "bfloat16"
    return dtypes.name_of_numpy(dtype.as_numpy_dtype) if dtype.is_numpy_compatible else None


def _tf_dtype(name: str):
    return tf.as_dtype(dtypes.numpy_dtype(name)) if name != "bfloat16" else tf.bfloat16


def _narrow_rows():
    """What this tensorflow does with each narrow row, found by trying once: (held, why not
    held, exported over DLPack, bit-cast, copied by its copy kernel). tensorflow 2.21 stores
    its fp8/fp4/int4 types but has no bitcast, DLPack or copy kernel for them."""
    held, why, out, views = set(), {}, set(), set()
    with tf.init_scope():  # eagerly, even when first loaded inside a tf.function's trace
        for name in dtypes.NARROW_DTYPES:
            missing = dtypes.numpy_missing(name)
            if missing is not None:
                why[name] = f"tensorflow takes it from numpy, and {missing}"
                continue
            row = dtypes.ROWS[name]
            try:
                dt = tf.as_dtype(dtypes.numpy_dtype(name))
                x = tf.constant(np.zeros(2, dtypes.numpy_dtype(name)))
                if x.dtype != dt or x.numpy().dtype != dtypes.numpy_dtype(name):
                    raise TypeError(f"it came back as {x.dtype.name}")
            except Exception as err:  # noqa: BLE001 - whatever it raised, tf cannot hold it
                why[name] = (f"tensorflow {tf.__version__} cannot hold {name}: "
                             f"{type(err).__name__}: {str(err).splitlines()[0][:160]}")
                continue
            held.add(name)
            try:
                got = _dlpack._tensor(_capsule(x)).dtype
                if (got.code, got.bits, got.lanes) == row.dlpack:
                    out.add(name)
            except Exception:  # noqa: BLE001 - no DLPack for it
                pass
            try:
                tf.bitcast(tf.bitcast(x, _tf_dtype(row.carrier)), dt)  # type: ignore[arg-type]
                views.add(name)
            except Exception:  # noqa: BLE001 - no bitcast kernel for it
                pass
    return frozenset(held), why, frozenset(out), frozenset(views)


_HELD, _CANNOT, _DLPACK_OUT, _VIEWS = _narrow_rows()


@functools.lru_cache(maxsize=None)
def _copy_kernel(name: str) -> bool:
    """Whether tensorflow's copy kernel takes ``name``, tried when first asked. A missing kernel
    logs native lines ("W0000 ... OP_REQUIRES failed at inplace_ops.cc:338 : INVALID_ARGUMENT:
    Unsupported data type: float8_e4m3fn", and a "Local rendezvous is aborting" line), which the
    trial keeps off stderr; tensorflow's kernel registry cannot answer first (DeepCopy's CPU
    kernel is registered for every type; its own switch refuses)."""
    def trial():
        with tf.init_scope():
            tf.raw_ops.DeepCopy(x=tf.constant(np.zeros(2, dtypes.numpy_dtype(name))))

    try:
        without_native_lines(trial, f"Unsupported data type: {_tf_dtype(name).name}".encode())
        return True
    except Exception:  # noqa: BLE001 - no copy kernel for it
        return False


#: held rows with no bit-view and no DLPack: they cross from and to numpy by tensorflow's own copies
_BY_NUMPY = _HELD - _VIEWS - _DLPACK_OUT
#: tf's dtype enums that DLPack exports, so that a data pointer can be read; an allow-list,
#: because asking for a capsule of any other (tf.string, resource, variant) aborts the process
#: ("Check failed: DataTypeCanUseMemcpy") where Python cannot catch it
_POINTER = frozenset(_tf_dtype(n).as_datatype_enum for n in (*dtypes.ALL, *_DLPACK_OUT))


@functools.lru_cache(maxsize=None)
def _casts(src: str, dst: str) -> bool:
    """Whether tf.cast keeps every src value in dst, tried once. A cast tensorflow has no kernel
    for raises (the finding) and logs "OP_REQUIRES failed at cast_op.cc : UNIMPLEMENTED: Cast
    float4_e2m1fn to float is not supported" and a "Local rendezvous is aborting" line natively;
    a first float16 cast on this CPU logs "oneDNN supports DT_HALF only on platforms with
    AVX-512": the trial keeps those lines off stderr."""
    return without_native_lines(
        lambda: cast_matches(src, dst, lambda a: tf.cast(tf.constant(a), _tf_dtype(dst)).numpy()),
        f"UNIMPLEMENTED: Cast {_CPP_NAMES.get(src, src)} to ".encode(), b"oneDNN supports DT_HALF only")


#: tensorflow's C++ names (DataTypeString) where they differ from ours
_CPP_NAMES = {"float32": "float", "float16": "half", "float64": "double"}


def _numpy(x):
    # a 0-d tensor's .numpy() is a numpy scalar, which no next step takes as an array
    return np.asarray(x.numpy())


def _copies(layout, aligned):
    return "tensorflow has no bit-view or DLPack for this dtype: it copies from and to numpy"


#: tensorflow's objects that hold tensors but are not one (no single buffer to move), each with
#: what it is and the way out; the first that matches says it
_COMPOSITES: tuple = (
    (tf.RaggedTensor, "ragged tensor (flat values and row partitions), not one tensor: pass rt.to_tensor() "
                      "(padded to a dense tensor), or its parts rt.flat_values and rt.nested_row_splits"),
    (tf.SparseTensor, "sparse tensor (indices, values and a shape), not one dense tensor: pass "
                      "tf.sparse.to_dense(sp), or its parts sp.indices and sp.values"),
    (tf.IndexedSlices, "IndexedSlices (a sparse gradient: indices and values), not one dense tensor: pass "
                       "tf.convert_to_tensor(x), or its parts x.indices and x.values"),
    (tf.TensorArray, "TensorArray (a list of tensors), not one tensor: pass ta.stack()"),
    (tf.data.Dataset, "dataset (a pipeline that yields elements), not a tensor: convert its elements as "
                      "they come (for x in ds: ...), or a batch of them (next(iter(ds.batch(n))))"),
    (tf.__internal__.CompositeTensor, "composite tensor (several tensors), not one tensor: pass its "
                                      "components, tf.nest.flatten(x, expand_composites=True)"),
)


class TensorflowAdapter(Adapter, BridgeHooks, CastHooks, KernelHooks, NumericsHooks, ProbeHooks, ShardHooks):
    def narrow_compute(self, dtype):
        if not self.holds(dtype):
            return ()
        try:
            x = tf.constant(np.ones((4, 4), dtype=dtypes.numpy_dtype(dtype)))
            tf.linalg.matmul(x, x)
        except Exception as err:  # noqa: BLE001 - what failed is the finding
            return (("cpu", "no", f"tf.linalg.matmul: {type(err).__name__}: "
                                  f"{(str(err).splitlines() or [''])[0][:200]}"),)
        return (("cpu", "unknown", "tf.linalg.matmul runs; how is not read"),)

    name = "tensorflow"
    immutable = True
    # a Variable's value read out (v.read_value(), v.value(), tf.identity(v)) is its buffer until
    # the next assign: a write through the alias changes the live Variable, which no test here can tell
    shared_with = "the live tf.Variable it was read from, if it was (v.read_value(), v.value())"
    dlpack_accepts = CONTIGUOUS  # anything else: "Invalid strides array from DLPack"
    # it imports any buffer, but the first op on one not 64-byte aligned aborts the
    # process ("Check failed: IsAligned()"): never hand it one
    dlpack_unaligned = "refuse"
    label_bitview = "tf.bitcast({dtype})"
    label_import = "tf.experimental.dlpack.from_dlpack"
    label_copy = "copy into a new aligned tensor"
    # an unaligned tensor (someone else's zero-copy import) aborts the process in any tf
    # kernel, DeepCopy and Cast included: such tensors are copied in numpy
    kernels_unaligned = False

    dlpack_export = frozenset(dtypes.ALL) | _DLPACK_OUT
    dlpack_import = frozenset(dtypes.ALL) | _DLPACK_OUT
    narrow_held, narrow_why = _HELD, _CANNOT

    def views_bits(self, dtype):
        return dtype == "bfloat16" or dtype in _VIEWS

    def can_copy(self, dtype):
        if dtype in _HELD:
            return _copy_kernel(dtype)
        return self.holds(dtype)

    def casts(self, src, dst):
        return self.holds(src) and self.holds(dst) and _casts(src, dst)

    def handoffs(self):
        if not _BY_NUMPY:
            return []
        return [Handoff("numpy", "tensorflow", "tf.constant", tf.constant, _copies, dtypes=_BY_NUMPY),
                # numpy allocates the copy: not 64-byte aligned (32 or 48 past a boundary here)
                Handoff("tensorflow", "numpy", "Tensor.numpy", _numpy, _copies, dtypes=_BY_NUMPY,
                        copies_aligned=False)]

    grad_words = "is watched by an active gradient tape (tf.GradientTape, or tf.autodiff.ForwardAccumulator)"
    grad_stays_on_value = True
    grad_note = ("a gradient tape watches the input: its data crosses, its gradient does not cross "
                 "(tf.stop_gradient(x), or on_grad='drop', says that is meant)")

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
        name = _name(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"tf tensor of dtype {x.dtype.name} is not moved by bf16bridge; supported: "
                f"{', '.join(d for d in dtypes.NAMES if self.holds(d))}"
            )
        shape = tuple(x.shape)
        nbytes = math.prod(shape) * x.dtype.size
        return Source(
            value=x, dtype=name, shape=shape, nbytes=nbytes, layout=CONTIGUOUS,
            # tf allocates on 64-byte boundaries, but a tensor imported zero-copy keeps its
            # source's alignment; reading it costs a DLPack capsule, so only when it matters
            # (the storage-only types have no capsule; nothing imports them zero-copy: tf allocated them)
            # (an empty one too: one imported zero-copy keeps its source's pointer, which jax's
            # import refuses unaligned, empty or not; its copy costs nothing)
            aligned=(not alignment or x._datatype_enum() not in _POINTER or self.data_ptr(x) % ALIGN == 0),
            readonly=False, device=_device(x.device), notes=notes, requires_grad=grad, owner=owner,
        )

    def fast_key(self, x, alignment, _no_tape=_no_tape, _gradient_types=_gradient_types,
                 _capsule_ptr=_dlpack.capsule_ptr):
        # convert keeps plans per input type, and never one for a tf.Variable (describe swaps it
        # for a snapshot) or a symbolic tensor (refused): only eager tensors get here with a plan
        try:
            empty = x._num_elements() == 0  # one C call, no shape tuple
        except AttributeError:
            empty = 0 in tuple(x.shape)
        # the dtype as tf's enum: an int, cheaper to read and hash than the DType object
        enum = x._datatype_enum()
        if enum not in _POINTER:
            # no DLPack capsule to read a pointer from (asking for one of a tf.string aborts the
            # process): the full path, which refuses the dtype or routes it by a copy
            return None
        # (an empty one's pointer too, as describe reads it: keyed "unaligned" for being empty, an
        # unaligned one took the zero-copy plan of an aligned one that plan() refused under copy=False)
        return (enum, x.device, empty, alignment and _capsule_ptr(_pointer_capsule(x)) % ALIGN == 0,
                # Source.requires_grad (_recorded): whether a tape watches it, asked per call (one C
                # call without a tape; the functions bound as defaults: no global lookup)
                not _no_tape() and _gradient_types((x,)) != 0)

    def data_ptr(self, x) -> int:
        if x._datatype_enum() not in _POINTER:  # a capsule of it would abort the process
            raise UnsupportedDtypeError(
                f"a tf tensor of dtype {x.dtype.name} has no DLPack export, so no data pointer to read; "
                f"those that have one: {', '.join(sorted(tf.as_dtype(e).name for e in _POINTER))}")
        return _dlpack.capsule_ptr(_pointer_capsule(x))

    def bitview(self, x, dtype):
        return tf.bitcast(x, _tf_dtype(dtype))

    def bitview_to(self, dtype):
        return functools.partial(tf.bitcast, type=_tf_dtype(dtype))

    def export(self, x, readonly):
        return x if _NATIVE_EXPORT else _Exported(x)

    def exporter(self, readonly):
        return None if _NATIVE_EXPORT else _Exported

    def capsule_exporter(self):
        return tf.experimental.dlpack.to_dlpack  # every tensorflow tested has it

    def capsule_importer(self):
        return tf.experimental.dlpack.from_dlpack

    def from_dlpack(self, obj):
        # a capsule: the one form every tensorflow tested takes (2.16 takes nothing else)
        return tf.experimental.dlpack.from_dlpack(obj.__dlpack__())

    def copy(self, x):
        # never reached with an unaligned tensor (kernels_unaligned is False: the planner
        # copies those in numpy, as plan() shows)
        return _unrecorded(tf.raw_ops.DeepCopy, x)

    def astype(self, x, dtype):
        src = _name(x.dtype)
        if src == dtype or not (float_row(src) and float_row(dtype)) or _rounds_as_ml_dtypes(src, dtype):
            return tf.cast(x, _tf_dtype(dtype))
        return _cast_in_numpy(x, dtype)

    def to_host(self, x):
        with tf.device("/CPU:0"):
            return _unrecorded(tf.raw_ops.DeepCopy, x)

    def devices(self):
        out: list[tuple[str, bool | None, str]] = []
        for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            cap = tf.config.experimental.get_device_details(gpu).get("compute_capability")
            if cap is None:
                out.append((f"gpu:{i}", None, "tensorflow does not say"))
            else:
                out.append((f"gpu:{i}", tuple(cap) >= (8, 0),
                            f"compute capability {cap[0]}.{cap[1]} (bf16 arithmetic from 8.0)"))
        return out

    def facts(self):
        return {"Tensor.__dlpack__": _EXPORT_FACT, "gradient tapes": _TAPE_FACT}

    computes = True

    def numerics(self):
        import os

        return {"tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on for x86)")}

    # -- functions across frameworks -----------------------------------------------
    differentiates = True

    def kept(self, outs, pullback=None):
        # every result: a tf result object can be new over a buffer the callee keeps (a tf.function's
        # captured constant or Variable forwarded as its output, tf.identity(c), v.read_value(), eagerly
        # tf.reshape(c), c[16:32] and tf.split(c) too, the last two at an offset: a sub-buffer of c's),
        # and tensorflow tells no buffer's holders (no Python or C API reads a TensorBuffer's reference
        # count; TF_TensorMaybeMove asks "one?" of a tensor that resolving the handle already shared);
        # a copy for a caller that writes in place
        return list(range(len(outs)))

    def shape_dtype(self, x):
        return tuple(x.shape), _name(x.dtype) or x.dtype.name

    def traced(self, leaves):
        return not tf.executing_eagerly()

    def differentiable_leaves(self, leaves, traced):
        # eagerly (traced: not tf.executing_eagerly(), asked once a call), no tape or accumulator
        # active on this thread (one C call), or none that watches any of them: one question for all
        if not traced and _no_tape():
            return [False] * len(leaves)
        leaves = _read(leaves)  # (a Variable read once, for both questions)
        if _forward_watched(leaves):
            raise UnsupportedTypeError(
                "a bridged function called with a tensor that a tf.autodiff.ForwardAccumulator watches: "
                "forward-mode tangents do not cross to another framework, and would be lost (acc.jvp gave None); "
                "take the gradient in reverse mode (tf.GradientTape) instead")
        if not traced and not _recording(leaves):
            return [False] * len(leaves)
        return [self.differentiable(x) for x in leaves]

    def differentiable(self, x):
        # eagerly, only a tape that watches it wants its gradient; in a graph, any may
        return (x.dtype.is_floating or x.dtype.is_complex) and (not tf.executing_eagerly() or _recording([x]))

    def call_foreign(self, call, leaves):
        # a variable is read here, under the caller's tape, so its gradient flows through the read
        # (an eager tensor, the usual leaf, is no variable: told by its type, no isinstance each)
        for x in leaves:
            if type(x) is not _EAGER_TENSOR:
                leaves = _read(leaves)
                break
        if not call.traced:  # eagerly
            if not any(call.diff):
                return call.forward(leaves, False, self.name)[0]

            @tf.custom_gradient
            def eager(*xs):
                outs, pullback = call.forward(list(xs), True, "tensorflow")

                def grad(*cts):
                    if not tf.executing_eagerly():
                        # the gradient traced into a graph (tape.jacobian's pfor, its default): run there
                        # through py_function, a gradient of it came back zeros, silently (pfor leaves out
                        # what refuses it)
                        raise UnsupportedTypeError(
                            f"the gradient of the bridged {call.callee} function "
                            f"{getattr(call.fn, '__qualname__', call.fn)!r} was traced into a graph, as "
                            "tape.jacobian and tape.batch_jacobian do by default (pfor): pass "
                            "experimental_use_pfor=False to them (the rows one by one, each an eager gradient)")
                    return _first_order_only(call, call.backward(pullback, list(cts), "tensorflow"), xs)

                return outs, grad

            return list(eager(*leaves))
        if _compiled_by_xla():
            raise UnsupportedTypeError(
                f"a bridged {call.callee} function ({getattr(call.fn, '__qualname__', call.fn)!r}) runs in Python, which "
                "XLA cannot call: not inside tf.function(jit_compile=True) (nor a Keras model compiled with "
                "jit_compile=True); drop jit_compile there, or call the bridged function outside the compiled one")
        # inside tf.function: the callee runs when the graph runs, through py_function;
        # results are declared first, and the backward recomputes the forward
        specs = call.specs(leaves, _static_shape_dtype)
        n = len(leaves)

        @tf.custom_gradient
        def graph(*xs):
            def run(*a):
                got = call.forward(list(a), False, "tensorflow")[0]
                call.check_declared(got, "tensorflow")  # (the graph keeps the declared static shapes)
                return got

            outs = tf.py_function(run, list(xs), Tout=[_tf_dtype(d) for _, d in specs])
            for o, (shape, _) in zip(outs, specs):
                o.set_shape(shape)

            def grad(*cts):
                def back(*a):
                    # py_function records this body under a tape of its own (watching its inputs), which
                    # a gradient of the gradient asks (an outer tape around the tf.function): refused
                    # there, not zeros, so the cotangents' conversion need not warn of it
                    grads = call.recompute_backward(list(a[:n]), list(a[n:]), "tensorflow", "drop")
                    return _refused_beyond(call, [tf.zeros_like(x) if g is None else g for x, g in zip(a[:n], grads)],
                                           a)

                gs = tf.py_function(back, [*xs, *cts], Tout=[x.dtype for x in xs])
                return _first_order_only(call, [g if d else None for g, d in zip(gs, call.diff)], xs)

            return outs, grad

        return list(graph(*leaves))

    def vjp(self, fn, leaves, diff):
        # persistent: a caller may ask the pullback again (torch's backward(retain_graph=True), then a
        # second; two autograd.grad calls over one graph), as jax's vjp and a torch callee (retain_graph)
        # allow; the tape lives as long as the pullback, which the caller's graph holds
        with tf.GradientTape(persistent=True) as tape:
            for x, d in zip(leaves, diff):
                if d:
                    tape.watch(x)
            outs = fn(*leaves)

        def pullback(cts):
            pairs = [(o, c) for o, c in zip(outs, cts) if c is not None and (o.dtype.is_floating or o.dtype.is_complex)]
            wrt = [x for x, d in zip(leaves, diff) if d]
            grads = iter(tape.gradient([o for o, _ in pairs], wrt, output_gradients=[c for _, c in pairs])
                         if pairs else [None] * len(wrt))
            return [next(grads) if d else None for d in diff]

        return outs, pullback


@functools.lru_cache(maxsize=None)
def _rounds_as_ml_dtypes(src: str, dst: str) -> bool:
    """Whether tf.cast from float row ``src`` to ``dst`` gives ml_dtypes' bits, tried once on the CPU:
    tensorflow's CPU casts (2.16 and 2.21) flush subnormals from float32 and bf16 to float64 and
    from float64 to the narrower floats."""
    to = _tf_dtype(dst)
    with tf.init_scope(), tf.device("/CPU:0"):  # eagerly, where the first cast comes inside a tf.function
        return rounds_as_ml_dtypes(src, dst, lambda a: tf.cast(tf.constant(a), to).numpy())


def _cast_in_numpy(x, dtype: str):
    """``x`` cast to row ``dtype`` by ml_dtypes in numpy, where tf.cast gives other bits, with
    tf.cast's gradient (the cotangent cast back). Eagerly on this Python thread; inside a
    tf.function through a numpy_function, which runs on tensorflow's threads: they flush subnormals
    for numpy too, so the cast runs with them kept (fpenv), as it would on this thread."""
    to = dtypes.numpy_dtype(dtype)

    def host(a):
        with np.errstate(all="ignore"):  # NaN and overflow casts warn: the rounding defines them
            return a.astype(to)

    if tf.executing_eagerly():
        def run(t):
            with tf.device(t.device):
                return tf.constant(host(t.numpy()))
    else:
        if _compiled_by_xla():
            raise UnsupportedTypeError(
                f"tensorflow {tf.__version__} casts {_name(x.dtype)} to {dtype} with other bits than ml_dtypes here "
                "(its CPU kernels flush subnormals to zero), and inside tf.function(jit_compile=True) the cast "
                "cannot go through numpy instead: cast outside the compiled function, or drop jit_compile")

        def kept(a):
            with fpenv.keeping():
                return host(a)

        def run(t):
            y = tf.numpy_function(kept, [t], _tf_dtype(dtype), stateful=False)
            y.set_shape(t.shape)
            return y

    @tf.custom_gradient
    def cast(t):
        return run(t), lambda dy: tf.cast(dy, t.dtype)

    return cast(tf.convert_to_tensor(x))  # a Variable read here, under the caller's tape


def _compiled_by_xla() -> bool:
    """Whether the graph being traced is compiled by XLA as a whole (tf.function(jit_compile=True)),
    where a py_function, the bridged call's way back into Python, has no kernel."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - every tensorflow tested has it: tensorflow's own error then
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _refused_beyond(call, grads: list, inputs) -> list:
    """``grads`` as they are, through an op whose own gradient (a gradient of the gradient, with
    respect to any of ``inputs``) raises our error: a foreign backward's second-order part is not
    seen by tensorflow's autodiff, which would take it as zero."""
    @tf.custom_gradient
    def refuse(*ts):
        def grad(*_):
            from bf16bridge.adapters.hooks import second_order_refused

            raise second_order_refused("tensorflow", call.fn)

        return [tf.identity(t) for t in ts[:len(grads)]], grad

    return list(refuse(*grads, *inputs))


def _first_order_only(call, grads, xs):
    """``grads`` as they are; where a tape records the inputs ``xs`` while they are computed (a
    gradient of this gradient may be asked for), through an op whose gradient raises our error."""
    live = [i for i, g in enumerate(grads) if g is not None]
    if not live or not _recording(list(xs)):
        return grads
    out = list(grads)
    for i, g in zip(live, _refused_beyond(call, [grads[i] for i in live], xs)):
        out[i] = g
    return out


def _recording(leaves) -> bool:
    """Whether a gradient tape watches any of ``leaves`` (no tape: no custom gradient needed)."""
    try:
        from tensorflow.python.eager import record
    except ImportError:  # pragma: no cover - a tensorflow without it: assume a tape
        return True
    # a tf.Variable is read under the tape by call_foreign: ask about what will be read
    return bool(record.should_record_backprop(_read(leaves)))


def _forward_watched(leaves) -> bool:
    """Whether a ForwardAccumulator has a tangent for any of ``leaves`` (a Variable: for its read)."""
    try:
        from tensorflow.python.eager import forwardprop_util
    except ImportError:  # pragma: no cover - every tensorflow tested has it
        return False
    return bool(forwardprop_util.pack_tangents(_read(leaves)).tangents)


def _read(leaves) -> list:
    """``leaves`` with each tf.Variable read (tf.identity), as call_foreign reads them under the
    caller's tape: what a tape or an accumulator watches is the read."""
    return [tf.identity(x) if isinstance(x, tf.Variable) else x for x in leaves]


def _unrecorded(op, x):
    """``op(x=x)``, which no tape records where one watches ``x``: DeepCopy has no registered
    gradient, and a recorded one made the tape's ``gradient`` raise LookupError; unrecorded, the
    copy's gradient is dropped, as plan's ``drops_grad`` says and ``convert`` warns."""
    if _no_tape():
        return op(x=x)
    from tensorflow.python.eager import record

    with record.stop_recording():
        return op(x=x)


def _static_shape_dtype(x):
    shape = tuple(x.shape)
    if any(d is None for d in shape):
        raise UnsupportedTypeError(
            f"inside tf.function a bridged function needs static shapes; got {x.shape}: give the "
            "tf.function an input_signature with full shapes, or call it eagerly"
        )
    return shape, _name(x.dtype) or x.dtype.name


ADAPTER = TensorflowAdapter()
