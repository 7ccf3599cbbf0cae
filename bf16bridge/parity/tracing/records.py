"""The records a trace report is made of: a paired layer's row, a paired parameter's gradient row, the
first divergence, and a cast copy's layer that loses the most; each with its JSON form."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bf16bridge.parity.tracing.judge import Verdict


@dataclass(frozen=True)
class LayerRow:
    """One paired layer output: its name in each model, and the judged side's verdict there."""

    index: int  # its place in the order the reference side (model_a without one) made its layers
    layer_a: str
    layer_b: str
    shape: tuple
    dtype_a: str  # "" where that model ran as its float64 copy only (its own run was not needed)
    dtype_b: str
    depth: int  # the layers with no layer inside them made up to here (the budget grows with it)
    verdict: Verdict
    #: the judged side's error at this layer's input (SQNR, dB), where inputs were traced; else None
    input_sqnr_db: float | None = None
    leaf: bool = True  # no traced layer runs inside it

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def error(self) -> float:
        return self.verdict.error

    @property
    def budget(self) -> float:
        return self.verdict.budget

    @property
    def sqnr_db(self) -> float:
        return self.verdict.sqnr_db

    @property
    def loss_db(self) -> float | None:
        """The SQNR this layer loses, from its input to its output (where inputs were traced)."""
        if self.input_sqnr_db is None or not math.isfinite(self.sqnr_db):
            return None
        return (self.input_sqnr_db - self.sqnr_db) if math.isfinite(self.input_sqnr_db) else None

    def to_dict(self) -> dict:
        return {"index": self.index, "layer_a": self.layer_a, "layer_b": self.layer_b, "shape": list(self.shape),
                "dtype_a": self.dtype_a, "dtype_b": self.dtype_b, "depth": self.depth,
                "leaf": self.leaf, "input_sqnr_db": _num(self.input_sqnr_db), "loss_db": _num(self.loss_db),
                **_verdict(self.verdict)}


@dataclass(frozen=True)
class Divergence:
    """The first layer whose error rounding does not explain, named on both sides, and what changed there."""

    layer_a: str
    layer_b: str
    why: str
    changes: tuple[str, ...]
    #: where the difference first showed, when that was a layer inside this one fed by code of this one
    #: between its layers (its input already differed); None when it showed here first
    first_seen: tuple[str, str] | None = None

    def __str__(self) -> str:
        seen = (f" (first seen at {self.first_seen[0] or '(model)'}, whose input already differed: the "
                "difference comes from this layer's own code between its layers)" if self.first_seen else "")
        return (f"{self.layer_a or '(model)'} / {self.layer_b or '(model)'}: {self.why}{seen}; what changed: "
                + "; ".join(self.changes))

    def to_dict(self) -> dict:
        return {"layer_a": self.layer_a, "layer_b": self.layer_b, "why": self.why, "changes": list(self.changes),
                "first_seen": list(self.first_seen) if self.first_seen else None}


@dataclass(frozen=True)
class GradRow:
    """One paired parameter: its gradient on the judged side, against the reference's (or the other side's)."""

    name_a: str
    name_b: str
    shape: tuple
    transposed: bool  # model_b holds this parameter transposed (compared so)
    verdict: Verdict

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def to_dict(self) -> dict:
        return {"name_a": self.name_a, "name_b": self.name_b, "shape": list(self.shape),
                "transposed": self.transposed, **_verdict(self.verdict)}


@dataclass(frozen=True)
class CastFix:
    """A cast copy's layer that loses the most, and the end result with that layer kept in float32."""

    layer: str
    loss_db: float
    kept: str  # how it was kept (the keep= pattern, or why it could not be)
    end_sqnr_db: float  # the model's output, cast as asked
    end_sqnr_kept_db: float | None  # the model's output with the layer kept (None: not tried)
    end_passed: bool
    end_passed_kept: bool | None

    @property
    def fixes(self) -> bool:
        """Keeping the layer makes the end result pass where it failed."""
        return bool(self.end_passed_kept) and not self.end_passed

    def to_dict(self) -> dict:
        return {"layer": self.layer, "loss_db": _num(self.loss_db), "kept": self.kept,
                "end_sqnr_db": _num(self.end_sqnr_db), "end_sqnr_kept_db": _num(self.end_sqnr_kept_db),
                "end_passed": self.end_passed, "end_passed_kept": self.end_passed_kept, "fixes": self.fixes}


def _num(x):
    """A float for JSON: None for a missing one, a string for an infinity or NaN."""
    if x is None:
        return None
    return x if math.isfinite(x) else str(x)


def _verdict(v: Verdict) -> dict:
    return {"passed": v.passed, "error": _num(v.error), "elementwise": _num(v.elementwise), "budget": _num(v.budget),
            "own": _num(v.own), "unit": v.unit, "sqnr_db": _num(v.sqnr_db), "cosine": _num(v.cosine),
            "nonfinite": v.nonfinite, "why": v.why}
