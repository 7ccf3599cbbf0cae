"""What ``fallback="auto"`` decides for a probed row (bf16): asked of a policy the package installs.

The core names no feature: the capability probe's decision is wired in by the package
(``bf16bridge/__init__.py``) as an import path, imported on the first "auto" that needs it.
"""

from __future__ import annotations

import importlib
import threading
from typing import Callable

from bf16bridge.errors import InvalidArgumentError

#: (target, for_compute, device) -> (the dtype chosen: the row's own name, "float32" or "bits"; why)
Decide = Callable[[str, bool, str], tuple[str, str]]

_POLICY: Decide | str | None = None
_LOCK = threading.Lock()


def set_auto_policy(policy: Decide | str) -> None:
    """Install what ``fallback="auto"`` asks for a probed row: a function, or its import path
    ("module:function"), imported on first need."""
    global _POLICY
    if not (callable(policy) or (isinstance(policy, str) and ":" in policy)):
        raise InvalidArgumentError(f"set_auto_policy takes a function or 'module:function'; got {policy!r}")
    _POLICY = policy


def decide(target: str, for_compute: bool, device: str) -> tuple[str, str]:
    """The installed policy's choice for a probed row into ``target``: (dtype, reason)."""
    global _POLICY
    policy = _POLICY
    if isinstance(policy, str):
        with _LOCK:
            if isinstance(_POLICY, str):
                module, _, name = _POLICY.partition(":")
                _POLICY = getattr(importlib.import_module(module), name)
            policy = _POLICY
    if policy is None:
        raise InvalidArgumentError("fallback='auto' has no policy installed (core.policy.set_auto_policy)")
    return policy(target, for_compute, device)  # type: ignore[operator]
