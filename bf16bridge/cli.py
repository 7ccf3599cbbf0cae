"""``bf16bridge`` / ``python -m bf16bridge``: demo, matrix, probe, parity."""

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
    q = sub.add_parser("parity", help="the same bf16 computations in torch, jax and tensorflow, compared")
    q.add_argument("--ops", default="", help="comma-separated built-in ops (default: all)")
    q.add_argument("--frameworks", default="torch,jax,tensorflow")
    q.add_argument("--policy", default="ulp(1)",
                   help="exact, ulp(N), allclose(RTOL,ATOL), reference(K), torch, jax or tensorflow")
    q.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an op size, e.g. k=1024 (matmul's inner dimension), rows=128, cols=512, seq=128")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--format", default="text", choices=["text", "json", "markdown", "html"])
    q.add_argument("--output", help="write the report here instead of printing it")
    q.add_argument("--recheck", metavar="RESULTS_JSON", help="judge results saved with --format json again")
    args = parser.parse_args(argv)

    if args.command == "parity":
        return _exit(_parity(args))

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


def _parity(args) -> int:
    from .parity import render, runner

    if args.recheck:
        reports = runner.recheck(args.recheck, args.policy)
    else:
        params = {}
        for item in args.set:
            name, _, value = item.partition("=")
            if not value.isdigit():
                raise SystemExit(f"--set takes NAME=INTEGER; got {item!r}")
            params[name] = int(value)
        ops = [o for o in args.ops.split(",") if o] or None
        frameworks = [f for f in args.frameworks.split(",") if f]
        reports = runner.suite(frameworks, ops=ops, policy=args.policy, seed=args.seed, params=params)
    if args.format == "json":
        out = runner.dumps(reports)
    elif args.format == "markdown":
        out = render.markdown(reports)
    elif args.format == "html":
        out = render.html(reports)
    else:
        out = "\n\n".join(str(r) for r in reports)
        failed = [r.op for r in reports if not r.passed]
        out += f"\n\n{len(reports) - len(failed)} of {len(reports)} cases pass {args.policy}" + (
            f"; failing: {', '.join(failed)}" if failed else "")
    if args.output:
        with open(args.output, "w") as f:
            f.write(out)
    else:
        print(out)
    return 0 if all(r.passed for r in reports) else 1


def _exit(code: int) -> int:
    # torch, tensorflow and jax imported together have crashed at interpreter
    # shutdown here; leave with our own status once the output is out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
