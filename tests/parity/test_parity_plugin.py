"""The pytest plugin (entry point pytest11): bf16_framework runs a test once per registered framework;
one not installed is a skip that names it, or an error where the run requires it.

Each case runs pytest in a subprocess (runpytest_subprocess): the plugin is loaded through its entry
point there, as in a user's suite, and the fake adapter a case registers stays in that process."""

from __future__ import annotations

import importlib.util
import re

import pytest

from bf16bridge.core import registry

pytest_plugins = ["pytester"]

#: registered in the inner run's conftest.py: a framework whose package does not exist
CONFTEST = """
import bf16bridge

bf16bridge.register_adapter("ghostfw", "ghostfw_adapter", types=("ghostfw:Tensor",), extra="ghost",
                            requires="bf16bridge_no_such_package")
"""

TEST = """
import sys

SEEN = []

def test_one(bf16_framework):
    # nothing was imported to ask which frameworks are installed
    assert not {"torch", "jax", "tensorflow"} & set(sys.modules), sorted({"torch", "jax", "tensorflow"} & set(sys.modules))
    print("RAN", bf16_framework)
"""

FRAMEWORKS = [*registry.names(), "ghostfw"]


def _installed(name: str) -> bool:
    return name != "ghostfw" and importlib.util.find_spec(registry.spec(name).requires or name) is not None


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.delenv("BF16BRIDGE_REQUIRED_FRAMEWORKS", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_user=TEST)
    return pytester


def test_every_registered_framework_is_a_parameter_and_one_not_installed_is_a_skip_naming_it(suite):
    result = suite.runpytest_subprocess("-rs", "-s")
    ids = [f"test_one[{n}]" for n in FRAMEWORKS]
    ran = [n for n in FRAMEWORKS if _installed(n)]
    result.assert_outcomes(passed=len(ran), skipped=len(FRAMEWORKS) - len(ran))
    out = result.stdout.str()
    assert re.findall(r"RAN (\w+)", out) == ran, out
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *bf16_framework=ghostfw: ghostfw is not installed here "
                                 "(pip install 'bf16bridge[[]ghost[]]'); to make that a failure, require it: "
                                 "--bf16-frameworks=ghostfw or $BF16BRIDGE_REQUIRED_FRAMEWORKS=ghostfw"])
    result = suite.runpytest_subprocess("--collect-only", "-q")
    for i in ids:
        assert f"test_user.py::{i}" in result.stdout.str(), result.stdout.str()


@pytest.mark.parametrize("how", ["option", "env", "all"])
def test_a_required_framework_that_is_not_installed_errors_naming_it(suite, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("BF16BRIDGE_REQUIRED_FRAMEWORKS", "numpy, ghostfw")
        args = []
    else:
        args = ["--bf16-frameworks=" + ("all" if how == "all" else "NumPy,ghostfw")]
    result = suite.runpytest_subprocess("-rs", *args)
    ran = [n for n in FRAMEWORKS if _installed(n)]
    # "all" requires every registered framework: each one missing here is an error too (torch and
    # tensorflow in .venv-numpy25), not only ghostfw
    errors = len(FRAMEWORKS) - len(ran) if how == "all" else 1
    result.assert_outcomes(passed=len(ran), errors=errors, skipped=len(FRAMEWORKS) - len(ran) - errors)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_one[[]ghostfw[]]*",
                                 "*bf16_framework=ghostfw: ghostfw is required (--bf16-frameworks or "
                                 "$BF16BRIDGE_REQUIRED_FRAMEWORKS) but not installed here; "
                                 "pip install 'bf16bridge[[]ghost[]]'"])


@pytest.mark.parametrize("args, env, says", [
    (["--bf16-frameworks=torch,nosuchfw"], None, "--bf16-frameworks: unknown framework 'nosuchfw'; choose one of"),
    (["--bf16-frameworks=,"], None, "--bf16-frameworks ',' names no framework; name one or more of numpy"),
    ([], "jax,nosuchfw", "$BF16BRIDGE_REQUIRED_FRAMEWORKS: unknown framework 'nosuchfw'"),
])
def test_a_required_name_the_registry_does_not_know_is_a_usage_error(suite, monkeypatch, args, env, says):
    if env is not None:
        monkeypatch.setenv("BF16BRIDGE_REQUIRED_FRAMEWORKS", env)
    result = suite.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert says in result.stderr.str(), result.stderr.str()
    assert "RAN" not in result.stdout.str()


def test_a_framework_registered_in_a_sub_directory_s_conftest_can_be_required(pytester, monkeypatch):
    # that conftest.py loads when its directory is collected, after pytest_configure: the names are
    # read once collection is done (read at configure, ghostfw was an unknown name: a usage error)
    monkeypatch.delenv("BF16BRIDGE_REQUIRED_FRAMEWORKS", raising=False)
    sub = pytester.mkpydir("sub")
    (sub / "conftest.py").write_text(CONFTEST)
    (sub / "test_user.py").write_text(TEST)
    result = pytester.runpytest_subprocess("-rs", "--bf16-frameworks=ghostfw")
    ran = [n for n in FRAMEWORKS if _installed(n)]
    result.assert_outcomes(passed=len(ran), errors=1, skipped=len(FRAMEWORKS) - len(ran) - 1)
    result.stdout.fnmatch_lines(["*bf16_framework=ghostfw: ghostfw is required*"])
