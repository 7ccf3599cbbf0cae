"""PyTorch. bf16 crosses DLPack to jax and tensorflow as it is; to numpy as a
free ``view(torch.uint16)``."""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import weakref

import torch
from torch.autograd import forward_ad as _forward_ad
from torch.utils.dlpack import to_dlpack as _to_dlpack

from bf16bridge.core import dtypes
from bf16bridge.core import versions
from bf16bridge.errors import UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.adapters import numpy as _numpy
from bf16bridge.adapters import cpython
from bf16bridge.adapters.hooks import BridgeHooks, CastHooks, KernelHooks, NumericsHooks, ProbeHooks, ShardHooks, Submodule
from bf16bridge.adapters.trials import cast_matches
from bf16bridge.core.adapter import ALIGN, CONTIGUOUS, STRIDED, Adapter, Handoff, Source, layout_of
from bf16bridge.adapters.quiet import without_native_lines

# for sharded tensors (bf16bridge.shards)
import sys

from bf16bridge.core import sharding as shards
from bf16bridge.errors import DeviceError, InvalidArgumentError

versions.require("torch", torch.__version__)


def _is_dtensor(x) -> bool:
    dt = sys.modules.get("torch.distributed.tensor")  # a DTensor cannot exist before it is imported
    return dt is not None and isinstance(x, dt.DTensor)


def _copies(dt) -> bool:
    try:
        torch.zeros(2, dtype=torch.uint8).view(dt).clone()
        return True
    except (RuntimeError, TypeError):
        return False


def _held() -> tuple[dict, dict]:
    """The table's rows this torch holds, found by trying: its dtype of that name stores
    elements of the row's width and views them as the row's carrier. Returns (held: name ->
    torch dtype, not held: name -> why)."""
    held, why = {}, {}
    for name in dtypes.NAMES:
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            packed = dtypes.UNPACKED.get(name)
            why[name] = f"torch {torch.__version__} has no torch.{name}" + (
                " (torch.uint16 needs torch >= 2.3)" if name == "uint16" else
                f" (it holds these values packed two a byte, torch.{packed}: the route packs them)"
                if isinstance(getattr(torch, packed or "-", None), torch.dtype) else "")
            continue
        row = dtypes.ROWS[name]
        try:
            size = torch.empty(2, dtype=dt).element_size()
            if row.carrier is not None:
                torch.zeros(2, dtype=getattr(torch, row.carrier)).view(dt)
        except (RuntimeError, TypeError, AttributeError) as err:
            why[name] = f"torch.{name} is unusable here: {type(err).__name__}: {err}"
            continue
        if size != row.itemsize:
            why[name] = f"torch.{name} stores {size} bytes an element, the table {row.itemsize}"
            continue
        held[name] = dt
    return held, why


_TO_TORCH, _CANNOT = _held()
_FROM_TORCH = {dt: name for name, dt in _TO_TORCH.items()}


def _dlpack_dtypes() -> tuple[frozenset, frozenset]:
    """The narrow rows torch exports over DLPack with the table's (code, bits, lanes), and
    takes back, found by trying its own round trip. Older torch raises for fp8; torch
    exports its sub-byte ints as 8-bit ints (the type is lost): those are not exported."""
    from bf16bridge.adapters import dlpack as _dlpack

    out, into = set(), set()
    for name, dt in _TO_TORCH.items():
        row = dtypes.ROWS[name]
        if row.family != "narrow" or row.dlpack is None:
            continue
        try:
            t = torch.zeros(2, dtype=getattr(torch, row.carrier)).view(dt)  # type: ignore[arg-type]
            capsule = torch.utils.dlpack.to_dlpack(t)
            got = _dlpack._tensor(capsule).dtype
            if (got.code, got.bits, got.lanes) != row.dlpack:
                continue
            out.add(name)
            if torch.from_dlpack(t).dtype == dt:
                into.add(name)
        except (BufferError, RuntimeError, TypeError, ValueError):
            continue
    return frozenset(out), frozenset(into)


_DLPACK_OUT, _DLPACK_IN = _dlpack_dtypes()
#: the held rows torch has no copy kernel for (its shell sub-byte ints): copied as their carrier
_NO_KERNELS = frozenset(name for name, dt in _TO_TORCH.items()
                        if dtypes.ROWS[name].family == "narrow" and not _copies(dt))


def _numpy_dtypes() -> tuple[frozenset, frozenset]:
    """The dtypes Tensor.numpy() and torch.from_numpy take in this torch, found by trying."""
    import numpy as np

    out, into = set(), set()
    for name, dt in _TO_TORCH.items():
        if name in dtypes.BITS_OF:
            continue  # numpy's bf16 is ml_dtypes', which torch does not know
        try:
            torch.zeros(1, dtype=dt).numpy()
            out.add(name)
        except (TypeError, RuntimeError):
            pass
        try:
            torch.from_numpy(np.zeros(1, dtype=name))
            into.add(name)
        except (TypeError, RuntimeError):
            pass
    return frozenset(out), frozenset(into)


_NUMPY_OUT, _NUMPY_IN = _numpy_dtypes()


def _from_numpy(a):
    """torch.from_numpy, taking an array of numpy's ulonglong (numpy 1.x's uint64 * a Python int
    gives one; np.dtype("Q") == np.dtype("uint64")) as the uint64 it is: torch refuses the type
    ("can't convert np.ndarray of type numpy.ulonglong"), not its bits."""
    try:
        return torch.from_numpy(a)
    except TypeError:
        import numpy as np

        same = np.dtype(a.dtype.str)  # numpy's own type for these bytes (uint64 for ulonglong)
        if same != a.dtype or same.type is a.dtype.type:
            raise
        return torch.from_numpy(a.view(same))


