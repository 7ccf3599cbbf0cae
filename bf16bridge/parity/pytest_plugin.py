"""pytest helpers, loaded automatically once bf16bridge is installed (entry point ``pytest11``).

- ``bf16_framework``: a test taking this argument runs once per framework the registry knows
  (numpy, torch, jax, tensorflow, and any adapter registered by the time tests are collected).
  One not installed here is skipped, with a reason naming it and its pip extra (``pytest -rs``
  lists them); one the run requires (``--bf16-frameworks=torch,jax``, or the environment
  variable ``BF16BRIDGE_REQUIRED_FRAMEWORKS``; ``all``: every registered one) errors instead.
- ``assert_parity`` is ``bf16bridge.parity.assert_parity``.

Nothing here imports a framework: installed ones are found by their package specs.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from bf16bridge.parity.compare import assert_parity  # noqa: F401 - re-exported for tests

#: the environment variable naming the frameworks a run requires (the option wins over it)
ENV = "BF16BRIDGE_REQUIRED_FRAMEWORKS"
_REQUIRED = pytest.StashKey[tuple]()


def installed(name: str) -> bool:
    """Whether a registered framework's package is installed here (found, not imported)."""
    from bf16bridge.core import registry

    package = registry.spec(name).requires or name
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def pytest_addoption(parser):
    parser.getgroup("bf16bridge").addoption(
        "--bf16-frameworks", default=None, metavar="NAMES",
        help="frameworks the bf16_framework tests must run in, comma-separated ('all': every registered "
             f"one): one not installed errors instead of skipping (default: ${ENV})")


def required(text: str, where: str) -> tuple:
    """The canonical names in ``text`` (comma-separated, or ``all``); a name the registry does not
    know, or a text naming none, is a usage error naming ``where`` it came from."""
    from bf16bridge.core import registry
    from bf16bridge.errors import Bf16BridgeError

    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return tuple(registry.names())
    if not names:
        raise pytest.UsageError(f"{where} {text!r} names no framework; name one or more of "
                                f"{', '.join(registry.names())}, or 'all'")
    try:
        return tuple(dict.fromkeys(registry.resolve(n) for n in names))
    except Bf16BridgeError as err:
        raise pytest.UsageError(f"{where}: {err}") from None


def pytest_collection_finish(session):
    # once every conftest.py has loaded (a directory's loads when it is collected): an adapter
    # registered in any of them is known here
    config = session.config
    text = config.getoption("bf16_frameworks", None)
    where = "--bf16-frameworks"
    if text is None and os.environ.get(ENV, "").strip():
        text, where = os.environ[ENV], f"${ENV}"
    config.stash[_REQUIRED] = required(text, where) if text is not None else ()


def pytest_generate_tests(metafunc):
    if "bf16_framework" in metafunc.fixturenames:
        from bf16bridge.core import registry

        metafunc.parametrize("bf16_framework", registry.names(), indirect=True)


@pytest.fixture
def bf16_framework(request) -> str:
    """The framework name this run of the test is for (see the module's docstring)."""
    from bf16bridge.core import registry

    name = request.param
    if not installed(name):
        how = registry.install_hint(name)
        if name in request.config.stash.get(_REQUIRED, ()):
            pytest.fail(f"bf16_framework={name}: {name} is required (--bf16-frameworks or ${ENV}) but not "
                        f"installed here; {how}", pytrace=False)
        pytest.skip(f"bf16_framework={name}: {name} is not installed here ({how}); to make that a failure, "
                    f"require it: --bf16-frameworks={name} or ${ENV}={name}")
    return name
