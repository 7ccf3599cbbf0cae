"""Tables as plain text (columns padded with spaces) or GitHub markdown: the one renderer the
probe, the parity report, the cli and the benchmark report share. Standard library only."""

from __future__ import annotations

from typing import Iterable, Literal, Sequence

FORMATS = ("text", "markdown")


def table(head: Sequence, rows: Iterable[Sequence], fmt: Literal["text", "markdown"] = "text") -> str:
    """``head`` and each row of ``rows`` as one table, every cell through ``str``.

    ``text``: columns left-aligned, two spaces apart, trailing spaces dropped.
    ``markdown``: a pipe table; a ``|`` inside a cell is escaped and a newline
    becomes a space, so a cell never breaks the table.
    """
    head = [str(c) for c in head]
    body = [[str(c) for c in r] for r in rows]
    for i, r in enumerate(body):
        if len(r) != len(head):
            raise ValueError(f"table: row {i} has {len(r)} cells, the head {len(head)}: {r!r}")
    if fmt == "markdown":
        def line(cells):
            return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

        return "\n".join([line(head), "|" + "---|" * len(head)] + [line(r) for r in body])
    if fmt != "text":
        raise ValueError(f"table: fmt must be one of {', '.join(FORMATS)}; got {fmt!r}")
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + body)