@functools.lru_cache(maxsize=None)
def _casts(src: str, dst: str) -> bool:
    """Whether Tensor.to turns every src value into the same dst value, found by trying once."""
    if src not in _TO_TORCH or dst not in _TO_TORCH:
        return False
    if src in _NO_KERNELS or dtypes.ROWS[src].packing > 1:
        return False
    import numpy as np

    def run(a):
        carrier = dtypes.BITS_OF.get(src)
        t = (torch.from_numpy(a.view(carrier)).view(_TO_TORCH[src]) if carrier
             else torch.from_numpy(np.ascontiguousarray(a)))
        out = t.to(_TO_TORCH[dst])
        bits = dtypes.BITS_OF.get(dst)
        return out.view(getattr(torch, bits)).numpy().view(dtypes.numpy_dtype(dst)) if bits else out.numpy()

    return cast_matches(src, dst, run)


def _no_copy(layout, aligned):
    return None


def _to_capsule(x):
    # Tensor.__dlpack__ checks what describe has already made true (no grad, no conj bit,
    # strided) and synchronises streams, which host memory has none of; a subclass keeps its own
    return _to_dlpack(x) if type(x) is torch.Tensor else x.__dlpack__()


#: a DLPack capsule's import (torch's private entry point, where this torch has it)
_capsule_import = getattr(torch._C, "_from_dlpack", torch.from_dlpack)


def _row_major(shape) -> tuple:
    strides, n = [], 1
    for size in reversed(shape):
        strides.append(n)
        n *= size
    return tuple(reversed(strides))


_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm")


def _narrow_matmul(dt, device: str) -> tuple[str, str]:
    """torch._scaled_mm on ``dt`` inputs, float32 out: 'emulated' when torch's profiler shows an
    aten matmul on wider copies inside it (its CPU kernel widens to float32), else 'native'."""
    from torch.profiler import ProfilerActivity, profile

    if torch._C._autograd._profiler_enabled():
        # a profiler of our own would stop the user's session (torch keeps one at a time)
        return "unknown", "not traced: a torch profiler is already running"
    try:
        a = torch.ones(16, 16, device=device).to(dt)
        b = torch.ones(16, 16, device=device).to(dt).t()  # its second operand must be column-major
        one = torch.ones((), device=device)
        def traced():
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
            return prof, out

        # kineto logs each start and stop natively ("USDT:... SyncActivityProfilerHandler.cpp:52]
        # profiler_start"): the trial's own lines, kept off stderr
        prof, out = without_native_lines(traced, b"SyncActivityProfilerHandler.cpp")
        if float(out[0, 0]) != 16.0:
            return "no", f"torch._scaled_mm ran but gave {float(out[0, 0])} for 16"
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        return "no", f"torch._scaled_mm: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    try:
        inner = [(e.name(), e.dtypes()) for e in prof.profiler.kineto_results.events() if e.name() in _MATMULS]
    except Exception as err:  # noqa: BLE001 - the trace's shape is the profiler's, not ours
        return "unknown", f"torch._scaled_mm runs; its trace could not be read ({type(err).__name__}: {err})"
    wide = [(n, d) for n, d in inner if d and "Float8" not in str(d[0])]
    if wide:
        return "emulated", (f"torch._scaled_mm runs {wide[0][0]} on {wide[0][1][0]} copies of the {dt} inputs "
                            "(torch's profiler)")
    return "native", "torch._scaled_mm runs no widening matmul inside (torch's profiler)"


def _empty(shape, dtype, device, nbytes: int, like=None):
    """``torch.empty``, but a large host tensor in numpy's memory, 64-byte aligned: torch's own
    allocation faults in every 4 KiB page of it, numpy's asks for huge pages
    (``adapters.numpy.FRESH_MEMORY_FROM`` says where and by how much that wins). ``like``: a tensor
    of that shape, dtype and device, whose ``empty_like`` a small one is (twice as fast as torch.empty)."""
    if nbytes < _numpy.FRESH_MEMORY_FROM or device.type != "cpu":
        if like is not None:
            return torch.empty_like(like, memory_format=torch.contiguous_format)
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.from_numpy(_numpy._aligned_bytes(nbytes)).view(dtype).view(shape)


