"""``bb.parity.trace``'s report as text, Markdown and HTML (a per-layer error plot, log scale, the rounding
budget beside it, as inline SVG)."""

from __future__ import annotations

import html as _html
import math
from typing import Protocol

from bf16bridge.parity.tracing.records import CastFix, Divergence, GradRow, LayerRow


class TraceReportLike(Protocol):
    """What the rendering reads of a trace report (report.TraceReport has it; render does not import it)."""

    @property
    def frameworks(self) -> tuple[str, str]: ...
    @property
    def models(self) -> tuple[str, str]: ...
    @property
    def reference(self) -> str: ...
    @property
    def k(self) -> float: ...
    @property
    def layers(self) -> tuple[LayerRow, ...]: ...
    @property
    def first_divergence(self) -> Divergence | None: ...
    @property
    def unpaired_a(self) -> tuple[str, ...]: ...
    @property
    def unpaired_b(self) -> tuple[str, ...]: ...
    @property
    def grads(self) -> tuple[GradRow, ...]: ...
    @property
    def grad_divergence(self) -> GradRow | None: ...
    @property
    def grads_unpaired_a(self) -> tuple[str, ...]: ...
    @property
    def grads_unpaired_b(self) -> tuple[str, ...]: ...
    @property
    def notes(self) -> tuple[str, ...]: ...
    @property
    def cast(self) -> CastFix | None: ...
    @property
    def passed(self) -> bool: ...


def _g(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.3g}"


def _name(n: str) -> str:
    return n or "(model)"


def _head(rep: TraceReportLike) -> list[str]:
    verdict = "passed" if rep.passed else "FAILED"
    budget = (f"budget {rep.k:g} roundings times sqrt(depth), or 4 times the reference side's own error where "
              "larger" if "float64" in rep.reference else f"budget {2 * rep.k:g} roundings times sqrt(depth)")
    lines = [f"trace: model_a {rep.models[0]} ({rep.frameworks[0]}) against model_b {rep.models[1]} "
             f"({rep.frameworks[1]}): {verdict}", f"measured against {rep.reference}; {budget}",
             f"{len(rep.layers)} layers paired, {sum(not r.passed for r in rep.layers)} beyond the budget; "
             f"unpaired: {len(rep.unpaired_a)} in model_a, {len(rep.unpaired_b)} in model_b"]
    if not rep.layers:
        lines.append("nothing was compared (no layer paired): a trace that compares nothing does not pass")
    d = rep.first_divergence
    lines.append(f"first divergence: {d}" if d else "first divergence: none")
    if rep.cast is not None:
        c = rep.cast
        kept = (f"; kept in float32 ({c.kept}): end SQNR {_g(c.end_sqnr_kept_db)} dB, "
                f"{'passes' if c.end_passed_kept else 'fails'}" if c.end_sqnr_kept_db is not None else f"; {c.kept}")
        lines.append(f"loses the most: {_name(c.layer)} ({_g(c.loss_db)} dB from its input to its output); end SQNR "
                     f"{_g(c.end_sqnr_db)} dB, {'passes' if c.end_passed else 'fails'}{kept}")
    return lines


_COLUMNS = ("#", "layer (model_a)", "layer (model_b)", "shape", "error", "budget", "own", "SQNR dB", "loss dB",
            "verdict")


def _rows(rep: TraceReportLike) -> list[tuple]:
    return [(str(r.index), _name(r.layer_a), _name(r.layer_b), "x".join(map(str, r.shape)) or "()", _g(r.error),
             _g(r.budget), _g(r.verdict.own), _g(r.sqnr_db), _g(r.loss_db), "ok" if r.passed else "BEYOND")
            for r in rep.layers]


def _grad_rows(rep: TraceReportLike) -> list[tuple]:
    return [(g.name_a, g.name_b + (" (T)" if g.transposed else ""), "x".join(map(str, g.shape)), _g(g.verdict.error),
             _g(g.verdict.budget), _g(g.verdict.own), _g(g.verdict.sqnr_db), "ok" if g.passed else "BEYOND")
            for g in rep.grads]


_GRAD_COLUMNS = ("parameter (model_a)", "parameter (model_b)", "shape", "error", "budget", "own", "SQNR dB", "verdict")


def _tail(rep: TraceReportLike) -> list[str]:
    out = []
    if rep.unpaired_a:
        out.append("unpaired in model_a: " + ", ".join(map(_name, rep.unpaired_a)))
    if rep.unpaired_b:
        out.append("unpaired in model_b: " + ", ".join(map(_name, rep.unpaired_b)))
    if rep.grads:
        g = rep.grad_divergence
        out.append("gradient divergence (the first parameter the backward reaches beyond the budget): "
                   + (f"{g.name_a} / {g.name_b}: {g.verdict.why}" if g else "none"))
    if rep.grads_unpaired_a or rep.grads_unpaired_b:
        out.append(f"parameters unpaired: model_a {', '.join(rep.grads_unpaired_a) or '-'}; model_b "
                   f"{', '.join(rep.grads_unpaired_b) or '-'}")
    out += [f"note: {n}" for n in rep.notes]
    return out


