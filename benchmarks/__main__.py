"""python -m benchmarks [--quick] [--out DIR]

Full mode writes docs/benchmarks.md, docs/benchmarks.png and
benchmarks/results/full.json; --quick (1 KiB and 32 MiB only) writes
benchmarks/results/quick.{md,json,png}; --out DIR writes all three there.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import harness, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 KiB and 32 MiB only (the CI smoke test)")
    ap.add_argument("--out", type=Path, help="write the report, plot and JSON into this folder")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    name = "quick" if args.quick else "full"
    if args.out:
        doc, png, js = args.out / "benchmarks.md", args.out / "benchmarks.png", args.out / f"{name}.json"
    elif args.quick:
        base = root / "benchmarks" / "results"
        doc, png, js = base / "quick.md", base / "quick.png", base / "quick.json"
    else:
        doc, png, js = root / "docs" / "benchmarks.md", root / "docs" / "benchmarks.png", \
            root / "benchmarks" / "results" / "full.json"
    res = harness.run(args.quick, log=lambda s: print(s, flush=True))
    report.write(res, doc, png, js)
    print(f"wrote {doc}, {js}" + (f", {png}" if png.exists() else ""))
    for what, ok, how in report.targets(res):
        print(f"{'met ' if ok else 'MISS'}  {what}: {how}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch, tensorflow and jax together have crashed at shutdown here


if __name__ == "__main__":
    sys.exit(main())
