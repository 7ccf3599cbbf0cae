"""A parity report as text, markdown, HTML (with the ULP histograms drawn) or JSON."""

from __future__ import annotations

import html as _html

from bf16bridge.core.text import table
from bf16bridge.parity.metrics import BIN_LABELS, KINDS
from bf16bridge.parity.policies import FRAMEWORK_DEFAULTS, REFERENCE_CAP, parse, rounding_multiple


def _g(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _pair_rows(rep):
    head = ["pair", "identical", "max ulp", "p50", "p99", "p99.9", "max abs", "max rel", "rmse", "cosine",
            "NaN", "inf", "-0/+0", "subnormal", "passed"]
    rows = []
    for p in rep.pairs:
        if p.shape_mismatch:
            rows.append([p.label, p.shape_mismatch] + [""] * 12 + ["no"])
            continue
        rows.append([p.label, _pct(p.identical_fraction), str(p.max_ulp), _g(p.ulp_p50), _g(p.ulp_p99),
                     _g(p.ulp_p999), _g(p.max_abs), _g(p.max_rel), _g(p.rmse), f"{p.cosine:.6f}",
                     str(p.nan_mismatches), str(p.inf_mismatches), str(p.signed_zero_mismatches),
                     str(p.subnormal_mismatches), {True: "yes", False: "no", None: "-"}[p.passed]])
    return head, rows


def _ref_rows(rep):
    head = ["result", "rms error", "max abs error", "ulps of", "p99 err (ulps of ref)", "max err (ulps of ref)",
            "max err / (u * condition)", "p99 err / (u * condition)", "non-finite mismatches", "passed"]
    rows = [[r.name, r.shape_mismatch] + [""] * 7 + ["no"] if r.shape_mismatch else
            [r.name, _g(r.rms_error), _g(r.max_abs_error), r.ulp_unit, _g(r.p99_ulps_of_reference),
             _g(r.max_ulps_of_reference),
             _g(r.max_normalised), _g(r.p99_normalised), str(r.nonfinite_mismatches),
             {True: "yes", False: "no", None: "-"}[r.passed]] for r in rep.references]
    return head, rows


def _smallest(rep) -> str:
    s = rep.smallest
    parts = []
    if s.get("ulp") == 0 and s.get("allclose_atol_at_rtol_0") == 0:
        parts.append("exact (every element bit-identical)" if all(p.identical_fraction == 1 for p in rep.pairs)
                     else "ulp(0): equal values, some bits differ (signed zeros, NaN payloads, or what rounding "
                          "one side to the other's dtype lost)")
    elif s.get("ulp") is not None:
        parts.append(f"ulp({s['ulp']})")
        parts.append(f"allclose(rtol={_g(s['allclose_rtol_at_atol_0'])}, atol=0)")
        parts.append(f"allclose(rtol=0, atol={_g(s['allclose_atol_at_rtol_0'])})")
    else:
        parts.append("no ulp or allclose tolerance (NaN/inf positions or shapes differ)")
    if s.get("rounding_k") is not None:
        parts.append(f"rounding({s['rounding_k']:.3g})")
    elif "rounding_k" in s:
        parts.append("no rounding(k) (a NaN/inf rounding does not explain, or shapes differ)")
    if s.get("reference_k") is not None:
        cap = s.get("reference_cap") or 0.0  # the default cap passes: not named
        parts.append(f"reference({s['reference_k']:.3g}" + (f", cap={cap:.3g})" if cap > REFERENCE_CAP else ")"))
    elif "reference_k" in s:
        parts.append("no reference(k) (a result's shape differs from the reference's)")
    return "; ".join(parts)


def _reference_rule(rep) -> str | None:
    """What "passed" means under reference(k), and each result's error in its dtype's roundings: a
    result passes beside others as wrong as it unless the cap bounds it, and the report says so."""
    if not rep.references or not rep.policy.startswith("reference("):
        return None
    pol = parse(rep.policy)
    scaled = any(r.max_normalised is not None for r in rep.references)
    how = "max |error| / (u * condition)" if scaled else "RMS error / its rounding floor"
    each = ", ".join(f"{r.name} {_g(rounding_multiple(r))}" for r in rep.references)
    rule = f"passed means: RMS error at most {pol.n:g}x the best result's (or its dtype's rounding floor, if larger)"
    if pol.cap is None:
        return (f"{rule}; relative to the best result only (cap=none), so an error every result shares passes; "
                f"error in its dtype's roundings ({how}): {each}")
    line = f"{rule}, and at most {pol.cap:g}x what its dtype's rounding allows ({how}): {each}"
    if any(not r.shape_mismatch and rounding_multiple(r) > pol.cap for r in rep.references):
        line += (" (beyond the cap: a fault those results share, or an algorithm less accurate than its dtype "
                 "allows: raise cap where that is expected)" if scaled else
                 " (beyond the cap: a fault those results share, or an ill-conditioned computation, whose correct "
                 "results may be many rounding floors off: give condition=, or raise cap)")
    return line


def _explained(rep) -> list:
    """(name, Explained) of what the rounding policy judged: each result against the reference,
    else each pair."""
    return ([(r.name, r.explained) for r in rep.references if r.explained is not None]
            or [(p.label, p.explained) for p in rep.pairs if p.explained is not None])


def _rounding_head(rep) -> str:
    judged = _explained(rep)
    budget = judged[0][1].budget if judged else 0
    side = "each result against the float64 reference" if rep.references else "each pair of results"
    return (f"what rounding explains, {side} (within {budget:g} roundings: u times each element's scale, "
            "element by element and normwise)")


def _rounding_lines(rep) -> list[str]:
    return [f"  {name}: {'explained' if e.passed else 'NOT explained'} ({e.decided_by}): {e.why}"
            for name, e in _explained(rep)]


def _title(rep) -> str:
    names = []
    for p in rep.pairs:
        for n in (p.a, p.b):
            if n not in names:
                names.append(n)
    names = names or [r.name for r in rep.references]
    shape = next((p.shape for p in rep.pairs), ())
    dtype = next((p.dtype for p in rep.pairs), "")
    what = f"{rep.op}: " if rep.op else ""
    held = f"{'x'.join(map(str, shape)) or 'scalar'} {dtype}" if rep.pairs else "no pair"  # no shape: say so
    return (f"parity {what}{' vs '.join(names)} [{held}], "
            f"policy {rep.policy}: {'PASSED' if rep.passed else 'FAILED'}")


def _table(head, rows) -> list[str]:
    return table(head, rows).split("\n")


def _region_head(rep) -> str:
    if rep.references:
        return f"where a result's error against the reference exceeds {rep.policy} (by input)"
    return f"where two results differ beyond {rep.policy} (by input)"


def region_text(rep, g) -> str:
    """One worst region in a line: the interval, how many inputs exceed, and the representative."""
    pair = g.reference != g.reference  # NaN: a pair's region, without a reference (regions.find_pairs)
    if g.ulps is None:
        dist = "NaN/inf on one side only" if pair else "NaN/inf where the rounded reference is not, or the reverse"
    else:
        dist = f"{g.ulps:g} ulp" + (" apart" if pair else "")
    vals = ", ".join(f"{n} {v:.8g}" for n, v in g.values)
    return (f"{g.result}: x in [{g.lo:.8g}, {g.hi:.8g}]: {g.exceeding} of {g.inputs} inputs exceed"
            f" ({g.nonfinite} non-finite); at x = {g.input:.8g}: {vals}"
            + (f" ({dist})" if pair else f", reference {g.reference:.8g} ({dist})"))


def _region_lines(rep) -> list[str]:
    out: list[str] = []
    shown: dict[str, int] = {}
    for g in rep.worst_regions:
        shown[g.result] = shown.get(g.result, 0) + 1
        out.append("  " + region_text(rep, g))
    for name, n in shown.items():
        total = next(g.regions_total for g in rep.worst_regions if g.result == name)
        if total > n:
            out.append(f"  ({name}: {total - n} smaller regions not shown)")
    return out


def _worst_lines(rep) -> list[str]:
    out = []
    for p in rep.pairs:
        if p.worst:
            out.append(f"worst elements, {p.label}:")
            for e in p.worst:
                dist = f"{e.ulp} ulp" if e.ulp is not None else "non-finite"
                out.append(f"  {list(e.index)}  {p.a} {e.a:.8g} ({e.a_bits})  {p.b} {e.b:.8g} ({e.b_bits})  {dist}")
    return out


def text(rep) -> str:
    lines = [_title(rep), ""]
    lines += _table(*_pair_rows(rep))
    lines += ["", "ULP histogram (finite elements):"]
    for p in rep.pairs:
        if p.ulp_histogram:
            lines.append(f"  {p.label}: " + "  ".join(f"{k}: {v}" for k, v in p.ulp_histogram.items() if v))
    notes = [f"  {p.label}: {p.note}" for p in rep.pairs if p.note]
    if notes:
        lines += ["", "notes:"] + notes
    if rep.references:
        lines += ["", "against the float64 reference (u = 2**-8, bf16's unit roundoff):"]
        lines += ["  " + line for line in _table(*_ref_rows(rep))]
        lines.append(f"outlier: {rep.outlier} ({rep.outlier_why})" if rep.outlier else f"outlier: none ({rep.outlier_why})")
        lines += [rule] if (rule := _reference_rule(rep)) else []
    if _explained(rep):
        lines += ["", _rounding_head(rep) + ":", *_rounding_lines(rep)]
    lines += ["", *_worst_lines(rep)] if any(p.worst for p in rep.pairs) else []
    if rep.worst_regions:
        lines += ["", _region_head(rep) + ":", *_region_lines(rep)]
    if rep.not_compared:
        lines += ["", f"not compared: {rep.not_compared}"]
    lines += ["", f"smallest tolerance of each kind that passes: {_smallest(rep)}"]
    if rep.settings:
        lines += ["", "settings: " + "; ".join(f"{k}={v}" for k, v in rep.settings.items())]
    return "\n".join(lines)


def _md_table(head, rows) -> list[str]:
    return table(head, rows, "markdown").split("\n")


def markdown(reports) -> str:
    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    out = []
    for rep in reports:
        out += [f"### {_title(rep)}", ""]
        out += _md_table(*_pair_rows(rep))
        out += [""] + _md_table(["pair", *BIN_LABELS], [[p.label, *(p.ulp_histogram.get(k, 0) for k in BIN_LABELS)]
                                                       for p in rep.pairs if not p.shape_mismatch])
        if rep.references:
            out += [""] + _md_table(*_ref_rows(rep))
            out += ["", f"Outlier: {rep.outlier or 'none'} ({rep.outlier_why})."]
            out += ["", rule + "."] if (rule := _reference_rule(rep)) else []
        if _explained(rep):
            out += ["", _rounding_head(rep) + ":", ""] + ["- " + line.strip() for line in _rounding_lines(rep)]
        if rep.worst_regions:
            out += ["", f"Worst regions, {_region_head(rep)}:", ""]
            out += _md_table(*_region_rows(rep))
        if rep.not_compared:
            out += ["", f"Not compared: {rep.not_compared}."]
        out += ["", f"Smallest passing tolerance: {_smallest(rep)}.", ""]
    return "\n".join(out)


def _region_rows(rep):
    names = [n for n, _ in rep.worst_regions[0].values] if rep.worst_regions else []
    head = ["result", "inputs from", "to", "exceeding", "of", "non-finite", "worst input", *names, "reference",
            "ulps from rounded reference"]
    rows = [[g.result, _g(g.lo), _g(g.hi), g.exceeding, g.inputs, g.nonfinite, f"{g.input:.6g}",
             *(f"{v:.6g}" for _, v in g.values), f"{g.reference:.6g}", "NaN/inf" if g.ulps is None else f"{g.ulps:g}"]
            for g in rep.worst_regions]
    return head, rows


def _svg_histogram(p, width=420, height=120) -> str:
    counts = [p.ulp_histogram.get(k, 0) for k in BIN_LABELS]
    top = max(counts) or 1
    bw = width / len(counts)
    bars = []
    for i, (k, c) in enumerate(zip(BIN_LABELS, counts)):
        h = 0 if c == 0 else max(1.0, (height - 30) * (c / top) ** 0.5)  # sqrt scale: small bins stay visible
        x = i * bw + 2
        bars.append(f'<rect x="{x:.1f}" y="{height - 18 - h:.1f}" width="{bw - 4:.1f}" height="{h:.1f}" fill="#3b7dd8">'
                    f"<title>{k} ulp: {c}</title></rect>")
        bars.append(f'<text x="{x + (bw - 4) / 2:.1f}" y="{height - 4}" font-size="9" text-anchor="middle">{k}</text>')
        if c:
            bars.append(f'<text x="{x + (bw - 4) / 2:.1f}" y="{height - 21 - h:.1f}" font-size="8" '
                        f'text-anchor="middle">{c}</text>')
    return f'<svg width="{width}" height="{height}" role="img" aria-label="ULP histogram">{"".join(bars)}</svg>'


def _html_table(head, rows) -> str:
    esc = _html.escape
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


def html(reports) -> str:
    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    esc = _html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>bf16bridge parity</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}.fail{color:#b00}.pass{color:#070}</style>",
             "</head><body><h1>bf16bridge parity</h1>"]
    for rep in reports:
        cls = "pass" if rep.passed else "fail"
        parts.append(f"<h2 class='{cls}'>{esc(_title(rep))}</h2>")
        for head, rows in (_pair_rows(rep), _ref_rows(rep) if rep.references else (None, None)):
            if head:
                parts.append(_html_table(head, rows))
        for p in rep.pairs:
            if not p.shape_mismatch:
                parts.append(f"<p>ULP histogram, {esc(p.label)}</p>{_svg_histogram(p)}")
        if rep.references:
            parts.append(f"<p>Outlier: {esc(str(rep.outlier or 'none'))} ({esc(str(rep.outlier_why))})</p>")
            if rule := _reference_rule(rep):
                parts.append(f"<p>{esc(rule)}</p>")
        if _explained(rep):
            parts.append(f"<p>{esc(_rounding_head(rep))}:</p><ul>"
                         + "".join(f"<li>{esc(line.strip())}</li>" for line in _rounding_lines(rep)) + "</ul>")
        if rep.worst_regions:
            parts.append(f"<p>Worst regions, {esc(_region_head(rep))}</p>")
            parts.append(_html_table(*_region_rows(rep)))
        if rep.not_compared:
            parts.append(f"<p class='fail'>Not compared: {esc(rep.not_compared)}</p>")
        parts.append(f"<p>Smallest passing tolerance: {esc(_smallest(rep))}</p>")
        if rep.settings:
            parts.append("<p>Settings: " + esc("; ".join(f"{k}={v}" for k, v in rep.settings.items())) + "</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _nonfinite(n: int, fmt: str = ", {} NaN/inf") -> str:
    return fmt.format(n) if n else ""


def _pairs_claim(rep) -> str:
    if any(p.shape_mismatch for p in rep.pairs):
        return "; ".join(f"{p.label}: {p.shape_mismatch}" for p in rep.pairs if p.shape_mismatch)
    if rep.pairs and all(p.identical_fraction == 1 for p in rep.pairs):
        return "bit-identical"
    return "; ".join(f"{p.label}: {_pct(p.identical_fraction)} identical, max {p.max_ulp} ulp"
                     + _nonfinite(p.nonfinite_mismatches) for p in rep.pairs) or "-"


def _reference_claim(rep) -> str:
    return "; ".join(
        f"{r.name}: {r.shape_mismatch}" if r.shape_mismatch else
        (f"{r.name} {_g(r.max_normalised)} u.cond" if r.max_normalised is not None
         else f"{r.name} {_g(r.max_ulps_of_reference)} ulp" + ("" if r.ulp_unit == "bfloat16" else f" ({r.ulp_unit})"))
        + _nonfinite(r.nonfinite_mismatches)
        for r in rep.references) or "-"


def _regions_claim(rep) -> str:
    return "; ".join(f"{g.result}: [{_g(g.lo)}, {_g(g.hi)}] {g.exceeding}/{g.inputs}"
                     + _nonfinite(g.nonfinite, " ({} NaN/inf)") for g in rep.worst_regions) or "-"


def summary(reports) -> str:
    """One markdown table of a suite, a row per case: whether it passed, how the results
    differ pairwise, each result's largest error against the float64 reference (in
    ULPs of the reference, or in units of u.condition where the op has a condition
    scale), the outlier, and the worst regions. Every number comes from the reports."""
    reports = reports if isinstance(reports, (list, tuple)) else [reports]
    policies = sorted({r.policy for r in reports})
    passed = sum(r.passed for r in reports)
    head = ["case", "passed", "results against each other", "max error against float64", "outlier",
            "worst regions (inputs from, to: exceeding/inputs)"]
    rows = [[r.op or "-", "yes" if r.passed else "no", _pairs_claim(r), _reference_claim(r), r.outlier or "none",
             _regions_claim(r)] for r in reports]
    return "\n".join([f"{passed} of {len(reports)} cases pass {', '.join(policies)}.", ""] + _md_table(head, rows))


def framework_policies(fmt="markdown") -> str:
    """The named framework policies' tolerances, a row per dtype parity compares: rtol / atol (a
    pair of dtypes takes the larger of each), and the dtype a result is computed in where its
    helper converts it first. From FRAMEWORK_DEFAULTS (docs/parity.md holds this table, tested)."""
    def cell(pol, kind):
        rtol, atol = pol.tolerances(kind, kind)
        to = dict(pol.widen).get(kind)
        return f"{rtol:g} / {atol:g}" + (f" (as {to})" if to else "")

    return table(["dtype", *(f"{n} rtol / atol" for n in FRAMEWORK_DEFAULTS)],
                 [[k, *(cell(p, k) for p in FRAMEWORK_DEFAULTS.values())] for k in KINDS], fmt)
