"""Write the harness results: JSON, docs/benchmarks.md with the targets judged, and a plot."""

from __future__ import annotations

import json
from pathlib import Path

from bf16bridge.core.text import table

from .harness import SIZES
from .loss_step import TARGET as LOSS_STEP_RATIO, judged_against
from .units import ratio as _ratio, secs as _t, size as _b, times_cell as _times_cell, times_x as _x

ZERO_COPY_RAW_RATIO, ZERO_COPY_SLACK_S = 1.5, 10e-6
SPEEDUP_AT = {"256 MiB": 1000, "32 MiB": 100}
COPY_RATIO = IMPORT_RATIO = 1.5
#: a kernel (float32 <-> bf16) against its bandwidth floor, both the fastest of calls alternated
KERNEL_RATIO = 1.2
#: the smallest size the bandwidth targets (a route that must copy against memcpy, a kernel against
#: its floor) are judged at: below it the fixed cost of a call outweighs the bytes (--quick's 1 MiB)
BANDWIDTH_FROM = "32 MiB"


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
    out += _bandwidth_targets(res)
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


def _judged(size: str) -> bool:
    return SIZES[size] >= SIZES[BANDWIDTH_FROM]


def _bandwidth_targets(res: dict) -> list[tuple[str, bool, str]]:
    """The routes that must copy against memcpy, the kernels against their floor: at BANDWIDTH_FROM
    and above (smaller sizes are on the page, not judged)."""
    out = []
    for c in res["copying"]:
        if c.get("copies") is False:  # a layout its target's import keeps: judged as a zero-copy route
            for at in (c, c["small"]):
                limit = ZERO_COPY_RAW_RATIO * at["raw"]["median"] + ZERO_COPY_SLACK_S
                out.append((f"zero-copy route {c['case']} ({at['size']}): at most 1.5x the raw call + 10 us",
                            at["bridge"]["median"] <= limit, f"bridge {_t(at['bridge']['median'])}, raw "
                            f"{_t(at['raw']['median'])} (limit {_t(limit)})"))
            growth = c["bridge"]["median"] / c["small"]["bridge"]["median"]
            out.append((f"zero-copy route {c['case']}: time independent of size ({c['small']['size']} -> "
                        f"{c['size']}, at most 1.5x)", growth <= 1.5, _x(growth)))
            continue
        if not _judged(c["size"]):
            continue
        ratio = c["bridge"]["median"] / c["memcpy"]["median"]
        how = f"{_x(ratio)} ({_t(c['bridge']['median'])} vs memcpy {_t(c['memcpy']['median'])})"
        if "own" in c:
            how += (f"; a transpose is a strided gather, not a memcpy: the framework's own "
                    f"`{c['own']['code']}` takes {_t(c['own']['median'])} "
                    f"({_x(c['bridge']['median'] / c['own']['median'])} of it)")
        out.append((f"copying route {c['case']} ({c['size']}): within 1.5x of memcpy", ratio <= COPY_RATIO, how))
    for k in res["kernels"]:
        if "time" in k and k["impl"].startswith("kernels.") and "auto" in k["impl"] and _judged(k["size"]):
            ratio, how = _kernel_ratio(k)
            out.append((f"kernel {k['kernel']} ({k['size']}): within {KERNEL_RATIO:g}x of the bandwidth floor",
                        ratio <= KERNEL_RATIO, how))
    return out


#: what each column of the main part means, on the page and at the top of its log
COLUMNS = (
    ("bridge", "`bb.convert(x, target)`: one call, the median of repeated calls after warm-up"),
    ("raw (raw call)", "the same move written by hand with the frameworks' own zero-copy calls (DLPack, bit "
                       "views: `bf16bridge/bench/raw.py`); bridge - raw is what the bridge adds"),
    ("workaround", "what people write without bf16bridge: widen to float32, cross, narrow again "
                   "(`bf16bridge/cli/workarounds.py`); the speed-up is workaround / bridge"),
    ("memcpy", "`np.copy` of the same bytes: what one copy costs here; a route that must copy is judged against it"),
    ("floor", "the kernels: the bytes a conversion reads and writes, at memcpy's bandwidth"),
)


