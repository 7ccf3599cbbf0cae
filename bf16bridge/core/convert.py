"""convert(), plan(), to_numpy() ...: plan a route, run it, check it, and say what it means."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Literal, overload

from bf16bridge.core import fastpath, registry
from bf16bridge.core.adapter import StalePlan, UnalignedImport
from bf16bridge.core.autograph import plain_python
from bf16bridge.core.warn import Once, say
from bf16bridge.errors import Bf16BridgeError, CopyRequiredError, InvalidArgumentError, UnsupportedTypeError

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
#: ``device=``: a device name in any framework's spelling ("cpu", "cuda:0", "gpu:0", "/GPU:0"), or a
#: device object of the target framework (torch.device, jax.Device, tf.DeviceSpec); None: where the
#: route puts the result
Device = Any


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


def find_device(target: str, device) -> str | None:
    """The target framework's name of the device ``device=`` names, or None for None; our DeviceError
    listing the devices it has otherwise (``Adapter.find_device``)."""
    return None if device is None else registry.get(target).find_device(device)


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
         for_compute: bool = False, device: Device = None) -> Plan:
    """What ``convert(x, to, ...)`` with the same keywords would do, without doing it (a
    ``keras.Variable`` or ``nnx.Param``: for the tensor it holds, as convert converts it).

    ``Plan.alias`` and ``Plan.drops_grad`` say what ``convert`` would warn about; ``Plan.to_device``
    and a "place" step the move to the device asked for.
    """
    check_keywords(copy, fallback, for_compute, "warn", "warn")
    source, target, src = _describe(x, to)
    return _planner().plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute,
                               device=find_device(target, device))


@overload
def convert(x, to: Literal["numpy", "np"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...,
            device: Device = ...) -> np.ndarray: ...
@overload
def convert(x, to: Literal["torch", "pt", "pytorch"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...,
            device: Device = ...) -> torch.Tensor: ...
@overload
def convert(x, to: Literal["jax"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...,
            device: Device = ...) -> jax.Array: ...
@overload
def convert(x, to: Literal["tensorflow", "tf"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...,
            device: Device = ...) -> tf.Tensor: ...
@overload
def convert(x, to: str, *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...,
            device: Device = ...) -> Any: ...
@plain_python
def convert(x, to, *, copy=None, fallback="error", for_compute=False, on_alias="warn", on_grad="warn",
            device=None):
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
    Warnings are ``Bf16BridgeWarning``, raised as ``warnings.warn`` does, at the caller's line; the
    alias warning is said once per process for each kind of alias.

    ``device``: the result lands on this device, as part of the route (one copy, a "place" step of
    the plan; none where the data is there already): "cpu", "cuda:0" (or "gpu:0", tensorflow's
    "/GPU:0": the same GPU in every framework), or a device object of the target framework
    (``torch.device``, ``jax.Device``, a tensorflow ``DeviceSpec``); a device the target framework
    does not have here is our ``DeviceError``, listing those it has. None (default): where the
    route puts it (the input's device).
    """
    # the hot path: an input of a kind seen before with these keywords runs its cached plan
    fast = fastpath.plans(type(x), to, copy, fallback, for_compute, on_alias, on_grad, device)
    if fast is not None:
        k = fast.fast_key(x, fast.alignment)  # (Plans.find, without its frame)
        hit = None if k is None else fast.plans.get(k if fast.state is None else (k, fast.state()))
        if hit is not None:
            run, messages = hit
            try:
                y = run(x)
            except UnalignedImport:  # a key without the alignment, whose import refused: planned afresh
                return _convert(x, to, copy, fallback, for_compute, on_alias, on_grad, device)
            if messages is not None:
                for message in messages:
                    say(message)
            return y
    return _convert(x, to, copy, fallback, for_compute, on_alias, on_grad, device)


def convert_into(out: list, xs, to, copy, fallback, on_alias, on_grad) -> list:
    """``out`` with ``convert(x, to, copy=copy, fallback=fallback, on_alias=on_alias, on_grad=on_grad)``
    of each of ``xs`` appended (a bridged call's leaves): the fast path's lookup once for a run of leaves of
    one type (the adapters' state does not change between them). An error stops it: ``len(out)`` says
    which leaf raised."""
    t = fast = state = None
    for x in xs:
        if type(x) is not t:
            t = type(x)
            fast = fastpath.plans(t, to, copy, fallback, False, on_alias, on_grad, None)
            state = None if fast is None or fast.state is None else fast.state()
        if fast is not None:
            k = fast.fast_key(x, fast.alignment)
            hit = None if k is None else fast.plans.get(k if fast.state is None else (k, state))
            if hit is not None:
                run, messages = hit
                try:
                    out.append(run(x))
                except UnalignedImport:  # (as in convert)
                    out.append(_convert(x, to, copy, fallback, False, on_alias, on_grad, None))
                    continue
                if messages is not None:
                    for message in messages:
                        say(message)
                continue
        out.append(_convert(x, to, copy, fallback, False, on_alias, on_grad, None))
    return out


