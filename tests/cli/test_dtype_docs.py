"""docs/dtypes.md's generated block is what the code and the installed frameworks say now.

The block is written by ``python -m bf16bridge.cli.tables docs/dtypes.md`` (``make dtype-docs``): the
probe's dtype table, the table's rows, the packing found by converting, the fallbacks and the
routes asked of bb.plan() and bb.convert() on real tensors. A route, a probe finding or a table row
that changes without the page fails here; so does a page that leaves out a dtype or a pair.
"""

import difflib
import pathlib

from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.cli import tables

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "dtypes.md"


def test_the_generated_block_is_what_the_code_says_now():
    saved = tables.generated_block(PAGE.read_text())
    now = tables.dtype_docs()
    diff = "\n".join(list(difflib.unified_diff(saved.splitlines(), now.splitlines(), "docs/dtypes.md", "now",
                                               lineterm="", n=0))[:40])
    assert saved == now, f"docs/dtypes.md is stale: run `make dtype-docs`\n{diff}"


def test_the_page_covers_every_dtype_beyond_numpys_own_and_every_pair():
    block = tables.generated_block(PAGE.read_text())
    names = [d for d in dtypes.NAMES if d not in dtypes.STANDARD]
    matrix = block.split("## The support matrix", 1)[1].split("## Routes", 1)[0]
    rows = [line.split(" | ")[0].lstrip("| ") for line in matrix.splitlines() if line.startswith("| ")][1:]
    assert rows == names  # after the head
    frameworks = registry.names()
    head = next(line for line in matrix.splitlines() if line.startswith("| dtype |"))
    assert head.count(" -> ") == len(frameworks) * (len(frameworks) - 1)
    assert [line[4:] for line in block.splitlines() if line.startswith("### ")] == names