#: the same for the cost of a call's log (its page explains each table in its own words)
FUNCTION_COLUMNS = (
    ("bridge (functions)", "the call through bf16bridge (convert, convert_tree, a bridged function): the "
                           "fastest of calls alternated with the others'"),
    ("raw, raw loop", "the same moves written by hand (raw.py's calls; a dict comprehension of them)"),
    ("on_alias='allow'", "the call that warns by default (a writable tensor over an immutable buffer), told not to"),
    ("torch_jax_interop", "the peer's own call for the same move"),
    ("vs (bridged)", "a bridged function against the wrapper a user writes by hand with raw DLPack moves"),
    ("loss step", "a torch MLP step whose loss is a jax function: each contender's step, and the bridge over the "
                  "fastest of the loss jitted by hand and torch_jax_interop's wrappers"),
)


def markdown(res: dict | None, plot_name: str | None, functions: dict | None = None) -> str:
    """The page: the main run's results (``res``) and the cost-of-a-call results (``functions``),
    each from its own saved run; either may be missing."""
    if res is None:
        return "\n".join(["# Benchmarks", *(function_markdown(functions) if functions else [])]) + "\n"
    lines = _intro(res)
    if plot_name:
        lines += ["", f"![time against size, bridge and workaround, per pair]({plot_name})"]
    lines += _pair_tables(res) + _copy_sections(res) + _kernel_and_import_sections(res)
    if functions:
        lines += function_markdown(functions)
    return "\n".join(lines) + "\n"


def _intro(res: dict) -> list[str]:
    m = res["machine"]
    left = res.get("frameworks_left_out") or {}
    lines = [
        "# Benchmarks",
        "",
        f"Written by `bf16bridge bench{' --quick' if res['mode'] == 'quick' else ''}` on {m['when']}. "
        "Times are medians of repeated runs after warm-up; every comparison is a ratio measured in the same "
        "run (the machine is shared and noisy). Raw results: `benchmarks/results/`.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m['cpu_bf16']}), Python {m['python']}. "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
    ]
    if left:
        lines += ["", "Frameworks left out of this run: " + "; ".join(f"{k} ({v})" for k, v in left.items()) + "."]
    return lines + [
        "",
        "Columns: " + "; ".join(f"**{name}**: {what}" for name, what in COLUMNS) + ".",
        "",
        "## Targets",
        "",
        table(["target", "met", "measured"], [(what, "yes" if ok else "**no**", how) for what, ok, how in targets(res)],
              "markdown"),
    ]


def _pair_tables(res: dict) -> list[str]:
    lines: list[str] = []
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
    return lines


