"""PyTorch. bf16 crosses DLPack to jax and tensorflow as it is; to numpy as a
free ``view(torch.uint16)``."""

from __future__ import annotations

import operator

import torch
from torch.utils.dlpack import to_dlpack as _to_dlpack

from .. import dtypes, versions
from ..errors import UnsupportedDtypeError, UnsupportedTypeError
from ._base import ALIGN, CONTIGUOUS, STRIDED, Adapter, Handoff, Source, layout_of

versions.require("torch", torch.__version__)

_TO_TORCH = {name: getattr(torch, name) for name in dtypes.ALL if isinstance(getattr(torch, name, None), torch.dtype)}
_FROM_TORCH = {dt: name for name, dt in _TO_TORCH.items()}


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


def _no_copy(layout, aligned):
    return None


def _to_capsule(x):
    # Tensor.__dlpack__ checks what describe has already made true (no grad, no conj bit,
    # strided) and synchronises streams, which host memory has none of; a subclass keeps its own
    return _to_dlpack(x) if type(x) is torch.Tensor else x.__dlpack__()


def _row_major(shape) -> tuple:
    strides, n = [], 1
    for size in reversed(shape):
        strides.append(n)
        n *= size
    return tuple(reversed(strides))


class TorchAdapter(Adapter):
    name = "torch"
    dlpack_accepts = STRIDED  # negative strides abort the process in torch.from_dlpack
    label_bitview = "Tensor.view(torch.{dtype})"
    label_import = "torch.from_dlpack"
    label_copy = "copy into a new contiguous tensor"

    def handoffs(self):
        # numpy's own bridge to torch: the calls a user writes by hand, cheaper per call than DLPack
        return [
            Handoff("torch", "numpy", "Tensor.numpy", torch.Tensor.numpy, _no_copy, dtypes=_NUMPY_OUT),
            Handoff("numpy", "torch", "torch.from_numpy", torch.from_numpy, _no_copy, dtypes=_NUMPY_IN,
                    layouts=STRIDED),  # it refuses negative strides
        ]

    def cannot_hold(self, dtype):
        if dtype not in _TO_TORCH:
            return f"torch {torch.__version__} has no {dtype} (torch.uint16 needs torch >= 2.3)"
        return None

    def describe(self, x, *, alignment: bool = True) -> Source:
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
        name = _FROM_TORCH.get(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"torch tensor of dtype {x.dtype} is not moved by bf16bridge; supported: {', '.join(dtypes.ALL)}"
            )
        notes: tuple[str, ...] = ()
        grad = x.requires_grad
        if grad:
            x = x.detach()
            notes = ("the tensor requires grad: its data crosses, detached; gradients do not cross",)
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

    def fast_key(self, x, alignment):
        # describe detaches, restrides or refuses these: the full path
        if x.requires_grad or x.is_nested or x.layout is not torch.strided or x.is_meta or 1 in x.shape:
            return None
        return (x.dtype, x.device, x.is_contiguous(), x.numel() == 0,
                x.is_conj() or x.is_neg(), alignment and x.data_ptr() % ALIGN == 0)

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
        return torch.from_dlpack  # takes a capsule as it is

    def copy(self, x):
        # copy_ resolves conj/neg bits; clone() would keep them
        return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)

    def astype(self, x, dtype):
        return x.to(_TO_TORCH[dtype])

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

    # integer kernels for bf16bridge.kernels: never torch's .to(bfloat16), whose vectorised
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

    def call_foreign(self, call, leaves):
        if not any(call.diff):
            return call.forward(leaves, False, self.name)[0]
        return list(_Foreign.apply(call, *leaves))

    def outside_compiler(self, call):
        # torch.compile's tracer cannot follow foreign code (DLPack, jax): a graph break here,
        # the bridged call runs eagerly, and tracing resumes after it
        if torch.compiler.is_compiling():
            return torch.compiler.disable(call)
        return None

    def vjp(self, fn, leaves, diff):
        ins = [x.detach().requires_grad_() if d else x for x, d in zip(leaves, diff)]
        with torch.enable_grad():
            outs = fn(*ins)

        def pullback(cts):
            pairs = [(o, c) for o, c in zip(outs, cts) if c is not None and o.requires_grad]
            wrt = [x for x, d in zip(ins, diff) if d]
            grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True)
                         if pairs else [None] * len(wrt))
            return [next(grads) if d else None for d in diff]

        return outs, pullback


class _Foreign(torch.autograd.Function):
    """A bridged function's call as one torch op: its backward is the callee's vjp."""

    @staticmethod
    def forward(ctx, call, *xs):
        outs, pullback = call.forward(list(xs), True, "torch")
        ctx.call, ctx.pullback = call, pullback
        ctx.set_materialize_grads(False)  # an unused output's cotangent stays None: nothing to convert
        ctx.mark_non_differentiable(*[o for o in outs if not (o.is_floating_point() or o.is_complex())])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *cts):
        return (None, *ctx.call.backward(ctx.pullback, list(cts), "torch"))


ADAPTER = TorchAdapter()
