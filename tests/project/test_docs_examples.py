"""Every fenced Python example in README.md and docs/*.md runs, and what it shows is what it gives.

A page's blocks (```python, ```py, and ```pycon sessions, whose output doctest compares) run in
order in one namespace, in a subprocess of their own (a page may set jax's x64 flag or register an
adapter) with a fresh temporary directory as its working directory. An HTML comment just before a
block changes what is expected of it:

- ``<!-- docs-test: skip (why) -->``: not run (needs a GPU, a download, ...); the reason is printed,
  and a marker without one fails.
- ``<!-- docs-test: raises NameError -->``: the block must raise exactly that error type.
- ``<!-- docs-test: needs ml_dtypes>=0.5.0 -->``: skipped, saying so, where the installed package
  is older (the oldest set's ml_dtypes 0.3.1 has no fp4); run everywhere else.

A block of no or an unknown language that parses as Python fails: name its language.
Run one page by hand: ``python tests/project/test_docs_examples.py docs/kernels.md`` (from any directory).
"""

from __future__ import annotations

import ast
import doctest
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "py"}
SESSION = {"pycon"}
#: languages that are not Python, as written on our pages; anything else is checked for Python
OTHER = {"sh", "bash", "console", "shell", "text", "json", "toml", "yaml", "ini", "html", "diff"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:(.*?)-->\s*$")
MARKER_FORMS = re.compile(r"^(?:skip \((?P<why>.*\S.*)\)|raises (?P<error>[A-Za-z_][\w.]*)"
                          r"|needs (?P<package>[\w-]+)>=(?P<version>[\w.]+))$")


@dataclass(frozen=True)
class Block:
    path: Path
    page: str  # relative to ROOT
    line: int  # of the fence, 1-based
    lang: str
    code: str
    marker: str | None  # the text after "docs-test:"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, each with the docs-test marker just before it (blank
    lines between are allowed)."""
    lines = page.read_text().split("\n")
    rel = _rel(page)
    out, marker, i = [], None, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            mk = MARKER.match(lines[i])
            if mk:
                marker = mk.group(1).strip()
            elif lines[i].strip():
                marker = None
            i += 1
            continue
        indent, fence, lang = m.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), None)
        if end is None:
            raise AssertionError(f"{rel}:{i + 1}: a fence that is never closed")
        code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:end])
        out.append(Block(page, rel, i + 1, lang.lower(), code + "\n", marker))
        marker, i = None, end + 1
    return out


def looks_like_python(code: str) -> bool:
    if re.search(r"^\s*>>> ", code, re.M):
        return True
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    # a lone name or constant ("make", "3") parses too, and is no example
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, (ast.Name, ast.Constant))) for n in tree.body)


def problems(page: Path) -> list[str]:
    """What is wrong with a page's blocks and markers, before anything runs."""
    out = []
    for b in blocks(page):
        if b.marker is not None:
            m = MARKER_FORMS.match(b.marker)
            if not m:
                out.append(f"{b.where}: marker {b.marker!r} is none of 'skip (reason)', 'raises ErrorName', "
                           f"'needs package>=version'")
            if b.lang not in RUN | SESSION:
                out.append(f"{b.where}: a docs-test marker before a {b.lang or 'plain'} block, which never runs")
            elif m and m["error"] and b.lang in SESSION:
                out.append(f"{b.where}: a raises marker before a session, which shows its error as output: "
                           "show the traceback's last line there, or make the block ```python")
            if m and m["package"] and not _pin_meets(m["package"], m["version"]):
                out.append(f"{b.where}: needs {m['package']}>={m['version']}, which no CI set has "
                           "(constraints.txt pins it older, or not at all): the block would never run")
        if b.lang not in RUN | SESSION | OTHER and looks_like_python(b.code):
            out.append(f"{b.where}: a block of language {b.lang or '(none)'!r} that parses as Python: "
                       f"mark it ```python (it then runs) or give its real language")
    markers = sum(bool(MARKER.match(line)) for line in page.read_text().split("\n"))
    dangling = markers - sum(b.marker is not None for b in blocks(page))
    if dangling:
        out.append(f"{_rel(page)}: {dangling} docs-test marker(s) not just before a block")
    return out


def _pin_meets(package: str, version: str) -> bool:
    """Whether constraints.txt (the newest set CI installs) pins ``package`` at ``version`` or newer."""
    from packaging.version import Version

    name = package.lower().replace("_", "-")
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        pin = re.match(r"^([\w.-]+)==(\S+)", line.strip())
        if pin and pin[1].lower().replace("_", "-") == name:
            return Version(pin[2]) >= Version(version)
    return False


def _raised_by_last_statement(b: Block, err: BaseException) -> bool:
    """Whether ``err`` came out of the block's last statement (an earlier mistake of the same type
    must not pass for the error the page shows)."""
    last = ast.parse(b.code).body[-1]
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != str(b.path):
        tb = tb.tb_next
    return tb is not None and b.line + last.lineno <= tb.tb_lineno <= b.line + (last.end_lineno or last.lineno)


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang in RUN | SESSION]


def _installed_older(package: str, version: str) -> str | None:
    from importlib.metadata import version as installed

    from packaging.version import Version

    have = installed(package)
    return have if Version(have) < Version(version) else None


