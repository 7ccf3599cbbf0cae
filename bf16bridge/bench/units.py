"""How the benchmark's pages and logs write times, sizes and ratios."""

from __future__ import annotations


def secs(s: float) -> str:
    """Seconds as us, ms or s."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def size(n) -> str:
    """Bytes as KiB or MiB ("n/a" for None)."""
    if n is None:
        return "n/a"
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def times_x(r: float) -> str:
    """A ratio as "1.23x", "12.3x" or "1,234x"."""
    return f"{r:,.0f}x" if r >= 100 else f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def ratio(times: dict, key: str, base: str) -> float:
    """The fastest call of ``key`` over the fastest of ``base``."""
    return times[key]["best"] / times[base]["best"]


def times_cell(t: dict) -> str:
    """The fastest call, and the median in parentheses."""
    return f"{secs(t['best'])} ({secs(t['median'])})"
