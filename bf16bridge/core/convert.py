"""convert(), plan(), to_numpy() ...: plan a route, run it, check it, and say what it means."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, overload

from bf16bridge.core import fastpath, registry
from bf16bridge.core.adapter import UnalignedImport
from bf16bridge.core.autograph import plain_python
from bf16bridge.core.warn import say
from bf16bridge.errors import CopyRequiredError, InvalidArgumentError, UnsupportedTypeError

if TYPE_CHECKING:
    import jax
    import numpy as np
    import tensorflow as tf
    import torch

    from bf16bridge.core.adapter import Source
    from bf16bridge.core.plan import Plan

#: the registered framework names and aliases (others can be registered: any str is taken)
Target = Literal["numpy", "np", "torch", "pt", "pytorch", "jax", "tensorflow", "tf", "keras"]
Fallback = Literal["error", "float32", "bits", "auto"]
#: what to do when the result would be a writable alias of memory its owner treats as
#: read-only or immutable (a torch tensor over a jax or tensorflow buffer)
OnAlias = Literal["warn", "copy", "error", "allow"]
#: what to do when the input takes part in autodiff (a torch tensor that requires grad, a tf
#: tensor a gradient tape watches): its data crosses, its gradient does not
OnGrad = Literal["warn", "error", "drop"]
ON_ALIAS = ("warn", "copy", "error", "allow")
ON_GRAD = ("warn", "error", "drop")


def _planner():
    """The planner, imported on first use: ``import bf16bridge`` does not load it."""
    from bf16bridge.core import planner

    return planner


def _describe(x, to) -> tuple[str, str, Source]:
    """(source, target, Source) of ``x``; a wrapper that holds a tensor in ``.value`` (a
    keras.Variable, an nnx.Param) is described by that tensor (``Source.value``)."""
    try:
        source = registry.framework_of(x)
    except UnsupportedTypeError:
        inner = registry.unwrap(x)
        if inner is None:
            raise
        x = inner
        source = registry.framework_of(x)
    target = registry.resolve(to)
    # a missing target framework fails here, naming its pip extra
    src_a, dst_a = registry.get(source), registry.get(target)
    # reading the buffer's alignment can cost: only where a route may depend on it
    alignment = dst_a.dlpack_unaligned != "ok" or not src_a.kernels_unaligned
    return source, target, src_a.describe(x, alignment=alignment)


def check_keywords(copy, fallback, for_compute, on_alias, on_grad) -> None:
    """Refuse keyword values outside their choices (our InvalidArgumentError, naming them)."""
    _planner().check_args(copy, fallback, for_compute)
    if on_alias not in ON_ALIAS:
        raise InvalidArgumentError(f"on_alias must be one of {', '.join(map(repr, ON_ALIAS))}; got {on_alias!r}")
    if on_grad not in ON_GRAD:
        raise InvalidArgumentError(f"on_grad must be one of {', '.join(map(repr, ON_GRAD))}; got {on_grad!r}")
    if on_alias == "copy" and copy is False:
        raise InvalidArgumentError("on_alias='copy' asks for a copy that copy=False forbids; choose one")


@plain_python
def plan(x, to: Target | str, *, copy: bool | None = None, fallback: Fallback = "error",
         for_compute: bool = False) -> Plan:
    """What ``convert(x, to, ...)`` with the same keywords would do, without doing it (a
    ``keras.Variable`` or ``nnx.Param``: for the tensor it holds, as convert converts it).

    ``Plan.alias`` and ``Plan.drops_grad`` say what ``convert`` would warn about.
    """
    check_keywords(copy, fallback, for_compute, "warn", "warn")
    source, target, src = _describe(x, to)
    return _planner().plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute)


@overload
def convert(x, to: Literal["numpy", "np"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> np.ndarray: ...
@overload
def convert(x, to: Literal["torch", "pt", "pytorch"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> torch.Tensor: ...
@overload
def convert(x, to: Literal["jax"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> jax.Array: ...
@overload
def convert(x, to: Literal["tensorflow", "tf"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> tf.Tensor: ...
@overload
def convert(x, to: str, *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> Any: ...
@plain_python
def convert(x, to, *, copy=None, fallback="error", for_compute=False, on_alias="warn", on_grad="warn"):
    """Move tensor ``x`` to framework ``to`` ("numpy", "torch", "jax", "tensorflow" or an alias).

    bf16 stays bf16 bit for bit, like every other dtype both sides hold.
    ``copy=None``: zero-copy where the route allows, a copy otherwise;
    ``copy=True``: always a fresh copy; ``copy=False``: zero-copy or CopyRequiredError.
    ``fallback`` decides what happens when the target cannot hold bf16: "error"
    (default), "float32" (exact widening), "bits" (raw uint16), or "auto": the
    capability probe chooses (bf16 where the target holds it, float32 where it
    cannot, and with ``for_compute=True`` float32 where the hardware has no bf16
    arithmetic); for a 64-bit integer the target cannot hold (jax without x64) "auto"
    narrows it to 32 bits where every value fits, and raises our error where one does
    not. ``plan(x, to, ...)`` shows the route, the decision and its
    reason, and whether the result shares memory and is writable.

    What the plan knows that matters is said, not left silent:
    ``on_alias`` ("warn", "copy", "error", "allow") chooses what happens when the
    result would be writable over memory its owner treats as immutable or read-only
    (jax or tensorflow -> torch, zero-copy); ``on_grad`` ("warn", "error", "drop")
    when the input takes part in autodiff (a torch tensor that requires grad, a tf
    tensor an active gradient tape watches), whose gradient does not cross.
    Warnings are ``Bf16BridgeWarning``, raised as ``warnings.warn`` does, at the caller's line.
    """
    # the hot path: an input of a kind seen before with these keywords runs its cached plan
    fast = fastpath.plans(type(x), to, copy, fallback, for_compute, on_alias, on_grad)
    if fast is not None:
        hit = fast.find(x, None if fast.state is None else fast.state())
        if hit is not None:
            run, messages = hit
            try:
                y = run(x)
            except UnalignedImport:  # a key without the alignment, whose import refused: planned afresh
                return _convert(x, to, copy, fallback, for_compute, on_alias, on_grad)
            if messages is not None:
                for message in messages:
                    say(message)
            return y
    return _convert(x, to, copy, fallback, for_compute, on_alias, on_grad)


def _convert(x, to, copy, fallback, for_compute, on_alias, on_grad):
    """The full path: describe, plan (and keep the plan where the fast path may run it), say, run."""
    check_keywords(copy, fallback, for_compute, on_alias, on_grad)
    source, target, src = _describe(x, to)  # src.value: the tensor a keras.Variable or nnx.Param holds
    p = _planner().plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute)
    # kept where the input stays as it is (not a wrapper's value; a torch tensor that drops its grad is
    # detached) and the call goes on as it will next time (no refusal, no copy instead)
    if (not p.copies and src.value is x and not (p.drops_grad and on_grad == "error") and on_alias != "copy"
            and not (p.alias is not None and on_alias == "error")):
        fastpath.remember(x, (to, copy, fallback, for_compute, on_alias, on_grad), p, _runner(p, copy),
                          _messages(p, on_alias, on_grad))
    if p.drops_grad and on_grad != "drop":
        if on_grad == "error":
            raise UnsupportedTypeError(f"{_grad_why(p)}; pass on_grad='drop' to detach, or use bb.bridge for gradients")
        say(_grad_message(p), 2)
    if p.alias is not None and on_alias != "allow":
        if on_alias == "copy":
            p = _planner().plan_for(src, source, target, copy=True, fallback=fallback, for_compute=for_compute)
        elif on_alias == "error":
            raise CopyRequiredError(f"{p.alias}; on_alias='error' refuses it: pass on_alias='copy'")
        else:
            say(_alias_message(p), 2)
    try:
        return _run(p, src.value, copy)
    except UnalignedImport:
        # the source described a buffer as aligned that the target's import found was not (a
        # framework's small or empty tensor over memory it did not allocate): planned as unaligned
        p = _planner().plan_for(src._replace(aligned=False), source, target, copy=copy, fallback=fallback,
                             for_compute=for_compute)
        return _run(p, src.value, copy)


def _runner(p: Plan, copy) -> Callable[[Any], Any]:
    """Plan ``p`` as one function for the fast path: its steps' own functions (and the read-only
    mark) chained, or ``_run`` where copy=False must check a pointer."""
    if copy is False and any(step.verify for step in p.steps):
        return lambda x: _run(p, x, False)
    runs = tuple(step.run for step in p.steps)
    dst = registry.get(p.target)
    if not p.writable and dst.marks_readonly:
        runs += (dst.mark_readonly,)
    return fastpath.chained(runs)


def _messages(p: Plan, on_alias, on_grad) -> tuple:
    """What a conversion planned as ``p`` warns with these keywords, in order."""
    return (((_grad_message(p),) if p.drops_grad and on_grad == "warn" else ())
            + ((_alias_message(p),) if p.alias is not None and on_alias == "warn" else ()))


def _grad_why(p: Plan) -> str:
    return (f"this {p.source} tensor {registry.get(p.source).grad_words}; its data crosses to {p.target} "
            "detached and its gradient does not cross")


def _grad_message(p: Plan) -> str:
    return f"{_grad_why(p)} (on_grad='drop' silences this; on_grad='error' refuses)"


def _alias_message(p: Plan) -> str:
    return f"{p.alias} (on_alias='allow' silences this; 'copy' or 'error' avoid it)"


def run_plan(p: Plan, x, copy: bool | None):
    """Run ``p``, which ``plan(x, ..., copy=copy)`` made for this very ``x``, and which warns of
    nothing (no alias, no dropped gradient): for a caller that planned already (Checkpoint.get)."""
    return _run(p, x, copy)


def _run(p: Plan, value, copy):
    here = p.source
    for step in p.steps:
        out = step.run(value)  # type: ignore[misc]
        if step.verify and not step.copies and p.nbytes and copy is False:
            # the framework decides whether it copies; check, so copy=False is never a lie
            before = registry.get(here).data_ptr(value)
            after = registry.get(step.framework).data_ptr(out)
            if before != after:
                raise CopyRequiredError(
                    f"copy=False, but {step.label} copied this {p.source} input; pass copy=None to allow it"
                )
        value, here = out, step.framework
    dst = registry.get(p.target)
    if not p.writable and dst.marks_readonly:
        # an empty result may come back writable from a framework that had nothing to share
        value = dst.mark_readonly(value)
    return value


@plain_python
def to_numpy(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
             on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> np.ndarray:
    """``convert(x, "numpy", ...)``"""
    return convert(x, "numpy", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)


@plain_python
def to_torch(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
             on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> torch.Tensor:
    """``convert(x, "torch", ...)``"""
    return convert(x, "torch", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)


@plain_python
def to_jax(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
           on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> jax.Array:
    """``convert(x, "jax", ...)``"""
    return convert(x, "jax", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)


@plain_python
def to_tensorflow(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
                  on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> tf.Tensor:
    """``convert(x, "tensorflow", ...)``"""
    return convert(x, "tensorflow", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)
