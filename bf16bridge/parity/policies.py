"""Policies decide whether a comparison passed.

``exact()``, ``ulp(n)``, ``allclose(rtol, atol)`` and ``reference(k)``, plus
the frameworks' own bf16 defaults as ready allclose tables. A policy is also
written as text: "exact", "ulp(2)", "allclose(1e-2, 1e-5)", "torch", "jax",
"tensorflow", "reference(2)".
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from ..errors import Bf16BridgeError


class PolicyError(Bf16BridgeError, ValueError):
    """A parity policy that cannot be read or makes no sense (the message lists the valid ones)."""


@dataclass(frozen=True)
class Policy:
    kind: str  # exact | ulp | allclose | reference
    n: float = 0  # ulp: max ULP distance; reference: k
    rtol: float = 0.0
    atol: float = 0.0
    name: str = ""  # e.g. "torch" for a framework's own defaults
    signed_zeros: bool = False  # ulp/allclose: count -0 against +0 as a mismatch
    #: allclose: NaN on both sides agrees (numpy's and jax's and tensorflow's test helpers); False, as
    #: torch.testing.assert_close's default: a NaN is close to nothing, not even a NaN
    equal_nan: bool = True
    #: allclose: "float64", the values as they are, exactly widened (a float32 result against a bf16
    #: one is judged on its own value, not rounded to bf16); "promoted", as torch.isclose computes
    #: after torch.testing.assert_close(check_dtype=False) promotes the two dtypes: in that dtype,
    #: each step rounded to it (see metrics.isclose)
    arithmetic: str = "float64"

    def __str__(self) -> str:
        nan = "" if self.equal_nan else ", equal_nan=false"
        if self.name:
            return f"{self.name} (allclose rtol={self.rtol:g}, atol={self.atol:g}{nan})"
        if self.kind == "exact":
            return "exact"
        if self.kind == "ulp":
            return f"ulp({self.n:g}" + (", signed_zeros=true)" if self.signed_zeros else ")")
        if self.kind == "allclose":
            return f"allclose(rtol={self.rtol:g}, atol={self.atol:g}{nan})"
        return f"reference({self.n:g})"


def _number(x) -> bool:
    """A finite real number (not a bool, a string or None): what a tolerance can be."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def exact() -> Policy:
    """Every element bit-identical (-0 against +0 and NaN payloads included)."""
    return Policy("exact")


def ulp(n: int = 1, *, signed_zeros: bool = False) -> Policy:
    """Finite elements within n ULPs; NaN and infinity in the same places."""
    if not _number(n) or not float(n).is_integer() or n < 0:
        raise PolicyError(f"ulp(n) needs a whole number n >= 0 (ULP distances are integers); got {n!r}")
    n = int(n)
    return Policy("ulp", n=n, signed_zeros=signed_zeros)


def allclose(rtol: float, atol: float = 0.0, *, equal_nan: bool = True) -> Policy:
    """|a - b| <= atol + rtol * |b| for finite elements; NaN and infinity in the same places
    (``equal_nan=False``: NaN anywhere fails, as torch.testing.assert_close's default)."""
    if not (_number(rtol) and _number(atol) and rtol >= 0 and atol >= 0):
        raise PolicyError(f"allclose(rtol, atol) needs finite numbers rtol >= 0 and atol >= 0; got rtol={rtol!r}, "
                          f"atol={atol!r}")
    if not isinstance(equal_nan, bool):
        raise PolicyError(f"allclose: equal_nan must be True or False; got {equal_nan!r}")
    return Policy("allclose", rtol=rtol, atol=atol, equal_nan=equal_nan)


def reference(k: float = 2.0) -> Policy:
    """Each candidate's RMS error against the float64 reference at most k times the best candidate's,
    or k times what correct rounding to its own dtype may err, whichever is larger."""
    if not (_number(k) and k >= 1):
        raise PolicyError(f"reference(k) needs a finite number k >= 1 (1: every result as close as the best); got {k!r}")
    return Policy("reference", n=k)