def _copy_sections(res: dict) -> list[str]:
    copying = [c for c in res["copying"] if c.get("copies") is not False]
    kept = [c for c in res["copying"] if c.get("copies") is False]
    unjudged = "" if all(_judged(c["size"]) for c in copying) else (
        f" Not judged below {BANDWIDTH_FROM}: the fixed cost of a call outweighs the bytes there.")
    lines = ["", "## Routes that must copy", "",
             "Each against a memcpy into fresh memory (`np.copy`) of the same bytes, measured next to it."
             + unjudged, "",
             table(["input", "size", "time", "memcpy", "ratio", "framework's own layout change", "why it copies"],
                   [(c["case"], c["size"], _t(c["bridge"]["median"]), _t(c["memcpy"]["median"]),
                     _x(c["bridge"]["median"] / c["memcpy"]["median"]),
                     f"`{c['own']['code']}` {_t(c['own']['median'])}" if "own" in c else "", "; ".join(c["reasons"]))
                    for c in copying], "markdown")]
    if kept:
        lines += ["", "## Layouts the target's import keeps (zero-copy)", "",
                  "Inputs that copied until the target's DLPack import was found (by trying, per version: the jax "
                  "fact `permuted import`) to keep their layout, so `bb.plan` says zero-copy: each against the raw "
                  "call (`bench/raw.py`), alternated with it, at two sizes. Target: at most 1.5x the raw call + "
                  "10 us, and no slower at the larger size than 1.5x the smaller.", "",
                  table(["input", "size", "bridge", "raw call", "ratio", "memcpy of the same bytes"],
                        [(c["case"], at["size"], _t(at["bridge"]["median"]), _t(at["raw"]["median"]),
                          _x(at["bridge"]["median"] / at["raw"]["median"]),
                          _t(c["memcpy"]["median"]) if at is c else "")
                         for c in kept for at in (c["small"], c)], "markdown")]
    if res.get("import_copy_cost"):
        lines += ["", "## What an import's own copy costs (`Adapter.import_copy_cost`)", "",
                  "An adapter whose import copies an unaligned buffer itself declares what that copy costs against "
                  "the bridge's own aligned copy followed by a zero-copy import; the planner prefers the cheaper. "
                  "Measured here as the ratio of the two routes' medians, alternated three times (best of each); "
                  "`tests/project/test_benchmarks_smoke.py` checks that each declared value lies on the same side of 1 "
                  "as the measured one.", "",
                  table(["adapter", "size", "its import of an unaligned array", "the bridge's copy, then import",
                         "measured", "declared"],
                        [(c["adapter"], c["size"], f"{_t(c['own']['median'])} (`{c['own']['code']}`)",
                          f"{_t(c['bridge']['median'])} (`{c['bridge']['code']}`)", _x(c["measured"]),
                          f"{c['declared']:g}") for c in res["import_copy_cost"]], "markdown")]
    return lines


def _kernel_ratio(k: dict) -> tuple[float, str]:
    """A kernel row's ratio to its floor, and the numbers as text: of the fastest calls where the kernel
    alternated with the floor's memcpy ("floor_best"), else (results saved before) of the medians."""
    med = k["time"]["median"] / k["floor"]
    if "floor_best" not in k:
        return med, f"{_x(med)} ({_t(k['time']['median'])} vs floor {_t(k['floor'])})"
    best = k["time"]["best"] / k["floor_best"]
    return best, (f"{_x(best)} (fastest calls: {_t(k['time']['best'])} vs floor {_t(k['floor_best'])}; "
                  f"medians: {_x(med)}, {_t(k['time']['median'])} vs {_t(k['floor'])})")


def _kernel_cells(k: dict, alternated: bool) -> tuple:
    """A kernel row's cells: its time, its floor and their ratio (the fastest, then the median)."""
    med = k["time"]["median"] / k["floor"]
    if not alternated:
        return k["size"], k["kernel"], k["impl"], _t(k["time"]["median"]), _t(k["floor"]), _x(med)
    return (k["size"], k["kernel"], k["impl"], _times_cell(k["time"]), f"{_t(k['floor_best'])} ({_t(k['floor'])})",
            f"{_x(k['time']['best'] / k['floor_best'])} ({_x(med)})")


def _kernel_and_import_sections(res: dict) -> list[str]:
    unjudged = "" if all(_judged(k["size"]) for k in res["kernels"]) else (
        f" Not judged below {BANDWIDTH_FROM}: the fixed cost of a call outweighs the bytes there.")
    alternated = all("floor_best" in k for k in res["kernels"] if "time" in k)
    lines = ["", "## Kernels", "",
             "The floor is the bytes a conversion must read and write (6 bytes an element) at the bandwidth "
             "of a memcpy into memory already there, measured in the same run (the kernels write into `out=`)."
             + (" The implementations and that memcpy alternate call by call; a cell shows the fastest call and, "
                "in parentheses, the median; a ratio is of the fastest calls (of the medians in parentheses), "
                "and so is the target's." if alternated else "") + unjudged, ""]
    lines.append(table(["size", "conversion", "implementation", "time", "floor", "ratio to floor"],
                       [_kernel_cells(k, alternated) if "time" in k else
                        (k["size"], k["kernel"], k["impl"], _b(k["peak_extra_bytes"]), "", "")
                        for k in res["kernels"]], "markdown"))
    imp = res["import"]
    runs = next(iter(imp.values())).get("n", 11)
    lines += ["", f"## Import time (a fresh process each, the two alternating, median of {runs})", "",
              table(["import", "time"], [(f"`import {k}`", _t(v["median"])) for k, v in imp.items()], "markdown")]
    return lines


