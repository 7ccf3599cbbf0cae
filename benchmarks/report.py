"""Write the harness results: JSON, docs/benchmarks.md with the targets judged, and a plot."""

from __future__ import annotations

import json
from pathlib import Path

from bf16bridge.tables import table

from .harness import SIZES

ZERO_COPY_RAW_RATIO, ZERO_COPY_SLACK_S = 1.5, 10e-6
SPEEDUP_AT = {"256 MiB": 1000, "32 MiB": 100}
COPY_RATIO = KERNEL_RATIO = IMPORT_RATIO = 1.5


def _t(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _b(n) -> str:
    if n is None:
        return "n/a"
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def _x(r: float) -> str:
    return f"{r:,.0f}x" if r >= 100 else f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def targets(res: dict) -> list[tuple[str, bool, str]]:
    """Each target of the benchmark issue: (what, met?, the measured numbers)."""
    out = []
    pairs = res["pairs"]
    sizes = sorted({r["size"] for r in pairs}, key=lambda k: SIZES[k])
    small, large = sizes[0], sizes[-1]
    zc = [r for r in pairs if not r["copies"]]
    worst_raw = max((r for r in zc if r["size"] == small),
                    key=lambda r: r["bridge"]["median"] / (ZERO_COPY_RAW_RATIO * r["raw"]["median"] + ZERO_COPY_SLACK_S))
    ok = all(r["bridge"]["median"] <= ZERO_COPY_RAW_RATIO * r["raw"]["median"] + ZERO_COPY_SLACK_S
             for r in zc if r["size"] == small)
    out.append((f"zero-copy routes at {small}: at most 1.5x the raw call + 10 us", ok,
                f"worst {worst_raw['source']} -> {worst_raw['target']}: bridge {_t(worst_raw['bridge']['median'])}, "
                f"raw {_t(worst_raw['raw']['median'])} (limit {_t(1.5 * worst_raw['raw']['median'] + 10e-6)})"))
    by = {(r["source"], r["target"], r["size"]): r for r in pairs}
    growth = [(by[(r["source"], r["target"], large)]["bridge"]["median"] / r["bridge"]["median"], r)
              for r in zc if r["size"] == small and (r["source"], r["target"], large) in by]
    worst_g, wr = max(growth, key=lambda g: g[0])
    out.append((f"zero-copy routes: time independent of size ({small} -> {large}, at most 1.5x)", worst_g <= 1.5,
                f"worst {wr['source']} -> {wr['target']}: {_x(worst_g)}"))
    for label, need in SPEEDUP_AT.items():
        rows = [r for r in pairs if r["size"] == label and not r["workaround_zero_copy"]]
        if not rows:
            continue
        sp = [(r["workarounds"][0]["median"] / r["bridge"]["median"], r) for r in rows]
        low, lr = min(sp, key=lambda s: s[0])
        skipped = [f"{r['source']} -> {r['target']}" for r in pairs if r["size"] == label and r["workaround_zero_copy"]]
        out.append((f"at {label}: every pair at least {need}x faster than the workaround", low >= need,
                    f"slowest {lr['source']} -> {lr['target']}: {_x(low)}; excluded (workaround already zero-copy): "
                    + ", ".join(skipped)))
    for c in res["copying"]:
        ratio = c["bridge"]["median"] / c["memcpy"]["median"]
        how = f"{_x(ratio)} ({_t(c['bridge']['median'])} vs memcpy {_t(c['memcpy']['median'])})"
        if "own" in c:
            how += (f"; a transpose is a strided gather, not a memcpy: the framework's own "
                    f"`{c['own']['code']}` takes {_t(c['own']['median'])} "
                    f"({_x(c['bridge']['median'] / c['own']['median'])} of it)")
        out.append((f"copying route {c['case']} ({c['size']}): within 1.5x of memcpy", ratio <= COPY_RATIO, how))
    for k in res["kernels"]:
        if "time" in k and k["impl"].startswith("kernels.") and "auto" in k["impl"]:
            ratio = k["time"]["median"] / k["floor"]
            out.append((f"kernel {k['kernel']} ({k['size']}): within 1.5x of the bandwidth floor",
                        ratio <= KERNEL_RATIO, f"{_x(ratio)} ({_t(k['time']['median'])} vs floor {_t(k['floor'])})"))
    for c in res.get("import_copy_cost", []):
        out.append((f"{c['adapter']}'s declared import_copy_cost ({c['declared']:g}) on the measured side of 1",
                    (c["declared"] > 1) == (c["measured"] > 1),
                    f"measured {_x(c['measured'])}: {_t(c['own']['median'])} for its own copy vs "
                    f"{_t(c['bridge']['median'])} for ours"))
    imp = res["import"]
    ratio = imp["bf16bridge"]["median"] / imp["numpy, ml_dtypes"]["median"]
    out.append(("import bf16bridge within 1.5x of import numpy, ml_dtypes", ratio <= IMPORT_RATIO,
                f"{_x(ratio)} ({_t(imp['bf16bridge']['median'])} vs {_t(imp['numpy, ml_dtypes']['median'])})"))
    return out


def markdown(res: dict, plot_name: str | None) -> str:
    m = res["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `python -m benchmarks{' --quick' if res['mode'] == 'quick' else ''}` on {m['when']}. "
        "Times are medians of repeated runs after warm-up; every comparison is a ratio measured in the same "
        "run (the machine is shared and noisy). Raw results: `benchmarks/results/`.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m['cpu_bf16']}), Python {m['python']}. "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
        "",
        "## Targets",
        "",
        table(["target", "met", "measured"], [(what, "yes" if ok else "**no**", how) for what, ok, how in targets(res)],
              "markdown"),
    ]
    if plot_name:
        lines += ["", f"![time against size, bridge and workaround, per pair]({plot_name})"]
    if res.get("pairs_left_out"):
        lines += ["", "Pairs left out (no raw call or workaround written for them): "
                  + ", ".join(res["pairs_left_out"]) + "."]
    sizes = sorted({r["size"] for r in res["pairs"]}, key=lambda k: SIZES[k])
    for label in sizes:
        rows = [r for r in res["pairs"] if r["size"] == label]
        cells = []
        for r in rows:
            w = r["workarounds"][0]
            note = " (already zero-copy)" if r["workaround_zero_copy"] else ""
            cells.append((f"{r['source']} -> {r['target']}", r["route"], "yes" if r["copies"] else "no",
                          _t(r["bridge"]["median"]), _t(r["raw"]["median"]),
                          f"+{_t(max(0.0, r['bridge']['median'] - r['raw']['median']))}", _t(w["median"]),
                          f"{_x(w['median'] / r['bridge']['median'])}{note}", f"`{w['code']}`"))
            cells += [("", "", "", "", "", "", _t(extra["median"]), _x(extra["median"] / r["bridge"]["median"]),
                       f"`{extra['code']}`") for extra in r["workarounds"][1:]]
        lines += ["", f"## {label} of bf16 (np.copy of the same bytes: {_t(rows[0]['memcpy']['median'])})", "",
                  table(["pair", "route", "copies", "bridge", "raw call", "overhead over raw", "workaround",
                         "speed-up", "workaround code"], cells, "markdown")]
    mem_rows = [r for r in res["pairs"] if "peak_extra_bytes" in r]
    if mem_rows:
        lines += ["", f"## Peak extra memory ({mem_rows[0]['size']} input)", "",
                  table(["pair", "bridge", "workaround"],
                        [(f"{r['source']} -> {r['target']}", _b(r["peak_extra_bytes"]["bridge"]),
                          _b(r["peak_extra_bytes"]["workaround"])) for r in mem_rows], "markdown")]
    lines += ["", "## Routes that must copy", "",
              "Each against a memcpy into fresh memory (`np.copy`) of the same bytes, measured next to it.", "",
              table(["input", "size", "time", "memcpy", "ratio", "framework's own layout change", "why it copies"],
                    [(c["case"], c["size"], _t(c["bridge"]["median"]), _t(c["memcpy"]["median"]),
                      _x(c["bridge"]["median"] / c["memcpy"]["median"]),
                      f"`{c['own']['code']}` {_t(c['own']['median'])}" if "own" in c else "", "; ".join(c["reasons"]))
                     for c in res["copying"]], "markdown")]
    if res.get("import_copy_cost"):
        lines += ["", "## What an import's own copy costs (`Adapter.import_copy_cost`)", "",
                  "An adapter whose import copies an unaligned buffer itself declares what that copy costs against "
                  "the bridge's own aligned copy followed by a zero-copy import; the planner prefers the cheaper. "
                  "Measured here as the ratio of the two routes' medians, alternated three times (best of each); "
                  "`tests/test_benchmarks_smoke.py` checks that each declared value lies on the same side of 1 "
                  "as the measured one.", "",
                  table(["adapter", "size", "its import of an unaligned array", "the bridge's copy, then import",
                         "measured", "declared"],
                        [(c["adapter"], c["size"], f"{_t(c['own']['median'])} (`{c['own']['code']}`)",
                          f"{_t(c['bridge']['median'])} (`{c['bridge']['code']}`)", _x(c["measured"]),
                          f"{c['declared']:g}") for c in res["import_copy_cost"]], "markdown")]
    lines += ["", "## Kernels", "",
              "The floor is the bytes a conversion must read and write (6 bytes an element) at the bandwidth "
              "of a memcpy into memory already there, measured in the same run (the kernels write into `out=`).", ""]
    lines.append(table(["size", "conversion", "implementation", "time", "floor", "ratio to floor"],
                       [(k["size"], k["kernel"], k["impl"], _t(k["time"]["median"]), _t(k["floor"]),
                         _x(k["time"]["median"] / k["floor"])) if "time" in k else
                        (k["size"], k["kernel"], k["impl"], _b(k["peak_extra_bytes"]), "", "")
                        for k in res["kernels"]], "markdown"))
    imp = res["import"]
    lines += ["", "## Import time (a fresh process each, the two alternating, median of 11)", "",
              table(["import", "time"], [(f"`import {k}`", _t(v["median"])) for k, v in imp.items()], "markdown")]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pairs = sorted({(r["source"], r["target"]) for r in res["pairs"]})
    fig, axes = plt.subplots(3, 4, figsize=(16, 10), sharex=True, sharey=True)
    for ax, (s, d) in zip(axes.flat, pairs):
        rows = sorted((r for r in res["pairs"] if (r["source"], r["target"]) == (s, d)), key=lambda r: r["nbytes"])
        xs = [r["nbytes"] for r in rows]
        ax.loglog(xs, [r["bridge"]["median"] for r in rows], "o-", label="bf16bridge")
        ax.loglog(xs, [r["workarounds"][0]["median"] for r in rows], "s--", label="workaround")
        ax.loglog(xs, [r["memcpy"]["median"] for r in rows], ":", color="gray", label="memcpy")
        ax.set_title(f"{s} -> {d}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("bytes of bf16")
    for ax in axes[:, 0]:
        ax.set_ylabel("seconds (median)")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("bf16bridge.convert against the usual workaround, per pair")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def write(res: dict, doc: Path, plot_path: Path, json_path: Path) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(res, indent=1))
    doc.parent.mkdir(parents=True, exist_ok=True)
    has_plot = plot(res, plot_path)
    rel = plot_path.name if plot_path.parent == doc.parent else str(plot_path)
    doc.write_text(markdown(res, rel if has_plot else None))
