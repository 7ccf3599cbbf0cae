"""The frameworks this run names must import: a missing one fails, never skips."""

import importlib

import pytest

from conftest import REQUIRED


@pytest.mark.parametrize("name", REQUIRED)
def test_required_framework_imports(name):
    importlib.import_module(name)