def plot(res: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no plot ({path.name}): matplotlib is not installed (pip install 'bf16bridge[bench]')", flush=True)
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
    fig.suptitle("bf16bridge.core.convert against the usual workaround, per pair")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def write(res: dict | None, doc: Path, plot_path: Path, json_path: Path | None,
          functions: dict | None = None, functions_json: Path | None = None) -> None:
    """Save what was run (``json_path``, ``functions_json``: None for results loaded, not run) and
    write the page from both sets of results."""
    for data, path in ((res, json_path), (functions, functions_json)):
        if data is not None and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1))
    doc.parent.mkdir(parents=True, exist_ok=True)
    # (a quick run's two sizes draw no curve, and the plot would take more memory than the run)
    has_plot = res is not None and res.get("mode") != "quick" and plot(res, plot_path)
    rel = plot_path.name if plot_path.parent == doc.parent else str(plot_path)
    doc.write_text(markdown(res, rel if has_plot else None, functions))


def load(path: Path) -> dict | None:
    """Saved results, or None where there are none."""
    return json.loads(path.read_text()) if path.exists() else None


# -- the cost of a call (bf16bridge/bench/functions.py): convert, convert_tree, bridged functions, peers

CONVERT_RATIO, CONVERT_SLACK_S = 1.3, 1e-6
TREE_RATIO = 1.2
BRIDGED_RATIO = 1.3
ALLOW = "bridge, on_alias='allow'"


def _convert_ok(times: dict, key: str = "bridge") -> bool:
    return times[key]["best"] <= CONVERT_RATIO * times["raw"]["best"] + CONVERT_SLACK_S


def function_targets(fres: dict) -> list[tuple[str, bool, str]]:
    """The targets of issue 9, judged on the fastest call of each contender (see bf16bridge/bench/functions.py)."""
    out = []
    rows = fres["convert"]["rows"]

    def worst(rs, key):
        return max(rs, key=lambda r: r["times"][key]["best"] / (CONVERT_RATIO * r["times"]["raw"]["best"]
                                                               + CONVERT_SLACK_S))

    ones = fres["convert"].get("rows_batch_of_one", [])  # (results saved before these rows had none)
    for what, key, rs in (("1 KiB (default call)", "bridge", rows),
                          ("1 KiB (on_alias='allow' where the default warns)", ALLOW,
                           [r for r in rows if ALLOW in r["times"]]),
                          ("a 1 x 512 tensor, a size-1 dimension (default call)", "bridge", ones)):
        if not rs:
            continue
        missed = [f"{r['source']} -> {r['target']}" for r in rs if not _convert_ok(r["times"], key)]
        w = worst(rs, key)
        out.append((f"convert of {what}: at most 1.3x the raw call + 1 us on every pair ({len(rs)})",
                    not missed, f"{len(rs) - len(missed)} of {len(rs)} met; worst {w['source']} -> {w['target']}: "
                    f"{_t(w['times'][key]['best'])} vs raw {_t(w['times']['raw']['best'])} "
                    f"(limit {_t(CONVERT_RATIO * w['times']['raw']['best'] + CONVERT_SLACK_S)})"
                    + (f"; missed: {', '.join(missed)}" if missed else "")))
    for r in rows:
        if "torch_jax_interop" not in r["times"]:
            continue
        for key in ("bridge", ALLOW):
            if key in r["times"]:
                ratio = _ratio(r["times"], key, "torch_jax_interop")
                out.append((f"convert {r['source']} -> {r['target']} ({'default call' if key == 'bridge' else key}): "
                            "faster than torch_jax_interop", ratio < 1,
                            f"{_x(ratio)} of it ({_t(r['times'][key]['best'])} vs "
                            f"{_t(r['times']['torch_jax_interop']['best'])})"))
    for r in fres["tree"]:
        for key in ("bridge", ALLOW):
            if key in r["times"]:
                ratio = _ratio(r["times"], key, "raw loop")
                out.append((f"convert_tree GPT-2 small ({r['tensors']} tensors) {r['source']} -> {r['target']}"
                            f"{'' if key == 'bridge' else ', ' + key[8:]}: at most 1.2x the raw loop",
                            ratio <= TREE_RATIO, f"{_x(ratio)} ({_t(r['times'][key]['best'])} vs "
                            f"{_t(r['times']['raw loop']['best'])})"))
    for key, where, part, name in (("bridged", "", "forward_backward", "forward and backward"),
                                   ("bridged", "", "forward", "forward only"),
                                   ("bridged_jit", " under jax.jit", "forward_backward", "forward and backward"),
                                   ("bridged_jit", " under jax.jit", "forward", "forward only")):
        rs = fres.get(key)
        if not rs:
            continue  # (results saved before the part existed)
        ratios = [(_ratio(r[part], "bridge", "hand-written"), r) for r in rs]
        missed = [f"{r['caller']} -> {r['callee']} {_x(q)}" for q, r in ratios if q > BRIDGED_RATIO]
        q, w = max(ratios, key=lambda p: p[0])
        out.append((f"bridged function{where}, three 64x64 bf16 inputs, {name}: at most 1.3x a hand-written wrapper "
                    f"in each of the {len(rs)} directions", not missed,
                    f"{len(rs) - len(missed)} of {len(rs)} met; worst {w['caller']} -> {w['callee']}: {_x(q)} "
                    f"({_t(w[part]['bridge']['best'])} vs {_t(w[part]['hand-written']['best'])})"
                    + (f"; missed: {', '.join(missed)}" if missed else "")))
    return out + _grad_inputs_targets(fres) + _loss_step_targets(fres)


