"""The versions CI tests, oldest and newest, and what the bridge does with others.

CI runs the bridge in two full environments: ``.venv`` (the newest set of all
four frameworks, ``constraints.txt``) and ``.venv-oldest`` (the oldest set,
``constraints-oldest.txt``); and in ``.venv-numpy25`` (``constraints-numpy25.txt``:
NumPy 2.5 and a newer jax, on Python 3.12, numpy and jax only). The newest tested
of each is the newest of those files; ``pyproject.toml``'s lower bounds are the
oldest set. ``tests/capabilities/test_probe.py`` checks that this table, those files and
``pyproject.toml`` agree.

A framework older than the oldest tested is refused when its adapter loads,
with an error naming its version and the tested range, instead of failing
later inside a conversion with a foreign error. Newer ones are taken: they
are expected to work, and the probe says they are untested.
"""

from __future__ import annotations

import re

from bf16bridge.errors import FrameworkNotInstalledError, PrivateApiError

#: the Pythons CI runs: the oldest (pyproject.toml's requires-python) and the newest (.venv-numpy25)
PYTHON = ("3.11", "3.12")

#: import name -> (oldest tested, newest tested)
TESTED = {
    "numpy": ("1.25.0", "2.5.5"),
    "ml_dtypes": ("0.3.1", "0.6.0"),
    "torch": ("2.13.0", "2.13.0"),
    "jax": ("0.4.30", "0.11.2"),
    "tensorflow": ("2.16.2", "2.21.0"),
}

#: Older than the oldest tested but expected to work, with why: only torch, whose
#: other releases CI cannot install here (each is a CUDA build of several GB).
EXPECTED = {
    "torch": ("2.3", "torch.uint16, which bf16 crosses to numpy as, exists from torch 2.3"),
}


def release(version: str) -> tuple:
    """The release numbers of a version string: "2.13.0+cpu" -> (2, 13, 0); "2.17.0rc1" -> (2, 17, 0).

    (``packaging`` is not a dependency of the core; release numbers are all this table needs.)
    """
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if m is None:
        raise ValueError(f"not a version: {version!r}")
    parts = [int(p) for p in m.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def tested_range(name: str) -> str:
    oldest, newest = TESTED[name]
    return oldest if oldest == newest else f"{oldest} to {newest}"


def private_api_missing(framework: str, version: str, api: str, stops: str) -> PrivateApiError:
    """Our error for private API ``api`` of ``framework`` that this version lacks: names it, what stops
    working without it, and the versions bf16bridge was checked with."""
    return PrivateApiError(
        f"{framework} {version} has no {api}, a private {framework} API bf16bridge relies on: {stops}; "
        f"bf16bridge is tested with {framework} {tested_range(framework)} (docs/adapters.md, private APIs)")


def status(name: str, version: str | None) -> str:
    """One line: is ``version`` of ``name`` tested, older, newer, or only expected to work?"""
    if name not in TESTED:
        return "no tested range (not a framework bf16bridge ships an adapter for)"
    if version is None:
        return f"not installed (tested: {tested_range(name)})"
    oldest, newest = (release(v) for v in TESTED[name])
    v = release(version)
    if v < oldest:
        if name in EXPECTED and v >= release(EXPECTED[name][0]):
            return (f"{version} is older than any tested ({tested_range(name)}); expected to work "
                    f"from {EXPECTED[name][0]}: {EXPECTED[name][1]}")
        return f"{version} is older than any tested ({tested_range(name)}): refused"
    if v > newest:
        return f"{version} is newer than any tested ({tested_range(name)}): expected to work, untested"
    return f"{version} is within the tested range ({tested_range(name)})"


def require(name: str, version: str) -> None:
    """Refuse a framework older than the oldest tested (or than its expected floor).

    Raises ``FrameworkNotInstalledError`` (an ``ImportError``), which the
    registry reports with the pip extra to install.
    """
    floor = EXPECTED[name][0] if name in EXPECTED else TESTED[name][0]
    if release(version) < release(floor):
        raise FrameworkNotInstalledError(
            f"{name} {version} is older than any version bf16bridge is tested with "
            f"({name} {tested_range(name)}); upgrade it: pip install '{name}>={TESTED[name][0]}'"
        )
