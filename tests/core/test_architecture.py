"""The house rules the import-linter contracts (pyproject.toml) cannot state: no module reads another
module's private names, and modules and functions stay small. Pure source reading: no import."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "bf16bridge"
MODULE_LINES = 600
FUNCTION_LINES = 60


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _private_reads(name: str, path: pathlib.Path) -> list[str]:
    """``from other import _x`` and ``other._x`` where ``other`` is another bf16bridge module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    aliases: dict[str, str] = {}  # local name -> bf16bridge module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in MODULES:
                    aliases[a.asname or a.name] = full
                elif base in MODULES and base != name and a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"line {node.lineno}: from {base} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and aliases[node.value.id] != name and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_reads_another_modules_private_names(name):
    assert _private_reads(name, MODULES[name]) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MODULE_LINES, f"{name} has {lines} lines: split it where its concerns part"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_functions_stay_short(name):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    long = [f"{n.name} (line {n.lineno}): {n.end_lineno - n.lineno + 1} lines" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > FUNCTION_LINES]
    assert long == [], f"split where their steps are: {long}"


def test_the_private_name_check_sees_both_spellings(tmp_path):
    """The check above finds an imported private name and a private attribute of an imported module."""
    source = ("from bf16bridge.core.registry import _LOCK\nfrom bf16bridge.core import registry\n"
              "x = registry._SPECS\n")
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    found = _private_reads("bf16bridge.core.convert", probe)
    assert len(found) == 2 and "_LOCK" in found[0] and "_SPECS" in found[1], found