def _grad_inputs_targets(fres: dict) -> list[tuple[str, bool, str]]:
    """A torch caller's forward-only call whose inputs require grad (under torch.no_grad): at most
    BRIDGED_RATIO the hand-written forward, in each direction measured (none in results saved before)."""
    rs = [r for r in fres.get("bridged") or () if "forward_grad_inputs" in r]
    if not rs:
        return []
    ratios = [(_ratio(r["forward_grad_inputs"], "bridge", "hand-written"), r) for r in rs]
    missed = [f"{r['caller']} -> {r['callee']} {_x(q)}" for q, r in ratios if q > BRIDGED_RATIO]
    bits = [f"{r['caller']} -> {r['callee']}" for r in rs if not r["same_bits_grad_inputs"]]
    q, w = max(ratios, key=lambda p: p[0])
    return [(f"bridged function, three 64x64 bf16 torch inputs that require grad, forward only (torch.no_grad): "
             f"at most 1.3x the hand-written forward in each of the {len(rs)} directions", not missed and not bits,
             f"{len(rs) - len(missed)} of {len(rs)} met; worst {w['caller']} -> {w['callee']}: {_x(q)} "
             f"({_t(w['forward_grad_inputs']['bridge']['best'])} vs "
             f"{_t(w['forward_grad_inputs']['hand-written']['best'])})"
             + (f"; missed: {', '.join(missed)}" if missed else "")
             + (f"; **bits differ**: {', '.join(bits)}" if bits else ""))]


def _loss_step_targets(fres: dict) -> list[tuple[str, bool, str]]:
    """The loss step (bf16bridge/bench/loss_step.py): the bridge within LOSS_STEP_RATIO of the fastest of the
    hand-jitted and torch_jax_interop steps, with the loss and gradients of jax.jit(vjp) by hand."""
    r = fres.get("mlp_step")
    if not r:
        return []  # (results saved before the part existed: its section on the page says so)
    t = r["times"]
    best = judged_against(t)
    q, same = _ratio(t, "bridge", best), r["same_bits_as_jit_vjp_by_hand"]
    return [(f"a torch MLP step with a jax loss through bb.bridge(\"jax\"): at most {LOSS_STEP_RATIO:g}x the fastest "
             "of the loss jitted by hand and torch_jax_interop, the same bits as jax.jit(vjp) by hand",
             q <= LOSS_STEP_RATIO and same,
             f"{_x(q)} of {best} ({_t(t['bridge']['best'])} vs {_t(t[best]['best'])}); "
             + ("the same loss and gradients, bit for bit" if same else "**the loss or gradients differ**"))]