def _table(head, rows) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *rows)]


def text(rep: TraceReportLike) -> str:
    out = _head(rep) + [""] + _table(_COLUMNS, _rows(rep))
    if rep.grads:
        out += ["", "gradients:"] + _table(_GRAD_COLUMNS, _grad_rows(rep))
    tail = _tail(rep)
    return "\n".join(out + ([""] + tail if tail else []))


def _md_table(head, rows) -> list[str]:
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(map(esc, head)) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(map(esc, r)) + " |" for r in rows]


def markdown(rep: TraceReportLike) -> str:
    out = [f"## {_head(rep)[0]}", ""] + [f"- {line}" for line in _head(rep)[1:]] + [""]
    out += _md_table(_COLUMNS, _rows(rep))
    if rep.grads:
        out += ["", "### gradients", ""] + _md_table(_GRAD_COLUMNS, _grad_rows(rep))
    tail = _tail(rep)
    return "\n".join(out + ([""] + [f"- {t}" for t in tail] if tail else [])) + "\n"


def _positive(v: float, lo: float) -> float:
    return v if math.isfinite(v) and v > 0 else lo


def _y(v: float, lo: float, hi: float, top: float, h: float) -> float:
    v = min(max(v, lo), hi)
    return top + h * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))


def plot(rep: TraceReportLike, width: int = 760, height: int = 280) -> str:
    """Each layer's error (roundings, log scale) beside its budget and the reference side's own error, as SVG."""
    rows = rep.layers
    if not rows:
        return ""
    finite = [v for r in rows for v in (r.error, r.budget, r.verdict.own or 0) if math.isfinite(v) and v > 0]
    lo = 10 ** math.floor(math.log10(min(finite + [0.1])))
    hi = 10 ** math.ceil(math.log10(max(finite + [10.0]) * 2))
    left, top, w, h = 56, 16, width - 72, height - 60
    x = lambda i: left + w * (i + 0.5) / len(rows)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11" '
             'font-family="sans-serif">',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    e = int(math.log10(lo))
    while 10 ** e <= hi:
        yy = _y(10.0 ** e, lo, hi, top, h)
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">1e{e}</text>')
        e += 1
    budget = " ".join(f"{x(i):.1f},{_y(_positive(r.budget, lo), lo, hi, top, h):.1f}"
                      for i, r in enumerate(rows))
    parts.append(f'<polyline points="{budget}" fill="none" stroke="#555" stroke-dasharray="4 3"/>')
    for i, r in enumerate(rows):
        if r.verdict.own is not None:
            parts.append(f'<circle cx="{x(i):.1f}" cy="{_y(r.verdict.own or lo, lo, hi, top, h):.1f}" r="2.5" '
                         f'fill="#aaa"><title>{_html.escape(_name(r.layer_a))}: reference side own error '
                         f'{_g(r.verdict.own)}</title></circle>')
        colour = "#2a7" if r.passed else "#d33"
        val = r.error if math.isfinite(r.error) else hi
        parts.append(f'<circle cx="{x(i):.1f}" cy="{_y(val if val > 0 else lo, lo, hi, top, h):.1f}" r="4" '
                     f'fill="{colour}"><title>{_html.escape(_name(r.layer_a))} / {_html.escape(_name(r.layer_b))}: '
                     f'{_html.escape(r.verdict.why)}</title></circle>')
    parts.append(f'<text x="{left}" y="{height - 24}">layers in order (hover a point for its name); '
                 'dashed: the budget; red: beyond it; grey: the reference side\'s own error</text>')
    parts.append(f'<text x="12" y="{top + h / 2:.0f}" transform="rotate(-90 12 {top + h / 2:.0f})" '
                 'text-anchor="middle">error (roundings)</text></svg>')
    return "".join(parts)


def _html_table(head, rows) -> str:
    th = "".join(f"<th>{_html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def html(rep: TraceReportLike) -> str:
    head = _head(rep)
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>bf16bridge trace</title><style>body{font-family:"
           "sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
           "font-size:12px}</style></head><body>", f"<h2>{_html.escape(head[0])}</h2>"]
    out += [f"<p>{_html.escape(line)}</p>" for line in head[1:]]
    out += [plot(rep), _html_table(_COLUMNS, _rows(rep))]
    if rep.grads:
        out += ["<h3>gradients</h3>", _html_table(_GRAD_COLUMNS, _grad_rows(rep))]
    out += [f"<p>{_html.escape(t)}</p>" for t in _tail(rep)]
    return "\n".join(out + ["</body></html>"]) + "\n"
