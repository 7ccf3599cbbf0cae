"""torch's hooks for casting models (``bb.cast_module``): an ``nn.Module``'s modules and their own
tensors, the in-place cast, and the forward hooks that cast a kept module's inputs and outputs."""

from __future__ import annotations

import torch

from bf16bridge.adapters.hooks import CastHooks, Submodule
from bf16bridge.adapters.torch import internals, probe
from bf16bridge.errors import UnsupportedTypeError


class TorchCast(CastHooks):
    """``bb.cast_module`` on a torch ``nn.Module``."""

    name = "torch"

    def submodules(self, model):
        if not isinstance(model, torch.nn.Module):
            return None
        out = []
        names: dict[tuple[type, ...], tuple[str, ...]] = {}
        for name, m in model.named_modules():
            # a module's own, as named_parameters/named_buffers(recurse=False) give them, read off
            # the dicts Module._apply walks
            params = _own(internals.own_parameters(m))
            buffers = _own(internals.own_buffers(m))
            lazy = [k for k, v in params + buffers if torch.nn.parameter.is_lazy(v)]
            if lazy:  # (Module.to casts them when they are made; a report of their bytes cannot be)
                raise UnsupportedTypeError(
                    f"{'.'.join(filter(None, (name, lazy[0])))} is not made yet (a lazy module's, "
                    f"{type(m).__qualname__}): run one forward pass first, then cast the model")
            classes = type(m).__mro__
            if classes not in names:
                names[classes] = tuple(c.__name__ for c in classes)
            out.append(Submodule(name, names[classes], classes, params + buffers, len(params)))
        return out

    def cast_module(self, model, plan, hooks):
        held = probe.to_torch()
        to = {}
        for m in model.modules():
            internals.remove_forward_hooks(m, (_CastInputs, _CastOutputs))
            for p in internals.own_parameters(m).values():
                if p is not None and id(p) in plan and p.grad is not None:
                    to[id(p.grad)] = held[plan[id(p)]]  # a gradient follows its parameter
        to.update({k: held[v] for k, v in plan.items()})

        def fn(t):
            dt = to.get(id(t))
            return t if dt is None else t.to(dt)

        internals.apply_to_tensors(model, fn)
        for name, compute, output in hooks:
            m = model.get_submodule(name)
            m.register_forward_pre_hook(_CastInputs(held[compute]), with_kwargs=True)
            m.register_forward_hook(_CastOutputs(held[output]))


def _own(members: dict) -> tuple:
    """A module's own parameters or buffers (a dict of them by name) as (name, tensor) pairs, as
    ``named_parameters(recurse=False)`` gives them: None and a second name for one tensor left out."""
    seen: set[int] = set()
    out = []
    for k, v in members.items():
        if v is not None and id(v) not in seen:
            seen.add(id(v))
            out.append((k, v))
    return tuple(out)


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


HOOKS = TorchCast()