def _loss_step_markdown(fres: dict) -> list[str]:
    lines = ["", "## The loss step: a torch MLP step with a jax loss", ""]
    r = fres.get("mlp_step")
    if not r:
        return lines + ["Not in these saved results (written before this row existed): "
                        "`bf16bridge bench --only functions` measures it."]
    t = r["times"]
    best = judged_against(t)
    cells = [(f"{k} (judged against)" if k == best else k, _times_cell(v), _x(_ratio(t, "bridge", k)))
             for k, v in t.items()]
    q, same = _ratio(t, "bridge", best), r["same_bits_as_jit_vjp_by_hand"]
    ok = q <= LOSS_STEP_RATIO and same
    absent = "" if any("interop" in k for k in t) else " torch_jax_interop did not import here (the log says why)."
    return lines + [
        "One SGD step of a float32 torch MLP (64 -> 128 -> 10, a batch of 32) whose loss, softmax cross-entropy, "
        "is a jax function: `bb.bridge(\"jax\")(loss)` (compiled by default; `jit=False` beside it) against the "
        "loss jitted by hand in a torch `autograd.Function` with raw DLPack moves (`jax.jit` of its vjp, or of "
        "`jax.value_and_grad`), torch_jax_interop's `WrappedJaxFunction` and `WrappedJaxScalarFunction`, and the "
        "loss written in torch (`bf16bridge/bench/loss_step.py`). Each contender steps its own model from the same "
        "weights; the steps alternate call by call, torch on one intra-op thread. \"Same bits\": the bridge's first "
        "step gives the loss and gradients of `jax.jit(vjp)` by hand, bit for bit. Target: the bridge at most "
        f"{LOSS_STEP_RATIO:g}x the fastest of the hand-jitted and torch_jax_interop steps." + absent, "",
        table(["contender", "step", "bridge / it"], cells, "markdown"), "",
        f"The bridge over {best}: {_x(q)} (target {LOSS_STEP_RATIO:g}x); same bits: {'yes' if same else '**no**'}; "
        f"target {'met' if ok else '**missed**'}."]


def _bridged_table(rows: list) -> str:
    """The table of bridged calls against their hand-written wrappers, forward and backward and forward only."""
    cells = []
    for r in rows:
        fb, fw = r["forward_backward"], r["forward"]
        cells.append((f"{r['caller']} -> {r['callee']}", _times_cell(fb["hand-written"]), _times_cell(fb["bridge"]),
                      _x(_ratio(fb, "bridge", "hand-written")), _times_cell(fw["hand-written"]),
                      _times_cell(fw["bridge"]), _x(_ratio(fw, "bridge", "hand-written")),
                      "yes" if r["same_bits"] else "**no**"))
    return table(["caller -> callee", "fwd+bwd hand-written", "fwd+bwd bridge", "ratio", "fwd hand-written",
                  "fwd bridge", "ratio", "same bits"], cells, "markdown")


