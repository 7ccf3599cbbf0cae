"""The torch adapter: what the planner reads of torch, and the primitives ``convert`` runs.

bf16 crosses DLPack to jax and tensorflow as it is; to numpy as a free ``view(torch.uint16)``.
The dtype tables come from ``probe`` on first need; the other features' hooks live beside this file.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys

import torch
from torch.utils.dlpack import to_dlpack

from bf16bridge.adapters.torch import internals, probe
from bf16bridge.core import dtypes, memory, versions
from bf16bridge.core.adapter import ALIGN, CONTIGUOUS, STRIDED, Adapter, Handoff, Source, layout_of, parse_device
from bf16bridge.errors import UnsupportedDtypeError, UnsupportedTypeError

versions.require("torch", torch.__version__)

# read on every fast_key call: module constants, not attribute chains
_Tensor, _Parameter, _STRIDED = torch.Tensor, torch.nn.Parameter, torch.strided
_dual_level = internals.dual_level
_Uninitialized = torch.nn.parameter.UninitializedTensorMixin


def is_dtensor(x) -> bool:
    """Whether ``x`` is a torch DTensor (a sharded tensor)."""
    dt = sys.modules.get("torch.distributed.tensor")  # a DTensor cannot exist before it is imported
    return dt is not None and isinstance(x, dt.DTensor)


def row_major(shape) -> tuple:
    """The strides, in elements, of a C-contiguous tensor of ``shape``."""
    strides, n = [], 1
    for size in reversed(shape):
        strides.append(n)
        n *= size
    return tuple(reversed(strides))


def _from_numpy(a):
    """torch.from_numpy, taking an array of numpy's ulonglong (numpy 1.x's uint64 times a Python int
    gives one) as the uint64 it is: torch refuses the type, not its bits."""
    try:
        return torch.from_numpy(a)
    except TypeError:
        import numpy as np

        same = np.dtype(a.dtype.str)  # numpy's own type for these bytes (uint64 for ulonglong)
        if same != a.dtype or same.type is a.dtype.type:
            raise
        return torch.from_numpy(a.view(same))


def _resolved(x):
    """``x``'s pending negation and conjugation materialised exactly as torch itself does it
    (``resolve_neg().resolve_conj().contiguous()``), as a contiguous tensor with row-major strides.
    A NaN's bits depend on the layout torch's kernel runs over (a sign flip where it vectorises, a
    canonical NaN elsewhere), so no copy into another layout gives the same bits."""
    try:
        out = x.resolve_neg().resolve_conj().contiguous()
    except (NotImplementedError, RuntimeError) as err:  # a dtype with no negation kernel (float8)
        raise UnsupportedDtypeError(
            f"this {x.dtype} tensor carries a pending {'negation' if x.is_neg() else 'conjugation'} "
            f"(a lazy view) that torch itself cannot materialise ({err}); convert the tensor the view was "
            "made from, and negate or conjugate in the target framework") from err
    shape = tuple(out.shape)
    if _odd_size_1_stride(out, shape):  # (DLPack would hand a size-1 dim's stride over)
        out = _row_major_view(out)
    return out


def _no_copy(layout, aligned):
    return None


def _to_capsule(x):
    # Tensor.__dlpack__ checks what describe has already made true (no grad, no conj bit,
    # strided) and synchronises streams, which host memory has none of; a subclass keeps its own
    return to_dlpack(x) if type(x) is torch.Tensor else x.__dlpack__()


def _odd_size_1_stride(x, shape) -> bool:
    """Whether a size-1 dimension of ``x`` (of ``shape``, contiguous) has a stride row-major would not give."""
    return 1 in shape and x.stride() != row_major(shape)


def _row_major_view(x):
    """``x`` (contiguous) with row-major strides on its size-1 dimensions too: a view of the same memory."""
    shape = tuple(x.shape)
    return x.as_strided(shape, row_major(shape))


def _detached_row_major_view(x):
    return _row_major_view(x.detach())


#: (detached, restrided) -> what gives describe's value from a tensor of such a key (kept_value)
_KEPT_VALUES = {(False, False): None, (True, False): torch.Tensor.detach, (False, True): _row_major_view,
                (True, True): _detached_row_major_view}


def _empty(shape, dtype, device, nbytes: int, like=None):
    """``torch.empty``, but a large host tensor in numpy's memory, ALIGN-aligned: numpy's large
    allocations get huge pages (``memory.FRESH_MEMORY_FROM``). ``like``: a tensor of that shape,
    dtype and device, whose ``empty_like`` a small one is (cheaper than torch.empty)."""
    if nbytes < memory.FRESH_MEMORY_FROM or device.type != "cpu":
        if like is not None:
            return torch.empty_like(like, memory_format=torch.contiguous_format)
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.from_numpy(memory.aligned_bytes(nbytes)).view(dtype).view(shape)


def _refusal(x) -> str | None:
    """Why ``describe`` refuses ``x`` outright (no single strided buffer to move), or None."""
    if type(x) is not torch.Tensor and is_dtensor(x):
        # a DTensor is a torch.Tensor whose data_ptr() is 0: read as one tensor it gave zeros
        return (f"a torch DTensor (global shape {tuple(x.shape)}, placements {tuple(x.placements)}) is not one "
                "buffer: bb.convert_shards(x, to) moves the shards this rank holds (no gather), or "
                "x.full_tensor() gathers the whole tensor onto every rank (communicates and copies) for bb.convert")
    if x.is_nested:
        return ("a torch nested (ragged) tensor has no single strided buffer; convert each of "
                "t.unbind(), or t.to_padded_tensor(0.0) first")
    if x.layout != torch.strided:
        return f"torch tensor with layout {x.layout} is not moved; call .to_dense() first"
    if x.device.type == "meta":
        return "a torch tensor on the meta device has no data to move"
    return _no_data(x)


class TorchAdapter(Adapter):
    """torch tensors as the planner sees them, and the calls that move them."""

    name = "torch"
    grad_words = "requires grad, or has a forward-mode tangent (torch.autograd.forward_ad)"
    dlpack_accepts = STRIDED  # negative strides abort the process in torch.from_dlpack
    label_bitview = "Tensor.view(torch.{dtype})"
    label_import = "torch.from_dlpack"
    label_copy = "copy into a new contiguous tensor"
    model_way_out = ("pass its weights, model.state_dict(), to convert or save them; "
                     "bb.cast_module(model, dtype) casts the model itself, in place")

    # what torch holds and speaks, tried on first need (probe), then kept on the instance
    @functools.cached_property
    def _to_torch(self) -> dict:
        return probe.to_torch()

    @functools.cached_property
    def _from_torch(self) -> dict:
        return probe.from_torch()

    @functools.cached_property
    def dlpack_export(self) -> frozenset:  # type: ignore[override]
        return frozenset(dtypes.ALL) | probe.dlpack_rows()[0]

    @functools.cached_property
    def dlpack_import(self) -> frozenset:  # type: ignore[override]
        return frozenset(dtypes.ALL) | probe.dlpack_rows()[1]

    def handoffs(self):
        # numpy's own bridge to torch: the calls a user writes by hand, cheaper per call than DLPack
        out, into = probe.numpy_rows()
        return [
            Handoff("torch", "numpy", "Tensor.numpy", torch.Tensor.numpy, _no_copy, dtypes=out),
            Handoff("numpy", "torch", "torch.from_numpy", _from_numpy, _no_copy, dtypes=into,
                    layouts=STRIDED),  # it refuses negative strides
        ]

    def cannot_hold(self, dtype):
        if dtype not in self._to_torch:
            return probe.not_held().get(dtype, f"{dtype!r} is not a dtype bf16bridge carries")
        return None

    def casts(self, src, dst):
        return probe.casts(src, dst)

    def describe(self, x, *, alignment: bool = True) -> Source:
        why = _refusal(x)
        if why is not None:
            raise UnsupportedTypeError(why)
        name = self._from_torch.get(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"torch tensor of dtype {x.dtype} is not moved by bf16bridge; supported: {', '.join(self._to_torch)}"
            )
        notes: tuple[str, ...] = ()
        grad = x.requires_grad
        if grad:
            x = x.detach()
            notes = ("the tensor requires grad: its data crosses, detached; gradients do not cross",)
        elif internals.has_tangent(x):
            grad, x = True, x.detach()
            notes = ("the tensor has a forward-mode tangent: its data crosses, detached; the tangent does not cross",)
        must_copy = None
        if x.is_conj() or x.is_neg():
            must_copy = "the tensor has a pending conj/neg bit, which only a copy can resolve"
        device = x.device.type if x.device.type == "cpu" else str(x.device)
        shape = tuple(x.shape)
        if x.is_contiguous():
            layout = CONTIGUOUS
            if _odd_size_1_stride(x, shape):
                # torch hands a size-1 dimension's arbitrary stride over DLPack, and numpy.asarray of
                # jax's import then copies: send row-major strides
                x = _row_major_view(x)
        else:
            layout = layout_of(shape, x.stride())
        return Source(
            value=x, dtype=name, shape=shape, nbytes=x.numel() * x.element_size(),
            layout=layout, aligned=x.data_ptr() % ALIGN == 0,
            readonly=False, device=device, must_copy=must_copy, notes=notes, requires_grad=grad,
        )

    def no_data(self, x):
        if type(x) is not torch.Tensor and is_dtensor(x):  # a cast (Tensor.to) casts this rank's part
            return _no_data(x.to_local())
        return _no_data(x)

    def fast_key(self, x, alignment):
        # describe refuses these, or asks for a tangent (inside a dual_level): the full path
        # (a meta tensor is keyed by its device, for which no plan is kept: describe refuses it)
        if x.is_nested or x.layout is not _STRIDED or _dual_level() >= 0:
            return None
        if type(x) is not _Tensor and type(x) is not _Parameter:  # a DTensor, a fake or wrapper subclass:
            return None  # describe decides (a frozen Parameter is a plain tensor: the checks below hold for it)
        # nor a tensor without memory behind it (_no_data's question, in few calls for the contiguous
        # case every hot call is; any doubt goes to describe, which says why)
        contiguous = x.is_contiguous()
        shape = x.shape
        n = x.nbytes
        try:
            at = x.data_ptr()
            if n:
                if not at:  # freed at offset 0, a zero tensor
                    return None
                if contiguous:  # a freed storage under an offset view (FSDP's flat parameters): its size
                    storage = x.untyped_storage()
                    base = storage.data_ptr()  # (a zero tensor's storage raises here)
                    if not base or storage.nbytes() < at - base + n:
                        return None
                elif _no_data(x) is not None:
                    return None
        except (NotImplementedError, RuntimeError):  # torch.func's wrappers
            return None
        # requires_grad, and a size-1 dimension's odd stride: describe's value is the tensor detached, a
        # row-major view (kept_value), their plans kept apart
        return (x.dtype, x.is_cpu or x.device, CONTIGUOUS if contiguous else layout_of(shape, x.stride()), not n,
                x.is_conj() or x.is_neg(), alignment and at % ALIGN == 0, x.requires_grad,
                contiguous and _odd_size_1_stride(x, shape))

    def kept_value(self, x, source):
        detach = source.requires_grad and x.requires_grad  # (a tangent: keyed only outside a dual level)
        restride = source.layout == CONTIGUOUS and _odd_size_1_stride(x, source.shape)
        return _KEPT_VALUES[detach, restride]

    def data_ptr(self, x) -> int:
        return x.data_ptr()

    def bitview(self, x, dtype):
        return x.view(self._to_torch[dtype])

    def bitview_to(self, dtype):
        return operator.methodcaller("view", self._to_torch[dtype])

    def from_dlpack(self, obj):
        return torch.from_dlpack(obj)

    def importer(self):
        return torch.from_dlpack

    def capsule_exporter(self):
        return _to_capsule

    def capsule_importer(self):
        # what torch.from_dlpack ends in for a capsule, without first asking the capsule for a
        # __dlpack__ it has not (a failed attribute lookup, per leaf of every bridged call)
        return internals.capsule_import

    def copy(self, x):
        name = self._from_torch.get(x.dtype)
        if name is not None and name in probe.no_kernels():  # a shell dtype (torch.int4): its carrier copies
            carrier = getattr(torch, dtypes.BITS_OF[name])
            return _empty(x.shape, carrier, x.device, x.nbytes).copy_(x.view(carrier)).view(x.dtype)
        if x.is_conj() or x.is_neg():
            return _resolved(x)
        n = x.nbytes
        if n < memory.FRESH_MEMORY_FROM:
            # empty_like and copy_ in one call (a bridged call's hot path)
            return x.clone(memory_format=torch.contiguous_format)
        return _empty(x.shape, x.dtype, x.device, n, like=x).copy_(x)

    def astype(self, x, dtype):
        # row-major, as the planner takes a widened tensor to be (a fresh copy): Tensor.to keeps
        # a strided input's strides, which tensorflow's DLPack import refuses
        return x.to(self._to_torch[dtype], memory_format=torch.contiguous_format)

    def to_host(self, x):
        return x.to("cpu", copy=True)

    def shape_dtype(self, x):
        return tuple(x.shape), self._from_torch.get(x.dtype, str(x.dtype))

    label_place = "Tensor.to({device!r})"
    device_objects = "torch.device"

    def devices(self):
        return ("cpu", *(f"cuda:{i}" for i in range(torch.cuda.device_count())))

    def find_device(self, device):
        if isinstance(device, str):
            parsed = parse_device(device)
            if parsed is None:
                raise self.no_device(device)
            kind, index = parsed
        elif isinstance(device, torch.device):
            kind, index = {"cpu": "cpu", "cuda": "gpu"}.get(device.type, device.type), device.index
        else:
            raise self.no_device(device, ": neither a device name nor a torch.device")
        if kind == "cpu" and not index:
            return "cpu"
        n = torch.cuda.device_count() if kind == "gpu" else 0
        if kind == "gpu" and index is None and n:  # torch's "cuda": its current device
            return f"cuda:{torch.cuda.current_device()}"
        if kind == "gpu" and index is not None and index < n:
            return f"cuda:{index}"
        raise self.no_device(device, "" if kind != "gpu" or n else " (torch sees no CUDA device)")

    def fixed_device(self, device):
        # (asked only of a device find_device took) "cuda" and torch.device("cuda") follow torch.cuda.set_device
        kind, index = ((device.type, device.index) if isinstance(device, torch.device)
                       else parse_device(device) or ("cpu", None))
        return kind == "cpu" or index is not None

    def device_of(self, x):
        return "cpu" if x.device.type == "cpu" else str(x.device)

    def place(self, x, device):
        dev = _torch_device(device)
        return x if x.device == dev else x.to(dev)

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

    def same_data(self, x):
        # state_dict() hands tied weights as two tensors over one storage
        if type(x) is not torch.Tensor and is_dtensor(x):  # (FSDP2's state dict) by this rank's part
            return ("DTensor", self.same_data(x.to_local()), tuple(x.shape), tuple(x.placements), id(x.device_mesh))
        if x.layout is not torch.strided or x.is_nested or x.device.type == "meta" or x.numel() == 0:
            return id(x)  # empty tensors all have data_ptr 0: not one storage
        # a lazy negation or conjugation (c.conj().imag is -c.imag over c's storage) is other values,
        # and a detached view of a parameter another tensor to cast (its cast has no graph to join)
        return (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), x.stride(), x.dtype, x.device,
                x.is_neg(), x.is_conj(), x.requires_grad)


@functools.lru_cache(maxsize=64)
def _torch_device(name: str) -> torch.device:
    return torch.device(name)


def _needed_bytes(x) -> int:
    """How many bytes of its storage tensor ``x`` reaches, from the storage's start."""
    if x.is_contiguous():  # (every call on the hot path asks: the common case in few calls)
        need = x.nbytes
        return need + x.storage_offset() * x.element_size() if need else 0
    if x.numel() == 0:
        return 0
    need = x.storage_offset() + 1
    for n, step in zip(x.shape, x.stride()):
        need += (n - 1) * step
    return need * x.element_size()


def _no_data(x) -> str | None:
    """Why ``x`` has no memory to move (None where it has): asked before its pointer is read, which
    would be 0 or garbage (a freed, fake or zero tensor) or raise torch's error (torch.func's
    wrappers, lazy parameters)."""
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
    subclass = type(x) is not torch.Tensor and type(x) is not _Parameter
    if subclass and isinstance(x, internals.FAKE_TENSOR):  # its pointer is 0, and reading it warns
        return (f"a torch FakeTensor of shape {tuple(x.shape)} has no memory behind it (fake mode traces "
                "shapes only); convert real tensors, outside fake mode")
    need = _needed_bytes(x)
    if not need:
        return None
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


ADAPTER = TorchAdapter()
