"""``bf16bridge`` / ``python -m bf16bridge``: demo, matrix, probe."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bf16bridge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="move a bf16 tensor through every framework, timed against the usual workaround")
    d.add_argument("--mib", type=float, default=32.0, help="size of the tensor in MiB (default 32)")
    d.add_argument("--repeat", type=int, default=5, help="timed runs per call (median)")
    m = sub.add_parser("matrix", help="the route of each of the 12 ordered pairs")
    m.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    p = sub.add_parser("probe", help="what this machine and these libraries can do with bf16")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--frameworks", default="", help="comma-separated frameworks to import and try, or 'all'")
    args = parser.parse_args(argv)

    if args.command == "probe":
        from .capabilities import probe

        names = args.frameworks.split(",") if args.frameworks and args.frameworks != "all" else args.frameworks
        caps = probe(frameworks=[n for n in names if n] if isinstance(names, list) else (names or None))
        print(caps.to_json() if args.json else caps)
        return _exit(0)

    from . import demo

    if args.command == "demo":
        text, ok = demo.demo(args.mib, args.repeat)
        print(text)
        return _exit(0 if ok else 1)
    print(demo.matrix(args.format))
    return _exit(0)


def _exit(code: int) -> int:
    # torch, tensorflow and jax imported together have crashed at interpreter
    # shutdown here; leave with our own status once the output is out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
