"""Regenerate the parity documents from one run of the built-in suite at the default policy:

    python -m bf16bridge.parity.docs [DOCS_DIR]     (default: docs)

writes DOCS_DIR/parity-results.json (every report, without the packed results),
DOCS_DIR/parity-results.md (the full tables) and the generated block of
DOCS_DIR/parity.md (the summary table, between the markers below); the prose around
the block is left as written. tests/parity/test_parity_docs.py checks every claim of that
table against parity-results.json.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys

BEGIN = "<!-- begin generated: python -m bf16bridge.parity.docs -->"
END = "<!-- end generated -->"


def _machine(reports) -> str:
    s = reports[0].settings if reports else {}
    versions = ", ".join(f"{k[:-len('_version')]} {v}" for k, v in s.items() if k.endswith("_version") and v)
    return f"{s.get('cpu_bf16', '?')}, {s.get('cores', '?')} cores; {versions}, numpy {s.get('numpy', '?')}"


def write(docs: pathlib.Path, reports, policy: str) -> None:
    from bf16bridge.parity import render

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    (docs / "parity-results.json").write_text(json.dumps([r.to_dict() for r in reports], indent=1, default=str) + "\n")
    (docs / "parity-results.md").write_text(
        "# Parity: the full built-in suite on this machine\n\n"
        f"Written by `python -m bf16bridge.parity.docs` (policy {policy}) on {when}; {_machine(reports)}. "
        "What the numbers mean: [parity.md](parity.md).\n\n" + render.markdown(reports))
    page = docs / "parity.md"
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page}: no generated block ({BEGIN} ... {END}); add the two markers where it goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    block = (f"Measured on {when}: {_machine(reports)}.\n\n" + render.summary(reports) + "\n")
    page.write_text(head + BEGIN + "\n" + block + END + tail)


def main(argv=None) -> int:
    from bf16bridge.parity.policies import DEFAULT_POLICY
    from bf16bridge.parity.runner import suite

    argv = sys.argv[1:] if argv is None else argv
    docs = pathlib.Path(argv[0] if argv else "docs")
    policy = DEFAULT_POLICY
    reports = suite(policy=policy)
    write(docs, reports, policy)
    print(f"wrote {docs}/parity-results.json, parity-results.md and the summary in parity.md "
          f"({sum(r.passed for r in reports)} of {len(reports)} cases pass {policy})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
