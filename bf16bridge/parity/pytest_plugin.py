"""pytest helpers, loaded automatically once bf16bridge is installed (entry point ``pytest11``).

- ``bf16_framework``: a test taking this argument runs once per framework that is
  installed here (numpy, torch, jax, tensorflow, and any registered adapter's).
- ``assert_parity`` is ``bf16bridge.parity.assert_parity``.

Nothing here imports a framework: installed ones are found by their package specs.
"""

from __future__ import annotations

import importlib.util

from .compare import assert_parity  # noqa: F401 - re-exported for tests


def installed_frameworks() -> list[str]:
    from .. import registry

    out = []
    for name in registry.names():
        package = registry.spec(name).requires or name
        try:
            if importlib.util.find_spec(package) is not None:
                out.append(name)
        except (ImportError, ValueError):
            continue
    return out


def pytest_generate_tests(metafunc):
    if "bf16_framework" in metafunc.fixturenames:
        metafunc.parametrize("bf16_framework", installed_frameworks())
