"""Policies decide whether a comparison passed.

``rounding(k)`` (the default: what bf16 rounding explains, see rounding.py), ``exact()``,
``ulp(n)``, ``allclose(rtol, atol)`` and ``reference(k)``, plus the frameworks' own test
helpers' allclose, tolerances per dtype included. A policy is also written as text:
"rounding(8)", "exact", "ulp(2)", "allclose(1e-2, 1e-5)", "torch", "jax", "tensorflow",
"reference(2)".
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from bf16bridge.errors import Bf16BridgeError


class PolicyError(Bf16BridgeError, ValueError):
    """A parity policy that cannot be read or makes no sense (the message lists the valid ones)."""


#: reference(k)'s default cap: a result whose error is more than this many times what its dtype's
#: rounding allows fails, however close the others are (a fault they all share). Correct matmuls of
#: random data stay well inside it (tests/parity/test_parity_policies.py; docs/parity.md, "reference(k)'s cap")
REFERENCE_CAP = 16.0

#: rounding(k)'s default budget: each result within k roundings of the exact answer, two results within 2k
ROUNDING_K = 8

#: the policy ``compare``, ``run``, ``suite``, ``compare_outputs``, the ``assert_*`` helpers and
#: ``bf16bridge parity`` use when none is given: passes what bf16 rounding explains (rounding.py)
DEFAULT_POLICY = "rounding(8)"


@dataclass(frozen=True)
class Policy:
    kind: str  # rounding | exact | ulp | allclose | reference
    n: float = 0  # ulp: max ULP distance; reference, rounding: k
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
    #: each step rounded to it; "numpy", numpy.isclose itself on the values after ``widen`` (what
    #: jax's and tensorflow's helpers hand numpy.testing.assert_allclose; see metrics.isclose)
    arithmetic: str = "float64"
    #: a named framework policy's tolerances per result dtype, ((dtype, rtol, atol), ...), with
    #: ("*", rtol, atol) for every other dtype; a pair of results takes the larger rtol and the
    #: larger atol of its two dtypes, as each of the three frameworks does (see tolerances());
    #: empty: rtol and atol for every dtype. (A named policy's rtol and atol are its bf16 row.)
    by_dtype: tuple = ()
    #: arithmetic "numpy": the dtypes converted before numpy.isclose, ((dtype, to), ...)
    widen: tuple = ()
    #: by_dtype: the rtol a pair whose larger rtol is 0 gets (jax passes no 0 on: numpy's 1e-7)
    rtol_when_0: float = 0.0
    #: reference: how far each result's error may be from what its own dtype's rounding allows
    #: (``rounding_multiple``), whatever the best result does: a fault every result shares
    #: fails it. None: no such bound (each result judged against the best one only)
    cap: float | None = REFERENCE_CAP

    def tolerances(self, a: str, b: str) -> tuple[float, float]:
        """(rtol, atol) for results of the dtypes named ``a`` and ``b``."""
        if not self.by_dtype:
            return self.rtol, self.atol
        table = {d: (r, t) for d, r, t in self.by_dtype}
        (ra, ta), (rb, tb) = table.get(a, table["*"]), table.get(b, table["*"])
        return max(ra, rb) or self.rtol_when_0, max(ta, tb)

    def __str__(self) -> str:
        nan = "" if self.equal_nan else ", equal_nan=false"
        if self.name:
            return f"{self.name} (allclose with its test helper's tolerances per dtype{nan})"
        if self.kind == "exact":
            return "exact"
        if self.kind == "rounding":
            return f"rounding({self.n:g})"
        if self.kind == "ulp":
            return f"ulp({self.n:g}" + (", signed_zeros=true)" if self.signed_zeros else ")")
        if self.kind == "allclose":
            return f"allclose(rtol={self.rtol:g}, atol={self.atol:g}{nan})"
        if self.cap == REFERENCE_CAP:
            return f"reference({self.n:g})"
        return f"reference({self.n:g}, cap={'none' if self.cap is None else format(self.cap, 'g')})"


def _number(x) -> bool:
    """A finite real number (not a bool, a string or None): what a tolerance can be."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def rounding(k: float = ROUNDING_K) -> Policy:
    """What rounding explains: each result within k roundings (u, the unit roundoff of its dtype, times
    each element's scale: its condition scale, or its magnitude and the tensor's) of the float64
    reference where there is one; without, two results within 2k of each other, element by element
    and normwise. NaN/inf only where rounding explains them (see rounding.py)."""
    if not (_number(k) and k >= 1):
        raise PolicyError(f"rounding(k) needs a finite number k >= 1 (1: as close as correct rounding); got {k!r}")
    return Policy("rounding", n=float(k))


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


