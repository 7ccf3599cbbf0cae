"""What a cast did, leaf by leaf: ``LeafCast`` rows gathered in a ``CastReport``."""

from __future__ import annotations

import dataclasses
import math

from bf16bridge.core import dtypes
from bf16bridge.core.plan import size

#: what a cast may do to a leaf, in the order the report's summary lists them
ACTIONS = ("cast", "kept", "unchanged", "skipped")


@dataclasses.dataclass(frozen=True)
class LeafCast:
    """What a cast did to one leaf."""

    path: str  # its label (dotted path)
    action: str  # "cast", "kept" (the policy kept it in float32), "unchanged" (already the dtype), "skipped"
    before: str  # dtype name before
    after: str  # dtype name after
    nbytes_before: int
    nbytes_after: int
    rule: str = ""  # the rule that kept it ("norm", "type layer-norm", "head"...)
    why: str = ""  # the rule's reason, or why it was skipped

    def __str__(self) -> str:
        change = self.before if self.before == self.after else f"{self.before} -> {self.after}"
        how = f" [{self.rule}]" if self.rule else (f" ({self.why})" if self.action == "skipped" and self.why else "")
        return f"{self.path}: {self.action} {change}{how}"


@dataclasses.dataclass(frozen=True)
class CastReport:
    """What ``cast_tree`` or ``cast_module`` did, leaf by leaf.

    ``leaves``: every tensor leaf in the order walked. ``cast`` / ``kept`` / ``unchanged`` /
    ``skipped``: those rows. ``bytes_before`` / ``bytes_after``: the sum over every leaf (a
    tensor shared by several paths counted each time it appears). ``notes``: what else the call
    did (hooks installed, ties kept together, in place or not)."""

    dtype: str
    leaves: tuple[LeafCast, ...]
    notes: tuple[str, ...] = ()
    #: how many leaves str() lists one by one before it summarises the rest
    SHOWN = 40

    def _where(self, action: str) -> tuple[LeafCast, ...]:
        return tuple(r for r in self.leaves if r.action == action)

    @property
    def cast(self) -> tuple[LeafCast, ...]:
        return self._where("cast")

    @property
    def kept(self) -> tuple[LeafCast, ...]:
        return self._where("kept")

    @property
    def unchanged(self) -> tuple[LeafCast, ...]:
        return self._where("unchanged")

    @property
    def skipped(self) -> tuple[LeafCast, ...]:
        return self._where("skipped")

    @property
    def bytes_before(self) -> int:
        return sum(r.nbytes_before for r in self.leaves)

    @property
    def bytes_after(self) -> int:
        return sum(r.nbytes_after for r in self.leaves)

    def __str__(self) -> str:
        lines = [f"cast to {self.dtype}: {len(self.leaves)} leaves, "
                 f"{size(self.bytes_before)} -> {size(self.bytes_after)}"]
        for action in ACTIONS:
            rows = self._where(action)
            if rows:
                lines.append(f"  {action:<9} {len(rows):>5} leaves, {size(sum(r.nbytes_before for r in rows))}"
                             f" -> {size(sum(r.nbytes_after for r in rows))}")
        rules: dict[str, int] = {}
        for r in self.kept:
            rules[r.rule] = rules.get(r.rule, 0) + 1
        if rules:
            lines.append("  kept by: " + ", ".join(f"{k} ({n})" for k, n in rules.items()))
        lines.extend(f"  note: {n}" for n in self.notes)
        # the interesting rows first: kept and skipped, then the casts
        ordered = sorted(self.leaves, key=lambda r: ("kept", "skipped", "unchanged", "cast").index(r.action))
        lines.extend(f"    {r}" for r in ordered[:self.SHOWN])
        if len(ordered) > self.SHOWN:
            lines.append(f"    ... {len(ordered) - self.SHOWN} more (report.leaves lists every one)")
        return "\n".join(lines)


def nbytes(x, shape, name: str) -> int:
    """The bytes of tensor ``x`` of ``shape`` and dtype ``name`` (0 where a dimension is not known)."""
    if any(d is None for d in shape):  # traced with a dimension not known yet: the report's notes say so
        return 0
    if name in dtypes.ROWS:
        return math.prod(shape) * dtypes.itemsize(name)
    n = getattr(x, "nbytes", None)  # a dtype the bridge does not carry: as the framework says
    return int(n) if isinstance(n, int) else 0
