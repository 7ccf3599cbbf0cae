"""Every private API of torch, and of CPython, that the torch adapter uses, each behind a name here.

No other module of the package names these. Each is looked up once, guarded, and importing this
module never fails: where this torch lacks one, its name here falls back to public torch (slower,
or more cautious), or raises our error naming the API and what stops working.
docs/adapters.md lists them with the torch versions they were checked on.
"""

from __future__ import annotations

import contextlib
import operator
import sys
from typing import Any

import torch
from torch.autograd import forward_ad

from bf16bridge.core import versions
from bf16bridge.errors import PrivateApiError


def missing(api: str, stops: str) -> PrivateApiError:
    """Our error for a private torch API this torch lacks: names it and what stops working."""
    return versions.private_api_missing("torch", torch.__version__, api, stops)


def _find(root, path: str):
    """``root.a.b`` for ``path`` "a.b", or None where any part is missing."""
    for part in path.split("."):
        root = getattr(root, part, None)
        if root is None:
            return None
    return root


class _Never:
    """A class nothing is an instance of: the stand-in for a torch class this torch lacks."""


# -- DLPack -------------------------------------------------------------------------------

#: a legacy DLPack capsule's import: torch._C._from_dlpack, what torch.from_dlpack ends in for a
#: capsule; where it is missing, torch.from_dlpack itself (which takes a capsule too)
capsule_import = _find(torch._C, "_from_dlpack") or torch.from_dlpack


# -- the profiler and torch._scaled_mm (the fp8 matmul trial) -------------------------------

_PROFILER_ENABLED = _find(torch._C, "_autograd._profiler_enabled")


def profiler_running() -> bool:
    """Whether a torch profiler records now: torch keeps one session at a time, so a trial's own
    profiler would stop the user's."""
    if _PROFILER_ENABLED is None:
        raise missing("torch._C._autograd._profiler_enabled",
                      "whether a profiler of yours runs cannot be told, so the fp8 matmul trial starts none")
    return bool(_PROFILER_ENABLED())


def scaled_mm(a, b, scale):
    """``torch._scaled_mm(a, b)`` with one scale for both, float32 out: torch's fp8 matmul."""
    fn = getattr(torch, "_scaled_mm", None)
    if fn is None:
        raise missing("torch._scaled_mm", "the fp8 matmul trial cannot run")
    return fn(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.float32)


def traced_ops(prof) -> list[tuple[str, list]]:
    """(name, input dtypes) of each op a finished ``torch.profiler.profile`` recorded."""
    results = _find(prof, "profiler.kineto_results")
    if results is None:
        raise missing("torch.profiler.profile().profiler.kineto_results",
                      "the fp8 matmul trial cannot read its own trace")
    return [(e.name(), e.dtypes()) for e in results.events()]


# -- what a tensor is -------------------------------------------------------------------------

#: fake mode's tensor class (shapes, no memory); where torch lacks it, such a tensor is refused
#: by its storage's size, with a less precise message
FAKE_TENSOR: Any = _find(torch, "_subclasses.fake_tensor.FakeTensor") or _Never

if hasattr(forward_ad, "_current_level"):
    def dual_level() -> int:
        """The current forward-mode AD level: -1 outside ``torch.autograd.forward_ad.dual_level``."""
        return forward_ad._current_level
else:  # pragma: no cover - torch 2.13 has it
    def dual_level() -> int:
        """Not known here: taken to be inside a level, so every tensor is asked for its tangent."""
        return 0


def has_tangent(x) -> bool:
    """Whether ``x`` has a forward-mode tangent at the current level."""
    return dual_level() >= 0 and forward_ad.unpack_dual(x).tangent is not None


_FUNCTORCH_ACTIVE = _find(torch._C, "_are_functorch_transforms_active")
_FUNCTORCH_WRAPPED = _find(torch._C, "_functorch.is_functorch_wrapped_tensor")


def functorch_active() -> bool:
    """Whether a torch.func transform (grad, vmap, ...) is active now. False where this torch
    cannot say: its wrappers are then refused when described (their storage cannot be read)."""
    return _FUNCTORCH_ACTIVE is not None and bool(_FUNCTORCH_ACTIVE())


def functorch_wrapped(x) -> bool:
    """Whether torch.func wrapped ``x`` (a plain tensor the transformed function captured is not);
    where this torch cannot tell, every tensor under a transform counts."""
    return True if _FUNCTORCH_WRAPPED is None else bool(_FUNCTORCH_WRAPPED(x))


