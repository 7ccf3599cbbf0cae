"""python -m benchmarks [--quick] [--only {all,main,functions,page,dtypes,checkpoints,shards,kernels,casting}] [--out DIR]

Full mode writes docs/benchmarks.md, docs/benchmarks.png, benchmarks/results/full.json and
benchmarks/results/functions.json (the cost of a call: convert, convert_tree and bridged
functions against raw calls and peers); --quick (1 KiB and 32 MiB only, short batches) writes
benchmarks/results/quick.{md,json,png} and functions-quick.json; --out DIR writes them there.

--only functions runs the cost-of-a-call part alone, saves its results, and writes the page
again from those and the main part's saved results (full.json, or quick.json), so each part
can be run on its own and the page stays generated from saved results.

--only main runs the main part alone (the routes against the workarounds, the routes that must
copy, the kernels, the import times: benchmarks/harness.py), saves full.json (quick.json), and
writes the page again from those and the saved functions.json (functions-quick.json).

--only page runs nothing: it rebuilds the page from the saved results (two branches that each
ran a part merge by rebuilding it).

--only dtypes (fp8 and fp4 routes beside bf16: benchmarks/dtypes.py), --only checkpoints (bb.load
against safetensors' loaders on a 1 GiB file: benchmarks/checkpoints.py, each loader in fresh
processes), --only shards (benchmarks/shards.py, in its own process), --only kernels (bb.kernels'
narrow dtypes against ml_dtypes' astype, torch's .to() and the numpy nibble one-liners:
benchmarks/kernels.py) and --only casting (bb.cast_tree / bb.cast_module against the hand loops:
benchmarks/casting.py) do the same: each saves benchmarks/results/{part}.json ({part}-quick.json
with --quick; in DIR with --out DIR), and the page gets a section for every part with saved
results. --only all runs every part.
"""

from __future__ import annotations

import argparse
import os
import sys
import subprocess
from pathlib import Path

from . import functions, harness, report

ONLY = ("all", "main", "functions", "page", *report.PARTS)


def run_shards(quick: bool, out: Path, log) -> dict:
    """benchmarks.shards in its own process (it sets XLA_FLAGS before jax starts); its JSON."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.shards", "--out", str(out)] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                          timeout=1800)
    for line in proc.stdout.splitlines():
        log(line)
    if proc.returncode != 0:
        raise SystemExit(f"python -m benchmarks.shards failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def run_part(part: str, quick: bool, out: Path, log) -> dict:
    """Run one of report.PARTS and save its results in ``out``."""
    import json

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 KiB and 32 MiB only, short batches (the CI smoke test)")
    ap.add_argument("--only", choices=ONLY, default="all",
                    help="main: only the main part (routes, copying routes, kernels, imports); "
                         "functions: only the cost of a call (convert, convert_tree, bridged functions, peers); "
                         "dtypes, checkpoints, shards, kernels, casting: only that part; "
                         "page: run nothing, rebuild the page from the saved results (after a merge)")
    ap.add_argument("--out", type=Path, help="write the report, plot and JSON into this folder")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    name = "quick" if args.quick else "full"
    fname = "functions-quick.json" if args.quick else "functions.json"
    if args.out:
        doc, png, js, fjs = (args.out / "benchmarks.md", args.out / "benchmarks.png", args.out / f"{name}.json",
                             args.out / fname)
    elif args.quick:
        base = root / "benchmarks" / "results"
        doc, png, js, fjs = base / "quick.md", base / "quick.png", base / "quick.json", base / fname
    else:
        doc, png, js, fjs = root / "docs" / "benchmarks.md", root / "docs" / "benchmarks.png", \
            root / "benchmarks" / "results" / "full.json", root / "benchmarks" / "results" / fname

    def log(s):
        print(s, flush=True)

    part_json = {p: js.parent / (f"{p}-quick.json" if args.quick else f"{p}.json") for p in report.PARTS}
    parts: dict[str, dict | None] = {}
    for p in report.PARTS:
        parts[p] = run_part(p, args.quick, part_json[p], log) if args.only in ("all", p) else report.load(part_json[p])
    res: dict | None
    fres: dict | None
    if args.only == "all":
        res = harness.run(args.quick, log=log)
        fres = functions.run(args.quick, log=log)
        report.write(res, doc, png, js, fres, fjs)
    elif args.only == "main":
        res, fres = harness.run(args.quick, log=log), report.load(fjs)
        report.write(res, doc, png, js, fres, None)
    elif args.only == "functions":
        res, fres = report.load(js), functions.run(args.quick, log=log)
        report.write(res, doc, png, None, fres, fjs)
    else:
        res, fres = report.load(js), report.load(fjs)
        report.write(res, doc, png, None, fres, None)
    doc.write_text(doc.read_text() + report.parts_markdown(parts))
    ran = {"all": [js, fjs, *part_json.values()], "main": [js], "functions": [fjs], "page": []}.get(
        args.only, [part_json.get(args.only)])
    print(f"wrote {doc}" + "".join(f", {p}" for p in ran) + (f", {png}" if png.exists() and res is not None else ""))
    judged = (report.targets(res) if res else []) + (report.function_targets(fres) if fres else [])
    for what, ok, how in judged + report.part_targets(parts):
        print(f"{'met ' if ok else 'MISS'}  {what}: {how}")
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # torch, tensorflow and jax together have crashed at shutdown here
