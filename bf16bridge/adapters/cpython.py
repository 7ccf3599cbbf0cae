"""What CPython's reference counts and referents say about an object: whether a callee kept a result.

These read CPython's own bookkeeping (``sys.getrefcount``, ``gc.get_referents``). ``FRESH`` is
measured on the running interpreter at import, so a count that differs by a constant between Python
versions is taken in; a free-threaded build is untested (docs/adapters.md, private APIs).
"""

from __future__ import annotations

import functools
import gc
import sys


def refcounts(objs: list) -> list[int]:
    """Python's reference count of each object of ``objs``, as read here (the list, the loop and the
    call each hold one): an object nothing else holds reads ``FRESH``."""
    return [sys.getrefcount(o) for o in objs]


#: what ``refcounts`` reads for an object that list alone holds (measured, not assumed: the count
#: a loop and a call add differ between Python versions)
FRESH = refcounts([object()])[0]


def held_in(root, ids: set[int]) -> dict[int, int]:
    """How many references to each object of ``ids`` (by id) ``root`` holds, itself and through the
    lists, tuples, dicts and ``functools.partial`` objects it holds (each walked once; older jax keeps
    residuals in a partial's arguments): ``gc.get_referents`` lists one entry per reference an object
    holds. References further in (a function's closure, another object's attributes) are not counted:
    an object held there stays counted as kept. What is walked is taken to be ``root``'s alone (a vjp's
    residual lists and partials, which its framework builds for that vjp)."""
    held: dict[int, int] = {}
    todo, seen = ([] if root is None else [root]), set()
    while todo:
        for r in gc.get_referents(todo.pop()):
            if id(r) in ids:
                held[id(r)] = held.get(id(r), 0) + 1
            elif (type(r) in (list, tuple, dict) or isinstance(r, functools.partial)) and id(r) not in seen:
                seen.add(id(r))
                todo.append(r)
    return held
