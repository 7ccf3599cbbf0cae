"""The dtype support matrix (`bf16bridge matrix --dtype`) and docs/dtypes.md's generated block,
asked of bb.plan and bb.convert on real tensors of each framework."""

from __future__ import annotations

import warnings
from typing import Literal

from bf16bridge.core.text import table

# Asked of bb.plan and bb.convert on real tensors of each framework (imported here, lazily),
# never written down: the tests compare docs/dtypes.md with what these return.

#: what every row of a dtype matrix assumes about its input
DTYPE_ASSUMES = ("each route is for a contiguous, 64-byte aligned tensor of the source framework holding every bit "
                 "pattern of the dtype; bb.plan(x, to=...) shows yours")

ROUTE_COLS = [("source", "from"), ("target", "to"), ("route", "route"), ("result", "result"),
              ("bit_exact", "bit-exact")]


def matrix_dtypes() -> tuple[str, ...]:
    """The dtypes ``--dtype all`` covers: the table's rows beyond numpy's own, in table order."""
    from bf16bridge.core import dtypes

    return tuple(d for d in dtypes.NAMES if d not in dtypes.STANDARD)


def _why(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _base(dtype: str):
    """A numpy array of every bit pattern of ``dtype`` (of the row it unpacks to, for a packed
    row numpy cannot hold), 64-byte aligned: what each source tensor is made from."""
    from bf16bridge.core import dtypes
    from bf16bridge.core.memory import aligned_empty

    name = dtypes.PACKED.get(dtype, dtype)
    bits = dtypes.all_patterns(name)
    out = aligned_empty(bits.shape, bits.dtype)
    out[...] = bits
    return out.view(dtypes.numpy_dtype(name))


def _source(base, dtype: str, framework: str):
    """A tensor of ``dtype`` in ``framework`` made from ``base``, or the reason there is none."""
    from bf16bridge.core import registry
    from bf16bridge.core.convert import convert, plan

    try:
        held = registry.get(framework).cannot_hold(dtype)
    except ImportError as err:  # not installed: its rows say so, the others still run
        return None, _why(err)
    if held:
        return None, f"{framework} cannot hold {dtype} ({held})"
    try:
        x = aligned_source(base, framework)
        got = plan(x, to=framework).dtype_in
    except Exception as err:  # noqa: BLE001 - the reason is the finding
        return None, f"no {dtype} tensor in {framework}: {_why(err)}"
    if got != dtype:
        return None, f"numpy's {base.dtype} arrives in {framework} as {got}, not {dtype}"
    return x, None


def aligned_source(base, framework: str):
    """``base`` (a 64-byte aligned numpy array) as a tensor of ``framework``, 64-byte aligned as the
    matrices assume of their inputs: a copy in memory of the framework's own where that lands aligned,
    else one sharing ``base``'s memory where the route takes it as it is (a framework's own buffers
    may be aligned to fewer bytes, and a row would then vary from run to run). Where
    neither is aligned, or no pointer can be read, the copy: its rows then say why they copy."""
    from bf16bridge.core import registry
    from bf16bridge.core.adapter import ALIGN
    from bf16bridge.core.convert import convert

    x = convert(base, framework, copy=True, on_alias="allow")
    adapter = registry.get(framework)
    try:
        if adapter.data_ptr(x) % ALIGN == 0:
            return x
        shared = convert(base, framework, on_alias="allow")
        return shared if adapter.data_ptr(shared) % ALIGN == 0 else x
    except Exception:  # noqa: BLE001 - no pointer to read (tensorflow's narrow rows): the copy, as made
        return x


def _same_bits(back, base) -> bool:
    """Every byte the same, as the tests compare: a padded row's padding (int4, fp6, fp4 one a byte:
    zero in ``base``) too, so a route that sets it is not called bit-exact."""
    import numpy as np

    if back.dtype != base.dtype or back.shape != base.shape:
        return False
    width = np.dtype(f"u{base.dtype.itemsize}")
    return bool(np.array_equal(back.view(width), base.view(width)))


def route_rows(dtype: str) -> list[dict]:
    """One row per ordered pair of registered frameworks: the route bb.plan() takes for a tensor of
    ``dtype`` (every bit pattern), and whether bb.convert() kept every bit; a pair with no route says
    why ("refused"), and one whose source cannot hold the dtype says so."""
    from bf16bridge.core import registry
    from bf16bridge.errors import UnsupportedDtypeError

    names = registry.names()
    try:
        base = _base(dtype)
    except UnsupportedDtypeError as err:  # this ml_dtypes lacks the row: no source is made, and each row says why
        sources = {s: (None, f"no {dtype} tensor in {s} is made here (each is made from numpy's): {_why(err)}")
                   for s in names}
    else:
        sources = {s: _source(base, dtype, s) for s in names}
    rows = []
    for s in names:
        x, missing = sources[s]
        for d in names:
            if d == s:
                continue
            row: dict = {"dtype": dtype, "source": s, "target": d, "route": "", "copies": None, "refused": None,
                         "reason": "", "bit_exact": None, "same_pointer": None}
            if x is None:
                row.update(refused=True, reason=missing)
            else:
                # a warning is part of the finding, and the same under pytest's warnings-as-errors
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    _route_row(row, x, d, base)
                if caught:
                    said = "; ".join(f"{w.category.__name__}: {w.message}" for w in caught)
                    row["reason"] += f"{'; ' if row['reason'] else ''}warns: {_why(Exception(said))}"
            row["result"] = result(row)
            rows.append(row)
    return rows


def _route_row(row: dict, x, target: str, base) -> None:
    """Fill ``row`` with the route of ``x`` to ``target``, and whether its bits came back unchanged."""
    from bf16bridge.core import registry
    from bf16bridge.core.convert import convert, plan

    try:
        p = plan(x, to=target)
        y = convert(x, target, on_alias="allow")  # the row's own tensor; the route says what it shares
    except Exception as err:  # noqa: BLE001 - a refusal is a finding of the matrix
        row.update(refused=True, reason=_why(err))
        return
    row.update(route=" -> ".join(f"{st.framework}: {st.label}" for st in p.steps), copies=p.copies, refused=False,
               dtype_out=p.dtype_out, shares_memory=p.shares_memory,
               reason="; ".join(st.reason for st in p.steps if st.copies and st.reason))
    if not p.copies:  # zero-copy, as the data pointers say (not only the plan)
        same = registry.get(row["source"]).data_ptr(x) == registry.get(target).data_ptr(y)
        row["same_pointer"] = same
        if not same:
            row.update(copies=True, reason="the plan says zero-copy, but the result's data pointer differs")
    try:
        row["bit_exact"] = _same_bits(convert(y, registry.HUB, copy=True), base)
    except Exception as err:  # noqa: BLE001 - said, and the bits stay unchecked
        row["reason"] += f"{'; ' if row['reason'] else ''}not checked: {_why(err)}"


def result(row: dict) -> str:
    """A route row's outcome in words: zero-copy, copies (why), refused (why)."""
    if row["refused"]:
        return f"refused ({row['reason']})"
    if row["copies"]:
        return f"copies ({row['reason']})" if row["reason"] else "copies"
    return "zero-copy"


def _short(row: dict) -> str:
    return "refused" if row["refused"] else "copies" if row["copies"] else "zero-copy"


def route_table(rows: list[dict], fmt: Literal["text", "markdown"] = "text") -> str:
    """Rows of route_rows() (one dtype or several) as tables, one per dtype under its name."""
    out = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == dtype]
        title = f"### {dtype}" if fmt == "markdown" else f"{dtype}:"
        out.append(title + "\n\n" + table([h for _, h in ROUTE_COLS],
                                          [[_cell(r[k]) for k, _ in ROUTE_COLS] for r in mine], fmt))
    return "\n\n".join(out)


