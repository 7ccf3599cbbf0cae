"""The runs ``bb.parity.trace`` makes: one side's model with every layer's output recorded as it is
made (its ``TraceHooks``), the side run first kept or measured, the judged side paired and judged."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from bf16bridge.adapters.hooks import TraceHooks
from bf16bridge.core import registry
from bf16bridge.core.convert import convert
from bf16bridge.errors import UnsupportedDtypeError
from bf16bridge.parity import metrics
from bf16bridge.parity.tracing import judge, tap
from bf16bridge.parity.tracing.names import Pairing, ancestors, layer_of
from bf16bridge.trees.walk import map_leaves, where


@dataclass
class Side:
    """One model as the trace runs it: its framework's hooks and its inputs in that framework."""

    model: Any
    framework: str
    hooks: TraceHooks
    args: tuple
    is_a: bool


def side_inputs(inputs: tuple, framework: str, widen: bool = False) -> tuple:
    """The inputs in ``framework``, the same bits (``widen``: floating ones widened to float64, exactly;
    integers too wide for it narrowed where every value fits, checked)."""
    def one(x, path):
        if widen:
            arr = metrics.ensure_numpy(x)
            if judge.floating(arr):
                x = metrics.to_float64(arr)
        try:
            return convert(x, framework)
        except UnsupportedDtypeError:
            return convert(x, framework, fallback="auto")
    return tuple(map_leaves(one, tuple(inputs)))


class Collector:
    """What one run records: each floating output leaf goes to ``on_row(row name, numpy)`` as it is
    made; the inputs of the layers in ``keep_inputs`` (all where True) are kept, with their raw arguments."""

    def __init__(self, on_row, keep_inputs=frozenset()):
        self.on_row, self.keep_inputs = on_row, keep_inputs
        self.calls: Counter = Counter()
        self.order: list[str] = []
        self.inputs: dict[str, np.ndarray | None] = {}
        self.raw_inputs: dict[str, tuple] = {}

    def __call__(self, layer: str, port: str, value) -> None:
        n = self.calls[(layer, port)]
        self.calls[(layer, port)] += 1
        call = layer if n == 0 else f"{layer}#{n + 1}"
        if port == "input":
            if self.keep_inputs is True or layer in self.keep_inputs:
                leaves = float_leaves(value)
                self.inputs[call] = np.array(leaves[0][1]) if leaves else None
                self.raw_inputs[call] = value
            return
        for suffix, x in float_leaves(value):
            self.order.append(call + suffix)
            self.on_row(call + suffix, x)


def float_leaves(value) -> list[tuple[str, np.ndarray]]:
    """The floating tensor leaves of a layer's output (or arguments), as numpy, with their paths."""
    if registry.tensor_framework(value) is not None:  # one tensor, the usual output: no walk
        arr = metrics.ensure_numpy(value)
        return [("", arr)] if judge.floating(arr) else []
    out: list[tuple[str, np.ndarray]] = []

    def take(x, path):
        arr = metrics.ensure_numpy(x)
        if judge.floating(arr):
            out.append((where(path) if path else "", arr))
        return x
    map_leaves(take, value)
    return out


def run_side(side: Side, collector: Collector, inputs_of=frozenset()):
    """Run one side with its layers recorded (and its taps); its output."""
    with tap.recording(collector):
        return side.hooks.run(side.model, side.args, collector, inputs_of)


def depths(order: list[str]) -> tuple[dict[str, int], dict[str, bool]]:
    """Each row's depth (the leaf layers made up to it, itself included) and whether it is a leaf (no
    traced layer runs inside it, as the names nest)."""
    layers = {layer_of(r) for r in order}
    parents = {p for name in layers for p in ancestors(name) if p in layers}
    depth, leaf, n = {}, {}, 0
    for r in order:
        is_leaf = layer_of(r) not in parents
        n += is_leaf
        depth[r], leaf[r] = max(n, 1), is_leaf
    return depth, leaf



@dataclass
class Base:
    """What the judged side is measured against: the float64 run's rows (with a reference) or the first
    side's (without one), in the order that run made them, and what the first side's run found."""

    order: list[str]
    ref: dict[str, np.ndarray]  # the float64 run's rows (with a reference)
    values: dict[str, np.ndarray]  # the first side's rows (without one)
    own: dict[str, judge.Measured]  # the first side's own error, at the rows it was asked for
    meta: dict[str, tuple[tuple, str]]  # each row's shape and dtype on the first side
    has_ref: bool = False
    output: Any = None
    ref_inputs: dict | None = None
    first_inputs: dict | None = None


