"""Trials an adapter runs on its framework's own casts: does a cast keep every value as ml_dtypes does?"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from bf16bridge.core import dtypes, formats


def cast_matches(src: str, dst: str, run: Callable[[Any], Any]) -> bool:
    """Whether ``run`` (a framework's own conversion, given and returning numpy arrays) keeps
    every ``src`` value exactly in ``dst``, as ml_dtypes reads both: NaN for NaN, zeros keeping
    their sign. For the adapters' ``casts``, found by trying (at most 256 values; 65,536 for bf16).

    ``run`` gets every ``src`` value as a numpy array of ``src``, or, where numpy cannot hold
    ``src`` (no ml_dtypes), as its carrier's bits: the expected values then come from the
    row's own decoding (``core.formats``), which reads its bits without ml_dtypes."""
    import numpy as np

    try:
        # NaN patterns warn "invalid value encountered in cast" in some ml_dtypes casts
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            bits = dtypes.all_patterns(src)
            if dtypes.numpy_missing(src) is None:
                a = bits.view(dtypes.numpy_dtype(src))
                want = a.astype(np.float64)
            else:
                a = bits
                want = formats.widen(bits, src).astype(np.float64)
            got = np.asarray(run(a)).astype(np.float64)
    except Exception:  # noqa: BLE001 - any failure means it does not convert
        return False
    nan = np.isnan(want)
    return bool(want.shape == got.shape and np.array_equal(nan, np.isnan(got))
                and np.array_equal(want[~nan], got[~nan])
                and np.array_equal(np.signbit(want[~nan]), np.signbit(got[~nan])))


def float_row(name: str | None) -> bool:
    """A floating row numpy holds here, one value a byte or more (ml_dtypes' cast is the reference
    an adapter's own cast between two of them is held to: ``rounds_as_ml_dtypes``)."""
    row = dtypes.ROWS.get(name) if name is not None else None
    return row is not None and row.kind == "float" and row.packing == 1 and dtypes.numpy_missing(row.name) is None


def _rounding_probe(src: str):
    """Values of float row ``src`` where two casts from it differ if they round differently: every
    pattern of a 16-bit or narrower type; for float32 and float64, every exponent (subnormals
    included) under mantissas at, just below and just above a tie at each bit (a tie plus the
    smallest tail shows a double rounding)."""
    import numpy as np

    dt = dtypes.numpy_dtype(src)
    if dt.itemsize <= 2:
        return dtypes.all_patterns(src).view(dt)
    mant = 23 if dt.itemsize == 4 else 52
    u = np.dtype(f"u{dt.itemsize}")
    tails = sorted({m for k in range(mant) for m in (1 << k, (1 << k) - 1, (1 << k) + 1, 3 << k)
                    if m < 1 << mant})
    heads = np.arange(1 << (dt.itemsize * 8 - mant), dtype=u) << u.type(mant)  # sign and exponent
    return (heads[:, None] | np.array(tails, u)[None, :]).ravel().view(dt)


def rounds_as_ml_dtypes(src: str, dst: str, run: Callable[[Any], Any]) -> bool:
    """Whether ``run`` (a framework's own cast from float row ``src`` to ``dst``, given and returning
    numpy arrays) gives ml_dtypes' bits (a NaN: a NaN) on every value where two casts can differ
    (subnormals flushed, a double rounding): tried once per pair by the adapters whose casts do
    not (XLA:CPU and tensorflow's CPU kernels flush subnormals), which then cast in numpy."""
    import numpy as np

    a = _rounding_probe(src)
    to = dtypes.numpy_dtype(dst)
    # NaN and overflow casts warn through errstate (no catch_warnings: from two threads at once, its
    # restore can leave "ignore" behind for the whole process)
    with np.errstate(all="ignore"):
        try:
            want = a.astype(to)
        except (TypeError, ValueError):  # no cast of ml_dtypes' between the two (e8m0 -> e4m3fn): none to hold to
            return True
        try:
            got = np.asarray(run(a))
        except Exception:  # noqa: BLE001 - a cast that fails is no cast to take
            return False
        if got.dtype != to or got.shape != want.shape:
            return False
        nan = np.isnan(want.astype(np.float32))
        return bool(np.isnan(got[nan].astype(np.float32)).all()
                    and np.array_equal(want[~nan].view(f"u{to.itemsize}"), got[~nan].view(f"u{to.itemsize}")))


# -- bf16 compute and allocations, for the capability probe ---------------------------------------

#: the side of the square matmuls the compute trial times: big enough that arithmetic, not the call, costs
MATMUL_SIDE = 256
#: bf16 counts as computed natively unless its matmul takes this many times float32's: widening costs a
#: copy of twice the size, worth it only where bf16 arithmetic is clearly the slower
SLOWER = 1.5
#: the sizes (bytes) of the fresh allocations whose alignment the probe reads: small and medium blocks,
#: which allocators place by their own alignment (large ones are page-aligned mappings)
ALLOCATION_SIZES = (1, 24, 100, 1000, 4099, 40000)


def timed_bf16_matmul(run: Callable[[str], Callable[[], Any]], what: str, rounds: int = 5) -> tuple[str, str, str]:
    """(dtype, "timed", why) for compute in one framework: ``run(dtype)`` ("bfloat16", "float32") gives a
    call doing one MATMUL_SIDE-square matmul in that dtype, finished when it returns. Each runs once to
    warm up, then they alternate ``rounds`` times; the best time of each is compared. float32 where bf16
    takes SLOWER times float32's or more."""
    import time

    calls = {d: run(d) for d in ("bfloat16", "float32")}
    best = dict.fromkeys(calls, float("inf"))
    for call in calls.values():
        call()
    for _ in range(rounds):
        for d, call in calls.items():
            t0 = time.perf_counter()
            call()
            best[d] = min(best[d], time.perf_counter() - t0)
    ratio = best["bfloat16"] / max(best["float32"], 1e-9)
    said = (f"a {MATMUL_SIDE}x{MATMUL_SIDE} {what} in bf16 took {ratio:.2f} times float32's "
            f"(best of {rounds}, timed)")
    return ("float32" if ratio >= SLOWER else "bfloat16"), "timed", said


def allocation_offsets(make: Callable[[int], Any], pointer: Callable[[Any], int]) -> tuple[int, ...]:
    """Each address mod 64 of fresh allocations of ALLOCATION_SIZES bytes (``make(n)``, all alive at
    once, so each is a block of its own; ``pointer(x)``: its data address)."""
    kept = [make(n) for n in ALLOCATION_SIZES]
    return tuple(pointer(x) % 64 for x in kept)