def _convert(x, to, copy, fallback, for_compute, on_alias, on_grad, device):
    """The full path: describe, plan (and keep the plan where the fast path may run it), say, run."""
    check_keywords(copy, fallback, for_compute, on_alias, on_grad)
    source, target, src = _describe(x, to)  # src.value: the tensor a keras.Variable or nnx.Param holds
    where = find_device(target, device)
    p = _planner().plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute,
                            device=where)
    # kept where the input stays as it is (not a wrapper's value), or becomes its value by the adapter's
    # kept_value (a torch tensor detached, restrided: run first), and the call goes on as it will next time
    # (no refusal, no copy instead), and where device= names the same device every time; once it ran as planned
    first = None if src.value is x or registry.framework_of_type(type(x)) != source else (
        registry.get(source).kept_value(x, src))
    # a plan that copies is kept too (each run copies afresh, sized as the planner sized it), but not a move
    # to a device
    keep = ((not p.copies or (copy is not False and p.to_device is None)) and (src.value is x or first is not None)
            and not (p.drops_grad and on_grad == "error") and on_alias != "copy"
            and not (p.alias is not None and on_alias == "error")
            and (device is None or registry.get(target).fixed_device(device)))
    if p.drops_grad and on_grad != "drop":
        if on_grad == "error":
            raise UnsupportedTypeError(f"{_grad_why(p)}; pass on_grad='drop' to detach, or use bb.bridge for gradients")
        say(_grad_message(p), 2)
    if p.alias is not None and on_alias != "allow":
        if on_alias == "copy":
            p = _planner().plan_for(src, source, target, copy=True, fallback=fallback, for_compute=for_compute,
                                    device=where)
        elif on_alias == "error":
            raise CopyRequiredError(f"{p.alias}; on_alias='error' refuses it: pass on_alias='copy'")
        else:
            say(alias_warning(p), 2)
    try:
        y, as_planned = _ran(p, src.value, copy)
    except UnalignedImport as err:
        return _unaligned(p, err, src, copy, fallback, for_compute, where)
    # (a plan whose step copied unforeseen is not kept: each call says so); a copying plan's key reads the
    # alignment only where the plan depends on it, and only where the source reads it cheaply
    if keep and as_planned:
        aligned = p.copies and _alignment_matters(src, source, target, copy, fallback, for_compute, where)
        if not aligned or registry.get(source).alignment_cheap:
            _remember(x, (to, copy, fallback, for_compute, on_alias, on_grad, device), p, src, first,
                      aligned if p.copies else None)
    return y


def _remember(x, key: tuple, p: Plan, src: Source, first, aligned: bool | None) -> None:
    """Keep ``p`` for the fast path (``fastpath.remember``), run after ``first`` (``kept_value``) and the
    planner's size checks where a later input of the key could fail them."""
    from bf16bridge.core.checks import size_guard  # (with the planner: not at import)

    sized = size_guard(src, p.source, p.target, p.steps, registry.get(p.source).shape_dtype)
    if sized is not None:
        first = sized if first is None else fastpath.chained((sized, first))
    copy, on_alias, on_grad = key[1], key[4], key[5]
    fastpath.remember(x, key, p, _runner(p, copy, first), _messages(p, on_alias, on_grad), aligned)


def _alignment_matters(src: Source, source, target, copy, fallback, for_compute, where) -> bool:
    """Whether the plan for ``src`` would differ for an input of the other alignment (asked of a plan that
    copies: a copy for the layout makes a buffer of its own, which later steps take whatever the input's
    alignment was). Asked on each call of an input whose plan is not kept: the answer is kept per kind."""
    args = (src._replace(value=None, shape=(), nbytes=0, owner=None), source, target, copy, fallback, for_compute,
            where, registry.get(source).state(), registry.get(target).state())
    try:
        return _steps_differ_by_alignment(*args)
    except TypeError:  # an unhashable device object: asked afresh
        return _steps_differ_by_alignment.__wrapped__(*args)


