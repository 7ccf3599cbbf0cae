"""How the harness times contenders against each other: alternated call by call, each call alone."""

from __future__ import annotations

import statistics
import time

BUDGET_S, QUICK_BUDGET_S = 1.5, 0.03  # seconds a comparison runs, all contenders together
MIN_ROUNDS, QUICK_MIN_ROUNDS = 20, 3


def ready(y):
    """``y``, each of its arrays (or its one array) finished computing."""
    for v in y if isinstance(y, (list, tuple)) else (y,):
        if hasattr(v, "block_until_ready"):
            v.block_until_ready()
    return y


def compare(contenders: dict, *, quick: bool, budget: float | None = None, min_rounds: int | None = None) -> dict:
    """Seconds a call of each contender: {"best", "median", "calls"}.

    The contenders alternate call by call (the order rotating each round), so a burst of other
    load on this shared machine hits each alike; each call is timed alone, less the cost of
    timing an empty call. ``budget`` and ``min_rounds``: other than the default for ``quick``."""
    budget = budget if budget is not None else QUICK_BUDGET_S if quick else BUDGET_S
    min_rounds = min_rounds if min_rounds is not None else QUICK_MIN_ROUNDS if quick else MIN_ROUNDS
    fns = list(contenders.items())
    for _, fn in fns:  # warm up
        ready(fn())
        ready(fn())
    clock = time.perf_counter
    floor = min(_time_one(clock, lambda: None) for _ in range(200))
    times: dict = {k: [] for k in contenders}
    start, rounds = clock(), 0
    while rounds < min_rounds or clock() - start < budget:
        k = rounds % len(fns)
        for name, fn in fns[k:] + fns[:k]:
            times[name].append(max(0.0, _time_one(clock, fn) - floor))
        rounds += 1
    return {k: {"best": min(v), "median": statistics.median(v), "calls": len(v)} for k, v in times.items()}


def _time_one(clock, fn) -> float:
    t0 = clock()
    ready(fn())
    return clock() - t0