if hasattr(torch.Tensor, "_version"):
    _VERSION = operator.attrgetter("_version")

    def version_counters(leaves: list) -> list:
        """Each tensor's version counter, which every in-place write bumps; None for an inference
        tensor, which keeps none."""
        try:
            return list(map(_VERSION, leaves))
        except RuntimeError:
            return [None if x.is_inference() else x._version for x in leaves]
else:  # pragma: no cover - torch 2.13 has it
    def version_counters(leaves: list) -> list:
        raise missing("Tensor._version", "a bridged torch function's in-place writes into its inputs cannot be "
                                         "seen; pass copy_inputs=True to bb.bridge")


# -- who holds a tensor's memory (bridge: the results a callee keeps) --------------------------

_USE_COUNT = _find(torch._C, "_storage_Use_Count")


def storage_use_count(storage) -> int | None:
    """How many hold a storage in C++ (the storage object asked holds one); None where this torch
    cannot tell (no torch._C._storage_Use_Count or UntypedStorage._cdata)."""
    cdata = getattr(storage, "_cdata", None)
    return None if _USE_COUNT is None or cdata is None else _USE_COUNT(cdata)


def storage_refs(storage) -> int:
    """Python's reference count of a storage object, as read where a caller holds it in a variable."""
    return sys.getrefcount(storage)


def view_base(x):
    """The tensor ``x`` views (``Tensor._base``); None for no view, or where this torch cannot tell."""
    return getattr(x, "_base", None)


def base_holders(o) -> tuple | None:
    """(o's base, the base's holders in C++: ``Tensor._use_count``, and in Python: its reference
    count), as read here; None for a tensor that is no view, or where this torch cannot tell."""
    base = getattr(o, "_base", None)
    if base is None:
        return None
    try:
        cpp = base._use_count()
    except AttributeError:
        return None
    return base, cpp, sys.getrefcount(base)


_DISABLE_MODES = _find(torch.utils, "_python_dispatch._disable_current_modes")


def no_dispatch_modes() -> contextlib.AbstractContextManager:
    """A context with no torch dispatch mode of the user's active (one that keeps the tensors it
    sees would count as their holder); none to leave where this torch cannot."""
    return _DISABLE_MODES() if _DISABLE_MODES is not None else contextlib.nullcontext()


# -- modules (bb.cast_module) -----------------------------------------------------------------

def apply_to_tensors(model, fn) -> None:
    """``Module._apply(fn)``, what ``Module.to`` runs: parameters keep their identity (optimizers
    still hold them), and modules that keep derived state (RNN's flat weights) redo it."""
    apply = getattr(model, "_apply", None)
    if apply is None:
        raise missing("torch.nn.Module._apply", "bb.cast_module cannot cast a model in place")
    apply(fn)


def own_parameters(m) -> dict:
    """A module's own parameters by name (``Module._parameters``, None entries included), or
    ``named_parameters(recurse=False)`` where this torch keeps no such dict."""
    found = getattr(m, "_parameters", None)
    return found if isinstance(found, dict) else dict(m.named_parameters(recurse=False))


def own_buffers(m) -> dict:
    """A module's own buffers by name (``Module._buffers``), as ``own_parameters``."""
    found = getattr(m, "_buffers", None)
    return found if isinstance(found, dict) else dict(m.named_buffers(recurse=False))


def remove_forward_hooks(m, classes: tuple[type, ...]) -> None:
    """Remove ``m``'s forward pre-hooks and forward hooks that are instances of ``classes``, from
    every dict Module keeps them in (found by class: a handle would not survive a deepcopy)."""
    pre, post = getattr(m, "_forward_pre_hooks", None), getattr(m, "_forward_hooks", None)
    if pre is None or post is None:
        raise missing("torch.nn.Module._forward_pre_hooks and _forward_hooks",
                      "bb.cast_module cannot replace the hooks an earlier cast installed")
    if not (pre or post):
        return
    for hooks, extras in ((pre, (getattr(m, "_forward_pre_hooks_with_kwargs", {}),)),
                          (post, (getattr(m, "_forward_hooks_with_kwargs", {}),
                                  getattr(m, "_forward_hooks_always_called", {})))):
        for k, v in list(hooks.items()):
            if isinstance(v, classes):
                del hooks[k]
                for extra in extras:
                    extra.pop(k, None)


# -- DTensor placements ----------------------------------------------------------------------

def strided_shard():
    """DTensor's strided shard placement class (``placement_types._StridedShard``), or None."""
    from torch.distributed.tensor import placement_types

    return getattr(placement_types, "_StridedShard", None)