@functools.lru_cache(maxsize=256)
def _steps_differ_by_alignment(src: Source, source, target, copy, fallback, for_compute, where, *state) -> bool:
    # (the adapters' state in the arguments: jax's x64 flag changes a route)
    def steps(aligned: bool) -> list:
        p = _planner().plan_for(src._replace(aligned=aligned), source, target, copy=copy, fallback=fallback,
                                for_compute=for_compute, device=where)
        return [(s.kind, s.framework, s.label, s.dtype, s.copies) for s in p.steps]  # (not why: the reason's words)

    try:
        return steps(True) != steps(False)
    except Bf16BridgeError:
        return True


def _unaligned(p: Plan, err: UnalignedImport, src: Source, copy, fallback, for_compute, where):
    """The target's import refused a buffer its source described as aligned (a framework's small or
    empty tensor over memory it did not allocate), or its strides (``StalePlan``: a jax array in an
    order this jax does not report): planned and run as unaligned, which copies it first. The strides'
    refusal is refused under copy=False, and said where ``p`` promised shared memory."""
    stale, why = isinstance(err, StalePlan), str(err).partition(";")[0]
    if copy is False and stale:
        raise CopyRequiredError(f"copy=False, but {why}: it must be copied; pass copy=None to allow it") from err
    q = _planner().plan_for(src._replace(aligned=False), p.source, p.target, copy=copy, fallback=fallback,
                            for_compute=for_compute, device=where)
    if stale and p.shares_memory and not q.shares_memory:
        say(f"{p.source} -> {p.target} copied this input although the plan said zero-copy: {why}")
    return _run(q, src.value, copy)