def reference(k: float = 2.0, *, cap: float | None = REFERENCE_CAP) -> Policy:
    """Each candidate's RMS error against the float64 reference at most k times the best candidate's,
    or k times what correct rounding to its own dtype may err, whichever is larger; and, unless
    ``cap=None``, its error at most ``cap`` times what its dtype's rounding allows (with condition=:
    max |error| / (u * condition); without: RMS error / the rounding floor): a fault every result
    shares fails, which the first rule alone passes."""
    if not (_number(k) and k >= 1):
        raise PolicyError(f"reference(k) needs a finite number k >= 1 (1: every result as close as the best); got {k!r}")
    if cap is not None and not (_number(cap) and cap >= 1):
        raise PolicyError(f"reference(k, cap): cap needs a finite number >= 1 (1: no result beyond its dtype's "
                          f"rounding), or None (no absolute bound: a fault every result shares passes); got {cap!r}")
    return Policy("reference", n=k, cap=cap)


def rounding_multiple(r) -> float:
    """How many times what its own dtype's rounding allows one result's error against the reference
    is (``r``: a compare.Against): with ``condition=``, its largest error in units of u * condition (a
    correct result of a backward-stable computation stays near or below 1, cancellation or not);
    without, its RMS error over the RMS error of the reference correctly rounded to its dtype (1 for a
    correctly rounded result; 0 for an exact one; infinite for an error where that floor is 0).
    reference(k)'s ``cap`` bounds it, so a fault every result shares fails. Without a condition scale
    it is no sound bound: a correct result of an ill-conditioned computation (cancellation, a long
    float32 sum) may be many rounding floors off."""
    if r.shape_mismatch:
        return float("inf")
    if r.max_normalised is not None:
        return r.max_normalised
    if r.rounding_rms > 0:
        return r.rms_error / r.rounding_rms
    return 0.0 if r.rms_error == 0 else float("inf")


_NARROW_FLOATS = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
                  "float8_e4m3", "float8_e3m4", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")
_NARROW_INTS = ("int4", "uint4", "int2", "uint2")

#: torch.testing.assert_close's _DTYPE_PRECISIONS (torch/testing/_comparison.py); any other dtype
#: (the fp8s, the narrow ints) (0, 0): equal values. get_tolerances reads both inputs' dtypes before
#: check_dtype=False promotes them and takes the larger rtol and atol (bf16 against float32: bf16's).
_TORCH = (("bfloat16", 1.6e-2, 1e-5), ("float16", 1e-3, 1e-5), ("float32", 1.3e-6, 1e-5), ("float64", 1e-7, 1e-7),
          ("*", 0.0, 0.0))

#: jax's _default_tolerance (jax/_src/public_test_util.py), read by JaxTestCase.assertAllClose as
#: both rtol and atol, the larger of the two dtypes'. float64: 1e-15 as with jax_enable_x64 (without
#: it jax reads float64 as float32, 1e-6, but then no jax result is float64). A 0 (two ints) is not
#: passed on (``if rtol:``), so numpy.testing.assert_allclose's defaults, rtol 1e-7 and atol 0, apply.
#: fp6, which jax has no dtype for (its table raises KeyError): 1e-1, its rule for the fp8 formats.
_JAX = (("bfloat16", 1e-2, 1e-2), ("float16", 1e-3, 1e-3), ("float32", 1e-6, 1e-6), ("float64", 1e-15, 1e-15),
        *((n, 1.0, 1.0) for n in ("float8_e8m0fnu", "float4_e2m1fn")),
        *((n, 1e-1, 1e-1) for n in _NARROW_FLOATS if n not in ("float8_e8m0fnu", "float4_e2m1fn")),
        ("*", 0.0, 0.0))
