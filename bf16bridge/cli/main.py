"""``bf16bridge`` / ``python -m bf16bridge``: demo, matrix, probe, parity, bench.

``main(argv)`` returns the exit status and leaves the interpreter running (a caller's
``finally`` blocks and atexit handlers run); ``console_main()``, the console script,
ends the process with that status at once (see there why), and quiets the frameworks'
start-up log lines (see there how).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import tempfile

from bf16bridge.core import registry
from bf16bridge.errors import Bf16BridgeError

# argparse prints these: plain text, no reStructuredText (the module docstring is for Python readers)
DESCRIPTION = "Move bfloat16 tensors between {} bit for bit, and check them."
EPILOG = ("exit status: 0 success; 1 a parity case or the demo failed (bench --strict: a target missed); "
          "2 a usage error.\n'bf16bridge COMMAND --help' describes each command.")

#: the console script's exit status when its reader closed the pipe early: 128 + SIGPIPE, as a
#: program the signal ended would give
BROKEN_PIPE = 141

#: the native log level the console script sets when the user set none: 1, no INFO lines
#: (0 all, 1 warnings and errors, 2 errors, 3 none, as TF_CPP_MIN_LOG_LEVEL counts)
QUIET_LEVEL = 1
# jax's JAX_LOGGING_LEVEL, counted as jax counts it for its C++ logs (jax/_src/logging_config.py)
_JAX_LEVELS = {"DEBUG": 0, "INFO": 0, "WARN": 1, "WARNING": 1, "ERROR": 2, "CRITICAL": 3, "FATAL": 3}

# The native log lines the frameworks' C++ writes through absl (absl's not-set-up notice, and
# lines like "I0000 00:00:1795.. 1900 port.cc:153] ..."), some at import whatever TF_CPP_MIN_LOG_LEVEL says.
_ABSL_NOTICE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR")
_ABSL_LINE = re.compile(r"([IWE])\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2}


def main(argv: list[str] | None = None, *, native_log_level: int | None = None) -> int:
    """Run the command line ``argv`` (default: sys.argv[1:]); returns the exit status:
    0 success, 1 a parity case or the demo failed, 2 a usage error (``--help``: 0).

    ``native_log_level`` (1 to 3, counted as TF_CPP_MIN_LOG_LEVEL counts): import the
    frameworks the command uses first, dropping the native log lines they write below
    that level (console_main() passes the user's level, or QUIET_LEVEL)."""
    parser, subs = _parser()
    try:
        args, rest = parser.parse_known_args(argv)
        if args.command == "bench":
            return _bench(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        _check(subs[args.command], args)  # usage errors before any framework is imported
        if native_log_level:
            with _native_logs_below(native_log_level):
                _load(args)
        return _run(subs[args.command], args)
    except SystemExit as stop:  # argparse's usage errors and --help: a status, as documented
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    except Bf16BridgeError as err:  # ours name the input and the way out: no traceback needed
        print(f"bf16bridge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except MemoryError as err:  # a size asked for (--mib, --set) that this machine cannot hold
        print(f"bf16bridge {args.command}: error: out of memory ({type(err).__name__}: {err}); ask for a smaller "
              "size (--mib, --set)", file=sys.stderr)
        return 2


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from bf16bridge.parity.ops import OPS  # (numpy only: no framework)
    from bf16bridge.parity.policies import DEFAULT_POLICY

    names = registry.names()
    parser = argparse.ArgumentParser(prog="bf16bridge", description=DESCRIPTION.format(", ".join(names)),
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    d = sub.add_parser("demo", help="move a bf16 tensor through every framework, timed against the usual workaround",
                       description="Move one bf16 tensor through every ordered pair of the registered frameworks "
                                   "and time each move against the usual workaround. Exits 1 if a bit changed.")
    d.add_argument("--mib", type=_mib, default=32.0, help="size of the tensor in MiB, 2 bytes or more (default 32)")
    d.add_argument("--repeat", type=_repeat, default=5, help="timed runs per call, 1 or more (median; default 5)")
    n = len(names)
    m = sub.add_parser("matrix", help=f"the route of each of the {n * (n - 1)} ordered pairs of registered frameworks",
                       description="The route of each ordered pair of registered frameworks for a contiguous, "
                                   "64-byte aligned bf16 tensor, and which common inputs (unaligned, read-only, "
                                   "transposed) copy instead. The text format prints both; markdown and json "
                                   "print the table on stdout and the rest on stderr. With --dtype, the routes "
                                   "for that dtype instead (docs/dtypes.md is --dtype all, with more).")
    m.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    m.add_argument("--dtype", metavar="DTYPE",
                   help="the routes for a tensor of DTYPE holding every bit pattern (zero-copy, copies and why, "
                        "refused and why), checked bit for bit, instead of bf16's table; 'all' for every dtype "
                        "beyond numpy's own (bfloat16, the float8/float6/float4 family, the sub-byte integers)")
    p = sub.add_parser("probe", help="what this machine and these libraries can do with bf16",
                       description="What this machine and these libraries can do with bf16. Frameworks are "
                                   "imported and tried only when named in --frameworks (or 'all').")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead: every finding, and each framework's decisions with their reasons")
    p.add_argument("--verbose", action="store_true",
                   help="after the line per framework, the details: versions, DLPack, devices, each dtype")
    p.add_argument("--frameworks", default="",
                   help=f"comma-separated frameworks to import and try ({', '.join(names)}), or 'all'")
    q = sub.add_parser("parity", help="the same bf16 computations in every framework that computes, compared",
                       description="Run the same bf16 computations in two or more frameworks and compare the "
                                   "results. Exits 1 if a case fails or nothing was compared.")
    q.add_argument("--ops", help=f"comma-separated built-in ops (default: all): {', '.join(OPS)}")
    q.add_argument("--frameworks",
                   help=f"two or more, comma-separated, from {', '.join(names)} "
                        "(default: every registered framework that computes)")
    q.add_argument("--allow-missing", action="store_true",
                   help="pass a case although a framework did not run it or fewer than two results were "
                        "compared (a run that compared nothing at all still fails)")
    q.add_argument("--policy", default=DEFAULT_POLICY,
                   help="rounding(K): pass what bf16 rounding explains, each result within K roundings of the "
                        "float64 reference, element by element and normwise (default: %(default)s); strict: "
                        "exact, ulp(N), allclose(RTOL,ATOL), reference(K) or reference(K, cap=C), torch, jax "
                        "or tensorflow")
    q.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an op size, e.g. k=1024 (matmul's inner dimension), rows=128, cols=512, seq=128")
    q.add_argument("--seed", type=_seed, default=None, help="the seed of the inputs, a whole number >= 0 (default 0)")
    q.add_argument("--format", default="text", choices=["text", "json", "markdown", "html"])
    q.add_argument("--output", help="write the report here; print where, and the summary line")
    q.add_argument("--recheck", metavar="RESULTS_JSON", help="judge results saved with --format json again")
    b = sub.add_parser("bench", add_help=False,
                       help="time every route against the raw call and the usual workaround (--quick: under a "
                            "minute; --strict: exit 1 on a missed target); 'bf16bridge bench --help' for more")
    return parser, {"demo": d, "matrix": m, "probe": p, "parity": q, "bench": b}


def _mib(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 2 <= x * (1 << 20) < float("inf"):  # NaN fails too; 2 bytes: one bf16 value
        raise argparse.ArgumentTypeError(f"a size in MiB that holds one bf16 value or more (2 bytes), not {text!r}")
    return x


def _repeat(text: str) -> int:
    if not text.isdecimal() or int(text) < 1:  # (isdigit: "²" too, which int() refuses)
        raise argparse.ArgumentTypeError(f"a whole number >= 1 (the median of the timed runs), not {text!r}")
    return int(text)


def _seed(text: str) -> int:
    if not text.isdecimal():
        raise argparse.ArgumentTypeError(f"a whole number >= 0, not {text!r}")
    return int(text)


def _run(parser: argparse.ArgumentParser, args) -> int:
    if args.command == "parity":
        return _parity(parser, args)
    if args.command == "probe":
        return _probe(parser, args)

    if args.command == "matrix" and args.dtype:
        return _dtype_matrix(parser, args)

    from bf16bridge.cli import demo

    if args.command == "demo":
        text, ok = demo.demo(args.mib, args.repeat)
        print(text)
        return 0 if ok else 1
    print(demo.matrix(args.format))
    if args.format != "text":  # stdout stays the table alone (docs/routes.md embeds the markdown)
        print(demo.matrix_notes(), file=sys.stderr)
    return 0


def _dtype_matrix(parser: argparse.ArgumentParser, args) -> int:
    import json

    from bf16bridge.cli import tables

    asked = list(tables.matrix_dtypes()) if args.dtype == "all" else args.dtypes
    rows = [r for d in asked for r in tables.route_rows(d)]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    out = tables.route_table(rows, args.format)
    if len(asked) > 1:
        out = tables.pair_matrix(rows, args.format) + "\n\n" + out
    print(out)
    # stdout stays the tables alone in markdown (docs/dtypes.md embeds it); the text says what they assume
    print(f"\nassumes: {tables.DTYPE_ASSUMES}", file=sys.stdout if args.format == "text" else sys.stderr)
    return 0


def _asked(frameworks: str, parser: argparse.ArgumentParser | None = None) -> list[str]:
    """The canonical names in --frameworks, once each; an unknown one is a usage error
    (listing the valid ones) when a parser is given, UnknownFrameworkError otherwise."""
    if frameworks == "all":
        return [n for n in registry.names() if n != registry.HUB]
    try:
        return list(dict.fromkeys(registry.resolve(f) for f in frameworks.split(",") if f))
    except Bf16BridgeError as err:
        if parser is None:
            raise
        parser.error(str(err))


def _probe(parser: argparse.ArgumentParser, args) -> int:
    from bf16bridge.capabilities.probing import probe
    from bf16bridge.cli import probe_text

    asked = args.asked
    caps = probe(frameworks="all" if args.frameworks == "all" else asked)
    # the probe's own hint is a Python call; on the command line the way is --frameworks
    hint = "not imported; 'bf16bridge probe --frameworks all' (or '--frameworks {0}') imports and tries it"
    caps = dataclasses.replace(caps, frameworks={
        name: fw if fw.probed or not fw.version or name in asked else dataclasses.replace(fw, why=hint.format(name))
        for name, fw in caps.frameworks.items()})
    print(probe_text.to_json(caps) if args.json else probe_text.render(caps, verbose=args.verbose))
    return 0


def _parity(parser: argparse.ArgumentParser, args) -> int:
    from bf16bridge.parity import render, runner

    if args.recheck:
        reports = runner.recheck(args.recheck, args.policy, allow_missing=args.allow_missing)
    else:
        reports = runner.suite(args.framework_names, ops=args.op_names, policy=args.policy, seed=args.seed or 0,
                               params=args.params, allow_missing=args.allow_missing)
    summary = _summary(reports, args.policy)
    if args.format == "json":
        out = runner.dumps(reports)
    elif args.format == "markdown":
        out = render.markdown(reports)
    elif args.format == "html":
        out = render.html(reports)
    else:
        out = "\n\n".join(str(r) for r in reports) + "\n\n" + summary
    if args.output:
        with open(args.output, "w") as f:
            f.write(out)
        print(f"wrote {len(reports)} case{'' if len(reports) == 1 else 's'} ({args.format}) to {args.output}")
        print(summary)
    else:
        print(out)
        if args.format != "text":  # the report is data; the verdict goes where a person sees it
            print(summary, file=sys.stderr)
    return 0 if reports and all(r.passed for r in reports) and any(r.pairs for r in reports) else 1


def _check_output(parser: argparse.ArgumentParser, output: str | None) -> None:
    """A usage error unless --output names a file that can be written, checked before the run,
    which would otherwise end in a raw error and lose its results."""
    if not output:
        return
    if not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        parser.error(f"--output {output}: no such directory; create it or write elsewhere")
    if os.path.isdir(output):
        parser.error(f"--output {output} is a directory; name a file in it")
    _writable(parser, output)


def _check(parser: argparse.ArgumentParser, args) -> None:
    """Every usage error that needs no framework, said before any is imported (_load): unknown
    names, options that cannot be read, an --output that cannot be written. What was read is kept
    on ``args`` for the command."""
    if args.command == "matrix" and args.dtype and args.dtype != "all":
        args.dtypes = _dtypes(parser, args.dtype)
    elif args.command == "probe":
        args.asked = _asked(args.frameworks, parser)
    elif args.command == "parity":
        from bf16bridge.parity.policies import parse

        parse(args.policy)  # a policy that cannot be read is refused before anything runs
        _check_output(parser, args.output)
        if args.recheck:
            _check_recheck(parser, args)
        else:
            _check_suite(parser, args)


def _dtypes(parser: argparse.ArgumentParser, text: str) -> list[str]:
    from bf16bridge.core import dtypes

    known = dtypes.NAMES
    asked = list(dict.fromkeys(d for d in text.split(",") if d))
    unknown = [d for d in asked if d not in known]
    if unknown or not asked:
        parser.error(f"unknown dtype {', '.join(unknown) or repr(text)}; choose 'all' or one or more "
                     f"(comma-separated) of {', '.join(known)}")
    return asked


def _check_recheck(parser: argparse.ArgumentParser, args) -> None:
    # a recheck runs nothing: options that shape a run would be ignored, and the report would not be
    # the one asked for
    ignored = [opt for opt, given in (("--ops", args.ops is not None),
                                      ("--frameworks", args.frameworks is not None),
                                      ("--set", args.set), ("--seed", args.seed is not None)) if given]
    if ignored:
        parser.error(f"--recheck judges saved results again and runs nothing; {', '.join(ignored)} "
                     "would change nothing: leave them out, or run without --recheck")


def _check_suite(parser: argparse.ArgumentParser, args) -> None:
    """--set, --ops and --frameworks read into args.params, args.op_names, args.framework_names."""
    from bf16bridge.parity.ops import OPS

    params = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if not value.isdecimal():
            parser.error(f"--set takes NAME=INTEGER; got {item!r}")
        if name in params:
            parser.error(f"--set {name} given twice")
        params[name] = int(value)
    for opt, value in (("--ops", args.ops), ("--frameworks", args.frameworks)):
        if value is not None and not value.strip(", "):  # left out, it means all; given, it names none
            parser.error(f"{opt} {value!r} names nothing; name one or more (or leave {opt} out for all)")
    ops = list(dict.fromkeys(o for o in args.ops.split(",") if o)) if args.ops is not None else None
    unknown = [o for o in ops or () if o not in OPS]
    if unknown:
        parser.error(f"unknown op{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                     f"built-in ops: {', '.join(OPS)}")
    frameworks = _asked(args.frameworks, parser) if args.frameworks is not None else None
    if frameworks is not None and len(frameworks) < 2:
        parser.error(f"parity compares two or more frameworks; --frameworks {args.frameworks} names only "
                     f"{frameworks[0]}; choose two or more of {', '.join(registry.names())}")
    args.params, args.op_names, args.framework_names = params, ops, frameworks


def _writable(parser: argparse.ArgumentParser, path: str) -> None:
    """A usage error unless ``path`` can be written, changing nothing there: a file or link that is
    there is asked (a link's target); where nothing is, one is made and removed again."""
    if os.path.lexists(path):
        target = os.path.realpath(path)
        if os.access(target if os.path.exists(target) else os.path.dirname(target), os.W_OK):
            return
        parser.error(f"--output {path}: cannot write there (permission denied); write elsewhere")
    try:
        with open(path, "x"):
            pass
    except OSError as err:
        parser.error(f"--output {path}: cannot write there ({err.strerror}); write elsewhere")
    os.remove(path)


def _summary(reports, policy: str) -> str:
    failed = [r.op for r in reports if not r.passed]
    line = f"{len(reports) - len(failed)} of {len(reports)} cases pass {policy}" + (
        f"; failing: {', '.join(failed)}" if failed else "")
    if not any(r.pairs for r in reports):  # --allow-missing passes such cases; the run still fails
        line += "; FAILED: nothing was compared (no case had results from two frameworks)"
    return line


def _load(args) -> None:
    """Import the frameworks the command will use (each adapter imports its framework),
    so that their start-up log lines fall inside _native_logs_below. A framework that
    cannot be imported, or a name that is unknown, is left for the command to report."""
    try:
        if args.command in ("demo", "matrix"):
            names = registry.names()
        elif args.command == "probe":
            names = args.asked
        elif args.recheck:  # runs nothing
            return
        else:
            names = args.framework_names or registry.names()
    except Bf16BridgeError:
        return
    for name in names:
        try:
            registry.get(name)
        except (ImportError, Bf16BridgeError):  # not installed, or refused: the command says so
            pass


def _bench(argv: list[str]) -> int:
    """``bf16bridge bench ARGS`` is ``python -m bf16bridge.bench ARGS``, in a process of its own: the
    harness sits above the command line (it times cli/workarounds.py's recipes, so cli imports none of
    it) and imports every framework itself. Its exit status is this one's; its usage errors, its own."""
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run([sys.executable, "-m", "bf16bridge.bench", *argv]).returncode


def user_log_level(environ=os.environ) -> int | None:
    """The native log level the user set (TF_CPP_MIN_LOG_LEVEL, JAX_LOGGING_LEVEL; the more
    verbose of the two), or None. A value neither framework reads counts as 0: show all."""
    levels = []
    if "TF_CPP_MIN_LOG_LEVEL" in environ:
        value = environ["TF_CPP_MIN_LOG_LEVEL"].strip()
        levels.append(min(int(value), 3) if value.isdecimal() else 0)
    if "JAX_LOGGING_LEVEL" in environ:
        levels.append(_JAX_LEVELS.get(environ["JAX_LOGGING_LEVEL"].strip().upper(), 0))
    return min(levels) if levels else None


def _below(line: str, level: int) -> bool:
    if _ABSL_NOTICE.match(line):
        return True  # absl's own notice, before the line it announces
    m = _ABSL_LINE.match(line)
    return m is not None and _SEVERITY[m.group(1)] < level


@contextlib.contextmanager
def _native_logs_below(level: int):
    """Send file descriptor 2 to a temporary file for the block, then copy what it caught
    to stderr without the frameworks' native log lines below ``level``. Only around imports:
    a process that aborts inside the block loses what the block caught."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to guard
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not _below(line, level))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def console_main() -> None:
    """The console script (``bf16bridge``, ``python -m bf16bridge``): main(), then leave at once.

    Several frameworks' native libraries in one process can abort at interpreter shutdown,
    turning a run that passed into a failed exit status. The script owns its process, so it
    flushes its output and exits with main()'s status without that shutdown; library callers
    use main(), which returns.

    A reader that closes the pipe early (``| head``) ends the script quietly with status
    BROKEN_PIPE (141), not a traceback.

    Log lines: unless the user set a level (user_log_level()), the script sets
    TF_CPP_MIN_LOG_LEVEL=QUIET_LEVEL (no INFO lines) before any framework is imported; and
    it drops the lines below the user's level or that one which the frameworks write at
    import whatever the variable says (main(native_log_level=...)). A value the user set
    is never changed.
    """
    level = user_log_level()
    if level is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = str(QUIET_LEVEL)
        level = QUIET_LEVEL
    try:
        code = main(native_log_level=level)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`bf16bridge matrix --dtype all | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is still buffered goes nowhere
        code = BROKEN_PIPE
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
