"""What ``bb.parity.trace`` returns: a row per paired layer (and per paired parameter's gradient), the
first divergence, what was left unpaired, and the report as text, JSON, Markdown and HTML. The rows are
records.py's (importable from here too), the text render.py's."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass

from bf16bridge.errors import MissingKeyError
from bf16bridge.parity.tracing import render
from bf16bridge.parity.tracing.records import CastFix, Divergence, GradRow, LayerRow

__all__ = ["CastFix", "Divergence", "GradRow", "LayerRow", "TraceReport"]


@dataclass(frozen=True)
class TraceReport:
    """Two models run on the same inputs, layer by layer (``bb.parity.trace``)."""

    frameworks: tuple[str, str]
    models: tuple[str, str]
    reference: str  # what the judged side was measured against, in words
    k: float
    layers: tuple[LayerRow, ...]
    first_divergence: Divergence | None
    unpaired_a: tuple[str, ...] = ()
    unpaired_b: tuple[str, ...] = ()
    grads: tuple[GradRow, ...] = ()
    grad_divergence: GradRow | None = None
    grads_unpaired_a: tuple[str, ...] = ()
    grads_unpaired_b: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    cast: CastFix | None = None

    @property
    def passed(self) -> bool:
        """Every paired layer (and gradient) within what rounding explains; nothing compared never passes."""
        return bool(self.layers) and all(r.passed for r in self.layers) and all(g.passed for g in self.grads)

    def layer(self, name: str) -> LayerRow:
        """The row of a layer, by its name in either model."""
        for r in self.layers:
            if name in (r.layer_a, r.layer_b):
                return r
        names = [r.layer_a for r in self.layers]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise MissingKeyError(f"no paired layer is named {name!r} in either model{hint}; the paired layers are "
                              "rep.layers[i].layer_a / .layer_b (unpaired: rep.unpaired_a, rep.unpaired_b)")

    @property
    def loses_most(self) -> LayerRow | None:
        """The layer that loses the most SQNR from its input to its output (where inputs were traced)."""
        rows = [r for r in self.layers if r.loss_db is not None and r.leaf]
        return max(rows, key=lambda r: r.loss_db or 0.0) if rows else None

    def to_dict(self) -> dict:
        return {"passed": self.passed, "frameworks": list(self.frameworks), "models": list(self.models),
                "reference": self.reference, "k": self.k, "layers": [r.to_dict() for r in self.layers],
                "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
                "unpaired_a": list(self.unpaired_a), "unpaired_b": list(self.unpaired_b),
                "grads": [g.to_dict() for g in self.grads],
                "grad_divergence": self.grad_divergence.to_dict() if self.grad_divergence else None,
                "grads_unpaired_a": list(self.grads_unpaired_a), "grads_unpaired_b": list(self.grads_unpaired_b),
                "notes": list(self.notes), "cast": self.cast.to_dict() if self.cast else None}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def text(self) -> str:
        return render.text(self)

    def markdown(self) -> str:
        return render.markdown(self)

    def html(self) -> str:
        return render.html(self)

    def __str__(self) -> str:
        return self.text()