class TorchAdapter(Adapter, BridgeHooks, CastHooks, KernelHooks, NumericsHooks, ProbeHooks, ShardHooks):
    def narrow_compute(self, dtype):
        dt = _TO_TORCH.get(dtype)
        if dt is None:
            return ()
        devices = ("cpu", *(f"cuda:{i}" for i in range(torch.cuda.device_count())))
        return tuple((d, *_narrow_matmul(dt, d)) for d in devices)

    name = "torch"
    grad_words = "requires grad, or has a forward-mode tangent (torch.autograd.forward_ad)"
    dlpack_accepts = STRIDED  # negative strides abort the process in torch.from_dlpack
    label_bitview = "Tensor.view(torch.{dtype})"
    label_import = "torch.from_dlpack"
    label_copy = "copy into a new contiguous tensor"

    def handoffs(self):
        # numpy's own bridge to torch: the calls a user writes by hand, cheaper per call than DLPack
        return [
            Handoff("torch", "numpy", "Tensor.numpy", torch.Tensor.numpy, _no_copy, dtypes=_NUMPY_OUT),
            Handoff("numpy", "torch", "torch.from_numpy", _from_numpy, _no_copy, dtypes=_NUMPY_IN,
                    layouts=STRIDED),  # it refuses negative strides
        ]

    dlpack_export = frozenset(dtypes.ALL) | _DLPACK_OUT
    dlpack_import = frozenset(dtypes.ALL) | _DLPACK_IN

    def cannot_hold(self, dtype):
        if dtype not in _TO_TORCH:
            return _CANNOT.get(dtype, f"{dtype!r} is not a dtype bf16bridge carries")
        return None

    def casts(self, src, dst):
        return _casts(src, dst)

    def describe(self, x, *, alignment: bool = True) -> Source:
        if type(x) is not torch.Tensor and _is_dtensor(x):
            # a DTensor is a torch.Tensor whose data_ptr() is 0: read as one tensor it gave zeros
            raise UnsupportedTypeError(
                f"a torch DTensor (global shape {tuple(x.shape)}, placements {tuple(x.placements)}) is not one "
                "buffer: bb.convert_shards(x, to) moves the shards this rank holds (no gather), or "
                "x.full_tensor() gathers the whole tensor onto every rank (communicates and copies) for bb.convert"
            )
        if x.is_nested:
            raise UnsupportedTypeError(
                "a torch nested (ragged) tensor has no single strided buffer; convert each of "
                "t.unbind(), or t.to_padded_tensor(0.0) first"
            )
        if x.layout != torch.strided:
            raise UnsupportedTypeError(
                f"torch tensor with layout {x.layout} is not moved; call .to_dense() first"
            )
        if x.device.type == "meta":
            raise UnsupportedTypeError("a torch tensor on the meta device has no data to move")
        why = _no_data(x)
        if why is not None:
            raise UnsupportedTypeError(why)
        name = _FROM_TORCH.get(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"torch tensor of dtype {x.dtype} is not moved by bf16bridge; supported: {', '.join(_TO_TORCH)}"
            )
        notes: tuple[str, ...] = ()
        grad = x.requires_grad
        if grad:
            x = x.detach()
            notes = ("the tensor requires grad: its data crosses, detached; gradients do not cross",)
        elif _dual(x):
            grad, x = True, x.detach()
            notes = ("the tensor has a forward-mode tangent: its data crosses, detached; the tangent does not cross",)
        must_copy = None
        if x.is_conj() or x.is_neg():
            must_copy = "the tensor has a pending conj/neg bit, which only a copy can resolve"
        device = x.device.type if x.device.type == "cpu" else str(x.device)
        shape = tuple(x.shape)
        if x.is_contiguous():
            layout = CONTIGUOUS
            if 1 in shape:
                # torch calls a size-1 dimension with any stride contiguous, and hands that
                # stride over DLPack; jax keeps it, and numpy.asarray then copies: send row-major strides
                x = x.as_strided(shape, _row_major(shape))
        else:
            layout = layout_of(shape, x.stride())
        return Source(
            value=x, dtype=name, shape=shape, nbytes=x.numel() * x.element_size(),
            layout=layout, aligned=x.data_ptr() % ALIGN == 0,
            readonly=False, device=device, must_copy=must_copy, notes=notes, requires_grad=grad,
        )

    def no_data(self, x):
        if type(x) is not torch.Tensor and _is_dtensor(x):  # a cast (Tensor.to) casts this rank's part
            return _no_data(x.to_local())
        return _no_data(x)

    def fast_key(self, x, alignment):
        # describe detaches, restrides or refuses these: the full path
        if (x.requires_grad or x.is_nested or x.layout is not torch.strided or x.is_meta or 1 in x.shape
                or _forward_ad._current_level >= 0):  # (inside a dual_level: describe asks for a tangent)
            return None
        if type(x) is not torch.Tensor and type(x) is not _Parameter:  # a DTensor, a fake or wrapper subclass:
            return None  # describe decides (a frozen Parameter is a plain tensor: the check below holds for it)
        # nor a tensor without memory behind it (_no_data's question, in few calls for the contiguous
        # case every hot call is; any doubt goes to describe, which says why)
        contiguous = x.is_contiguous()
        n = x.nbytes
        try:
            at = x.data_ptr()
            if n:
                if not at:  # freed at offset 0, a zero tensor
                    return None
                if contiguous:  # a freed storage under an offset view (FSDP's flat parameters): its size
                    storage, offset = x.untyped_storage(), x.storage_offset()
                    if storage.nbytes() < n + offset * x.element_size() or (offset and not storage.data_ptr()):
                        return None  # (a zero tensor's storage raises there)
                elif _no_data(x) is not None:
                    return None
        except (NotImplementedError, RuntimeError):  # torch.func's wrappers
            return None
        return (x.dtype, x.device, contiguous, not n, x.is_conj() or x.is_neg(), alignment and at % ALIGN == 0)

    def data_ptr(self, x) -> int:
        return x.data_ptr()

    def bitview(self, x, dtype):
        return x.view(_TO_TORCH[dtype])

    def bitview_to(self, dtype):
        return operator.methodcaller("view", _TO_TORCH[dtype])

    def from_dlpack(self, obj):
        return torch.from_dlpack(obj)

    def importer(self):
        return torch.from_dlpack

    def capsule_exporter(self):
        return _to_capsule

    def capsule_importer(self):
        # what torch.from_dlpack ends in for a capsule, without first asking the capsule for a
        # __dlpack__ it has not (a failed attribute lookup, per leaf of every bridged call)
        return _capsule_import

    def copy(self, x):
        name = _FROM_TORCH.get(x.dtype)
        if name is not None and name in _NO_KERNELS:  # a shell dtype (torch.int4): its carrier copies
            carrier = getattr(torch, dtypes.BITS_OF[name])
            return _empty(x.shape, carrier, x.device, x.nbytes).copy_(x.view(carrier)).view(x.dtype)
        n = x.nbytes
        if n < _numpy.FRESH_MEMORY_FROM and not (x.is_conj() or x.is_neg()):
            # empty_like and copy_ in one call (a bridged call copies each tensorflow result for a torch
            # caller: this is on its hot path); clone keeps conj/neg bits lazily, so those take copy_ below
            return x.clone(memory_format=torch.contiguous_format)
        # copy_ resolves conj/neg bits; clone() would keep them
        return _empty(x.shape, x.dtype, x.device, n, like=x).copy_(x)

    def astype(self, x, dtype):
        # row-major, as the planner takes a widened tensor to be (a fresh copy): Tensor.to keeps
        # a strided input's strides, which tensorflow's DLPack import refuses
        return x.to(_TO_TORCH[dtype], memory_format=torch.contiguous_format)

    def to_host(self, x):
        return x.to("cpu", copy=True)

    def devices(self):
        out = []
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                out.append((f"cuda:{i} {torch.cuda.get_device_name(i)}", cap >= (8, 0),
                            f"compute capability {cap[0]}.{cap[1]} (bf16 arithmetic from 8.0)"))
        return out

    def facts(self):
        try:
            torch.zeros(2, dtype=torch.bfloat16).view(torch.uint16)
            return {"uint16": (True, "Tensor.view(torch.uint16) works")}
        except (AttributeError, RuntimeError, TypeError) as err:
            return {"uint16": (False, f"{type(err).__name__}: {err} (torch >= 2.3 has it)")}

    # integer kernels for bf16bridge.kernels.chunked: never torch's .to(bfloat16), whose vectorised
    # path differs on NaNs and, with AVX512-BF16, flushes subnormals
    offers_kernels = True
    kernels_threaded = True  # torch spreads each call over its own threads

    def widen_bits(self, src_u16, dst_u32):
        s = torch.from_numpy(src_u16.view("i2"))
        d = torch.from_numpy(dst_u32.view("i4"))
        torch.bitwise_left_shift(s.to(torch.int32), 16, out=d)

    def round_bits(self, src_u32, dst_u16):
        u = torch.from_numpy(src_u32.view("i4"))
        # int32 arithmetic wraps like uint32 for the low bits we keep; >> is arithmetic, so mask
        r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        r &= 0xFFFF
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        if bool(nan.any()):
            r = torch.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, r)
        torch.from_numpy(dst_u16.view("i2")).copy_(r.to(torch.int16))

    computes = True

    def numerics(self):
        return {"torch_threads": torch.get_num_threads(), "torch_mkldnn": torch.backends.mkldnn.is_available()}

    # -- functions across frameworks -----------------------------------------------
    differentiates = True

    def shape_dtype(self, x):
        return tuple(x.shape), _FROM_TORCH.get(x.dtype, str(x.dtype))

    def differentiable(self, x):
        return x.requires_grad and torch.is_grad_enabled()

    def differentiable_leaves(self, leaves, traced):
        # asked on every bridged call: whether autograd records at all, once for all leaves
        if not torch.is_grad_enabled():
            return [False] * len(leaves)
        return [x.requires_grad for x in leaves]

    def call_foreign(self, call, leaves):
        if _functorch_active() and any(_functorch_wrapped(x) for x in leaves):
            raise UnsupportedTypeError(
                f"the bridged function {getattr(call.fn, '__qualname__', call.fn)!r} called under a torch.func "
                "transform (grad, vmap, jacrev, vjp, ...): its tensors are torch.func's wrappers, which hold "
                "no data to hand to another framework; call it under torch.autograd instead (loss.backward(), "
                "torch.autograd.grad), one example at a time for vmap")
        if _forward_ad._current_level >= 0 and any(_dual(x) for x in leaves):
            raise UnsupportedTypeError(
                f"the bridged function {getattr(call.fn, '__qualname__', call.fn)!r} called with a dual tensor "
                "(torch.autograd.forward_ad): forward-mode tangents do not cross to another framework, and would be "
                "lost; take the gradient in reverse mode (loss.backward(), torch.autograd.grad) instead")
        if not any(call.diff):
            return call.forward(leaves, False, self.name)[0]
        return list(_Foreign.apply(call, *leaves))

    def device_streams(self):
        return ("cuda",) if torch.cuda.is_available() else ()

    @contextlib.contextmanager
    def on_device_stream(self, platform, index, stream):
        device = torch.device(platform, index)
        # torch's current device and stream become the foreign runtime's: the callee's kernels, its
        # temporaries (the caching allocator keys blocks by stream) and the copy of its results queue
        # behind that runtime's earlier work and ahead of its later work
        with torch.cuda.device(device), torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device)):
            yield

    def write_into(self, dst, src):
        if src is None:
            dst.zero_()
        else:
            dst.copy_(src)

    def watch_writes(self, leaves):
        # torch has no read-only tensors, but every in-place op (add_, x[i] = v, out=, copy_) bumps the
        # version counter a tensor shares with its views and detached copies. Not seen: writes
        # through .data, .numpy() or a raw pointer, and tensors made under inference_mode (no counter)
        try:
            return leaves, [x._version for x in leaves]
        except RuntimeError:  # an inference tensor among them: watch the others
            return leaves, [None if x.is_inference() else x._version for x in leaves]

    def written(self, watched):
        leaves, versions = watched
        try:  # (every call: the plain read first)
            now: list = [x._version for x in leaves]
        except RuntimeError:  # an inference tensor among them, not watched
            now = [None if v is None else x._version for x, v in zip(leaves, versions)]
        return [] if now == versions else [i for i, (v, w) in enumerate(zip(versions, now)) if v != w]

    def kept(self, outs, pullback=None):
        # the same tensor object held elsewhere (Adapter.kept's reference count), or a new tensor over
        # kept memory: a view, a detach of a parameter (its storage's use count), unless what shares it is
        # only the view's base, an intermediate nothing else holds (_lone_base); once a bridged call
        counts = cpython.refcounts(outs)
        found = []
        for i, o in enumerate(outs):
            if counts[i] > cpython.FRESH or (isinstance(o, torch.Tensor) and weakref.getweakrefcount(o)):
                found.append(i)  # (a weak reference to it: a handle the callee may dereference and write)
            elif isinstance(o, torch.Tensor):
                try:
                    storage = o.untyped_storage()
                    # memory torch did not allocate (torch.from_numpy of the callee's own array, a DLPack
                    # import: its owner may write it; not resizable), a storage object held elsewhere
                    # (y.untyped_storage() or a weak reference to it: torch keeps one Python object a
                    # storage, which its use count does not count twice), or shared with another tensor
                    # (the storage's use count, where this torch tells it)
                    if (not storage.resizable() or _storage_refs(storage) != _STORAGE_REFS
                            or weakref.getweakrefcount(storage)):
                        found.append(i)
                        continue
                    shared = 0 if _use_count is None or _ALONE is None else _use_count(storage._cdata) - _ALONE
                except (RuntimeError, NotImplementedError, AttributeError):  # no storage of its own (a wrapper)
                    continue
                if shared > 0 and not _lone_base(o, outs, counts, shared):
                    found.append(i)
        return found

    def aliased(self, outs, ins):
        # an output that shares an input's memory starts inside it: the callee only had the input's
        # own bytes (its data pointer to data pointer + nbytes), so no output's extent is needed
        spans = [(p, p + x.nbytes) for x in ins if isinstance(x, torch.Tensor) and (p := x.data_ptr())]
        if not spans:
            return []
        found = []
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                p = o.data_ptr()
                if any(start <= p < end for start, end in spans):
                    found.append(i)
        return found

    def outside_compiler(self, call):
        # torch.compile's tracer cannot follow foreign code (DLPack, jax): a graph break here,
        # the bridged call runs eagerly, and tracing resumes after it
        if torch.compiler.is_compiling():
            return torch.compiler.disable(call)
        return None

    def no_grad(self):
        return torch.no_grad()

    def vjp(self, fn, leaves, diff):
        ins = [x.detach().requires_grad_() if d else x for x, d in zip(leaves, diff)]
        with torch.enable_grad():
            outs = fn(*ins)

        def pullback(cts):
            pairs = [(o, c) for o, c in zip(outs, cts) if c is not None and o.requires_grad]
            wrt = [x for x, d in zip(ins, diff) if d]
            # the graph kept for another use: a persistent tf.GradientTape asks twice (two targets,
            # tape.jacobian's rows); it lives as long as the pullback, which the caller's tape holds
            grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True,
                                             retain_graph=True)
                         if pairs else [None] * len(wrt))
            return [next(grads) if d else None for d in diff]

        return outs, pullback

    # -- casting models --------------------------------------------------------------------
    model_way_out = ("pass its weights, model.state_dict(), to convert or save them; "
                     "bb.cast_module(model, dtype) casts the model itself, in place")

    def not_a_tensor(self, x):
        # asked wherever a walk meets an object no adapter claims (a bridged call's arguments too):
        # the first parameter or buffer answers, without listing every module as submodules does
        if isinstance(x, torch.nn.Module) and next(itertools.chain(x.parameters(), x.buffers()), None) is not None:
            return self.model_message(x)
        if isinstance(x, torch.optim.Optimizer):
            return (f"{type(x).__module__}.{type(x).__qualname__} is an optimizer object of torch, not a tensor or a "
                    "tree of tensors: pass opt.state_dict() (its state and parameter groups as a tree) to convert or "
                    "save it")
        return None

    def submodules(self, model):
        if not isinstance(model, torch.nn.Module):
            return None
        out = []
        names: dict[tuple[type, ...], tuple[str, ...]] = {}
        for name, m in model.named_modules():
            # a module's own, as named_parameters/named_buffers(recurse=False) give them (None and
            # a second name for the same tensor left out), read off the dicts Module._apply walks
            params = _own(m._parameters)
            lazy = [k for k, v in params + _own(m._buffers) if torch.nn.parameter.is_lazy(v)]
            if lazy:  # (Module.to casts them when they are made; a report of their bytes cannot be)
                raise UnsupportedTypeError(
                    f"{'.'.join(filter(None, (name, lazy[0])))} is not made yet (a lazy module's, "
                    f"{type(m).__qualname__}): run one forward pass first, then cast the model")
            classes = type(m).__mro__
            if classes not in names:
                names[classes] = tuple(c.__name__ for c in classes)
            out.append(Submodule(name, names[classes], classes, params + _own(m._buffers), len(params)))
        return out

    def same_data(self, x):
        # state_dict() hands tied weights as two tensors over one storage
        if type(x) is not torch.Tensor and _is_dtensor(x):  # (FSDP2's state dict) by this rank's part
            return ("DTensor", self.same_data(x.to_local()), tuple(x.shape), tuple(x.placements), id(x.device_mesh))
        if x.layout is not torch.strided or x.is_nested or x.device.type == "meta" or x.numel() == 0:
            return id(x)  # empty tensors all have data_ptr 0: not one storage
        # a lazy negation or conjugation (c.conj().imag is -c.imag over c's storage) is other values,
        # and a detached view of a parameter another tensor to cast (its cast has no graph to join)
        return (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), x.stride(), x.dtype, x.device,
                x.is_neg(), x.is_conj(), x.requires_grad)

    def cast_module(self, model, plan, hooks):
        to = {}
        for m in model.modules():
            _remove_cast_hooks(m)
            for p in m._parameters.values():
                if p is not None and id(p) in plan and p.grad is not None:
                    to[id(p.grad)] = _TO_TORCH[plan[id(p)]]  # a gradient follows its parameter
        to.update({k: _TO_TORCH[v] for k, v in plan.items()})

        def fn(t):
            dt = to.get(id(t))
            return t if dt is None else t.to(dt)

        # Module._apply is what Module.to runs: parameters keep their identity (optimizers
        # still hold them), and modules that keep derived state (RNN's flat weights) redo it
        model._apply(fn)
        for name, compute, output in hooks:
            m = model.get_submodule(name)
            m.register_forward_pre_hook(_CastInputs(_TO_TORCH[compute]), with_kwargs=True)
            m.register_forward_hook(_CastOutputs(_TO_TORCH[output]))

    # -- sharded tensors (DTensor), for bf16bridge.shards ---------------------------------------------
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
        k = _packing(_FROM_TORCH.get(x.dtype))
        if k > 1 and shape:  # fp4 x2: said in values, as its shards cross (review: index packed, tensors not)
            shape = dtypes.in_values(shape, _FROM_TORCH[x.dtype])[0]
            index = (*index[:-1], slice(index[-1].start * k, index[-1].stop * k))
        return shape, layout, [(index, device, local, _replica(tuple(mesh.shape), kinds, coord))]

    def assemble(self, shape, pieces, sharding, layout, copy, on_alias, convert):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor

        mesh, placements = (sharding if isinstance(sharding, tuple) and len(sharding) == 2 else (sharding, None))
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
        kinds = tuple(_kind(p) for p in placements)
        # placements given by the caller: one per mesh axis, each Shard(d) within the tensor's dimensions
        # (the layout's own checks; a wrong count built a DTensor its mesh does not match, a Shard(2) of a
        # 2-d tensor was a raw IndexError)
        axes = tuple(mesh.mesh_dim_names or map(str, range(mesh.ndim)))
        shards.Layout.from_placements(axes, tuple(mesh.shape), kinds, len(shape))
        if any(k == "partial" for k, _ in kinds):
            raise UnsupportedTypeError("a Partial placement holds partial sums, not shards of one array: "
                                       "use Shard(d) or Replicate()")
        coord = mesh.get_coordinate()
        if coord is None:
            raise InvalidArgumentError("this process is not in the DeviceMesh: it holds no part of a DTensor over it")
        shape = tuple(shape)
        k = _packing(_packed_here(pieces))  # shape and indices are in values; torch holds fp4 two a byte
        if k > 1 and shape:
            if shape[-1] % k:
                raise InvalidArgumentError(
                    f"a DTensor of {shape[-1]} values of fp4 in its last dimension: torch holds them packed {k} a "
                    f"byte (float4_e2m1fn_x2), which needs a multiple of {k}; pad that dimension first")
            shape = (*shape[:-1], shape[-1] // k)
        index = _local_index(shape, tuple(mesh.shape), kinds, coord)
        if k > 1 and shape:  # this rank's part, in values, as the pieces say theirs
            index = (*index[:-1], slice(index[-1].start * k, index[-1].stop * k))
        def span(index):
            return tuple((s.start, s.stop) for s in index)

        held = {span(i) for i, _, _ in pieces}
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
        mine = [t for i, _, t in pieces if span(i) == span(index)]
        if not mine:
            raise InvalidArgumentError(
                f"this rank's place {tuple(coord)} in the mesh holds {_show(index)}, but the shards given hold "
                f"{', '.join(sorted({_show(i) for i, _, _ in pieces})) or 'nothing'}: order the mesh's ranks as the "
                "source's devices are ordered")
        t = convert(mine[0], "torch", copy=copy, on_alias=on_alias)
        if t.device.type != mesh.device_type:
            raise DeviceError(
                f"this rank's shard is on {t.device}, and the DeviceMesh is over {mesh.device_type!r} devices: "
                f"move the shards to {mesh.device_type} first, or build the mesh over {t.device.type!r}")
        return DTensor.from_local(t, mesh, placements, run_check=False, shape=torch.Size(shape),
                                  stride=_row_major(shape))


def _cast_one(x, dtype):
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
        return x.to(dtype)
    return x


def _cast_floating(tree, dtype):
    # runs on every forward of a kept module: the usual shapes (a tensor, a tuple of them, no
    # keywords) without the tree walk
    if isinstance(tree, torch.Tensor):
        return _cast_one(tree, dtype)
    if not tree:
        return tree
    if type(tree) is tuple and all(isinstance(x, torch.Tensor) for x in tree):
        return tuple(_cast_one(x, dtype) for x in tree)
    from bf16bridge.trees import walk as trees

    return trees.map_leaves(lambda x, path: _cast_one(x, dtype), tree)


class _CastInputs:
    """Forward pre-hook of a module cast_module kept: its floating inputs to its own dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, module, args, kwargs):
        return _cast_floating(args, self.dtype), _cast_floating(kwargs, self.dtype)


class _CastOutputs:
    """Forward hook of a module cast_module kept: its floating outputs to the model's dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, module, args, output):
        return _cast_floating(output, self.dtype)


def _own(members: dict) -> tuple:
    """A module's own parameters or buffers (its ``_parameters`` or ``_buffers``) as (name, tensor)
    pairs, as ``named_parameters(recurse=False)`` gives them: None and a second name left out."""
    seen: set[int] = set()
    out = []
    for k, v in members.items():
        if v is not None and id(v) not in seen:
            seen.add(id(v))
            out.append((k, v))
    return tuple(out)


def _remove_cast_hooks(m):
    # the hooks an earlier cast_module installed (found by their class: a handle would not
    # survive a deepcopy of the model)
    if not (m._forward_pre_hooks or m._forward_hooks):
        return
    for hooks, extras in ((m._forward_pre_hooks, (getattr(m, "_forward_pre_hooks_with_kwargs", {}),)),
                          (m._forward_hooks, (getattr(m, "_forward_hooks_with_kwargs", {}),
                                              getattr(m, "_forward_hooks_always_called", {})))):
        for k, v in list(hooks.items()):
            if isinstance(v, (_CastInputs, _CastOutputs)):
                del hooks[k]
                for extra in extras:
                    extra.pop(k, None)


_Uninitialized = torch.nn.parameter.UninitializedTensorMixin
_Parameter = torch.nn.Parameter
_FakeTensor = torch._subclasses.fake_tensor.FakeTensor  # imported by `import torch`


def _no_data(x) -> str | None:
    """Why ``x`` has no memory to move (None where it has): asked before its pointer is read, which
    would be 0 or garbage (a freed, fake or zero tensor: a zero-copy result over it read the heap)
    or raise torch's error (torch.func's wrappers, lazy parameters)."""
    if isinstance(x, _Uninitialized):  # every read of it raises torch's ValueError
        return (f"an uninitialized {type(x).__name__} (a lazy module's, before its first forward) has no data "
                "yet: run the module on one batch first")
    try:
        storage = x.untyped_storage()
    except (NotImplementedError, RuntimeError) as err:
        return (f"a torch tensor whose storage cannot be read ({err}): a torch.func transform's wrapper "
                "(vmap, grad, ...) or a tensor subclass with no memory of its own; convert outside the "
                "transform (bb.bridge makes a function callable under torch.autograd), or convert the plain "
                "tensors the subclass holds")
    subclass = type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter
    if subclass and isinstance(x, _FakeTensor):  # its pointer is 0, and reading it warns
        return (f"a torch FakeTensor of shape {tuple(x.shape)} has no memory behind it (fake mode traces "
                "shapes only); convert real tensors, outside fake mode")
    if x.is_contiguous():  # (every call on the hot path asks: the common case in few calls)
        need = x.nbytes
        if not need:
            return None
        need += x.storage_offset() * x.element_size()
    else:
        if x.numel() == 0:
            return None
        need = x.storage_offset() + 1
        for n, step in zip(x.shape, x.stride()):
            need += (n - 1) * step
        need *= x.element_size()
    have = storage.nbytes()
    try:
        at = storage.data_ptr()
    except RuntimeError:  # a zero tensor's storage: "invalid python storage"
        at = 0
    if at and have >= need:
        return None
    if subclass and not at and _dispatches(x):  # a wrapper subclass: the tensors it holds have the data
        return (f"a {type(x).__module__}.{type(x).__qualname__} (a torch tensor subclass) has no memory of its "
                "own; convert the plain tensors it holds (its own way to get them, such as a dequantize or "
                "an attribute), not the wrapper")
    return (f"a torch tensor of shape {tuple(x.shape)} whose storage holds {have} bytes at {at:#x} where it "
            f"needs {need}: its storage was freed (untyped_storage().resize_(0), as FSDP does to sharded "
            "parameters), or it is a zero tensor (_efficientzerotensor) with no memory behind it; convert it "
            "while its storage is allocated (inside FSDP's summon_full_params), or materialize it first (x.clone())")


def _dispatches(x) -> bool:
    """Whether ``x`` is a wrapper subclass (its own ``__torch_dispatch__``, as torch's
    ``_make_wrapper_subclass`` tensors have), not a plain subclass over memory of its own."""
    return getattr(type(x), "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__


def _dual(x) -> bool:
    """Whether ``x`` has a forward-mode tangent at the current level (only inside a dual_level)."""
    return _forward_ad._current_level >= 0 and _forward_ad.unpack_dual(x).tangent is not None


#: torch.func (functorch) transforms active now (a private probe, where this torch has it)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
#: a tensor torch.func wrapped (a plain tensor captured by the transformed function is not, and
#: crosses as any other); where this torch cannot tell, every tensor under a transform counts
_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda x: True)


class _Foreign(torch.autograd.Function):
    """A bridged function's call as one torch op: its backward is the callee's vjp."""

    @staticmethod
    def forward(ctx, call, *xs):
        outs, pullback = call.forward(list(xs), True, "torch")
        ctx.call, ctx.pullback = call, pullback
        ctx.set_materialize_grads(False)  # an unused output's cotangent stays None: nothing to convert
        ctx.mark_non_differentiable(*[o for o in outs if not (o.is_floating_point() or o.is_complex())])
        # the callee's pullback may keep views of these (zero-copy): saved, so that torch's own
        # check refuses a backward after one was written in place, as it would natively
        ctx.save_for_backward(*xs, *outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *cts):
        saved = ctx.saved_tensors  # raises torch's error if an input or output was written since
        grads = ctx.call.backward(ctx.pullback, list(cts), "torch")
        if torch.is_grad_enabled():  # create_graph=True: a gradient of these must be refused, not short
            grads = _first_order_only(ctx.call, grads, saved[:len(grads)])
        return (None, *grads)


def _first_order_only(call, grads, xs):
    """``grads`` that raise our error when differentiated (their graph reaches the inputs ``xs``)."""
    live = [i for i, g in enumerate(grads) if g is not None]
    if not live:
        return grads
    got = _SecondOrder.apply(call, len(live), *[grads[i] for i in live], *xs)
    out = list(grads)
    for i, g in zip(live, got):
        out[i] = g
    return out


class _SecondOrder(torch.autograd.Function):
    """The gradients of a bridged call as they are; differentiating them raises our error."""

    @staticmethod
    def forward(ctx, call, n, *ts):
        ctx.call = call
        return tuple(t.view_as(t) for t in ts[:n])

    @staticmethod
    def backward(ctx, *_):
        from bf16bridge.adapters.hooks import second_order_refused

        raise second_order_refused("torch", ctx.call.fn)


def _kind(p) -> tuple[str, int | None]:
    """A DTensor placement as data: ("shard", dim), ("replicate", None) or ("partial", None)."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor import placement_types

    strided = getattr(placement_types, "_StridedShard", None)
    if strided is not None and isinstance(p, strided):
        raise UnsupportedTypeError(
            f"the DTensor placement {p!r} (a strided shard, as FSDP with tensor parallelism makes) has no "
            "jax sharding: redistribute to Shard(d) / Replicate() placements first")
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
    return shards.Layout.from_placements(tuple(names), tuple(mesh.shape), kinds, ndim, ranks)


#: how many hold a storage (torch's use count; private, where this torch has it): None, unknown
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _storage_count(t) -> int | None:
    try:
        return _use_count(t.untyped_storage()._cdata) if _use_count is not None else None
    except (RuntimeError, NotImplementedError, AttributeError):  # no storage of its own (a wrapper)
        return None


def _storage_refs(storage) -> int:
    """Python's reference count of a storage object, as read where a caller holds it in a variable."""
    return sys.getrefcount(storage)


def _calibrate() -> tuple:
    """(_ALONE, _STORAGE_REFS) for a tensor alone on its storage: measured with no dispatch mode of
    the user's active (one that keeps the tensors it sees would count as a holder)."""
    with _no_modes():
        t = torch.empty(1)
        storage = t.untyped_storage()
        return _storage_count(t), _storage_refs(storage)


def _no_modes():
    modes = getattr(getattr(torch.utils, "_python_dispatch", None), "_disable_current_modes", None)
    return modes() if modes is not None else contextlib.nullcontext()


#: what _storage_count reads for a tensor alone on its storage (the storage object asked holds one),
#: and the reference count of that storage's Python object as ``kept`` reads it (held in one variable)
_ALONE, _STORAGE_REFS = _calibrate()


def _base_holders(o) -> tuple | None:
    """(o's base, the base's holders in C++: its tensor's use count, and in Python: its reference
    count), as read here; None for a tensor that is no view (or a torch that cannot tell)."""
    base = o._base
    return None if base is None else (base, base._use_count(), sys.getrefcount(base))


def _calibrate_base() -> tuple | None:
    try:
        with _no_modes():
            got = _base_holders(torch.empty(2).view(2))  # a view of an intermediate nothing else holds
    except (AttributeError, RuntimeError):  # a torch without Tensor._use_count
        return None
    return None if got is None else got[1:]


#: what _base_holders reads for the base of one view, when that view alone holds the base (measured,
#: not assumed: how torch keeps a base's Python object alive beside its C++ holders changes)
_LONE_BASE = _calibrate_base()


def _lone_base(o, outs: list, counts: list[int], shared: int) -> bool:
    """Whether the ``shared`` tensors beside result ``o`` on its storage are its base, an intermediate
    held by nothing but its views, and other such views among the results ``outs`` that nothing else
    holds (``(x * 2).reshape(...)``, ``torch.split`` at a model's end): memory the callee keeps no handle
    on. Anything else on that storage (a parameter, a buffer, an input, a view or a detach of one kept
    anywhere, a base with any other holder in Python or in C++: autograd's saved tensors, a scripted
    module, a weak reference) is counted by torch's own counts and makes it kept."""
    lone = _LONE_BASE
    got = _base_holders(o) if lone is not None else None
    if got is None or lone is None:
        return False
    base, cpp, py = got
    views = 0
    for x, n in zip(outs, counts):
        if n == cpython.FRESH and isinstance(x, torch.Tensor) and x._base is base:
            views += 1
    # each view of the base holds it once in C++, and the storage once (o among them); a weak reference
    # to the base is a handle on it too
    return (shared == views and cpp == lone[0] + views - 1 and py == lone[1]
            and not weakref.getweakrefcount(base))


def _packing(name: str | None) -> int:
    """Values a byte of a dtype torch holds packed (fp4 x2: 2); 1 for any other."""
    return dtypes.ROWS[name].packing if name in dtypes.PACKED else 1


def _packed_here(pieces) -> str | None:
    """The packed dtype torch will hold the pieces' values in (fp4 from numpy or jax: x2), if any."""
    if not pieces:
        return None
    from bf16bridge.core import registry

    tensor = pieces[0][2]
    name = registry.get(registry.framework_of(tensor)).shape_dtype(tensor)[1]
    packed = name if name in dtypes.PACKED else dtypes.UNPACKED.get(name)
    return packed if packed in _TO_TORCH else None


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


ADAPTER = TorchAdapter()
