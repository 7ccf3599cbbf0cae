"""python -m benchmarks [--quick] [--only {all,functions}] [--out DIR]

Full mode writes docs/benchmarks.md, docs/benchmarks.png, benchmarks/results/full.json and
benchmarks/results/functions.json (the cost of a call: convert, convert_tree and bridged
functions against raw calls and peers); --quick (1 KiB and 32 MiB only, short batches) writes
benchmarks/results/quick.{md,json,png} and functions-quick.json; --out DIR writes them there.

--only functions runs the cost-of-a-call part alone, saves its results, and writes the page
again from those and the main part's saved results (full.json, or quick.json), so each part
can be run on its own and the page stays generated from saved results.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import functions, harness, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 KiB and 32 MiB only, short batches (the CI smoke test)")
    ap.add_argument("--only", choices=("all", "functions"), default="all",
                    help="functions: only the cost of a call (convert, convert_tree, bridged functions, peers)")
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

    if args.only == "functions":
        res, fres = report.load(js), functions.run(args.quick, log=log)
        report.write(res, doc, png, None, fres, fjs)
    else:
        res = harness.run(args.quick, log=log)
        fres = functions.run(args.quick, log=log)
        report.write(res, doc, png, js, fres, fjs)
    print(f"wrote {doc}, {fjs}" + ("" if args.only == "functions" else f", {js}")
          + (f", {png}" if png.exists() and res is not None else ""))
    for what, ok, how in (report.targets(res) if res else []) + report.function_targets(fres):
        print(f"{'met ' if ok else 'MISS'}  {what}: {how}")
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # torch, tensorflow and jax together have crashed at shutdown here
