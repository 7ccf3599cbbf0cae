"""docs/parity.md's summary table says only what the saved results (docs/parity-results.json) hold.

The table is written by ``python -m bf16bridge.parity.docs``; this reads it back as claims and checks
each against the saved reports, independently of the code that wrote it. A claim the results do not
support, a claim this cannot read, a case left out, or a measured number in the hand-written
explanations fails.
"""

import json
import math
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
BEGIN, END = "<!-- begin generated: python -m bf16bridge.parity.docs -->", "<!-- end generated -->"

PAIR = re.compile(r"(\S+) vs (\S+): ([\d.]+)% identical, max (\d+) ulp(?:, (\d+) NaN/inf)?")
REF = re.compile(r"(\S+) ([-\d.e+]+|inf) (ulp|u\.cond)(?:, (\d+) NaN/inf)?")
REGION = re.compile(r"(\S+): \[(\S+), (\S+)\] (\d+)/(\d+)(?: \((\d+) NaN/inf\))?")
COUNT = re.compile(r"(\d+) of (\d+) cases pass (.+)\.")


def _page() -> str:
    return (DOCS / "parity.md").read_text()


def _saved() -> list:
    return json.loads((DOCS / "parity-results.json").read_text())


def _as_printed(x: float) -> float:
    return float(f"{x:.3g}")  # the table prints 3 significant digits


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def problems(page: str, saved: list) -> list[str]:
    """Every claim of the generated block that the saved reports do not support."""
    if BEGIN not in page or END not in page:
        return ["no generated block in parity.md"]
    block = page.split(BEGIN, 1)[1].split(END, 1)[0]
    out = []
    counts = [m for m in map(COUNT.fullmatch, block.splitlines()) if m]
    if len(counts) != 1:
        out.append("no single 'N of M cases pass POLICY.' line")
    else:
        n, m, pol = counts[0].groups()
        if (int(n), int(m)) != (sum(d["passed"] for d in saved), len(saved)):
            out.append(f"claims {n} of {m} pass")
        if {d["policy"] for d in saved} != {pol}:
            out.append(f"claims policy {pol}")
    rows = [_cells(l) for l in block.splitlines() if l.startswith("| ")][1:]  # minus the head
    if [r[0] for r in rows] != [d["op"] for d in saved]:
        out.append(f"cases {[r[0] for r in rows]} are not the saved ones {[d['op'] for d in saved]}")
    by_op = {d["op"]: d for d in saved}
    for row in rows:
        d = by_op.get(row[0])
        if d is None or len(row) != 6:
            out.append(f"row {row[0]!r}: no saved case, or not 6 cells")
            continue
        out += [f"{row[0]}: {p}" for p in _row(row, d)]
    return out


def _row(row, d) -> list[str]:
    out = []
    _, passed, pairs, refs, outlier, regions = row
    if passed != ("yes" if d["passed"] else "no"):
        out.append(f"passed {passed!r}")
    # results against each other
    if pairs == "bit-identical":
        if not d["pairs"] or any(p["identical_fraction"] != 1 for p in d["pairs"]):
            out.append("not bit-identical")
    else:
        claimed = set()
        for part in pairs.split("; "):
            m = PAIR.fullmatch(part)
            if not m:
                out.append(f"unreadable pair claim {part!r}")
                continue
            a, b, pct, mx, nf = m.groups()
            p = next((p for p in d["pairs"] if (p["a"], p["b"]) == (a, b)), None)
            if p is None:
                out.append(f"no pair {a} vs {b}")
                continue
            claimed.add((a, b))
            if abs(float(pct) - 100 * p["identical_fraction"]) > 0.005 or int(mx) != p["max_ulp"] \
                    or int(nf or 0) != p["nonfinite_mismatches"]:
                out.append(f"{part!r} against {p['identical_fraction']}, {p['max_ulp']}, {p['nonfinite_mismatches']}")
        if claimed != {(p["a"], p["b"]) for p in d["pairs"]}:
            out.append("a pair left out")
    # each result against the reference
    names = set()
    for part in refs.split("; "):
        m = REF.fullmatch(part)
        r = next((r for r in d["references"] if m and r["name"] == m.group(1)), None)
        if r is None:
            out.append(f"unreadable or unknown reference claim {part!r}")
            continue
        names.add(r["name"])
        _, value, unit, nf = m.groups()
        actual = r["max_normalised"] if unit == "u.cond" else r["max_ulps_of_reference"]
        if (unit == "u.cond") != (r["max_normalised"] is not None) or actual is None \
                or not math.isclose(float(value), _as_printed(actual)) or int(nf or 0) != r["nonfinite_mismatches"]:
            out.append(f"{part!r} against {r}")
    if names != {r["name"] for r in d["references"]}:
        out.append("a result left out of the reference column")
    if outlier != (d["outlier"] or "none"):
        out.append(f"outlier {outlier!r}, saved {d['outlier']!r}")
    # worst regions
    saved = {(g["result"], _as_printed(g["lo"]), _as_printed(g["hi"]), g["exceeding"], g["inputs"], g["nonfinite"])
             for g in d["worst_regions"]}
    claimed = set()
    for part in ([] if regions == "-" else regions.split("; ")):
        m = REGION.fullmatch(part)
        if not m:
            out.append(f"unreadable region claim {part!r}")
            continue
        name, lo, hi, n, of, nf = m.groups()
        claimed.add((name, float(lo), float(hi), int(n), int(of), int(nf or 0)))
    if claimed != saved:
        out.append(f"regions {sorted(claimed ^ saved)} claimed but not saved, or saved but not claimed")
    return out