#: jax's _assert_numpy_allclose: its custom floats (bf16, the fp8s, fp4; fp6 here too) to float32,
#: int2/int4 to int8 (uint2/uint4 to uint8), then numpy.testing.assert_allclose
_JAX_WIDEN = (("bfloat16", "float32"), *((n, "float32") for n in _NARROW_FLOATS),
              *((n, "uint8" if n.startswith("u") else "int8") for n in _NARROW_INTS))

#: tensorflow's TensorFlowTestCase.assertAllCloseAccordingToType defaults
#: (tensorflow/python/framework/test_util.py): 1e-6 for every dtype (float32's float_rtol/float_atol
#: too, float64 and the fp8s unnamed), raised to 1e-3 where either side is float16 and to 1e-2 where
#: either is bf16: the larger of the two dtypes'.
_TENSORFLOW = (("bfloat16", 1e-2, 1e-2), ("float16", 1e-3, 1e-3), ("*", 1e-6, 1e-6))
#: its _assertArrayLikeAllClose: bf16 and five fp8s to float32, then numpy.allclose and
#: numpy.testing.assert_allclose(equal_nan=True); its fp4 and int4/int2 stay as they are (numpy
#: computes in fp4, and int4 with a float in float16). The dtypes tensorflow has none of (fp6, e8m0,
#: e3m4, e4m3) go to float32 too, as its other fp8s, not into arithmetic of their own
_TENSORFLOW_WIDEN = (("bfloat16", "float32"), *((n, "float32") for n in _NARROW_FLOATS if n != "float4_e2m1fn"))

#: the frameworks' own test helpers: torch.testing.assert_close(check_dtype=False) (equal_nan=False:
#: NaN is close to nothing; computed as torch.isclose does, in the dtype the two promote to); jax's
#: JaxTestCase.assertAllClose(check_dtypes=False) and tensorflow's assertAllCloseAccordingToType, both
#: numpy.isclose on the values their helper widens, with equal_nan=True (NaN in the same places agrees)
FRAMEWORK_DEFAULTS = {
    "torch": Policy("allclose", rtol=1.6e-2, atol=1e-5, name="torch", equal_nan=False, arithmetic="promoted",
                    by_dtype=_TORCH),
    "jax": Policy("allclose", rtol=1e-2, atol=1e-2, name="jax", arithmetic="numpy", by_dtype=_JAX,
                  widen=_JAX_WIDEN, rtol_when_0=1e-7),
    "tensorflow": Policy("allclose", rtol=1e-2, atol=1e-2, name="tensorflow", arithmetic="numpy",
                         by_dtype=_TENSORFLOW, widen=_TENSORFLOW_WIDEN),
}


#: each policy written as text: its arguments, in order, and their defaults (None: required)
_SIGNATURES = {
    "rounding": (("k", float(ROUNDING_K)),),
    "exact": (),
    "ulp": (("n", 1), ("signed_zeros", False)),
    "allclose": (("rtol", None), ("atol", 0.0), ("equal_nan", True)),
    "reference": (("k", 2.0), ("cap", REFERENCE_CAP)),
}

_USAGE = ("use rounding(K) (the default, rounding(8)), exact, ulp(N) (N a whole number), ulp(N, signed_zeros=true), allclose(RTOL, ATOL) "
          "(or allclose(rtol=R, atol=A, equal_nan=false)), reference(K) (or reference(K, cap=C), cap=none), torch, "
          "jax or tensorflow")


def _bad(spec, why: str) -> PolicyError:
    return PolicyError(f"policy {spec!r}: {why}; {_USAGE}")


def _value(spec, name: str, text: str):
    if name in ("signed_zeros", "equal_nan"):
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise _bad(spec, f"{name} takes true or false, not {text!r}")
    if name == "cap" and text == "none":
        return None
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
    if inner is None and kind not in ("exact", "rounding"):
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
    return _made(spec, kind, got)


def _made(spec, kind: str, got: dict) -> Policy:
    """The policy of ``kind`` with the arguments read from ``spec``; refused as ``spec``'s error."""
    try:
        if kind == "exact":
            return exact()
        if kind == "rounding":
            return rounding(got["k"])
        if kind == "ulp":
            return ulp(got["n"], signed_zeros=got["signed_zeros"])
        if kind == "allclose":
            return allclose(got["rtol"], got["atol"], equal_nan=got["equal_nan"])
        return reference(got["k"], cap=got["cap"])
    except PolicyError as err:
        raise _bad(spec, str(err)) from err