def _cell(v) -> str:
    return "-" if v is None else str(v)


def pair_matrix(rows: list[dict], fmt: Literal["text", "markdown"] = "markdown") -> str:
    """dtype x ordered pair: zero-copy, copies or refused (the reasons are in route_table)."""
    pairs = list(dict.fromkeys((r["source"], r["target"]) for r in rows))
    by = {(r["dtype"], r["source"], r["target"]): r for r in rows}
    body = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        body.append([dtype, *(_short(by[(dtype, s, d)]) + ("" if by[(dtype, s, d)]["bit_exact"] in (True, None)
                                                          else ", BITS CHANGED")
                              for s, d in pairs)])
    return table(["dtype", *(f"{s} -> {d}" for s, d in pairs)], body, fmt)


def packing_rows() -> list[dict]:
    """For each packed row and each framework that holds it: the byte a pair of values becomes
    there, found by converting numpy's one-a-byte values (the first 1, the second 2) and reading the
    packed byte through the framework's bit-view."""
    import numpy as np

    from bf16bridge.core import dtypes
    from bf16bridge.core import registry
    from bf16bridge.core.memory import aligned_empty
    from bf16bridge.core.convert import convert

    out = []
    for packed, unpacked in dtypes.PACKED.items():
        row = dtypes.ROWS[packed]
        carrier = row.carrier or "uint8"
        pair = aligned_empty((2,), np.uint8)
        pair[...] = (1, 2)
        missing = dtypes.numpy_missing(unpacked)  # (this ml_dtypes lacks it: each holder's entry says so)
        base = pair.view(dtypes.numpy_dtype(unpacked)) if missing is None else None
        for name in registry.names():
            try:
                a = registry.get(name)
            except ImportError:  # not installed: nothing to find there
                continue
            if a.cannot_hold(packed):
                continue
            entry = {"dtype": packed, "unpacked": unpacked, "framework": name, "packing": row.packing}
            try:
                x, why = _source(base, packed, name) if base is not None else (None, f"numpy: {missing}")
                if x is None:
                    raise ValueError(why)
                byte = int(convert(a.bitview(x, carrier), registry.HUB, copy=True).reshape(-1)[0])
                entry["byte"] = f"0x{byte:02x}"
                entry["order"] = {0x21: "first value in the low nibble (bits 0-3), second in the high nibble",
                                  0x12: "first value in the high nibble (bits 4-7), second in the low nibble"
                                  }.get(byte, f"neither nibble order (0x{byte:02x} for the values 1, 2)")
            except Exception as err:  # noqa: BLE001 - the reason is the finding
                entry.update(byte="-", order=f"not found: {_why(err)}")
            out.append(entry)
    return out


