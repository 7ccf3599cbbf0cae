"""``bb.parity.trace_cast``: a model against its own cast copy (``bb.cast_module``), layer by layer: the
SQNR of each layer's output and of its input, the layer that loses the most, and whether keeping that
layer in float32 fixes the end result (the cast made again with it kept, and the output judged)."""

from __future__ import annotations

import re

import numpy as np

from bf16bridge.adapters.hooks import TraceHooks
from bf16bridge.casting.module import cast_module
from bf16bridge.core import registry
from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import explain, metrics
from bf16bridge.parity.tracing import judge
from bf16bridge.parity.tracing.api import owner, run_trace
from bf16bridge.parity.tracing.report import CastFix, LayerRow, TraceReport
from bf16bridge.parity.tracing.run import Side, side_inputs
from bf16bridge.trees.walk import map_leaves


def _rounded_inputs(inputs: tuple, dtype: str) -> tuple[tuple, tuple]:
    """(the floating inputs rounded to ``dtype``; the same values in each input's own dtype): both models
    see the same values, the cast one in its dtype."""
    def narrow(x, path):
        arr = metrics.ensure_numpy(x)
        return metrics.rounded(np.ascontiguousarray(arr), dtype) if judge.floating(arr) else arr

    def wide(x, path):
        arr = metrics.ensure_numpy(x)
        if not judge.floating(arr):
            return arr
        return metrics.to_float64(metrics.rounded(np.ascontiguousarray(arr), dtype)).astype(arr.dtype)
    return tuple(map_leaves(narrow, tuple(inputs))), tuple(map_leaves(wide, tuple(inputs)))


def _end(rep: TraceReport) -> LayerRow | None:
    """The model's output row (the last row where the model itself is not a traced layer)."""
    return next((r for r in rep.layers if r.layer_a == ""), rep.layers[-1] if rep.layers else None)


def trace_cast(model, *inputs, dtype="bfloat16", fix: bool = True, k: float = explain.DEFAULT_K,
               **cast_kwargs) -> TraceReport:
    """``model`` (float32) against ``bb.cast_module(model, dtype, inplace=False, **cast_kwargs)``, each
    layer's input traced too: ``rep.layers[i].sqnr_db`` and ``.loss_db`` (what that layer loses from its
    input to its output), ``rep.loses_most``, and ``rep.cast`` (a ``CastFix``): the end result's SQNR and
    verdict as cast, and (``fix``) with the layer that loses the most kept in float32. Floating inputs are
    rounded to ``dtype`` for both models, so both see the same values."""
    if not isinstance(fix, bool):
        raise InvalidArgumentError(f"trace_cast: fix must be True or False; got {fix!r}")
    if "inplace" in cast_kwargs:
        raise InvalidArgumentError("trace_cast: casts a copy of the model (inplace=False) itself; leave inplace out")
    fw = owner(model, "model")
    hooks = registry.hooks(fw, TraceHooks)
    narrow, wide = _rounded_inputs(inputs, dtype)
    cast, _ = cast_module(model, dtype, inplace=False, **cast_kwargs)
    a = Side(model, fw, hooks, side_inputs(wide, fw), True)
    rep = run_trace(a, Side(cast, fw, hooks, side_inputs(narrow, fw), False), wide, reference="a", k=k,
                    layer_inputs=True)
    worst, end = rep.loses_most, _end(rep)
    if worst is None or end is None:
        return rep
    kept, end_kept, passed_kept = "not tried (fix=False)", None, None
    if fix:
        pattern = rf"^{re.escape(worst.layer_a)}\." if worst.layer_a else r"."
        keep = [*_as_list(cast_kwargs.pop("keep", None)), pattern]
        again, cast_rep = cast_module(model, dtype, inplace=False, keep=keep, **cast_kwargs)
        if not any(re.search(pattern, r.path) for r in cast_rep.kept):
            kept = f"{worst.layer_a or '(model)'} has no parameters to keep in float32 (keep_types= may keep its class)"
        else:
            kept = f"keep={pattern!r}"
            rep2 = run_trace(a, Side(again, fw, hooks, side_inputs(narrow, fw), False), wide, reference="a", k=k)
            end2 = _end(rep2)
            end_kept, passed_kept = (end2.sqnr_db, end2.passed) if end2 is not None else (None, None)
    fixed = CastFix(worst.layer_a, worst.loss_db or 0.0, kept, end_sqnr_db=end.sqnr_db, end_sqnr_kept_db=end_kept,
                    end_passed=end.passed, end_passed_kept=passed_kept)
    return TraceReport(rep.frameworks, rep.models, rep.reference, rep.k, rep.layers, rep.first_divergence,
                       rep.unpaired_a, rep.unpaired_b, notes=rep.notes, cast=fixed)


def _as_list(keep) -> list:
    if keep is None:
        return []
    return [keep] if isinstance(keep, str) else list(keep)
