"""The per-type cache of plans: an input of a type, layout and keywords seen before runs
its cached plan without being described or planned again.

The key holds everything a plan depends on: the input's type and ``Adapter.fast_key`` (dtype,
layout, alignment where it matters, read-only, device, empty or not, whether it takes part in autodiff:
a torch tensor that requires grad runs its plan after ``Adapter.kept_value``, a detach), the keywords (``device=``
among them: a plan is kept for a device only where it needs no move) and the adapters' run-time
state; a change of the registry empties the cache. An input the key cannot describe
cheaply (``fast_key`` None) takes the full path. A plan that copies is kept too: each run copies afresh,
after the planner's size checks (``checks.size_guard``), and a copy decided by the dtype alone (packing:
``Step.by_dtype``) refuses an input its key cannot tell apart (a 0-d array to unpack) by sending it to the
full path; a move to a device is not kept.
``convert`` and ``convert_tree`` share the lookup: ``plans`` once per type, ``Plans.find`` per input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from bf16bridge.core import registry
from bf16bridge.core.adapter import Adapter

if TYPE_CHECKING:
    from bf16bridge.core.plan import Plan

#: (type, to, copy, fallback, for_compute, on_alias, on_grad, device) -> Plans
CACHE: dict = {}
#: the most keys, and the most plans under one key
LIMIT = 4096


class Plans:
    """The cached plans for one input type, target and set of keywords."""

    __slots__ = ("src", "fast_key", "alignment", "plans", "state")

    def __init__(self, src: Adapter, hub: Adapter, dst: Adapter, alignment: bool):
        self.src = src
        #: ``src.fast_key``, bound once (read for every input)
        self.fast_key: Callable[[Any, bool], tuple | None] = src.fast_key
        stateful = tuple(a for a in dict.fromkeys((src, hub, dst)) if type(a).state is not Adapter.state)
        #: the run-time state of the adapters a route depends on (jax's x64 flag) as one call;
        #: None where none has any
        self.state: Callable[[], object] | None = (
            None if not stateful else stateful[0].state if len(stateful) == 1
            else lambda: tuple(a.state() for a in stateful))
        #: whether the key reads the input's alignment (alignment_read)
        self.alignment = alignment
        #: fast_key, or (fast_key, state()) -> (run: the plan as one function, the warnings it gives
        #: with these keywords, or None)
        self.plans: dict = {}

    def find(self, x, state: object) -> tuple | None:
        """The cached (run, messages) for ``x`` under the adapters' ``state`` (``self.state()``, read
        once for a call, or once for a whole tree; anything where ``self.state`` is None), or None."""
        k = self.fast_key(x, self.alignment)
        if k is None:
            return None
        return self.plans.get(k if self.state is None else (k, state))


def plans(t: type, to, copy, fallback, for_compute, on_alias, on_grad, device) -> Plans | None:
    """The cached plans for inputs of type ``t`` with these keywords, or None (none yet, or a keyword
    no plan is kept for: only exact bools and None are)."""
    if not ((copy is None or copy is True or copy is False) and (for_compute is False or for_compute is True)):
        return None
    try:
        return CACHE.get((t, to, copy, fallback, for_compute, on_alias, on_grad, device))
    except TypeError:  # an unhashable keyword value: the full path says what is wrong with it
        return None


def remember(x, key: tuple, p: Plan, run: Callable[[Any], Any], messages: tuple, read: bool | None = None) -> None:
    """Keep plan ``p``, made for ``x`` under ``key`` (``plans``' arguments after the type), to run as ``run``
    on later inputs of the same kind, saying ``messages``. ``read``: whether the plan depends on the input's
    alignment, where the caller knows (else ``alignment_read``'s answer)."""
    if len(CACHE) >= LIMIT:
        return
    src, hub, dst = registry.get(p.source), registry.get(registry.HUB), registry.get(p.target)
    full = (type(x), *key)
    fast = CACHE.get(full)
    if read is None:
        read = alignment_read(p, dst)
    # the plans of one key share its use of alignment: a plan that needs it read, where the key did
    # not, starts a new set that reads it (replaced, not changed: a concurrent call keeps the old)
    if fast is None or (read and not fast.alignment):
        fast = CACHE[full] = Plans(src, hub, dst, read)
    k = fast.fast_key(x, fast.alignment)
    if k is not None and len(fast.plans) < LIMIT:
        fast.plans[k if fast.state is None else (k, fast.state())] = (run, messages or None)


def alignment_read(p: Plan, dst: Adapter) -> bool:
    """Whether the key must read the input's alignment for plan ``p`` into ``dst``. Only a target's
    import can make a zero-copy route depend on it; not where each step is a bit-view or a DLPack
    import that takes any buffer or refuses an unaligned one (``Adapter.importer_aligned``: it
    raises ``UnalignedImport``, and the call is planned afresh)."""
    if dst.dlpack_unaligned == "ok":
        return False
    for step in p.steps:
        if step.kind == "bitview":
            continue
        if step.kind == "dlpack":
            a = registry.get(step.framework)
            if a.dlpack_unaligned == "ok" or (a.dlpack_unaligned == "copies" and a.importer_aligned() is not None):
                continue
        return True
    return False


def chained(runs: tuple) -> Callable[[Any], Any]:
    """Functions run one after another, as one: nested calls for up to three (cheaper than a loop)."""
    if len(runs) == 1:
        return runs[0]
    if len(runs) == 2:
        first, second = runs

        def two(x):
            return second(first(x))

        return two
    if len(runs) == 3:
        first, second, third = runs

        def three(x):
            return third(second(first(x)))

        return three

    def chained(x):
        for run in runs:
            x = run(x)
        return x

    return chained


def clear() -> None:
    """Forget every cached plan."""
    CACHE.clear()


registry.on_change(clear)