def test_every_claim_of_the_summary_table_holds_in_the_saved_results():
    assert problems(_page(), _saved()) == []


def _row_of(page: str, op: str) -> str:
    block = page.split(BEGIN, 1)[-1]
    return next((l for l in block.splitlines() if l.startswith(f"| {op} |")), f"(no row {op!r})")


def _last_cell(row: str, text: str) -> str:
    """``row`` with its last cell (the worst regions) replaced by ``text``."""
    cells = row.rstrip().rstrip("|").rsplit("|", 1)[0]
    return f"{cells}| {text} |"


def _mutations(page: str):
    """(what, edited page): each a claim the results do not support."""
    gelu, softmax, log = _row_of(page, "gelu [all]"), _row_of(page, "softmax [normal]"), _row_of(page, "log [all]")
    flip = {"| yes |": "| no |", "| no |": "| yes |"}
    verdict = next(v for v in flip if v in softmax)
    yield "outlier", page.replace(softmax, softmax.replace("| jax |", "| torch |"))
    yield "passed", page.replace(softmax, softmax.replace(verdict, flip[verdict], 1))
    yield "max ulp", page.replace(softmax, re.sub(r"max (\d+) ulp", lambda m: f"max {int(m[1]) - 1} ulp", softmax, 1))
    yield "bit-identical", page.replace(softmax, re.sub(r"\| torch vs jax[^|]*\|", "| bit-identical |", softmax))
    yield "region claimed", page.replace(log, _last_cell(log, "jax: [1, 2] 3/4"))  # one the results do not hold
    yield "prose in a cell", page.replace(gelu, gelu.replace("| torch |", "| torch (within 0.5 ULP elsewhere) |"))
    yield "reference", page.replace(softmax, re.sub(r"jax [\d.]+ (ulp|u\.cond)", r"jax 0.5 \1", softmax))
    yield "count", re.sub(r"(\d+) of (\d+) cases pass", lambda m: f"{int(m[1]) - 1} of {m[2]} cases pass", page)
    yield "case left out", page.replace(gelu + "\n", "")


@pytest.mark.parametrize("what", [w for w, _ in _mutations(_page())])
def test_a_claim_the_results_do_not_support_fails(what):
    edited = dict(_mutations(_page()))[what]
    assert edited != _page(), f"the mutation {what!r} changed nothing: the table is not what this test expects"
    assert problems(edited, _saved()), what


def test_hand_written_explanations_state_no_measured_number():
    page = _page()
    prose = page.split(END, 1)[1].split("\n## ", 1)[0]
    assert "Why they differ" in prose
    numbers = re.findall(r"(?<![\w.*/^-])\d+(?:\.\d+)?(?:e[+-]?\d+)?%?(?![\w.])", prose)
    assert numbers == [], f"measured numbers belong in the generated table, not the prose: {numbers}"