def layout_rows() -> list[list[str]]:
    """The table's rows beyond numpy's own: how each is stored and carried."""
    from bf16bridge.core import dtypes

    out = []
    for name in matrix_dtypes():
        r = dtypes.ROWS[name]
        how = (f"{r.packing} values a byte ({r.unpacked} packed)" if r.packing > 1 else
               f"one a byte, the low {r.bits} bits" if r.bits < 8 * r.itemsize else f"{r.itemsize} byte(s)")
        code = "-" if r.dlpack is None else "code {}, bits {}, lanes {}".format(*r.dlpack)
        out.append([name, str(r.bits), how, r.carrier or "-", code, ", ".join(r.widenings) or "none"])
    return out


def fallback_rows() -> list[list[str]]:
    """What fallback='auto' gives each target that has no route for a dtype without one, asked of
    bb.plan() with a tensor of the dtype from the first framework that holds it (a route that packs
    or unpacks is no fallback: the matrix shows it)."""
    from bf16bridge.core import dtypes
    from bf16bridge.core import registry
    from bf16bridge.core.convert import plan

    out = []
    for dtype in matrix_dtypes():
        if dtypes.values_missing(dtype):  # no tensor of it is made here (the matrix says why)
            continue
        base = _base(dtype)
        src = next(((s, x) for s in registry.names() for x, _ in [_source(base, dtype, s)] if x is not None), None)
        if src is None:
            continue
        s, x = src
        for t in registry.names():
            if t == s:
                continue
            try:
                plan(x, to=t)
                continue  # a route without a fallback
            except Exception:  # noqa: BLE001 - refused: what does the fallback do?
                pass
            try:
                p = plan(x, to=t, fallback="auto")
                got = [f"{p.dtype_out} ({'copies' if p.copies else 'zero-copy'})", p.decision or ""]
            except Exception as err:  # noqa: BLE001 - a refusal is a finding
                got = ["refused", _why(err)]
            out.append([dtype, f"{s} -> {t}", *got])
    return out


DOCS_BEGIN = "<!-- begin generated: python -m bf16bridge.cli.tables docs/dtypes.md; tests/cli/test_dtype_docs.py checks it -->"
DOCS_END = "<!-- end generated -->"