def function_markdown(fres: dict) -> list[str]:
    t = fres["timing"]
    m = fres["machine"]
    lines = [
        "", "# The cost of a call (issue 9)", "",
        f"Written by `bf16bridge bench --only functions{' --quick' if fres['mode'] == 'quick' else ''}` "
        f"(or a full run) on {m['when']}, {fres.get('code', 'code not recorded')}; results in "
        "`benchmarks/results/functions.json`. Contenders alternate call by call (the order rotating each "
        f"round), each call timed alone, for about {t['budget_s']:g} s a comparison and at least "
        f"{t['min_rounds']} rounds; a cell shows the fastest call and, in parentheses, the median call. "
        f"Targets are judged on the {t['judged_on']} (the least disturbed by other load on this shared machine).",
        "", "## Targets (the cost of a call)", "",
        table(["target", "met", "measured"],
              [(what, "yes" if ok else "**no**", how) for what, ok, how in function_targets(fres)], "markdown"),
    ]
    conv = fres["convert"]
    cells = []
    for r in conv["rows"]:
        tm = r["times"]
        cells.append((f"{r['source']} -> {r['target']}", _times_cell(tm["raw"]), _times_cell(tm["bridge"]),
                      _x(_ratio(tm, "bridge", "raw")), "yes" if _convert_ok(tm) else "**no**",
                      f"{_times_cell(tm[ALLOW])}, {_x(_ratio(tm, ALLOW, 'raw'))}, "
                      f"{'met' if _convert_ok(tm, ALLOW) else '**missed**'}" if ALLOW in tm else "",
                      _times_cell(tm["torch_jax_interop"]) if "torch_jax_interop" in tm else ""))
    lines += ["", "## convert of 1 KiB against the raw call of the same route", "",
              "The raw calls are `bf16bridge/bench/raw.py`'s: the calls a user writes, such as `torch.from_dlpack(x)`. "
              "Between torch, jax and tensorflow on the host the bridge hands a DLPack capsule straight over "
              "(`Adapter.capsule_exporter`), which skips the device and version questions `torch.from_dlpack(x)` "
              "asks first: there it can beat the raw call. jax -> torch and tensorflow -> torch warn by default "
              "(`Bf16BridgeWarning`: the result is a writable torch tensor over an immutable buffer); the default "
              "call is timed with that warning filtered out (its cost included: a filter that ignores the "
              "category everywhere, newest in the list, is read before `warnings.warn` is called), and the call with "
              "`on_alias=\"allow\"` beside it. Target: at most 1.3x raw + 1 us.", "",
              table(["pair", "raw call", "bridge (default)", "ratio", "target met",
                     "on_alias='allow': time, ratio, target", "torch_jax_interop"], cells, "markdown")]
    if conv.get("peer_error"):
        lines += ["", f"torch_jax_interop did not import: `{conv['peer_error']}`."]
    if conv.get("rows_batch_of_one"):
        lines += ["", "The same 1 KiB as a 1 x 512 tensor (a size-1 dimension, as a batch of one has). Target: at most "
                  "1.3x raw + 1 us.", "",
                  table(["pair", "raw call", "bridge (default)", "ratio", "target met"],
                        [(f"{r['source']} -> {r['target']}", _times_cell(r["times"]["raw"]),
                          _times_cell(r["times"]["bridge"]), _x(_ratio(r["times"], "bridge", "raw")),
                          "yes" if _convert_ok(r["times"]) else "**no**") for r in conv["rows_batch_of_one"]],
                        "markdown")]
    return lines + _tree_and_bridged_markdown(fres) + _loss_step_markdown(fres) + _peers_markdown(fres["peers"])


