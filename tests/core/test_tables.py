"""bf16bridge.core.text.table: one renderer for text and markdown tables."""

import pytest

from bf16bridge.core.text import table

HEAD = ("pair", "time", "ok")
ROWS = [("torch -> numpy", "12 us", True), ("numpy -> tensorflow", "3.5 ms", False)]

CASES = [
    ("text", HEAD, ROWS,
     "pair                 time    ok\n"
     "torch -> numpy       12 us   True\n"
     "numpy -> tensorflow  3.5 ms  False"),
    ("markdown", HEAD, ROWS,
     "| pair | time | ok |\n"
     "|---|---|---|\n"
     "| torch -> numpy | 12 us | True |\n"
     "| numpy -> tensorflow | 3.5 ms | False |"),
    ("text", ("a", "b"), [], "a  b"),
    ("markdown", ("a", "b"), [], "| a | b |\n|---|---|"),
    # a pipe or newline inside a cell must not break a markdown table
    ("markdown", ("code",), [("x | y\nz",)], "| code |\n|---|\n| x \\| y z |"),
    # trailing padding is dropped, empty cells keep their column
    ("text", ("a", "b", "c"), [("", "long cell", "")], "a  b          c\n   long cell"),
]


@pytest.mark.parametrize("fmt, head, rows, expect", CASES)
def test_table(fmt, head, rows, expect):
    assert table(head, rows, fmt) == expect


@pytest.mark.parametrize("fmt, rows, match", [
    ("html", ROWS, "fmt must be one of text, markdown"),
    ("text", [("only one",)], "row 0 has 1 cells, the head 3"),
])
def test_bad_calls_say_why(fmt, rows, match):
    with pytest.raises(ValueError, match=match):
        table(HEAD, rows, fmt)
