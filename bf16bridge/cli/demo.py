"""The demo and the route matrix behind ``bf16bridge demo`` / ``bf16bridge matrix``."""

from __future__ import annotations

import json
import statistics
import time
from typing import Literal

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.core.memory import aligned_empty
from bf16bridge.core.convert import convert, plan
from bf16bridge.errors import FrameworkNotInstalledError, InvalidArgumentError
from bf16bridge.cli.tables import aligned_source
from bf16bridge.core.text import table
from bf16bridge.cli.workarounds import WORKAROUNDS, ZERO_COPY_ALREADY


def _usable() -> tuple[list[str], list[str]]:
    """The registered frameworks usable here (an adapter registered later joins in), and a line for
    each one left out: not installed, or failing to load, with the way to install it."""
    names, left_out = [], []
    for name in registry.names():
        try:
            registry.get(name)
        except FrameworkNotInstalledError as err:
            left_out.append(f"{name}: {err}")
        else:
            names.append(name)
    return names, left_out


def _pairs(names: list[str]):
    """Every ordered pair of ``names``."""
    return [(s, d) for s in names for d in names if s != d]


def left_out_note(missing: list[str]) -> str:
    """What the demo and the matrix leave out here (``missing``: _usable's lines; "" where none is)."""
    return "left out (their pairs are not shown):\n" + "\n".join(f"  {m}" for m in missing) if missing else ""


def sample(n: int, seed: int = 0) -> np.ndarray:
    """n random bf16 values (every bit pattern class) in a 64-byte aligned numpy array."""
    out = aligned_empty((n,), np.uint16)
    out[...] = np.random.default_rng(seed).integers(0, 1 << 16, n, dtype=np.uint16)
    return out.view(dtypes.numpy_dtype("bfloat16"))


def _ready(y):
    if hasattr(y, "block_until_ready"):
        y.block_until_ready()
    return y