def _tree_and_bridged_markdown(fres: dict) -> list[str]:
    lines: list[str] = []
    cells = []
    for r in fres["tree"]:
        tm = r["times"]
        cells.append((f"{r['source']} -> {r['target']}", _times_cell(tm["raw loop"]), _times_cell(tm["bridge"]),
                      _x(_ratio(tm, "bridge", "raw loop")),
                      f"{_times_cell(tm[ALLOW])}, {_x(_ratio(tm, ALLOW, 'raw loop'))}" if ALLOW in tm else ""))
    lines += ["", f"## convert_tree of a GPT-2-small-shaped state dict ({fres['tree'][0]['tensors']} bf16 tensors)",
              "", "Against a dict comprehension of the raw per-tensor calls (`bf16bridge/bench/raw.py`'s: the cheapest "
              "public zero-copy call of each pair). Target: at most 1.2x.", "",
              table(["direction", "raw loop", "convert_tree (default)", "ratio", "on_alias='allow': time, ratio"],
                    cells, "markdown")]
    lines += ["", "## Bridged functions against a hand-written wrapper", "",
              "`(a @ b) * c` on three 64x64 bf16 tensors, written in the callee (jax: `jax.jit`-compiled), called "
              "from the caller's tensors; forward and backward is the caller's own vjp with a 64x64 cotangent "
              "(torch `autograd.grad`, eager `jax.vjp`, `tf.GradientTape`). The hand-written wrappers "
              "(`bf16bridge/bench/functions.py: baseline`) use the cheapest raw moves (DLPack capsules straight over, "
              "numpy's own hand-off to torch): a torch `autograd.Function` around "
              "the callee's vjp; for a jax caller `jax.custom_vjp` + `jax.pure_callback`, whose backward "
              "recomputes the forward with the callee's vjp as the bridge's does (a callback cannot keep the "
              "pullback); for tensorflow `tf.custom_gradient`. Forward only: the caller's tensors need no "
              "gradient, both call the callee directly (no callback). Torch runs on one intra-op thread here "
              "(its threads fight jax's and tensorflow's pools on this 2-core machine). \"Same bits\": the bridge "
              "and the wrapper return the same output and gradients, bit for bit. Target: at most 1.3x.", "",
              _bridged_table(fres["bridged"])]
    grad_rows = [r for r in fres["bridged"] if "forward_grad_inputs" in r]
    if grad_rows:
        cells = [(f"{r['caller']} -> {r['callee']}", _times_cell(r["forward_grad_inputs"]["hand-written"]),
                  _times_cell(r["forward_grad_inputs"]["bridge"]),
                  _x(_ratio(r["forward_grad_inputs"], "bridge", "hand-written")),
                  "yes" if r["same_bits_grad_inputs"] else "**no**") for r in grad_rows]
        lines += ["", "Forward only, the torch inputs requiring grad (a model's parameters in inference: the call "
                  "under `torch.no_grad()`), against the hand-written forward, whose moves take such tensors as "
                  "they are. Target: at most 1.3x.", "",
                  table(["caller -> callee", "fwd hand-written", "fwd bridge", "ratio", "same bits"], cells, "markdown")]
    if fres.get("bridged_jit"):
        lines += ["", "## Bridged functions under jax.jit against a hand-written pure_callback wrapper", "",
                  "The same function and inputs, called from a `jax.jit`-compiled caller: forward and backward is a "
                  "jitted `jax.vjp`, forward only the jitted call. The hand-written wrapper is the jax one above "
                  "(`jax.custom_vjp` + `jax.pure_callback`, host copies of every input and result); the bridge runs "
                  "the callee in `jax.experimental.buffer_callback` where it can, on copies of jax's input buffers "
                  "of its own and writing into jax's result buffers (`docs/functions.md`; the jax fact "
                  "`buffer_callback` says whether it did here). Target: at most 1.3x.", "",
                  _bridged_table(fres["bridged_jit"])]
    return lines


def _peers_markdown(peers: list) -> list[str]:
    tools = list(dict.fromkeys(r["tool"] for r in peers if r["case"] != "import"))
    keys = list(dict.fromkeys((r["direction"], r["case"]) for r in peers if r["case"] != "import"))
    by = {(r["tool"], r["direction"], r["case"]): r for r in peers}
    verdict = {True: "ok: ", False: "**fails**: ", None: ""}
    cells = [(direction, case, *(verdict[by[(tl, direction, case)]["ok"]] + by[(tl, direction, case)]["result"]
                                 if (tl, direction, case) in by else "" for tl in tools)) for direction, case in keys]
    lines = ["", "## Where each peer fails (bf16)", "",
              "Each tool on a bf16 torch tensor of each layout (jax -> torch: a jax array, always compact). "
              "\"copied\": the result does not share the input's memory. Generated from the run, not written by hand.",
              "", table(["direction", "input", *tools], cells, "markdown")]
    for r in peers:
        if r["case"] == "import":
            lines += ["", f"{r['tool']} did not import: `{r['result']}`."]
    return lines
