"""Where ``bb.parity.trace``'s first failing layer got its difference: from its own computation, or
from code of a layer around it that ran before it (its input already differed)?

The three runs go again, keeping only the inputs and outputs of the failing layer and of the layers
around it; the first divergence is the innermost whose input still agreed. There, a few diagnostics
say what changed (``tracing.changes``), the reference side's layer run again with a weight transposed
among them."""

from __future__ import annotations

import numpy as np

from bf16bridge.parity import metrics
from bf16bridge.parity.tracing import judge
from bf16bridge.parity.tracing.run import Collector, Side, run_side
from bf16bridge.parity.tracing.changes import what_changed
from bf16bridge.parity.tracing.names import ancestors, layer_of
from bf16bridge.parity.tracing.report import Divergence, LayerRow


def _call(row: str) -> str:
    """A row's layer call: its name without an output index ("attn[0]" -> "attn")."""
    return row.split("[", 1)[0]


class _Keep:
    """A run's outputs at some rows, kept."""

    def __init__(self, rows: set[str]):
        self.rows = rows
        self.values: dict[str, np.ndarray] = {}

    def __call__(self, name: str, x: np.ndarray) -> None:
        if name in self.rows:
            self.values[name] = np.array(x)


def _candidates(first_fail: LayerRow, rows: list[LayerRow], first_is_a: bool) -> list[tuple[str, str, LayerRow]]:
    """(first side's layer call, judged side's, its row) for the failing layer and each paired layer around it,
    innermost first."""
    def mine(r: LayerRow) -> str:
        return r.layer_a if first_is_a else r.layer_b

    def theirs(r: LayerRow) -> str:
        return r.layer_b if first_is_a else r.layer_a
    out = [(_call(mine(first_fail)), _call(theirs(first_fail)), first_fail)]
    for layer in ancestors(layer_of(mine(first_fail))):
        row = next((r for r in rows if _call(mine(r)) == layer), None)
        if row is not None:
            out.append((layer, _call(theirs(row)), row))
    return out


def _rerun(side: Side | None, layers: set[str], rows: set[str]) -> tuple[Collector | None, dict]:
    if side is None:
        return None, {}
    keep = _Keep(rows)
    col = Collector(keep, layers)
    run_side(side, col, layers)
    return col, keep.values


def locate(first_fail: LayerRow, first: Side, judged: Side, ref: Side | None, rows: list[LayerRow],
           k: float) -> Divergence:
    """The first divergence, starting from the first failing row (in the first side's order)."""
    cands = _candidates(first_fail, rows, first.is_a)

    def name(r: LayerRow, is_first: bool) -> str:
        return r.layer_a if first.is_a == is_first else r.layer_b
    r_col, r_out = _rerun(ref, {c[0] for c in cands}, {name(c[2], True) for c in cands})
    f_col, f_out = _rerun(first, {c[0] for c in cands}, {name(c[2], True) for c in cands})
    j_col, j_out = _rerun(judged, {c[1] for c in cands}, {name(c[2], False) for c in cands})
    assert f_col is not None and j_col is not None
    culprit = cands[-1]
    for cand in cands:
        got = j_col.inputs.get(cand[1])
        want = (r_col or f_col).inputs.get(cand[0])
        own_in = f_col.inputs.get(cand[0]) if r_col is not None else None
        if _agrees(got, want, own_in, cand[2].depth, k):
            culprit = cand
            break
    layer, _, row = culprit
    x, base = j_out.get(name(row, False)), (r_out if ref is not None else f_out).get(name(row, True))
    changes: list[str] = []
    if x is not None and base is not None:
        model = ref.model if ref is not None else first.model
        raw = (r_col or f_col).raw_inputs.get(layer)
        variants = first.hooks.layer_variants(model, layer, raw) if raw is not None else {}
        changes = what_changed(x, base, unit=row.verdict.unit, budget=row.verdict.budget, variants=variants)
    seen = None if row is first_fail else (first_fail.layer_a, first_fail.layer_b)
    return Divergence(row.layer_a, row.layer_b, row.verdict.why, tuple(changes), seen)


def _agrees(got, want, own_in, depth: int, k: float) -> bool:
    """Whether the judged side's input to a layer agrees with the reference's (or the first side's)."""
    if got is None or want is None:
        return got is None and want is None
    if got.shape != want.shape:
        return False
    if own_in is not None:
        own = judge.measure(own_in, metrics.to_float64(want), k)
        return judge.against(got, metrics.to_float64(want), own, depth, k).passed
    if metrics.kind_of(want) == "float64" and metrics.kind_of(got) != "float64":
        return judge.against(got, want, None, depth, k).passed
    return judge.between(want, got, depth, k).passed