def time_call(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs, after ``warmup`` runs."""
    for _ in range(warmup):
        _ready(fn())
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        _ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bits(y) -> np.ndarray:
    return convert(y, "numpy", copy=True).view(np.uint16)


def matrix_rows(n: int = 1024) -> list[dict]:
    """One row per ordered pair: the route for a contiguous, aligned bf16 tensor."""
    base = sample(n)
    rows = []
    for s, d in _pairs(_usable()[0]):
        x = aligned_source(base, s)
        p = plan(x, to=d)
        y = convert(x, d, on_alias="allow")  # the table's writable column says it
        rows.append({
            "source": s, "target": d,
            "route": " -> ".join(f"{st.framework}: {st.label}" for st in p.steps),
            "copies": p.copies, "shares_memory": p.shares_memory, "writable": p.writable,
            "bit_exact": bool(np.array_equal(_bits(y), base.view(np.uint16))),
        })
    return rows


def _table(rows: list[dict], cols: list[tuple[str, str]], fmt: Literal["text", "markdown"] = "text") -> str:
    return table([h for _, h in cols], [[r[k] for k, _ in cols] for r in rows], fmt)


MATRIX_COLS = [("source", "from"), ("target", "to"), ("route", "route"), ("copies", "copies"),
               ("writable", "writable"), ("bit_exact", "bit-exact")]


#: what every row of the matrix assumes about its input
MATRIX_ASSUMES = ("each route is for a contiguous, 64-byte aligned, writable bf16 tensor of the source "
                  "framework; other inputs can take other routes, and bb.plan(x, to=...) shows yours")


def common_input_rows(n: int = 1 << 19) -> list[dict]:
    """Inputs people commonly have that the matrix's assumptions leave out, and what the
    planner does with each (asked of plan(), never written down here): a default numpy
    allocation (numpy aligns to less than 64 bytes, so most of its buffers are not), a read-only
    numpy array, and a transposed (strided) 2-D tensor of each framework that has ``.T``."""
    bf16 = dtypes.numpy_dtype("bfloat16")
    held = []  # numpy's own buffers land where malloc puts them; keep the first not 64-byte aligned
    for _ in range(16):
        held.append(np.empty(n, dtype=bf16))
        if held[-1].ctypes.data % 64:
            break
    default = held[-1]
    read_only = sample(1024)
    read_only.flags.writeable = False
    inputs = [(f"default {registry.HUB} allocation (np.empty: address {default.ctypes.data % 64} mod 64)", default),
              (f"read-only {registry.HUB} array", read_only)]
    square = sample(64 * 64).reshape(64, 64)
    names = _usable()[0]
    for s in names:
        transposed = getattr(convert(square, s, copy=True), "T", None)
        if transposed is not None:
            inputs.append((f"transposed 2-D {s} tensor (x.T)", transposed))
    rows = []
    for label, x in inputs:
        source = registry.framework_of(x)
        for d in names:
            if d == source:
                continue
            p = plan(x, to=d)
            rows.append({"input": label, "source": source, "target": d, "copies": p.copies,
                         "why": "; ".join(st.reason for st in p.steps if st.copies and st.reason)})
    return rows


COMMON_COLS = [("input", "input"), ("target", "to"), ("copies", "route"), ("why", "why")]


def matrix_notes() -> str:
    """What the matrix assumes, and which common inputs copy (text; ``matrix("text")`` includes it)."""
    rows = [{**r, "copies": "copy" if r["copies"] else "zero-copy"} for r in common_input_rows()]
    note = left_out_note(_usable()[1])
    return (f"assumes: {MATRIX_ASSUMES}\n\n"
            "common inputs outside that assumption, as bb.plan() routes them here:\n"
            + _table(rows, COMMON_COLS) + (f"\n\n{note}" if note else ""))


def matrix(fmt: Literal["text", "markdown", "json"] = "text") -> str:
    """The route matrix as a text or markdown table, or JSON.

    "markdown" and "json" are the table alone (docs/routes.md embeds the markdown);
    "text" adds what the table assumes and which common inputs copy (matrix_notes()).
    """
    if fmt not in ("text", "markdown", "json"):
        raise InvalidArgumentError(f"matrix: fmt must be one of text, markdown, json; got {fmt!r}")
    rows = matrix_rows()
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "markdown":
        return _table(rows, MATRIX_COLS, fmt)
    return f"{_table(rows, MATRIX_COLS, fmt)}\n\n{matrix_notes()}"


def _fmt_time(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.1f} ms"


def demo(mib: float = 32.0, repeat: int = 5) -> tuple[str, bool]:
    """Move one bf16 tensor through every pair; time each against the usual workaround."""
    n = int(mib * (1 << 20)) // 2
    base = sample(n)
    expect = base.view(np.uint16)
    names, missing = _usable()
    note = left_out_note(missing)
    if len(names) < 2:
        raise FrameworkNotInstalledError(
            f"the demo moves a tensor between frameworks, and only {', '.join(names) or 'none'} is usable here:\n"
            f"{note}")
    lines = [f"bf16bridge demo: {n:,} bf16 values ({mib:g} MiB), every ordered pair of {', '.join(names)}", ""]
    if note:
        lines += [note, ""]
    rows, ok, longest = [], True, None
    for s, d in _pairs(names):
        x = aligned_source(base, s)
        p = plan(x, to=d)
        if longest is None or len(p.steps) > len(longest.steps):
            longest = p
        y = convert(x, d, on_alias="allow")  # the demo's own tensor; the table shows the route
        exact = bool(np.array_equal(_bits(y), expect))
        t_bridge = time_call(lambda: convert(x, d, on_alias="allow"), repeat)
        ok &= exact
        row = {"pair": f"{s} -> {d}", "copies": "copy" if p.copies else "zero-copy", "bridge": _fmt_time(t_bridge),
               "bits": "exact" if exact else "CHANGED", "workaround": "", "speedup": "", "workaround_bits": "",
               "code": "(none known for an adapter registered outside bf16bridge)"}
        if (s, d) in WORKAROUNDS:
            code, work = WORKAROUNDS[(s, d)]
            with np.errstate(invalid="ignore"):  # the workarounds' NaN casts warn; we count what they change
                changed = int(np.count_nonzero(_bits(work(x)) != expect))
                t_work = time_call(lambda: work(x), max(1, repeat // 2))
            speedup = t_work / t_bridge
            row.update(workaround=_fmt_time(t_work), code=code,
                       speedup=(f"{speedup:,.0f}x" if speedup >= 10 else f"{speedup:.1f}x")
                       + (" (workaround zero-copy too)" if (s, d) in ZERO_COPY_ALREADY else ""),
                       workaround_bits="exact" if not changed else f"{changed:,} changed")
        rows.append(row)
    cols = [("pair", "pair"), ("copies", "bridge"), ("bridge", "bridge time"), ("workaround", "workaround time"),
            ("speedup", "speed-up"), ("bits", "bridge bits"), ("workaround_bits", "workaround bits")]
    lines.append(_table(rows, cols))
    lines += ["", "'changed': values whose bits the workaround alters (NaN payloads lost through float32)",
              "", "workarounds timed (what people write today):"]
    lines += [f"  {r['pair']:<22} {r['code']}" for r in rows]
    lines += ["", "the longest route, as plan() shows it:", str(longest), ""]
    lines.append(f"all {len(rows)} pairs bit-exact" if ok else "BITS CHANGED on some pair")
    return "\n".join(lines), ok
