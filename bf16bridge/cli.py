"""``bf16bridge`` / ``python -m bf16bridge``: demo, matrix, probe, parity.

``main(argv)`` returns the exit status and leaves the interpreter running (a caller's
``finally`` blocks and atexit handlers run); ``console_main()``, the console script,
ends the process with that status at once (see there why).
"""

from __future__ import annotations

import argparse
import os
import sys

from . import registry
from .errors import Bf16BridgeError


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: sys.argv[1:]); returns the exit status:
    0 success, 1 a parity case or the demo failed, 2 a usage error."""
    parser = argparse.ArgumentParser(prog="bf16bridge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="move a bf16 tensor through every framework, timed against the usual workaround")
    d.add_argument("--mib", type=float, default=32.0, help="size of the tensor in MiB (default 32)")
    d.add_argument("--repeat", type=int, default=5, help="timed runs per call (median)")
    n = len(registry.names())
    m = sub.add_parser("matrix", help=f"the route of each of the {n * (n - 1)} ordered pairs of registered frameworks")
    m.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    p = sub.add_parser("probe", help="what this machine and these libraries can do with bf16")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--frameworks", default="", help="comma-separated frameworks to import and try, or 'all'")
    q = sub.add_parser("parity", help="the same bf16 computations in every framework that computes, compared")
    q.add_argument("--ops", default="", help="comma-separated built-in ops (default: all)")
    q.add_argument("--frameworks", default="",
                   help=f"comma-separated, from {', '.join(registry.names())} "
                        "(default: every registered framework that computes)")
    q.add_argument("--allow-missing", action="store_true",
                   help="pass a case although a framework did not run it or fewer than two results were compared")
    q.add_argument("--policy", default="ulp(1)",
                   help="exact, ulp(N), allclose(RTOL,ATOL), reference(K), torch, jax or tensorflow")
    q.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an op size, e.g. k=1024 (matmul's inner dimension), rows=128, cols=512, seq=128")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--format", default="text", choices=["text", "json", "markdown", "html"])
    q.add_argument("--output", help="write the report here instead of printing it")
    q.add_argument("--recheck", metavar="RESULTS_JSON", help="judge results saved with --format json again")
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except Bf16BridgeError as err:  # ours name the input and the way out: no traceback needed
        print(f"bf16bridge {args.command}: error: {err}", file=sys.stderr)
        return 2


def _run(parser, args) -> int:
    if args.command == "parity":
        return _parity(parser, args)

    if args.command == "probe":
        from .capabilities import probe

        names = args.frameworks.split(",") if args.frameworks and args.frameworks != "all" else args.frameworks
        caps = probe(frameworks=[n for n in names if n] if isinstance(names, list) else (names or None))
        print(caps.to_json() if args.json else caps)
        return 0

    from . import demo

    if args.command == "demo":
        text, ok = demo.demo(args.mib, args.repeat)
        print(text)
        return 0 if ok else 1
    print(demo.matrix(args.format))
    return 0


def _parity(parser, args) -> int:
    from .parity import parse, render, runner

    parse(args.policy)  # a policy that cannot be read is refused before anything runs
    if args.recheck:
        reports = runner.recheck(args.recheck, args.policy, allow_missing=args.allow_missing)
    else:
        params = {}
        for item in args.set:
            name, _, value = item.partition("=")
            if not value.isdigit():
                parser.error(f"--set takes NAME=INTEGER; got {item!r}")
            params[name] = int(value)
        ops = [o for o in args.ops.split(",") if o] or None
        unknown = [o for o in ops or () if o not in runner.OPS]
        if unknown:
            parser.error(f"unknown op(s) {', '.join(unknown)}; built-in ops: {', '.join(runner.OPS)}")
        frameworks = [registry.resolve(f) for f in args.frameworks.split(",") if f] or None
        reports = runner.suite(frameworks, ops=ops, policy=args.policy, seed=args.seed, params=params,
                               allow_missing=args.allow_missing)
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


def console_main() -> None:
    """The console script (``bf16bridge``, ``python -m bf16bridge``): main(), then leave at once.

    torch, tensorflow and jax imported into one process have crashed at interpreter
    shutdown here ("terminate called without an active exception"), turning a run that
    passed into a failed exit status. The script owns its process, so it flushes its
    output and exits with main()'s status without that shutdown; library callers use
    main(), which returns.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
