"""``bb.parity.trace``: run two models on bit-identical inputs and name the first layer that goes wrong.

The runs, in order: the float64 copy of the reference side (its layers' outputs kept, as numpy), the
other side (each layer paired and measured as it is made, nothing of it kept), then the reference side
itself where its own error is asked (a layer beyond what depth alone allows) or gradients are. So one
side's activations are held, not two or three. Without a reference the first side's are held and the
second is judged against them. Where a layer fails, the models run again keeping only the inputs and
outputs of that layer and the layers around it (``tracing.locate``): the first divergence is the innermost
of them whose input still agreed. Every framework-specific step is asked of the framework's ``TraceHooks``.
"""

from __future__ import annotations

import math
import numbers
import sys

from bf16bridge.adapters.hooks import TraceHooks
from bf16bridge.core import registry
from bf16bridge.errors import FrameworkNotInstalledError, InvalidArgumentError, UnsupportedTypeError
from bf16bridge.parity import explain
from bf16bridge.parity.tracing import locate
from bf16bridge.parity.tracing.grads import gradients
from bf16bridge.parity.tracing.names import Pairing
from bf16bridge.parity.tracing.report import LayerRow, TraceReport
from bf16bridge.parity.tracing.run import (Side, decided, depths, first_run, input_sqnr, judged_run, reference_run,
                                         side_inputs, wanted_own)


def trace(model_a, model_b, *inputs, frameworks=(None, None), pairs=None, rename=None, pair_by: str = "name",
          reference: str | None = "auto", k: float = explain.DEFAULT_K, grads: bool = False, loss=None,
          grad_pairs=None, layer_inputs: bool = False, seed: int = 0) -> TraceReport:
    """Run ``model_a`` and ``model_b`` on ``inputs`` (any framework's tensors, or numpy: each side gets
    them in its own framework, the same bits) and judge every paired layer's output against what
    rounding explains; the report names the first layer that goes wrong (docs/parity-trace.md).

    ``frameworks``: each model's framework, for plain functions (found by asking each framework's
    hooks otherwise). ``pairs``: {model_a layer: model_b layer}; ``rename``: model_b's layer names to
    model_a's (a function, or a dict of regular expressions to replacements); ``pair_by``: "name" (after
    the default rule: "/" as ".", "blocks_0" as "blocks.0") or "order". ``reference``: "auto" (a float64
    copy of model_a, else of model_b, where its framework makes one), "a", "b" or None (the two sides
    against each other). ``k``: roundings from the exact answer, the default policy's. ``grads``: judge
    each parameter's gradient too, of ``loss`` ((loss_a, loss_b), each a scalar of its model's output)
    or of the output times a fixed random cotangent; ``grad_pairs``: {model_a parameter: model_b's}.
    ``layer_inputs``: trace each layer's input too (its SQNR, and the SQNR each layer loses)."""
    _check(pair_by, reference, k, layer_inputs, grads)
    fa, fb = _frameworks(frameworks)
    a = _side(model_a, fa, "model_a", inputs, True)
    b = _side(model_b, fb, "model_b", inputs, False)
    return run_trace(a, b, inputs, pairs=pairs, rename=rename, pair_by=pair_by, reference=reference, k=k,
                     grads=grads, loss=loss, grad_pairs=grad_pairs, layer_inputs=layer_inputs, seed=seed)


