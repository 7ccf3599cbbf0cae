"""bf16bridge bench: the benchmark harness from the command line (python -m bf16bridge.bench is the same).

Parts: main (every pair of frameworks against the raw call and the usual workaround, the routes that
must copy, an import's own copy, the kernels, the import time), functions (the cost of a call:
convert, convert_tree and bridged functions against raw calls and peers), and the parts run alone:
dtypes, checkpoints, shards, kernels, casting. Every part saves its JSON; the page is written from
every part's saved results, so a part run alone keeps the others' sections. --only page runs
nothing and writes the page again from the saved results (and judges their targets).

--quick: the main part alone at two small sizes with short batches (under a minute), over the
frameworks whose import fits its memory budget (--frameworks chooses others); --quick --only all
runs every part in its quick form (the CI smoke test: minutes).

Where it writes: in a checkout of the repository, docs/benchmarks.md and benchmarks/results/
(--quick: benchmarks/results/quick.md); installed, ./bf16bridge-bench/; --out DIR, DIR.

Exit status: 0, also when a target is missed (each is printed, MISS or met); with --strict, 1 when
any target is missed; 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bf16bridge.core import registry
from bf16bridge.errors import Bf16BridgeError

from . import paths
from .report_parts import PART_COLUMNS, PARTS

PROG = "bf16bridge bench"
ONLY = ("all", "main", "functions", "page", *PARTS)
#: left out of --quick unless --frameworks names them, and why
QUICK_LEAVES_OUT = {"tensorflow": "its import alone holds more memory than --quick's 500 MiB; --frameworks all "
                                  "measures it"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="the main part at 1 KiB and 1 MiB with short batches, without "
                         f"{', '.join(QUICK_LEAVES_OUT)} (under a minute, 500 MiB); with --only, that part's "
                         "quick form")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed (a MISS line)")
    ap.add_argument("--only", choices=ONLY, metavar="PART",
                    help=f"one of {', '.join(ONLY)} (default: all; with --quick, main). main: the routes, the "
                         "routes that must copy, the kernels, the imports; functions: the cost of a call; "
                         "page: run nothing, write the page again from the saved results")
    ap.add_argument("--frameworks", metavar="LIST",
                    help="the main part's frameworks, comma-separated, two or more of "
                         f"{', '.join(registry.names())}, or 'all' (default: all; with --quick, all but "
                         f"{', '.join(QUICK_LEAVES_OUT)})")
    ap.add_argument("--out", type=Path, metavar="DIR",
                    help="write the page, the plot and every JSON into DIR (default: in a checkout, docs/ and "
                         f"benchmarks/results/; installed, ./{paths.INSTALLED_OUT}/)")
    return ap


def frameworks(ap: argparse.ArgumentParser, args) -> tuple[list[str], dict[str, str]]:
    """The main part's frameworks, and those left out with why; a name that is unknown, or fewer
    than two, is a usage error (checked before any framework is imported)."""
    names = registry.names()
    if args.frameworks is None:
        left = {n: why for n, why in QUICK_LEAVES_OUT.items() if n in names} if args.quick else {}
        return [n for n in names if n not in left], left
    if args.frameworks == "all":
        return list(names), {}
    try:
        asked = list(dict.fromkeys(registry.resolve(f) for f in args.frameworks.split(",") if f.strip()))
    except Bf16BridgeError as err:
        ap.error(f"--frameworks {args.frameworks}: {err}")
    if len(asked) < 2:
        ap.error(f"--frameworks {args.frameworks} names {len(asked)} framework(s): the main part measures pairs; "
                 f"name two or more of {', '.join(names)}, or 'all'")
    return [n for n in names if n in asked], {n: "not in --frameworks" for n in names if n not in asked}


def header(only: str, quick: bool, names: list[str], left: dict, out: paths.Outputs) -> str:
    """What the run does, where it writes, and what each column of its log means."""
    from .harness import ONE_SIZE
    from .report import BANDWIDTH_FROM, COLUMNS, FUNCTION_COLUMNS

    runs = ["main", "functions", *PARTS] if only == "all" else [only]
    lines = [f"{PROG}{' --quick' if quick else ''}: " + (
        "no part runs: the page is written again from the saved results" if only == "page" else
        f"runs {', '.join(runs)}" + (f" (main part over {', '.join(names)})" if "main" in runs else ""))]
    if "main" in runs and left:
        lines.append("left out: " + "; ".join(f"{k} ({v})" for k, v in left.items()))
    if "main" in runs and quick:
        lines.append(f"the routes that must copy and the kernels run at {ONE_SIZE['quick']}: listed, not judged "
                     f"(their targets hold from {BANDWIDTH_FROM}, where the bytes outweigh a call's fixed cost)")
    lines.append(f"writes the page to {out.doc} and the results to {out.results}/")
    glossary = [*(COLUMNS if "main" in runs else ()), *(FUNCTION_COLUMNS if "functions" in runs else ()),
                *(c for p in runs for c in PART_COLUMNS.get(p, ()))]
    glossary.append(("met / MISS", "each target judged on this run, at the end; --strict exits 1 on a MISS"))
    width = max(len(name) for name, _ in glossary)
    lines += ["columns:"] + [f"  {name:<{width}}  {what.replace('`', '')}" for name, what in glossary]
    return "\n".join(lines)


def run_shards(quick: bool, out: Path, log) -> dict:
    """bf16bridge.bench.shards in its own process (it sets XLA_FLAGS before jax starts); its JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bf16bridge.bench.shards", "--out", str(out)] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        log(line)
    if proc.returncode != 0:
        raise SystemExit(f"python -m bf16bridge.bench.shards failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def run_part(part: str, quick: bool, out: Path, log) -> dict:
    """Run one of PARTS and save its results in ``out``."""
    if part == "shards":
        return run_shards(quick, out, log)
    if part == "dtypes":
        from . import dtypes

        data = dtypes.run(quick, log=log)
    elif part == "kernels":
        from . import kernels

        data = kernels.run(quick, log=log)
    elif part == "casting":
        from . import casting

        data = casting.run(quick, log=log)
    else:
        from . import checkpoints

        data = checkpoints.bench(quick, log=log)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return data


def _log(s: str) -> None:
    print(s, flush=True)


def main(argv=None) -> int:
    """Run the command line ``argv``; the exit status (see the module)."""
    ap = parser()
    args = ap.parse_args(argv)
    names, left = frameworks(ap, args)
    only = args.only or ("main" if args.quick else "all")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; name a folder (it is made where it is not there)")
    out = paths.outputs(args.quick, args.out)
    _log(header(only, args.quick, names, left, out))
    judged = _run(only, args.quick, out, names, left)
    missed = [what for what, ok, _ in judged if not ok]
    print(f"{len(judged) - len(missed)} of {len(judged)} targets met"
          + (f"; {len(missed)} missed" + (" (--strict: exit status 1)" if args.strict else "") if missed else ""))
    return 1 if args.strict and missed else 0


def _run(only: str, quick: bool, out: paths.Outputs, names: list[str], left: dict) -> list[tuple[str, bool, str]]:
    """Run the parts asked, write the page from every saved result, print what was written and
    each target judged; the targets."""
    from . import functions, harness, report, report_parts

    parts: dict[str, dict | None] = {p: run_part(p, quick, out.part(p, quick), _log) if only in ("all", p)
                                     else report.load(out.part(p, quick)) for p in PARTS}
    res: dict | None = harness.run(quick, log=_log, frameworks=names, left_out=left) if only in ("all", "main") \
        else report.load(out.main)
    fres: dict | None = functions.run(quick, log=_log) if only in ("all", "functions") else report.load(out.functions)
    report.write(res, out.doc, out.plot, out.main if only in ("all", "main") else None, fres,
                 out.functions if only in ("all", "functions") else None)
    out.doc.write_text(out.doc.read_text() + report_parts.parts_markdown(parts))
    ran = {"all": [out.main, out.functions, *(out.part(p, quick) for p in PARTS)], "main": [out.main],
           "functions": [out.functions], "page": []}.get(only, [out.part(only, quick)])
    plot = f", {out.plot}" if out.plot.exists() and res is not None else ""
    print(f"wrote {out.doc}" + "".join(f", {p}" for p in ran) + plot)
    judged = (report.targets(res) if res else []) + (report.function_targets(fres) if fres else []) \
        + report_parts.part_targets(parts)
    for what, ok, how in judged:
        print(f"{'met ' if ok else 'MISS'}  {what}: {how}")
    return judged