#: the frameworks' own bf16 test defaults: torch.testing.assert_close (equal_nan=False: NaN is close
#: to nothing; computed as torch.isclose does, in the dtype after check_dtype=False's promotion);
#: jax's check_close and tensorflow's assertAllCloseAccordingToType, both through
#: numpy.testing.assert_allclose with equal_nan=True (NaN in the same places agrees)
FRAMEWORK_DEFAULTS = {
    "torch": Policy("allclose", rtol=1.6e-2, atol=1e-5, name="torch", equal_nan=False, arithmetic="promoted"),
    "jax": Policy("allclose", rtol=1e-2, atol=1e-2, name="jax"),
    "tensorflow": Policy("allclose", rtol=1e-2, atol=1e-2, name="tensorflow"),
}


#: each policy written as text: its arguments, in order, and their defaults (None: required)
_SIGNATURES = {
    "exact": (),
    "ulp": (("n", 1), ("signed_zeros", False)),
    "allclose": (("rtol", None), ("atol", 0.0), ("equal_nan", True)),
    "reference": (("k", 2.0),),
}

_USAGE = ("use exact, ulp(N) (N a whole number), ulp(N, signed_zeros=true), allclose(RTOL, ATOL) "
          "(or allclose(rtol=R, atol=A, equal_nan=false)), reference(K), torch, jax or tensorflow")


def _bad(spec, why: str) -> PolicyError:
    return PolicyError(f"policy {spec!r}: {why}; {_USAGE}")


def _value(spec, name: str, text: str):
    if name in ("signed_zeros", "equal_nan"):
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise _bad(spec, f"{name} takes true or false, not {text!r}")
    try:
        x = float(text)
    except ValueError:
        raise _bad(spec, f"{name} must be a number, not {text!r}") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise _bad(spec, f"{name} must be finite, not {text!r}")
    if name == "n":
        if x != int(x):
            raise _bad(spec, f"a ULP count is a whole number, not {text!r}")
        return int(x)
    return x


def parse(spec) -> Policy:
    """A Policy from a Policy or its text.

    Arguments are positional or ``name=value`` (``allclose(atol=0.1)`` sets atol, rtol
    then defaults to 0); anything that does not fit (an unknown name, a fractional
    ULP count, an argument given twice or one too many) is refused with PolicyError
    (a ValueError).
    """
    if isinstance(spec, Policy):
        return spec
    if not isinstance(spec, str):
        raise PolicyError(f"a policy is a Policy or its text, not {type(spec).__name__}; {_USAGE}")
    text = spec.strip().lower().replace(" ", "")
    if text in FRAMEWORK_DEFAULTS:
        return FRAMEWORK_DEFAULTS[text]
    if text == "tf":
        return FRAMEWORK_DEFAULTS["tensorflow"]
    m = re.fullmatch(r"([a-z_]+)(?:\((.*)\))?", text)
    if not m or m.group(1) not in _SIGNATURES:
        raise _bad(spec, "unknown policy")
    kind, inner = m.group(1), m.group(2)
    if inner is None and kind != "exact":
        raise _bad(spec, f"{kind} needs parentheses")
    params = _SIGNATURES[kind]
    got: dict = {}
    args = inner.split(",") if inner else []
    positional = True
    for i, arg in enumerate(args):
        if not arg:
            raise _bad(spec, "an empty argument")
        name, eq, value = arg.partition("=")
        if eq:
            positional = False
            if name not in dict(params):
                known = ", ".join(n for n, _ in params) or "no arguments"
                raise _bad(spec, f"{kind} takes {known}, not {name!r}")
        elif not positional:
            raise _bad(spec, "a positional argument after a keyword one")
        elif i >= len(params):
            raise _bad(spec, f"{kind} takes at most {len(params)} argument(s)")
        else:
            name, value = params[i][0], arg
        if name in got:
            raise _bad(spec, f"{name} given twice")
        got[name] = _value(spec, name, value)
    for name, default in params:
        if name not in got:
            if default is None and not (kind == "allclose" and "atol" in got):
                raise _bad(spec, f"{kind} needs {name}")
            got[name] = 0.0 if default is None else default
    try:
        if kind == "exact":
            return exact()
        if kind == "ulp":
            return ulp(got["n"], signed_zeros=got["signed_zeros"])
        if kind == "allclose":
            return allclose(got["rtol"], got["atol"], equal_nan=got["equal_nan"])
        return reference(got["k"])
    except PolicyError as err:
        raise _bad(spec, str(err)) from err
