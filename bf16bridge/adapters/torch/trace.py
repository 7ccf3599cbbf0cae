"""torch's hooks for ``bb.parity.trace``: forward hooks on every submodule of an ``nn.Module``, its
float64 copy, its parameters' gradients by autograd, and a layer run again with a weight transposed."""

from __future__ import annotations

import numpy as np
import torch

from bf16bridge.adapters.hooks import TraceHooks, first_floating
from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError


class TorchTrace(TraceHooks):
    """``bb.parity.trace`` on a torch ``nn.Module`` (or a function of torch tensors, through taps)."""

    name = "torch"

    def owns(self, model):
        return isinstance(model, (torch.nn.Module, Float64))

    def run(self, model, args, record, inputs_of=frozenset()):
        module = model.model if isinstance(model, Float64) else model
        if not isinstance(module, torch.nn.Module):
            with torch.no_grad():
                return model(*args)
        args = _to_device(args, _device(module))
        _refuse_dropout(module)
        handles = []
        try:
            for name, m in module.named_modules():
                if inputs_of is True or name in inputs_of:
                    handles.append(m.register_forward_pre_hook(_Inputs(name, record)))
                handles.append(m.register_forward_hook(_Outputs(name, record)))
            with torch.no_grad():
                return model(*args)
        finally:
            for h in handles:
                h.remove()

    def float64_copy(self, model):
        return Float64(model) if isinstance(model, torch.nn.Module) else None

    def gradients(self, model, args, cotangent, loss=None):
        module = model.model if isinstance(model, Float64) else model
        if not isinstance(module, torch.nn.Module):
            raise UnsupportedTypeError(f"gradients of {type(model).__qualname__}, a plain function: parameters are "
                                       "an nn.Module's; pass the model object, or grads=False")
        args = _to_device(args, _device(module))
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if isinstance(model, Float64):
            named = [(n, model.tensors[n].clone().requires_grad_()) for n, _ in named]
        with torch.enable_grad():
            out = model(*args) if not isinstance(model, Float64) else model.call(dict(named), args)
            if loss is not None:
                target, wanted = loss(out), None
            else:
                target = first_floating(out, _floating)
                if target is None:
                    raise UnsupportedTypeError(f"the model's output ({type(out).__qualname__}) holds no floating "
                                               "tensor to take gradients of: pass loss= (a scalar of the output)")
                wanted = torch.from_numpy(np.ascontiguousarray(cotangent)).to(target.device, target.dtype)
            grads = torch.autograd.grad(target, [p for _, p in named], grad_outputs=wanted, allow_unused=True)
        return [(n, p.detach(), None if g is None else g.detach()) for (n, p), g in zip(named, grads)]

    def layer_variants(self, model, layer, args):
        module = model.model if isinstance(model, Float64) else model
        if not isinstance(module, torch.nn.Module):
            return {}
        try:
            sub = module.get_submodule(layer)
        except AttributeError:
            return {}
        own = {n: model.of[id(p)] if isinstance(model, Float64) else p.detach()
               for n, p in sub.named_parameters(recurse=False)}
        out = {}
        for pname, p in own.items():
            if p.ndim == 2 and p.shape[0] == p.shape[1]:
                with torch.no_grad():
                    out[f"{pname} transposed"] = torch.func.functional_call(sub, {**own, pname: p.T}, args)
        return out


class Float64:
    """A model run in float64: its floating parameters and buffers widened (exactly) and swapped in for
    the call (``torch.func.functional_call``), the model itself untouched and not copied."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.tensors, self.of = {}, {}  # by name (a tied tensor under its first name), and by the original's id
        for n, t in [*model.named_parameters(), *model.named_buffers()]:
            self.tensors[n] = self.of[id(t)] = t.detach().to(torch.float64) if t.is_floating_point() else t

    def __call__(self, *args):
        return torch.func.functional_call(self.model, self.tensors, args)

    def call(self, replaced: dict, args: tuple):
        """The model run on ``args`` with ``replaced`` ({name: tensor}) in place of those of its float64 tensors."""
        return torch.func.functional_call(self.model, {**self.tensors, **replaced}, args)


class _Outputs:
    """A forward hook handing a module's output to the trace."""

    def __init__(self, name: str, record):
        self.name, self.record = name, record

    def __call__(self, module, args, output):
        self.record(self.name, "output", output)


class _Inputs:
    """A forward pre-hook handing a module's positional arguments to the trace."""

    def __init__(self, name: str, record):
        self.name, self.record = name, record

    def __call__(self, module, args):
        self.record(self.name, "input", args)


_DROPOUT = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
            torch.nn.FeatureAlphaDropout)


def _refuse_dropout(module: torch.nn.Module) -> None:
    """A model in training mode with an active dropout gives other numbers on every run: refused."""
    for name, m in module.named_modules():
        if m.training and isinstance(m, _DROPOUT) and m.p > 0:
            raise InvalidArgumentError(f"{type(module).__qualname__} is in training mode and its dropout "
                                       f"{name!r} drops at random, so two runs differ by chance: call model.eval() "
                                       "before tracing it")


def _device(model) -> torch.device | None:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return None


def _to_device(args: tuple, device) -> tuple:
    """The model's inputs on its device (the trace makes them on the host)."""
    if device is None or device.type == "cpu":
        return args
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def _floating(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


HOOKS = TorchTrace()
