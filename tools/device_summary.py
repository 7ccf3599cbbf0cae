"""Turn the device check's results (device-check.json, written by tests/device/conftest.py)
into device-check.md, and decide whether the check passed.

    python tools/device_summary.py OUT_DIR [--status FILE=N ...] [--junit-from DIR]
    python tools/device_summary.py --docs RESULTS.json docs/routes.md

``--status`` gives each test file's pytest exit status (tools/device_check.sh runs
each file in a process of its own); ``--junit-from`` merges the JUnit reports found
in DIR into OUT_DIR/device-junit.xml. ``--docs`` writes a GPU run's saved results
(benchmarks/results/device-gpu.json) into docs/routes.md's generated block.

Exit status 0 only when every expected check ran and passed (or, for a framework missing on
the machine, was skipped with the reason said) and recorded what it found; 1 otherwise, with
the reasons at the top of the summary. A check that ran but recorded nothing counts as failed:
it did nothing anyone can read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: the checks the device tests must run (test function names); each must record something
EXPECTED = (
    "test_all_patterns_bit_exact",
    "test_zero_copy_by_pointer",
    "test_device_index_kept",
    "test_producer_stream_busy",
    "test_copy_true_stays_on_device",
    "test_numpy_target",
    "test_torch_caller_jax_callee_grad",
    "test_jax_caller_torch_callee",
    "test_jax_caller_torch_callee_grad",
    "test_jax_jit_caller_torch_callee_on_jaxs_buffers_in_order",
    "test_jax_jit_torch_callee_keeping_its_input_and_giving_no_gradient",
    "test_jax_jit_packed_types_through_a_callee",
    "test_framework_present",
    "test_probe_reports_the_device",
    "test_registry_present",
    "test_from_dlpack_host_copy",
    "test_bridge_registration",
    "test_fp8_every_pattern_zero_copy",
    "test_bridge_against_workaround",
    "test_shards_to_torch_zero_copy",
    "test_shards_back_to_jax_no_copy",
    "test_shards_to_host_target",
    "test_dtensor_to_jax_and_back",
)
#: checks that may be skipped, because they say why (a framework missing on the machine)
MAY_SKIP = ("test_framework_present",)


#: checks shown in a timings table of their own, not in the checks table
TIMED = ("test_bridge_against_workaround", "test_overhead_against_raw_dlpack")


def base(name: str) -> str:
    return name.split("[")[0]


#: what a pytest exit status means, beyond "tests failed" (1)
STATUS = {2: "interrupted or a usage error", 3: "an internal error", 4: "a usage error",
          5: "no tests were collected", 124: "it ran past its time limit", 137: "it was killed",
          139: "a segmentation fault", 134: "an abort"}


def problems(data: dict | None, statuses: dict[str, int]) -> list[str]:
    """Why the check did not pass; empty when it did."""
    out = [f"{name}: pytest exited with status {n}" + (f" ({STATUS[n]})" if n in STATUS else "")
           for name, n in statuses.items() if n != 0]
    if data is None:
        return out + ["no device-check.json: the tests did not start (see device-check.log)"]
    tests = data.get("tests", [])
    for session in data.get("sessions", []):
        if "finished" not in session:
            out.append(f"the session of {' '.join(session.get('args', []))} did not finish: its results are partial")
    ran = {base(t["name"]) for t in tests}
    for name in EXPECTED:
        if name not in ran:
            out.append(f"{name} did not run")
    for t in tests:
        if t["outcome"] == "failed":
            out.append(f"{t['name']} failed ({t['when']})")
        elif t["outcome"] == "skipped" and base(t["name"]) not in MAY_SKIP:
            out.append(f"{t['name']} was skipped: {t.get('why', 'no reason given')}")
        elif t["outcome"] == "skipped" and not t.get("why"):
            out.append(f"{t['name']} was skipped without a reason")
        if t["outcome"] == "passed" and not t.get("records"):
            out.append(f"{t['name']} recorded nothing")
    return out


def not_checked(data: dict) -> list[str]:
    """What the checks that ran could not try here, from what they recorded (not a fixed list)."""
    out = []
    if data.get("mode") == "dry-run":
        out.append("a GPU (a dry run: the same tests on CPU tensors)")
    for t in data.get("tests", []):
        rec = t.get("records", {})
        if base(t["name"]) == "test_registry_present" and rec.get("register_dlpack_dtype") is False:
            out.append(f"the bridge's registration with NumPy's DLPack registry (numpy {rec.get('numpy', '?')} "
                       "has none; NumPy >= 2.5)")
        route = str(rec.get("route", ""))
        if base(t["name"]) == "test_fp8_every_pattern_zero_copy" and route.startswith("none:"):
            out.append(f"{t['name'].split('[')[-1].rstrip(']')} ({route[len('none:'):].strip()})")
    return out


def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def render(data: dict | None, found: list[str]) -> str:
    lines = []
    if data is None:
        return "# Device check\n\n**FAILED**\n\n" + "".join(f"- {p}\n" for p in found)
    mode = data.get("mode", "?")
    lines.append(f"# Device check ({mode}, {data.get('started', '?')})")
    lines.append("")
    lines.append("**PASSED**" if not found else "**FAILED**")
    lines += [f"- {p}" for p in found]
    lines.append("")
    versions = ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items())
    lines.append(f"Python {data.get('python')} on {data.get('machine')}, tensors on `{data.get('device')}`; {versions}.")
    missing = data.get("missing", [])
    lines.append("")
    lines.append("Not installed here, so not checked: " + (", ".join(missing) if missing else "nothing") + ".")
    unchecked = not_checked(data)
    lines.append("Not checked on this machine: " + ("; ".join(unchecked) if unchecked else "nothing") + ".")
    tests = data.get("tests", [])
    counts: dict = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    lines += ["", "## Checks (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ")", "",
              "| check | outcome | what it found |", "|---|---|---|"]
    for t in tests:
        if base(t["name"]) in TIMED:
            continue  # in the timings tables
        rec = "; ".join(f"{k}: {v}" for k, v in t.get("records", {}).items())
        if t["outcome"] != "passed" and t.get("why"):
            rec += f" -- {t['why'][:300]}"
        lines.append(f"| {_cell(t['name'])} | {t['outcome']} | {_cell(rec)} |")
    timed = [t for t in tests if base(t["name"]) == "test_bridge_against_workaround"]
    if timed:
        lines += ["", "## Timings: the bridge against the float32 workaround (best of several, same run)", "",
                  "| route | MiB | bridge ms | workaround ms | workaround / bridge | bridge zero-copy | outcome |",
                  "|---|---|---|---|---|---|---|"]
        for t in timed:
            r = t.get("records", {})
            route = t["name"].split("[")[-1].rstrip("]")
            lines.append(f"| {route} | {r.get('mib', '')} | {r.get('bridge_ms', '')} | {r.get('workaround_ms', '')} "
                         f"| {r.get('ratio', '')} | {r.get('bridge_zero_copy', '')} | {t['outcome']} |")
    overhead = [t for t in tests if base(t["name"]) == "test_overhead_against_raw_dlpack"]
    if overhead:
        lines += ["", "## Per call: the bridge against the raw DLPack import (small tensor, zero-copy both, same run)", "",
                  "| route | elements | bridge us | raw us | bridge / raw | outcome |", "|---|---|---|---|---|---|"]
        for t in overhead:
            r = t.get("records", {})
            route = t["name"].split("[")[-1].rstrip("]")
            lines.append(f"| {route} | {r.get('elements', '')} | {r.get('bridge_us', '')} | {r.get('raw_us', '')} "
                         f"| {r.get('bridge_over_raw', '')} | {t['outcome']} |")
    if data.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {_cell(w)[:300]}" for w in data["warnings"][:20]]
    return "\n".join(lines) + "\n"


def merge_junit(folder: Path, into: Path) -> None:
    """One JUnit file of every test suite in ``folder``'s reports (each file's own process wrote one)."""
    import xml.etree.ElementTree as ET

    merged = ET.Element("testsuites")
    for report in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError:  # a process killed while writing it: its tests are missing from the JSON too
            continue
        merged.extend(root.iter("testsuite"))
    for key in ("tests", "failures", "errors", "skipped"):
        merged.set(key, str(sum(int(s.get(key, 0)) for s in merged)))
    ET.ElementTree(merged).write(into, encoding="utf-8", xml_declaration=True)


#: the block of docs/routes.md that --docs writes from a GPU run's saved results
DOCS_OPEN, DOCS_CLOSE = "<!-- gpu: generated by", "<!-- /gpu -->"


def docs_block(data: dict, results: str) -> str:
    """A GPU run's summary as the block of docs/routes.md: the same text as device-check.md,
    its headings one level down, under a line that names the run and its saved results."""
    text = render(data, data.get("problems", []))
    lines = text.splitlines()[1:]  # the title: said by the first line instead
    lines = [("#" + line) if line.startswith("## ") else line for line in lines]
    head = [f"{DOCS_OPEN} `python tools/device_summary.py --docs {results} docs/routes.md`; "
            "tests/project/test_device_check.py checks it -->",
            f"`tools/device_check.sh` on the device machine ({data.get('mode')}, {data.get('started')}; "
            f"`{results}`):"]
    return "\n".join(head + lines).rstrip() + "\n" + DOCS_CLOSE


def write_docs(results: Path, doc: Path) -> None:
    """Put the block of ``results`` (a GPU run's device-check.json) into ``doc`` between its markers."""
    data = json.loads(results.read_text())
    if data.get("mode") != "gpu" or "problems" not in data:
        raise SystemExit(f"{results}: not the results of a finished GPU run (mode {data.get('mode')!r})")
    text = doc.read_text()
    start, end = text.find(DOCS_OPEN), text.find(DOCS_CLOSE)
    if start < 0 or end < start:
        raise SystemExit(f"{doc}: no block between {DOCS_OPEN!r} and {DOCS_CLOSE!r} to write into")
    doc.write_text(text[:start] + docs_block(data, results.as_posix()) + text[end + len(DOCS_CLOSE):])


def _status(text: str) -> tuple[str, int]:
    name, _, n = text.rpartition("=")
    return name, int(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--status", type=_status, nargs="*", default=[], help="FILE=N: a test file's pytest exit status")
    ap.add_argument("--junit-from", type=Path, default=None)
    ap.add_argument("--docs", type=Path, nargs=2, metavar=("RESULTS", "DOC"),
                    help="write a GPU run's saved device-check.json into DOC's generated block, and stop")
    args = ap.parse_args(argv)
    if args.docs is not None:
        write_docs(*args.docs)
        return 0
    if args.out is None:
        ap.error("give the output folder (OUT), or --docs RESULTS DOC")
    if args.junit_from is not None:
        merge_junit(args.junit_from, args.out / "device-junit.xml")
    path = args.out / "device-check.json"
    data = json.loads(path.read_text()) if path.exists() else None
    found = problems(data, dict(args.status))
    if data is not None:
        data["passed"] = not found
        data["problems"] = found
        path.write_text(json.dumps(data, indent=1, default=str))
    text = render(data, found)
    (args.out / "device-check.md").write_text(text)
    print(text)
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