def reference_run(ref: Side, keep=frozenset()) -> Base:
    """Run the float64 copy, its rows kept."""
    base = Base([], {}, {}, {}, {}, has_ref=True)
    col = Collector(lambda n, x: base.ref.__setitem__(n, metrics.to_float64(x)), keep)
    run_side(ref, col, keep)
    base.order, base.ref_inputs = col.order, col.inputs
    return base


def first_run(first: Side, base: Base | None, k: float, keep=frozenset(),
              wanted: set | frozenset = frozenset()) -> Base:
    """Run the first side: without a reference (``base`` None) its rows are kept; with one, its own error is
    measured at the rows in ``wanted`` (the float64 run's rows freed as it passes them)."""
    if base is None:
        base = Base([], {}, {}, {}, {})

    def on_row(n: str, x: np.ndarray) -> None:
        base.meta[n] = (tuple(x.shape), metrics.kind_of(x))
        if not base.has_ref:
            base.values[n] = np.array(x)
            return
        r = base.ref.get(n) if n in wanted or keep else base.ref.pop(n, None)
        if n in wanted and r is not None and r.shape == x.shape:
            base.own[n] = judge.measure(x, r, k)
    col = Collector(on_row, keep)
    base.output = run_side(first, col, keep)
    base.first_inputs = col.inputs
    if not base.has_ref:
        base.order = col.order
    return base


def layer_verdict(x: np.ndarray, name: str, base: Base, depth: int, k: float):
    """The judged side's row ``x`` against row ``name``: its ``Measured`` against the float64 run (decided once
    the first side ran), or its ``Verdict`` against the first side's row."""
    target = base.ref.get(name) if base.has_ref else base.values.get(name)
    if target is None:
        return judge.mismatched(tuple(x.shape), ())
    if tuple(target.shape) != tuple(x.shape):
        return judge.mismatched(tuple(x.shape), tuple(target.shape))
    if base.has_ref:
        return judge.measure(x, target, k)
    return judge.between(target, x, depth, k)


def judged_run(side: Side, base: Base, pairing: Pairing, depth: dict, k: float, keep=frozenset()):
    """Run the judged side, each row paired and measured as it is made (without a reference the first side's
    kept row is freed once used): {first side's row: (judged side's row, shape, dtype, Measured or Verdict)},
    and its collector."""
    rows: dict[str, tuple] = {}

    def on_row(n: str, x: np.ndarray) -> None:
        mine = pairing.match(n)
        if mine is None:
            return
        rows[mine] = (n, tuple(x.shape), metrics.kind_of(x), layer_verdict(x, mine, base, depth[mine], k))
        if not keep and not base.has_ref:
            base.values.pop(mine, None)
    col = Collector(on_row, keep)
    out = run_side(side, col, keep)
    return rows, col, out


def decided(rows: dict, base: Base, depth: dict, k: float) -> dict[str, judge.Verdict]:
    """Each row's verdict, the first side's own error the yardstick where it was measured."""
    out = {}
    for name, (_, _, _, m) in rows.items():
        out[name] = judge.decide(m, base.own.get(name), depth[name], k) if isinstance(
            m, judge.Measured) else m
    return out


def wanted_own(rows: dict, depth: dict, k: float) -> set[str]:
    """The rows whose measure depth alone does not allow: the first side's own error is asked there."""
    return {n for n, (_, _, _, m) in rows.items() if isinstance(m, judge.Measured)
            and judge.over_base(m, depth[n], k)}


def input_sqnr(base: Base, col: Collector, first_row: str, judged_row: str) -> float | None:
    """SQNR of the judged side's input to a layer, against the reference's (or the first side's)."""
    def call(row: str) -> str:
        return row.split("[", 1)[0]
    mine = (base.ref_inputs if base.ref_inputs is not None else base.first_inputs) or {}
    want, got = mine.get(call(first_row)), col.inputs.get(call(judged_row))
    if want is None or got is None or want.shape != got.shape:
        return None
    return judge.sqnr_db(metrics.to_float64(got), metrics.to_float64(want))
