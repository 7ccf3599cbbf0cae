"""What the planner returns: a ``Plan`` of ``Step``s, and how they read.

Both are frozen dataclasses: a plan is a record to read, compare and print,
never a tuple to unpack. ``Step.run`` is what ``convert`` calls; it takes no
part in comparisons or in ``repr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

StepKind = Literal["bitview", "dlpack", "handoff", "copy", "to_host", "widen", "narrow", "pack", "unpack", "place"]


@dataclass(frozen=True)
class Step:
    """One step of a route, as ``plan()`` shows it and ``convert()`` runs it."""

    kind: StepKind
    framework: str  # where the result of the step lives
    label: str
    dtype: str  # dtype after the step
    copies: bool
    reason: str = ""  # why it copies
    verify: bool = False  # check the data pointer after running (the framework decides)
    run: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)
    #: a cheap test that ``run``'s result still shares its input's memory (``Handoff.shares``)
    shares: Callable[[Any], bool] | None = field(default=None, compare=False, repr=False)
    #: its copy is decided by the dtype alone (packing, unpacking) and makes a fresh result each run:
    #: the fast path may keep a plan whose copies are all such
    by_dtype: bool = False

    def __str__(self) -> str:
        how = f"copy ({self.reason})" if self.copies else "zero-copy"
        return f"{self.framework}: {self.label} -> {self.dtype}  [{how}]"


@dataclass(frozen=True)
class Plan:
    """What ``convert()`` will do with one input: the route, its copies, the result's nature."""

    source: str
    target: str
    dtype_in: str
    dtype_out: str
    shape: tuple[int, ...]
    nbytes: int
    device: str
    steps: tuple[Step, ...]
    copies: bool
    shares_memory: bool  # the result aliases the input's memory
    writable: bool  # the result can be written in place
    decision: str | None  # the dtype chosen by a fallback, and why; None when none was asked
    notes: tuple[str, ...] = ()
    #: why the result is a writable alias of memory its owner treats as read-only or
    #: immutable (``convert`` warns, copies or raises, as ``on_alias`` says); None if it is not
    alias: str | None = None
    #: the input requires grad, and its gradient does not cross (``on_grad`` says what to do)
    drops_grad: bool = False
    #: the result's shape: the input's, but where a packing route changes it (torch's
    #: float4_e2m1fn_x2 [..., n] <-> one value a byte [..., 2n]); None given: the input's
    result_shape: tuple[int, ...] | None = None
    #: the device ``device=`` asked for, as the target framework names it: the result is there (a
    #: "place" step copies it there where the route leaves it elsewhere); None: not asked, the result
    #: is where the route puts it
    to_device: str | None = None
    #: why converting may still be refused by the data, which no plan sees (fallback='auto''s checked
    #: narrowing of int64 to int32); None: the plan holds whatever the values
    depends_on_values: str | None = None

    def __post_init__(self) -> None:
        if self.result_shape is None:
            object.__setattr__(self, "result_shape", self.shape)

    @property
    def zero_copy(self) -> bool:
        return not self.copies

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        out = "" if self.result_shape == self.shape else f" [{'x'.join(map(str, self.result_shape or ())) or 'scalar'}]"
        lines = [
            f"{self.source} {self.dtype_in} [{shape}, {size(self.nbytes)}, {self.device}]"
            f" -> {self.target} {self.dtype_out}{out}"
        ]
        if not self.steps:
            lines.append("  (nothing to do: already a tensor of the target framework)")
        for i, step in enumerate(self.steps, 1):
            lines.append(f"  {i}. {step}")
        kind = "zero-copy, shares memory with the input" if self.shares_memory else (
            "copied" if self.copies else "new tensor")
        lines.append(f"  result: {kind}; {'writable' if self.writable else 'read-only'}")
        if self.decision:
            lines.append(f"  dtype: {self.decision}")
        if self.to_device is not None:
            moved = any(s.kind == "place" for s in self.steps)
            lines.append(f"  device: {self.to_device} (asked; {'moved there' if moved else 'already there: no move'})")
        if self.depends_on_values:
            lines.append(f"  values: {self.depends_on_values}; the plan cannot see them")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "source": self.source, "target": self.target, "dtype_in": self.dtype_in,
            "dtype_out": self.dtype_out, "shape": list(self.shape),
            "result_shape": list(self.result_shape or ()), "nbytes": self.nbytes,
            "device": self.device, "copies": self.copies, "shares_memory": self.shares_memory,
            "writable": self.writable, "decision": self.decision, "notes": list(self.notes),
            "alias": self.alias, "drops_grad": self.drops_grad, "to_device": self.to_device,
            "depends_on_values": self.depends_on_values,
            "steps": [{"kind": s.kind, "framework": s.framework, "label": s.label, "dtype": s.dtype,
                       "copies": s.copies, "reason": s.reason} for s in self.steps],
        }


def size(n: float) -> str:
    """``n`` bytes, for people: "2.0 KiB", "1.8 TiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover



@dataclass(frozen=True)
class TreePlan:
    """``plan_tree``'s answer: each tensor leaf's path and its Plan (or the error it would raise)."""

    leaves: tuple[tuple[str, Plan | Exception], ...]

    @property
    def plans(self) -> tuple[Plan, ...]:
        return tuple(p for _, p in self.leaves if isinstance(p, Plan))

    @property
    def errors(self) -> tuple[tuple[str, Exception], ...]:
        return tuple((w, e) for w, e in self.leaves if isinstance(e, Exception))

    @property
    def zero_copy_bytes(self) -> int:
        return sum(p.nbytes for p in self.plans if not p.copies)

    @property
    def copied_bytes(self) -> int:
        return sum(p.nbytes for p in self.plans if p.copies)

    @property
    def aliases(self) -> tuple[str, ...]:
        """Paths of leaves whose result would be writable over immutable or read-only memory."""
        return tuple(w for w, p in self.leaves if isinstance(p, Plan) and p.alias is not None)

    @property
    def drops_grad(self) -> tuple[str, ...]:
        """Paths of leaves whose gradient would not cross (``on_grad`` says what ``convert_tree`` does)."""
        return tuple(w for w, p in self.leaves if isinstance(p, Plan) and p.drops_grad)

    def __str__(self) -> str:
        plans = self.plans
        n = len(self.leaves)  # a refused leaf need not be a tensor (a model object in the tree)
        lines = [f"{n} lea{'f' if n == 1 else 'ves'}: {sum(not p.copies for p in plans)} zero-copy "
                 f"({size(self.zero_copy_bytes)}), {sum(p.copies for p in plans)} copied "
                 f"({size(self.copied_bytes)}), {len(self.errors)} refused"]
        for where, p in self.leaves:
            if isinstance(p, Exception):
                lines.append(f"  {where}: refused: {type(p).__name__}: {p}")
            elif p.copies:
                why = "; ".join(s.reason for s in p.steps if s.copies)
                lines.append(f"  {where}: copies {size(p.nbytes)} ({why})")
        for where in self.aliases:
            lines.append(f"  {where}: writable alias of immutable or read-only memory")
        for where in self.drops_grad:
            lines.append(f"  {where}: takes part in autodiff; its gradient does not cross")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"zero_copy_bytes": self.zero_copy_bytes, "copied_bytes": self.copied_bytes,
                "aliases": list(self.aliases), "drops_grad": list(self.drops_grad),
                "leaves": [{"path": w, **(p.to_dict() if isinstance(p, Plan) else
                                          {"error": f"{type(p).__name__}: {p}"})} for w, p in self.leaves]}
