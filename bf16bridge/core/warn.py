"""Our warnings: ``warnings.warn`` with ``Bf16BridgeWarning``, pointed at the user's line.

Python's own filters and registries decide what is shown. A message of a kind said once per
process (``Once``: the alias warning) is said the first time only: a set of those said, kept per
list of warnings filters (``warnings.catch_warnings`` starts a new one, as Python's own registries
start over). A call that converts many tensors at once (``convert_tree``, ``convert_shards``) gathers
what each would say and says each message once, with how many it concerns (``gathered``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import warnings
from types import FrameType
from typing import Callable, Iterator

from bf16bridge.errors import Bf16BridgeWarning

#: the package's directory: a frame whose file is under it is ours, not the user's
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def warn(message: str, above: int = 1) -> None:
    """``warnings.warn(message, Bf16BridgeWarning)`` pointed at the first frame outside this package.
    ``above``: how many frames above the caller the search starts (the frames between are ours)."""
    if ignored():
        return
    if sys.version_info >= (3, 12):  # Python skips our frames itself; stacklevel counts the others
        warnings.warn(message, Bf16BridgeWarning, stacklevel=2, skip_file_prefixes=(PACKAGE_DIR,))
        return
    level = above + 2
    frame: FrameType | None
    try:
        frame = sys._getframe(level - 1)
    except ValueError:  # no frame that far up: search from the caller
        level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, Bf16BridgeWarning, stacklevel=level)


def ignored() -> bool:
    """Whether the newest warnings filter ignores our category everywhere (no message, module or line
    in it, as ``filterwarnings("ignore", category=...)`` adds): ``warnings.warn`` would show nothing
    and record nothing, so a hot loop that silenced us does not pay for the call."""
    filters = warnings.filters
    try:
        action, text, category, module, line = filters[0]
        return (action == "ignore" and text is None and module is None and line == 0
                and issubclass(Bf16BridgeWarning, category))
    except (IndexError, TypeError, ValueError):  # no filters, or one of an unusual shape: warnings decides
        return False


class Once(str):
    """A message said once per process (per list of warnings filters), whatever the call site."""

    __slots__ = ()


#: (the warnings filters list they were said under, the Once messages said): a new list starts over
_SAID: tuple[object, set] = ([], set())


def said(message: Once) -> bool:
    """Whether ``message`` was said already under the current warnings filters."""
    filters, done = _SAID
    return message in done and filters is warnings.filters


def warn_once(message: Once, text: str | None = None, above: int = 1) -> None:
    """``warn(text or message)`` the first time ``message`` is said under these filters, nothing after.
    A filter that raises it (``error``) raises it every time: it is marked said once shown only; one
    that ignores it everywhere (``ignored``) leaves it to be said once that filter is gone."""
    global _SAID
    filters, done = _SAID
    if filters is not warnings.filters:
        filters, done = warnings.filters, set()
        _SAID = (filters, done)
    elif message in done:
        return
    if ignored():
        return
    warn(message if text is None else text, above + 1)
    done.add(message)


#: inside ``gathered()``: message -> how many times it was said
_GATHERED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("bf16bridge_gathered", default=None)


def say(message: str, above: int = 1) -> None:
    """``warn(message)``, or, inside ``gathered()``, counted for the end of the call."""
    pending = _GATHERED.get()
    if pending is None:
        if type(message) is Once:
            warn_once(message, None, above + 1)
        else:
            warn(message, above + 1)
    else:
        pending[message] = pending.get(message, 0) + 1


@contextlib.contextmanager
def gathered() -> Iterator[dict]:
    """Within the block, ``say`` counts its messages in the dict yielded (message -> times) instead
    of warning: the caller says each once, with how many leaves or shards it concerns."""
    pending: dict = {}
    token = _GATHERED.set(pending)
    try:
        yield pending
    finally:
        _GATHERED.reset(token)


def warn_gathered(pending: dict, counted: Callable[[int], str]) -> None:
    """Say each message ``gathered`` counted, once, as ``counted(times) + message`` (a ``Once``
    message only where it was not said already)."""
    for message, n in pending.items():
        text = f"{counted(n)}{message}"
        if type(message) is Once:
            warn_once(message, text)
        else:
            warn(text)