def dtype_docs() -> str:
    """docs/dtypes.md's generated block, from this machine: the frameworks are imported and tried
    (the probe again, not its cached answer: the page says what the code says now)."""
    from bf16bridge.capabilities.probing import probe

    with warnings.catch_warnings(record=True):  # the same page under pytest's warnings-as-errors
        warnings.simplefilter("always")
        return _dtype_docs(probe(frameworks="all", refresh=True))


def _dtype_docs(caps) -> str:
    fws = ", ".join(f"{n} {fw.version}" for n, fw in caps.frameworks.items() if fw.probed)
    rows = [r for d in matrix_dtypes() for r in route_rows(d)]
    pack = packing_rows()
    parts = [
        f"Made on {caps.cpu.arch} (CPU) with numpy {caps.numpy.version}, ml_dtypes {caps.numpy.ml_dtypes_version}, "
        f"{fws}.",
        "## Which framework holds which dtype",
        "`yes` holds it; `DLPack out/in`: exports / imports it over DLPack, tried on a tensor of its own "
        "(`bf16bridge probe --frameworks all` prints the same with every reason).",
        caps.dtype_table("markdown"),
        "## The rows: storage, bit carrier, DLPack code, exact widenings",
        table(["dtype", "bits", "stored", "bit carrier", "DLPack", "exact widenings (narrowest first)"],
              layout_rows(), "markdown"),
        "## Packing",
        (table(["dtype", "framework", "values a byte", "one a byte", "values 1, 2 pack to", "nibble order"],
               [[p["dtype"], p["framework"], p["packing"], p["unpacked"], p["byte"], p["order"]] for p in pack],
               "markdown") if pack else "No framework here holds a packed row."),
        "## Fallbacks: what `fallback='auto'` gives where no route keeps the dtype",
        table(["dtype", "pair", "arrives as", "why"], fallback_rows(), "markdown"),
        "## The support matrix: dtype x ordered pair",
        f"Each cell: the route for {DTYPE_ASSUMES.split('; ')[0][len('each route is for '):]} "
        f"(`bf16bridge matrix --dtype all`); the reasons are in the tables below.",
        pair_matrix(rows, "markdown"),
        "## Routes, pair by pair",
        "bit-exact: the result, brought back to numpy, has every byte of the input (`.view(uint8)` of each), "
        "a padded row's padding bits (zero in the input) included. Padding bits that are not zero (no value has "
        "them; ml_dtypes never writes them) are kept on every route but those that pack: through jax for the rows "
        "XLA packs (4 bits and fewer), into torch's float4_e2m1fn_x2, and into a checkpoint's F4 (two values a "
        "byte); those keep only the value bits and give the padding back zero. ml_dtypes ignores padding bits "
        "in the integer rows, so their values are kept; it reads a set one as the sign in the fp4 row, so "
        "there a packing route would change the value numpy reads, and refuses instead (InvalidArgumentError "
        "naming the byte; `a.astype(np.float32).astype(a.dtype)` keeps the values and packs; "
        "tests/core/test_dtypes.py and tests/kernels/test_narrow_kernels.py check this).",
        route_table(rows, "markdown"),
    ]
    return "\n\n".join(p.strip() for p in parts)


def _page_parts(text: str) -> tuple[str, str, str]:
    if DOCS_BEGIN not in text or DOCS_END not in text:
        raise ValueError(f"no generated block ({DOCS_BEGIN} ... {DOCS_END})")
    head, rest = text.split(DOCS_BEGIN, 1)
    block, tail = rest.split(DOCS_END, 1)
    return head, block, tail


def generated_block(text: str) -> str:
    """The generated block of a docs/dtypes.md text, as dtype_docs() returns it."""
    return _page_parts(text)[1].strip()


def write_dtype_docs(path: str) -> None:
    """Replace the generated block of the page at ``path`` with dtype_docs()."""
    import pathlib

    page = pathlib.Path(path)
    head, _, tail = _page_parts(page.read_text())
    page.write_text(f"{head}{DOCS_BEGIN}\n{dtype_docs()}\n{DOCS_END}{tail}")


if __name__ == "__main__":
    import sys

    write_dtype_docs(sys.argv[1] if len(sys.argv) > 1 else "docs/dtypes.md")
    print(f"wrote {sys.argv[1] if len(sys.argv) > 1 else 'docs/dtypes.md'}")
