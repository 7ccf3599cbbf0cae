"""The frameworks this run names must import: a missing one fails, never skips. A run that names
the numpy it is for (BF16BRIDGE_TEST_NUMPY, set by `make test-numpy25`) must have that numpy."""

import importlib
import importlib.util
import os
import pathlib
import subprocess
import types

import numpy as np
import pytest

from conftest import EXCLUDED, EXCLUDED_LIBRARIES, FRAMEWORKS, LIBRARIES, REQUIRED, REQUIRED_LIBRARIES, needs

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_framework_imports(name):
    importlib.import_module(name)


def test_the_libraries_this_run_names_are_installed_and_those_it_leaves_out_are_not():
    """A run leaves a library out (deselecting the tests that need it) only where it is missing:
    one installed after all is tested, not passed over; one named and missing fails."""
    assert set(REQUIRED_LIBRARIES) <= set(LIBRARIES), f"BF16BRIDGE_TEST_LIBRARIES: known {LIBRARIES}"
    assert [n for n in REQUIRED_LIBRARIES if importlib.util.find_spec(n) is None] == []
    assert [n for n in EXCLUDED_LIBRARIES if importlib.util.find_spec(n) is not None] == []


def test_the_numpy_this_run_is_for():
    """tests/adapters/test_numpy_registry.py's registry tests skip on NumPy < 2.5; the run meant for 2.5 must
    not pass by skipping them on another numpy."""
    want = os.environ.get("BF16BRIDGE_TEST_NUMPY")
    if want:
        assert np.__version__.split(".")[:2] == want.split("."), (np.__version__, want)
        assert hasattr(np.dtypes, "register_dlpack_dtype") or tuple(map(int, want.split("."))) < (2, 5)


def test_excluded_is_what_required_leaves_out():
    assert set(EXCLUDED) == set(FRAMEWORKS) - set(REQUIRED) and "numpy" in REQUIRED


def test_the_frameworks_this_run_leaves_out_are_not_installed():
    """A run deselects the tests of a framework it leaves out only where that framework is missing
    (.venv-numpy25 has no torch or tensorflow): one installed after all is tested, not passed over."""
    assert [n for n in EXCLUDED if importlib.util.find_spec(n) is not None] == []


def _item(params=None, marks=(), libraries=()):
    by_kind = {"frameworks": marks, "libraries": libraries}
    item = types.SimpleNamespace(nodeid="t", iter_markers=lambda name: [types.SimpleNamespace(args=m)
                                                                        for m in by_kind.get(name, ())])
    if params is not None:
        item.callspec = types.SimpleNamespace(params=params)
    return item


@pytest.mark.parametrize("params,marks,want", [
    ({"src": "torch", "dst": "jax"}, (), {"torch", "jax"}),
    ({"dtype": "bfloat16", "source": "numpy", "n": 3}, (), {"numpy"}),
    (None, (("tensorflow",),), {"tensorflow"}),
    ({"target": "jax"}, (("torch", "tensorflow"),), {"jax", "torch", "tensorflow"}),
    (None, (), set()),
])
def test_what_a_test_needs(params, marks, want):
    """What the conftest reads to deselect a test in a run without some framework (.venv-numpy25)."""
    assert needs(_item(params, marks)) == want


def test_a_mark_naming_no_framework_is_an_error():
    with pytest.raises(ValueError, match="keras"):
        needs(_item(None, (("keras",),)))


def test_what_a_test_needs_includes_its_libraries():
    assert needs(_item({"to": "jax"}, (), (("flax", "optree"),))) == {"jax", "flax", "optree"}
    with pytest.raises(ValueError, match="libraries mark names \\['torch'\\]"):
        needs(_item(None, (), (("torch",),)))


def _make_test_commands(**env):
    """The commands `make test` would run from scratch (-n -B: print, run nothing)."""
    # run from inside make (make test-numpy25 runs this file), the child would print "make[1]: ..."
    # lines and inherit the parent's flags: drop both
    outer = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", "test"], cwd=ROOT, capture_output=True,
                         text=True, env={**outer, **env}, check=True).stdout
    return out.splitlines()


def test_ci_prunes_each_side_environment_after_its_tests():
    # .ci/run sets PRUNE=1 so that a CI disk holds two environments at a time, not four
    lines = _make_test_commands(PRUNE="1")
    removed = [line.split()[-1] for line in lines if line.startswith("rm -rf")]
    assert removed == [".venv-legacy", ".venv-oldest", ".venv-numpy25"]
    for venv in removed:
        ran = max(i for i, line in enumerate(lines) if line.startswith(f"{venv}/bin/python -m pytest")
                  or f" {venv}/bin/python -m pytest" in line)
        assert lines.index(f"rm -rf {venv}") == ran + 1, venv
    # the main environment stays: the main run comes last and uses it
    assert "-m pytest -q" in lines[-1] and ".venv/bin/python" in lines[-1]


def test_a_developer_keeps_the_side_environments():
    assert not [line for line in _make_test_commands(PRUNE="") if line.startswith("rm -rf")]


def test_ci_script_asks_for_pruning():
    text = (ROOT / ".ci" / "run").read_text()
    assert "PRUNE=1" in text and text.rstrip().endswith("make test")