def _runner(p: Plan, copy, first: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """Plan ``p`` as one function for the fast path: its steps' own functions (the device's check, and
    the read-only mark) chained, or ``_run`` where copy=False must check a pointer (a step whose copying
    the framework decides; the device). Under copy=None the plan ran as planned on the input it was
    made for, and inputs of its key are taken to run alike: the hot path reads no pointer. ``first``:
    what gives the plan's input from the caller's (``Adapter.kept_value``), run before the rest."""
    if copy is False and (p.to_device is not None or any(step.verify for step in p.steps)):
        run = functools.partial(_run, p, copy=False, kept=True)
        return run if first is None else fastpath.chained((first, run))
    # a step with a cheap test of sharing is tested (copy=None: its key may serve an input it copies)
    runs = tuple(_sharing(step) if step.shares is not None and copy is None and not step.copies and p.nbytes
                 else _replanning(step) if step.by_dtype else step.run for step in p.steps)
    if first is not None:
        runs = (first, *runs)
    dst = registry.get(p.target)
    check = _unplaced(p)
    if check is not None:
        runs += (functools.partial(dst.place, device=check),)
    if not p.writable and dst.marks_readonly:
        runs += (dst.mark_readonly,)
    return fastpath.chained(runs)


def _sharing(step) -> Callable[[Any], Any]:
    """``step.run``, raising ``StalePlan`` (the full path plans the input afresh) where its result
    does not share the input's memory, by ``step.shares``."""
    run, shares = step.run, step.shares

    def sharing(x):
        out = run(x)
        if not shares(out):
            raise StalePlan(f"{step.label} copied this input, which the kept plan took to share memory")
        return out

    return sharing


def _replanning(step) -> Callable[[Any], Any]:
    """``step.run`` (a copy decided by the dtype: packing), raising ``StalePlan`` where it refuses an input
    its plan's key took in (a 0-d array to unpack, an odd last dimension to pack, a byte packing would
    change): the full path plans that input afresh and says what is wrong in the planner's words."""
    run, label = step.run, step.label

    def replanning(x):
        try:
            return run(x)
        except Bf16BridgeError as err:
            raise StalePlan(f"{label} refused this input, which the kept plan took in: {err}") from err

    return replanning


def _unplaced(p: Plan) -> str | None:
    """The device ``p`` asks for where it has no step moving the result there (the route leaves it
    there, which the run checks: ``Adapter.place`` hands back a tensor already there as it is), else None."""
    return None if p.steps and p.steps[-1].kind == "place" else p.to_device


def _messages(p: Plan, on_alias, on_grad) -> tuple:
    """What a conversion planned as ``p`` warns with these keywords, in order."""
    return (((_grad_message(p),) if p.drops_grad and on_grad == "warn" else ())
            + ((alias_warning(p),) if p.alias is not None and on_alias == "warn" else ()))


def _grad_why(p: Plan) -> str:
    return (f"this {p.source} tensor {registry.get(p.source).grad_words}; its data crosses to {p.target} "
            "detached and its gradient does not cross")


def _grad_message(p: Plan) -> str:
    return f"{_grad_why(p)} (on_grad='drop' silences this; on_grad='error' refuses)"


def alias_warning(p: Plan) -> Once:
    """The alias warning, one line, said once per process for each kind (source, target, owner):
    the first clause of ``Plan.alias`` (``bb.plan(x, to).alias`` says the rest) and the way out."""
    head = (p.alias or "").partition(": ")[0]
    return Once(f"{head}; said once per process (on_alias='copy' copies, 'allow' silences; "
                "bb.plan(x, to).alias says more)")


def run_plan(p: Plan, x, copy: bool | None):
    """Run ``p``, which ``plan(x, ..., copy=copy)`` made for this very ``x``, and which warns of
    nothing (no alias, no dropped gradient): for a caller that planned already (Checkpoint.get)."""
    return _run(p, x, copy)


def _run(p: Plan, value, copy, kept: bool = False):
    """Run ``p``'s steps on ``value``. Where the framework decides whether a step copies, the pointers
    are compared (unless copy=True), so a copy the plan did not foresee is never silent: refused under
    copy=False, said under copy=None. ``kept``: ``p`` is the fast path's plan for another input of
    this kind, and such a copy sends this input to the full path (``StalePlan``)."""
    return _ran(p, value, copy, kept)[0]


def _ran(p: Plan, value, copy, kept: bool = False) -> tuple[Any, bool]:
    """``_run``'s result, and whether every step copied as planned (False: one copied unforeseen, said)."""
    here, as_planned = p.source, True
    for step in p.steps:
        out = step.run(value)  # type: ignore[misc]
        if (step.verify and not step.copies and p.nbytes and copy is not True
                and registry.get(here).data_ptr(value) != registry.get(step.framework).data_ptr(out)):
            _copied_unplanned(p, step, copy, kept)
            as_planned = False
        value, here = out, step.framework
    dst = registry.get(p.target)
    check = _unplaced(p)
    if check is not None:
        placed = dst.place(value, check)
        if placed is not value and copy is False:
            raise CopyRequiredError(f"copy=False, but this {p.target} result was not on {check}, which "
                                    "device= asks for, and moving it there copies; pass copy=None to allow it")
        value = placed
    if not p.writable and dst.marks_readonly:
        # an empty result may come back writable from a framework that had nothing to share
        value = dst.mark_readonly(value)
    return value, as_planned


def _copied_unplanned(p: Plan, step, copy, kept: bool) -> None:
    """A step planned zero-copy copied: a kept plan's input is planned afresh (the full path), copy=False
    refuses, copy=None says so where the plan promised shared memory."""
    if kept:
        raise StalePlan(f"{step.label} copied this {p.source} input, which the kept plan took to share memory")
    if copy is False:
        raise CopyRequiredError(f"copy=False, but {step.label} copied this {p.source} input; pass copy=None to allow it")
    if p.shares_memory:
        say(f"{step.label} copied this {p.source} input although the plan said zero-copy: the {p.target} result "
            "does not share its memory (copy=True asks for the copy, copy=False refuses it)")


@plain_python
def to_numpy(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
             on_alias: OnAlias = "warn", on_grad: OnGrad = "warn", device: Device = None) -> np.ndarray:
    """``convert(x, "numpy", ...)``"""
    return convert(x, "numpy", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad, device=device)


@plain_python
def to_torch(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
             on_alias: OnAlias = "warn", on_grad: OnGrad = "warn", device: Device = None) -> torch.Tensor:
    """``convert(x, "torch", ...)``"""
    return convert(x, "torch", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad, device=device)


@plain_python
def to_jax(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
           on_alias: OnAlias = "warn", on_grad: OnGrad = "warn", device: Device = None) -> jax.Array:
    """``convert(x, "jax", ...)``"""
    return convert(x, "jax", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad, device=device)


@plain_python
def to_tensorflow(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
                  on_alias: OnAlias = "warn", on_grad: OnGrad = "warn", device: Device = None) -> tf.Tensor:
    """``convert(x, "tensorflow", ...)``"""
    return convert(x, "tensorflow", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad, device=device)


registry.on_change(_steps_differ_by_alignment.cache_clear)
