"""Policies decide whether a comparison passed.

``exact()``, ``ulp(n)``, ``allclose(rtol, atol)`` and ``reference(k)``, plus
the frameworks' own bf16 defaults as ready allclose tables. A policy is also
written as text: "exact", "ulp(2)", "allclose(1e-2, 1e-5)", "torch", "jax",
"tensorflow", "reference(2)".
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    kind: str  # exact | ulp | allclose | reference
    n: float = 0  # ulp: max ULP distance; reference: k
    rtol: float = 0.0
    atol: float = 0.0
    name: str = ""  # e.g. "torch" for a framework's own defaults
    signed_zeros: bool = False  # ulp/allclose: count -0 against +0 as a mismatch

    def __str__(self) -> str:
        if self.name:
            return f"{self.name} (allclose rtol={self.rtol:g}, atol={self.atol:g})"
        if self.kind == "exact":
            return "exact"
        if self.kind == "ulp":
            return f"ulp({self.n:g})" + (", signed zeros" if self.signed_zeros else "")
        if self.kind == "allclose":
            return f"allclose(rtol={self.rtol:g}, atol={self.atol:g})"
        return f"reference({self.n:g})"


def exact() -> Policy:
    """Every element bit-identical (-0 against +0 and NaN payloads included)."""
    return Policy("exact")


def ulp(n: int = 1, *, signed_zeros: bool = False) -> Policy:
    """Finite elements within n ULPs; NaN and infinity in the same places."""
    if n < 0:
        raise ValueError("ulp(n) needs n >= 0")
    return Policy("ulp", n=n, signed_zeros=signed_zeros)


def allclose(rtol: float, atol: float = 0.0) -> Policy:
    """|a - b| <= atol + rtol * |b| for finite elements; NaN and infinity in the same places."""
    return Policy("allclose", rtol=rtol, atol=atol)


def reference(k: float = 2.0) -> Policy:
    """Each candidate's RMS error against the float64 reference at most k times the best candidate's."""
    if k < 1:
        raise ValueError("reference(k) needs k >= 1")
    return Policy("reference", n=k)


#: the frameworks' own bf16 test tolerances (torch.testing.assert_close; jax's and tf's test utilities)
FRAMEWORK_DEFAULTS = {
    "torch": Policy("allclose", rtol=1.6e-2, atol=1e-5, name="torch"),
    "jax": Policy("allclose", rtol=1e-2, atol=1e-2, name="jax"),
    "tensorflow": Policy("allclose", rtol=1e-2, atol=1e-2, name="tensorflow"),
}


def parse(spec) -> Policy:
    """A Policy from a Policy or its text."""
    if isinstance(spec, Policy):
        return spec
    text = str(spec).strip().lower().replace(" ", "")
    if text in ("exact", "exact()"):
        return exact()
    if text in FRAMEWORK_DEFAULTS:
        return FRAMEWORK_DEFAULTS[text]
    if text in ("tf",):
        return FRAMEWORK_DEFAULTS["tensorflow"]
    m = re.fullmatch(r"(ulp|reference|allclose)\(([^)]*)\)", text)
    if m:
        args = [a for a in m.group(2).split(",") if a]
        try:
            nums = [float(a.split("=")[-1]) for a in args]
        except ValueError:
            nums = None
        if nums is not None:
            if m.group(1) == "ulp" and len(nums) <= 1:
                return ulp(int(nums[0]) if nums else 1)
            if m.group(1) == "reference" and len(nums) <= 1:
                return reference(nums[0] if nums else 2.0)
            if m.group(1) == "allclose" and 1 <= len(nums) <= 2:
                return allclose(*nums)
    raise ValueError(
        f"unknown policy {spec!r}; use exact, ulp(N), allclose(RTOL, ATOL), reference(K), torch, jax or tensorflow"
    )