def _check(pair_by, reference, k, layer_inputs, grads) -> None:
    if pair_by not in ("name", "order"):
        raise InvalidArgumentError(f"trace: pair_by must be 'name' or 'order'; got {pair_by!r}")
    if reference not in ("auto", "a", "b", None):
        raise InvalidArgumentError(f"trace: reference must be 'auto', 'a', 'b' or None; got {reference!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Real) or not math.isfinite(k) or k < 1:
        raise InvalidArgumentError(f"trace: k is the roundings allowed from the exact answer, a finite number >= 1; "
                                   f"got {k!r}")
    for flag, value in (("layer_inputs", layer_inputs), ("grads", grads)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"trace: {flag} must be True or False; got {value!r}")


def _frameworks(frameworks) -> tuple:
    if not isinstance(frameworks, (tuple, list)) or len(frameworks) != 2:
        raise InvalidArgumentError(f"trace: frameworks= is a pair (model_a's, model_b's; None: found from the "
                                   f"model); got {frameworks!r}")
    return tuple(None if f is None else registry.resolve(f) for f in frameworks)


def owner(model, what: str) -> str:
    """The framework whose hooks own a model object (asked only of frameworks already imported)."""
    for name in registry.names():
        s = registry.spec(name)
        if s.instance is None and (s.requires or s.name) not in sys.modules:
            continue
        try:
            if registry.hooks(name, TraceHooks).owns(model):
                return name
        except FrameworkNotInstalledError:
            continue
    t = type(model)
    raise UnsupportedTypeError(
        f"trace: {what} is a {t.__module__}.{t.__qualname__}, not a model object of a registered framework (a "
        "torch nn.Module, a flax linen module as (module, variables) or bound, a flax nnx module); for a plain "
        "function, say its framework: frameworks=('torch', 'jax'), and mark its layers with bb.parity.tap")


def _side(model, framework, what: str, inputs: tuple, is_a: bool, widen: bool = False) -> Side:
    if not callable(model) and not isinstance(model, tuple):
        raise UnsupportedTypeError(f"trace: {what} is a {type(model).__qualname__}, which is neither a model nor a "
                                   "function: pass a torch nn.Module, a flax model ((module, variables), bound, or "
                                   "nnx), a Keras model, or a function marking its layers with bb.parity.tap")
    name = framework or owner(model, what)
    return Side(model, name, registry.hooks(name, TraceHooks), side_inputs(inputs, name, widen), is_a)


def _roles(a: Side, b: Side, reference, inputs: tuple) -> tuple[Side, Side, Side | None, str]:
    """(the side run first, the judged side, the float64 copy of the first or None, what it is)."""
    order = {"auto": (a, b), "a": (a,), "b": (b,), None: ()}[reference]
    for first in order:
        copy = first.hooks.float64_copy(first.model)
        if copy is not None:
            other = b if first is a else a
            r = Side(copy, first.framework, first.hooks, side_inputs(inputs, first.framework, widen=True), first.is_a)
            label = "model_a" if first.is_a else "model_b"
            return first, other, r, f"the float64 run of {label} ({first.framework}: a float64 copy of it)"
    if reference in ("a", "b"):
        side = a if reference == "a" else b
        raise InvalidArgumentError(f"trace: reference={reference!r}, but {side.framework} makes no float64 copy of "
                                   f"{type(side.model).__qualname__} here; pass reference='auto' or None")
    why = "reference=None" if reference is None else f"neither {a.framework} nor {b.framework} makes a float64 copy"
    return a, b, None, f"each other: model_b against model_a, no float64 run ({why})"


def run_trace(a: Side, b: Side, inputs: tuple, *, pairs=None, rename=None, pair_by="name", reference="auto",
              k=explain.DEFAULT_K, grads=False, loss=None, grad_pairs=None, layer_inputs=False, seed=0,
              notes: tuple = ()) -> TraceReport:
    """``trace`` on two prepared sides (``trace_cast`` gives each its own inputs)."""
    first, judged, ref, ref_what = _roles(a, b, reference, inputs)
    keep: bool | frozenset = True if layer_inputs else frozenset()
    base = reference_run(ref, keep) if ref is not None else first_run(first, None, k, keep)
    pairing = Pairing(base.order, pairs=pairs, rename=rename, by=pair_by, stored_is_a=first.is_a)
    depth, leaf = depths(base.order)
    rows, col, _ = judged_run(judged, base, pairing, depth, k, keep)
    pairing.check_seen()
    wanted = set(rows) if layer_inputs else wanted_own(rows, depth, k) if ref is not None else set()
    if ref is not None and (wanted or grads):  # the first side itself, where its own error is needed
        first_run(first, base, k, keep, wanted)
    elif ref is not None:
        side = "model_a" if first.is_a else "model_b"
        notes = (*notes, f"{side} ran as its float64 copy only: every layer of the other was within {k:g} roundings "
                         "times sqrt(depth) of it, so its own error was not needed")
    verdicts = decided(rows, base, depth, k)
    layer_rows = []
    for i, name in enumerate(base.order):
        if name not in rows:
            continue
        other, shape, kind, _ = rows[name]
        sq = input_sqnr(base, col, name, other) if layer_inputs else None
        la, lb = (name, other) if first.is_a else (other, name)
        mine = base.meta.get(name, ((), ""))[1]  # "": not run (its float64 copy only)
        da, db = (mine, kind) if first.is_a else (kind, mine)
        layer_rows.append(LayerRow(i, la, lb, shape, da, db, depth[name], verdicts[name], sq, leaf[name]))
    unpaired_first, unpaired_judged = pairing.unpaired_stored(), pairing.unpaired_streamed
    ua, ub = (unpaired_first, unpaired_judged) if first.is_a else (unpaired_judged, unpaired_first)
    divergence = None
    failing = [r for r in layer_rows if not r.passed]
    if failing:
        divergence = locate.locate(failing[0], first, judged, ref, layer_rows, k)
    g = gradients(first, judged, ref, base.output, k=k, loss=loss, grad_pairs=grad_pairs,
                              rename=rename, seed=seed, depth=max(depth.values(), default=1)) if grads else None
    fw = (a.framework, b.framework)
    models = (_model_name(a.model), _model_name(b.model))
    return TraceReport(fw, models, ref_what, float(k), tuple(layer_rows), divergence, tuple(ua), tuple(ub),
                       notes=tuple(notes), **(g or {}))


def _model_name(model) -> str:
    m = model[0] if isinstance(model, tuple) and model else model
    return getattr(m, "__qualname__", None) or type(m).__qualname__