def run_block(b: Block, ns: dict) -> str:
    """Runs one block in ``ns``; returns what to print about it, raises on a failure."""
    m = MARKER_FORMS.match(b.marker or "")
    if m and m["why"]:
        return f"skipped {b.where}: {m['why']}"
    if m and m["package"]:
        have = _installed_older(m["package"], m["version"])
        if have:
            return f"skipped {b.where}: needs {m['package']}>={m['version']}, this has {have}"
    if b.lang in SESSION:
        test = doctest.DocTestParser().get_doctest(b.code, ns, b.where, str(b.path), b.line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, clear_globs=False)
        ns.update(test.globs)
        if runner.failures:
            raise AssertionError(f"{b.where}: {runner.failures} example(s) above show what the code does not give")
        return f"ran {b.where} ({runner.tries} examples compared)"
    # the Markdown's own line numbers in a traceback
    code = compile("\n" * b.line + b.code, str(b.path), "exec")
    if m and m["error"]:
        try:
            exec(code, ns)
        except Exception as err:
            if type(err).__name__ != m["error"].rsplit(".", 1)[-1]:
                raise AssertionError(f"{b.where}: raised {type(err).__name__}, the page says {m['error']}") from err
            if not _raised_by_last_statement(b, err):
                raise AssertionError(f"{b.where}: raised {type(err).__name__} before its last statement, which "
                                     "the page shows raising it") from err
            return f"ran {b.where}: raised {type(err).__name__}, as marked"
        raise AssertionError(f"{b.where}: raised nothing, the page says {m['error']}")
    exec(code, ns)
    return f"ran {b.where}"


def run_page(page: Path) -> int:
    """The subprocess's part: every block of a page in order, in one namespace."""
    ns: dict = {"__name__": "__docs__"}
    status = 0
    for b in runnable(page):
        try:
            print(run_block(b, ns), flush=True)
        except BaseException:
            traceback.print_exc()
            print(f"FAILED {b.where}", flush=True)
            status = 1
            break
    return status


# --- the tests -------------------------------------------------------------------------------------

if __name__ != "__main__":
    import pytest

    from conftest import FRAMEWORKS

    def _frameworks(page: Path) -> tuple[str, ...]:
        """The frameworks a page's examples name (deselected where the run leaves one out)."""
        code = "".join(b.code for b in runnable(page))
        return tuple(f for f in FRAMEWORKS if f != "numpy" and re.search(rf"\b{f}\b", code))

    @pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
    def test_blocks_are_marked_well(page):
        assert problems(page) == []

    @pytest.mark.parametrize("page", [
        pytest.param(p, id=str(p.relative_to(ROOT)), marks=pytest.mark.frameworks(*_frameworks(p)))
        for p in PAGES if runnable(p)])
    def test_examples_run(page, tmp_path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "TF_CPP_MIN_LOG_LEVEL": "2"}
        proc = subprocess.run([sys.executable, __file__, str(page)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        print(proc.stdout)  # which blocks ran, which were skipped and why
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-6000:]}"
        expected = [b.where for b in runnable(page)]
        said = re.findall(r"^(?:ran|skipped) (\S+?:\d+)", proc.stdout, re.M)
        assert said == expected, proc.stdout

    def test_a_wrong_output_and_a_wrong_error_fail(tmp_path):
        """The runner itself: a shown value the code does not give, and a marked error not raised."""
        page = tmp_path / "page.md"
        page.write_text("```python\nx = 1 + 1\n```\n\n```pycon\n>>> x\n3\n```\n\n"
                        "<!-- docs-test: raises KeyError -->\n```python\n{}[0] if x == 2 else None\n```\n")
        ns: dict = {}
        bs = runnable(page)
        assert run_block(bs[0], ns) == "ran page.md:1" and ns["x"] == 2
        with pytest.raises(AssertionError, match="show what the code does not give"):
            run_block(bs[1], ns)
        assert run_block(bs[2], ns) == "ran page.md:11: raised KeyError, as marked"
        ns["x"] = 3
        with pytest.raises(AssertionError, match="raised nothing"):
            run_block(bs[2], ns)
        page.write_text("<!-- docs-test: raises NameError -->\n```python\nundefined_name\nassert False\n```\n")
        with pytest.raises(AssertionError, match="before its last statement"):  # an earlier mistake of that type
            run_block(runnable(page)[0], {})
        page.write_text("<!-- docs-test: skip () -->\n```python\npass\n```\n\n```\nimport os\n```\n\n"
                        "<!-- docs-test: needs ml_dtypes>=99.0 -->\n```python\npass\n```\n\n"
                        "<!-- docs-test: raises KeyError -->\n```pycon\n>>> {}[0]\n```\n\n"
                        "<!-- docs-test: skip (no block after) -->\nprose\n")
        assert [p.split(": ", 1)[0] for p in problems(page)] == [
            "page.md:2", "page.md:6", "page.md:11", "page.md:16", "page.md"]


if __name__ == "__main__":
    sys.stdout.flush()
    code = run_page(Path(sys.argv[1]).resolve())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a process that imported torch, tensorflow and jax has crashed at exit here
