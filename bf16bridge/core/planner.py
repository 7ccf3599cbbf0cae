"""The planner: the cheapest route between two adapters for one input.

Routes are a small graph. A node is a tensor in some framework with some
dtype and memory layout; an edge is one step that an adapter declares as data
(a DLPack hand-over, a bit-view between a dtype and the unsigned integer
carrying its bits, a hand-off of its own, a copy, a widening, a packing). A
step that copies costs one copy of the data; one that does not costs nothing.
The planner runs a shortest-path search, so a new adapter or dtype joins by
declaring its abilities (and a dtype by its row in ``dtypes.TABLE``: carrier,
exact widenings, packing), with no framework or dtype named here.

A route only passes through the source, the target and numpy (the core
dependency), so planning never imports a third framework.
"""

from __future__ import annotations

import heapq
import itertools
from functools import lru_cache, partial
from typing import Any, Callable, NamedTuple

from bf16bridge.core import checks, dtypes, policy, registry
from bf16bridge.core.adapter import CONTIGUOUS, LAYOUT_NAMES, Adapter, Source, on_host, same_device
from bf16bridge.core.plan import Plan, Step
from bf16bridge.core.registry import HUB
from bf16bridge.errors import CopyRequiredError, DeviceError, InvalidArgumentError, UnsupportedDtypeError

FALLBACKS = ("error", "float32", "bits", "auto")


class Node(NamedTuple):
    """A node of the route graph: a tensor in some framework, with what matters for the next step."""

    framework: str
    dtype: str
    layout: int
    aligned: bool
    readonly: bool  # memory marked read-only: never handed to a framework that cannot mark it
    shared: bool  # still the input's memory
    host: bool
    #: the row whose bits this unsigned integer carries after a bit-view (or a packing), None
    #: for a plain tensor: a bit-view back goes to that row only
    carries: str | None = None


class Route(NamedTuple):
    steps: tuple
    final: Node
    dtype: str
    decision: str | None  # why the dtype changed (fallback), or None


# -- the graph ------------------------------------------------------------------


def _holds_readonly(a: Adapter) -> bool:
    """Whether ``a`` can hold read-only memory without a copy (its tensors are immutable, or it
    marks them read-only)."""
    return a.immutable or a.marks_readonly


def _copy_reason(s: Node, target: Adapter, copy: bool | None) -> str:
    if copy:
        return "copy=True"
    if not s.host:
        return "to host memory"
    why = []
    if s.readonly and not _holds_readonly(target):
        why.append(f"the input is read-only and {target.name} cannot hold read-only memory")
    if s.layout != CONTIGUOUS:
        why.append(f"the input is {LAYOUT_NAMES[s.layout]}")
    if not s.aligned and target.dlpack_unaligned != "ok":
        why.append("not 64-byte aligned")
    return "; ".join(why) or "needed by the next step"


def _fresh(a: Adapter, dtype: str, host: bool) -> Node:
    """The node of a new buffer ``a`` made: contiguous, aligned as ``a`` allocates, writable, not shared."""
    return Node(a.name, dtype, CONTIGUOUS, a.copies_aligned, False, False, host)


def _widenings(dtype: str) -> tuple[str, ...]:
    """The exact widenings of a row (a packed row's are those of its values, one a byte)."""
    row = dtypes.ROWS.get(dtype)
    if row is None:
        return ()
    return row.widenings or (dtypes.ROWS[row.unpacked].widenings if row.unpacked else ())


@lru_cache(maxsize=256)
def _wider(goal: frozenset) -> frozenset:
    """Rows whose widening reaches the goal: an unpacking may lead to them."""
    return frozenset(d for d in dtypes.NAMES if goal & set(_widenings(d)))


def _enter(s: Node, src: Adapter, dst: Adapter, copies: bool) -> Node | None:
    """The node after moving into ``dst``; None if ``dst`` cannot take it that way."""
    if dst.host_only and not s.host:
        return None
    if not dst.holds(s.dtype):
        return None
    if copies:  # a copy of a carrier still carries that row's bits
        return _fresh(dst, s.dtype, s.host)._replace(carries=s.carries)
    if s.readonly and not _holds_readonly(dst):
        return None  # e.g. a read-only numpy array into torch: must copy first
    readonly = s.readonly or (src.immutable and dst.marks_readonly)
    return s._replace(framework=dst.name, readonly=readonly)


def _via_dlpack(a: Adapter, b: Adapter, readonly: bool, host: bool, aligned: bool) -> Callable[[Any], Any]:
    # an aligned buffer into an importer that would copy an unaligned one: the importer that refuses
    # to (Adapter.importer_aligned), so that convert's hot path need not read the alignment
    refusing = b.importer_aligned() if aligned and b.dlpack_unaligned == "copies" else None
    if refusing is not None:
        out, strict = a.exporter(readonly), refusing
        if out is None:
            return strict

        def checked(x):
            return strict(out(x))

        return checked
    if host:  # a capsule straight over, where both sides offer it (Adapter.capsule_exporter)
        to_capsule, from_capsule = a.capsule_exporter(), b.capsule_importer()
        if to_capsule is not None and from_capsule is not None:
            def direct(x):
                return from_capsule(to_capsule(x))

            return direct
    export, imp = a.exporter(readonly), b.importer()
    if export is None:
        return imp

    def run(x):
        return imp(export(x))

    return run


class _Search(NamedTuple):
    """What one search asks of every edge: the adapters it may pass through, the target, the goal
    dtypes, and ``copy``."""

    adapters: dict
    target: str
    goal: frozenset
    copy: bool | None


def _bitviews(s: Node, a: Adapter, q: _Search):
    """A row <-> the unsigned integer carrying its bits, and back to that row only."""
    view: tuple[str, str | None] | None = None
    if s.carries is not None:
        if a.views_bits(s.carries):
            view = (s.carries, None)
    elif s.dtype in dtypes.BITS_OF and a.views_bits(s.dtype):
        view = (dtypes.BITS_OF[s.dtype], s.dtype)
    if view is not None and not (q.copy is False and not a.bitview_free):  # jax's bit-cast copies
        d, carries = view
        copies = not a.bitview_free
        nxt = (_fresh(a, d, s.host) if copies else s)._replace(dtype=d, carries=carries)
        yield int(copies), Step("bitview", a.name, a.label_bitview.format(dtype=d), d, copies,
                                "the framework's bit-view copies" if copies else "", False,
                                run=a.bitview_to(d)), nxt


def _packings(s: Node, a: Adapter, q: _Search):
    """One value a byte <-> two a byte (torch's float4_e2m1fn_x2), by an adapter's kernels."""
    if not (a.packs and s.host and q.copy is not False):
        return
    packed = dtypes.UNPACKED.get(s.dtype) if s.carries is None else None
    if packed is not None and packed in q.goal:
        carrier = dtypes.BITS_OF[packed]
        yield 1, Step("pack", a.name, a.label_pack.format(dtype=packed), carrier, True,
                      f"{q.target} holds {s.dtype} packed {dtypes.ROWS[packed].packing} a byte ({packed})",
                      run=partial(a.pack, dtype=packed), by_dtype=True), _fresh(a, carrier, s.host)._replace(carries=packed)
    carried = s.carries or ""
    unpacked = dtypes.PACKED.get(carried)
    if unpacked is not None and unpacked in q.goal | _wider(q.goal) and a.holds(unpacked):
        yield 1, Step("unpack", a.name, a.label_unpack.format(dtype=unpacked), unpacked, True,
                      f"{carried} holds {dtypes.ROWS[carried].packing} values a byte; {unpacked} holds one",
                      run=partial(a.unpack, dtype=carried), by_dtype=True), _fresh(a, unpacked, s.host)


def _copies_here(s: Node, a: Adapter, q: _Search) -> bool:
    """Whether ``a`` may copy (or convert) this tensor: not under copy=False, and not by a framework
    whose kernels abort on an unaligned buffer (tensorflow)."""
    return q.copy is not False and (s.aligned or a.kernels_unaligned)


def _copies(s: Node, a: Adapter, q: _Search):
    """A copy within the framework (contiguous, aligned as it allocates, writable), or to the host."""
    if not _copies_here(s, a, q):
        return
    if (s.host or q.copy) and a.can_copy(s.dtype):
        # a device tensor is copied on its device; only a host-only target takes it to the host
        bias = 0 if s.framework == q.target else 0.5  # with copy=True, copy where the result lives
        yield 1 + bias, Step("copy", a.name, a.label_copy, s.dtype, True, _copy_reason(s, q.adapters[q.target], q.copy),
                             run=a.copy), _fresh(a, s.dtype, s.host)._replace(carries=s.carries)
    if not s.host and q.copy and q.adapters[q.target].host_only:
        yield 1, Step("to_host", a.name, "copy to host memory", s.dtype, True, "to host memory",
                      run=a.to_host), _fresh(a, s.dtype, True)._replace(carries=s.carries)


def _int32s(s: Node, a: Adapter, q: _Search):
    """A 64-bit integer to 32 bits, checked on the values (fallback='auto')."""
    narrow = dtypes.INT32_OF.get(s.dtype)
    if narrow is not None and narrow in q.goal and a.fits_int and s.host and _copies_here(s, a, q):
        yield 2, Step("narrow", a.name, f"narrow to {narrow}, checked", narrow, True,
                      f"fallback='auto': narrowed where every value fits in {narrow} (checked)",
                      run=partial(a.fit_int, dtype=narrow)), _fresh(a, narrow, s.host)


def _widens(s: Node, a: Adapter, q: _Search):
    """An exact widening the row's table lists (a fallback)."""
    if s.carries is None and s.host and _copies_here(s, a, q):
        for w in _widenings(s.dtype):
            if w in q.goal and a.casts(s.dtype, w):
                yield 2, Step("widen", a.name, f"widen to {w} (exact)", w, True, f"fallback: widen to {w}",
                              run=partial(a.astype, dtype=w)), _fresh(a, w, s.host)


def _handoffs(s: Node, a: Adapter, b: Adapter, q: _Search):
    """An adapter's own hand-off to another framework (its framework's direct call)."""
    for h in (*a.handoffs(), *b.handoffs()):
        if h.src != a.name or h.dst != b.name or s.dtype not in h.dtypes or s.layout > h.layouts:
            continue
        reason = h.copies(s.layout, s.aligned)
        entered = _enter(s, a, b, reason is not None)
        if entered is not None and reason and not h.copies_aligned:
            entered = entered._replace(aligned=False)
        if entered is not None and not (reason and q.copy is False):
            yield b.import_copy_cost if reason else 0, Step(
                "handoff", b.name, h.label, s.dtype, reason is not None, reason or "",
                verify=h.verify, run=h.run, shares=h.shares, by_dtype=h.copies_by_dtype and reason is not None), entered


def _takes(b: Adapter, host: bool) -> int:
    """The least regular layout ``b``'s DLPack import takes of host (``host``) or device memory."""
    on_device = b.dlpack_accepts_device
    return b.dlpack_accepts if host or on_device is None else on_device


def _dlpacks(s: Node, a: Adapter, b: Adapter, q: _Search):
    """A DLPack hand-over between frameworks."""
    unaligned = b.dlpack_unaligned if not s.aligned else "ok"
    if (s.dtype in a.dlpack_export and s.dtype in b.dlpack_import and s.layout <= _takes(b, s.host)
            and unaligned != "refuse"):
        copies = unaligned == "copies"
        entered = _enter(s, a, b, copies)
        if entered is not None and not (copies and q.copy is False):
            yield b.import_copy_cost if copies else 0, Step(
                "dlpack", b.name, b.label_import, s.dtype, copies,
                "not 64-byte aligned" if copies else "", verify=b.dlpack_unaligned == "copies",
                run=_via_dlpack(a, b, s.readonly, s.host, s.aligned)), entered


#: the edges out of a node, in the order ties are broken: steps within its framework, then, per other
#: framework, steps into it (hand-offs before DLPack: an adapter's own is cheaper per call)
_WITHIN = (_bitviews, _packings, _copies, _int32s, _widens)
_BETWEEN = (_handoffs, _dlpacks)


def _edges(s: Node, q: _Search):
    """Yield (cost, Step, next Node) for every step out of node ``s``."""
    a = q.adapters[s.framework]
    for within in _WITHIN:
        yield from within(s, a, q)
    for b in q.adapters.values():
        if b is not a:
            for between in _BETWEEN:
                yield from between(s, a, b, q)


def _search(start: Node, adapters: dict, target: str, goal: frozenset, copy: bool | None, raw: bool = False):
    """Dijkstra over nodes: the cheapest list of steps reaching the target with a goal dtype.

    A carrier node (an unsigned integer holding another row's bits) ends a route only when
    ``raw`` (fallback='bits'): uint8 is uint4's widening and its carrier too, and a bit-view is
    not a widening (padding bits would arrive as values).
    """
    q = _Search(adapters, target, goal, copy)
    tie = itertools.count()
    heap = [(0, 0, next(tie), start, ())]
    seen = set()
    while heap:
        cost, n, _, s, steps = heapq.heappop(heap)
        if s in seen:
            continue
        seen.add(s)
        if s.framework == target and s.dtype in goal and not (copy and s.shared) and (raw or s.carries is None):
            return steps, s
        for c, step, nxt in _edges(s, q):
            if nxt not in seen:
                heapq.heappush(heap, (cost + c, n + 1, next(tie), nxt, steps + (step,)))
    return None


@lru_cache(maxsize=1024)
def _route(source: str, target: str, start: Node, must_copy: str | None,
           copy: bool | None, attempts: tuple, key: tuple) -> Route:
    """The cheapest route; ``attempts`` are (goal dtypes, decision, raw bits accepted) tried in order.

    ``key`` is ``registry.route_key(...)``: the registry's generation and the adapters' run-time
    settings (jax's x64 flag). It is part of the cache key only: a route depends on it through what
    adapters declare.
    """
    names = dict.fromkeys((source, HUB, target))
    adapters = {n: registry.get(n) for n in names}
    prefix: tuple = ()
    if must_copy:
        if copy is False:
            raise CopyRequiredError(f"copy=False, but {must_copy}; pass copy=None to allow the copy")
        a = adapters[source]
        prefix = (Step("copy", source, a.label_copy, start.dtype, True, must_copy, run=a.copy),)
        start = _fresh(a, start.dtype, start.host)
    for goal, decision, raw in attempts:
        found = _search(start, adapters, target, goal, copy, raw)
        if found:
            steps, final = found
            return Route(prefix + steps, final, final.dtype, decision)
    raise _no_route(source, target, start, adapters, copy, attempts)


def _no_route(source: str, target: str, start: Node, adapters: dict, copy: bool | None, attempts: tuple):
    """Our error when no attempt found a route: why, as precisely as we can, and the way out."""
    dtype = start.dtype
    with_copies = next((found for found in (_search(start, adapters, target, goal, None, raw)
                                            for goal, _, raw in attempts) if found), None) if copy is False else None
    if with_copies:
        steps, _ = with_copies
        why = "; ".join(f"{s.label}: {s.reason}" for s in steps if s.copies)
        # what of the input itself could change (a step that copies whatever its input, such as
        # jax's bit-cast, leaves only copy=None)
        fix = [w for w, bad in (("contiguous", start.layout != CONTIGUOUS), ("64-byte aligned", not start.aligned),
                                ("writable", start.readonly)) if bad]
        return CopyRequiredError(f"copy=False, but {source} -> {target} must copy here ({why}); "
                                 "pass copy=None to allow the copy"
                                 + (f", or make the input {' and '.join(fix)}" if fix else ""))
    if not start.host and adapters[target].host_only:
        return DeviceError(f"{target} holds host memory only and the {source} input is on a device; "
                           "pass copy=True to copy it to the host, or move it yourself first")
    if not start.host:
        return DeviceError(f"no route takes this {source} device tensor to {target} without a host copy; "
                           "pass copy=True to allow one")
    held = adapters[target].cannot_hold(dtype)
    # only the fallbacks that reach the target from here (a row with no widening kernel, or no other
    # side to widen it on, has none); asked as copy=None would: a fallback that copies is still
    # offered under copy=False, whose own error then names copy=None
    works = frozenset(fb for fb in ("auto", "float32", "bits")
                      if any(_search(start, adapters, target, goal, None if copy is False else copy, raw)
                             for goal, _, raw in _fixed_attempts(dtype, target, fb)[1:]))
    return UnsupportedDtypeError(
        f"{target} cannot hold {dtype} from {source} bit for bit here"
        + (f" ({held})" if held else "") + "; "
        + _way_out(dtype, target, frozenset().union(*(goal for goal, _, _ in attempts)), works))


def _way_out(dtype: str, target: str, tried: frozenset = frozenset(),
             works: frozenset = frozenset(("auto", "float32", "bits"))) -> str:
    """The fallbacks the table offers for ``dtype`` and not ``tried`` already, of those that ``works``
    (reach the target), as an error message ends."""
    if dtype in dtypes.INT32_OF:
        return f"or pass fallback='auto' (narrows to {dtypes.INT32_OF[dtype]} when every value fits, checked)"
    ways = []
    wide = _widenings(dtype)
    if wide and dtypes.ROWS[dtype].family == "narrow" and not tried & set(wide) and "auto" in works:
        ways.append(f"fallback='auto' (the narrowest of {', '.join(wide)} that {target} holds: exact)")
    if "float32" in wide and "float32" not in tried and "float32" in works:
        ways.append("fallback='float32' (exact widening)")
    if dtype in dtypes.BITS_OF and "bits" in works:
        ways.append(f"fallback='bits' (raw {dtypes.BITS_OF[dtype]})")
    return "pass " + " or ".join(ways) if ways else "no fallback exists for this dtype here"


def _attempts(dtype: str, target: str, fallback: str, for_compute: bool, device: str) -> tuple:
    """The goal dtypes to try in order, each with the decision to report and whether a raw
    bit-view (a carrier of the row's bits) may end the route."""
    if dtype in dtypes.PROBED and fallback == "auto":
        chosen, reason = policy.decide(target, for_compute, device)  # the row's own name, "float32" or "bits"
        goal = {"float32": "float32", "bits": dtypes.BITS_OF[dtype]}.get(chosen, dtype)
        return ((frozenset([goal]), f"{goal} (fallback='auto': {reason})", chosen == "bits"),)
    if dtype in dtypes.INT32_OF and fallback == "auto":
        narrow = dtypes.INT32_OF[dtype]
        return ((frozenset([dtype]), None, False),
                (frozenset([narrow]), f"{narrow} (fallback='auto': {target} cannot hold {dtype} here; "
                                      f"narrowed where every value fits in {narrow}, checked when converting: "
                                      "otherwise UnsupportedDtypeError)", False))
    return _fixed_attempts(dtype, target, fallback)


@lru_cache(maxsize=256)
def _fixed_attempts(dtype: str, target: str, fallback: str) -> tuple:
    out: tuple = ((frozenset([dtype]), None, False),)
    row = dtypes.ROWS.get(dtype)
    if row is None:
        return out
    why = f"{target} cannot hold {dtype} bit for bit here"
    # the same values in the other layout (one a byte <-> packed): no fallback needed, the plan says so
    twin = dtypes.PACKED.get(dtype) or dtypes.UNPACKED.get(dtype)
    if twin is not None:
        how = "unpacked, one value a byte" if dtype in dtypes.PACKED else \
            f"packed {dtypes.ROWS[twin].packing} values a byte, low nibble first"
        out += ((frozenset([twin]), f"{twin} ({why}; the same values {how})", False),)
    wide = _widenings(dtype)
    if fallback == "auto" and row.family == "narrow":
        out += tuple((frozenset([w]), f"{w} (fallback='auto': {why}; {w} holds every {dtype} value exactly, "
                                      "NaN payloads aside)", False)
                     for w in wide)
    elif fallback == "float32" and "float32" in wide:
        out += ((frozenset(["float32"]), f"float32 (fallback='float32': {why}; widened exactly, NaN payloads "
                                         "aside)", False),)
    elif fallback == "bits" and row.carrier is not None:
        out += ((frozenset([row.carrier]), f"{row.carrier} (fallback='bits': {why}; raw bit patterns)", True),)
    return out


def check_args(copy, fallback, for_compute) -> None:
    """Refuse keyword values outside their choices, before anything is cached on them."""
    if not (copy is None or copy is True or copy is False):
        raise InvalidArgumentError(
            f"copy must be None (copy only where needed), True (always copy) or False (never copy); "
            f"got {copy!r} of type {type(copy).__name__}: pass bool(...) if you mean a truth value"
        )
    if fallback not in FALLBACKS:
        raise InvalidArgumentError(f"fallback must be one of {', '.join(map(repr, FALLBACKS))}; got {fallback!r}")
    if not (for_compute is True or for_compute is False):
        raise InvalidArgumentError(f"for_compute must be True or False; got {for_compute!r}")
    if for_compute and fallback != "auto":
        raise InvalidArgumentError(
            "for_compute=True asks the probe to choose the dtype: pass fallback='auto' with it")


def plan_for(src: Source, source: str, target: str, *, copy: bool | None = None,
             fallback: str = "error", for_compute: bool = False, device: str | None = None) -> Plan:
    """The plan for an already-described input (``convert`` calls this; arguments already checked).
    ``device``: the target's name of the device the result must be on (``Adapter.find_device``), or
    None (where the route puts it)."""
    host = on_host(src.device)
    # where the route leaves the result, as the target names it: the input's device (host memory of
    # another framework is the target's "cpu")
    here = src.device if source == target or not host else "cpu"
    moves = device is not None and not same_device(here, device)
    if moves and copy is False:
        raise CopyRequiredError(f"copy=False, but the {source} input is on {src.device} and device={device!r} asks "
                                "for a copy there; pass copy=None to allow it")
    # a move to another device is the copy copy=True asks for: the route before it need not copy
    route_copy = None if moves else copy
    if moves and not host and registry.get(target).host_only:
        route_copy = True  # device="cpu" into a host-only target: the route's own copy to the host is the move
    start = Node(source, src.dtype, src.layout, src.aligned, src.readonly, True, host)
    attempts = _attempts(src.dtype, target, fallback, for_compute, src.device)
    route = _route(source, target, start, src.must_copy, route_copy, attempts, registry.route_key(source, target))
    if checks.packing_fails(src, route.steps):
        # packing pairs values along the last dimension: an odd one, or a 0-d input either way
        # (a 0-d packed tensor holds two values), takes the next fallback asked for, if any, else
        # is refused
        twins = dtypes.PACKED.keys() | dtypes.UNPACKED.keys()
        later = tuple(a for a in attempts if not (a[0] & twins))
        try:
            route = _route(source, target, start, src.must_copy, route_copy, later, registry.route_key(source, target))
        except UnsupportedDtypeError:
            checks.check_packing(src, source, target, route.steps)
            raise
        # a later fallback may unpack on its way too (a packed row widens as its values, one a byte)
        checks.check_packing(src, source, target, route.steps)
    if moves and device is not None:
        route = _placed(route, here, target, device)
    copies, shares, writable, notes, alias = _outcome(
        route, source, target, src.readonly, src.nbytes > 0, src.notes, registry.GENERATION, src.owner)
    if copies:
        checks.check_copy_size(src, source, target, route.steps)
    checks.check_addressable(src, source, target, route.steps)
    shape = tuple(src.shape)
    # a route with no steps hands back the described value: its gradient is lost only where
    # describe detached it (and then describe's note of it does not hold)
    drops_grad = src.requires_grad and (bool(route.steps) or not registry.get(source).grad_stays_on_value)
    if src.requires_grad and not drops_grad:
        notes = tuple(n for n in notes if n != registry.get(source).grad_note)
    return Plan(source, target, src.dtype, route.dtype, shape, src.nbytes, src.device,
                route.steps, copies, shares, writable, route.decision, notes, alias, drops_grad,
                _result_shape(shape, src.dtype, route.steps), device, _depends_on_values(route.steps))


def _depends_on_values(steps: tuple) -> str | None:
    """What the steps that check the data as they run may refuse (Plan.depends_on_values), or None."""
    why = [f"the narrowing to {s.dtype} refuses any value outside {s.dtype} (UnsupportedDtypeError when converting)"
           if s.kind == "narrow" else
           "the packing refuses a byte whose high bits are set, as no ml_dtypes value has (InvalidArgumentError "
           "when converting)"
           for s in steps if s.kind in ("narrow", "pack")]
    return "; ".join(why) or None


def _placed(route: Route, here: str, target: str, device: str) -> Route:
    """``route`` ending on ``device`` (the target's name of it): a last step that copies the result
    there, where the route leaves it elsewhere (on the input's device; on the host after a copy to it)."""
    if any(s.kind == "to_host" for s in route.steps):
        here = "cpu"
    if same_device(here, device):
        return route
    dst = registry.get(target)
    step = Step("place", target, dst.label_place.format(device=device), route.dtype, True,
                f"device={device!r} asked; the data is on {here}", run=partial(dst.place, device=device))
    return route._replace(steps=route.steps + (step,), final=_fresh(dst, route.dtype, on_host(device)))


def _result_shape(shape: tuple[int, ...], dtype: str, steps: tuple[Step, ...]) -> tuple[int, ...]:
    """The shape a route's result has: a packing step divides the last dimension by the packed
    row's values a byte, an unpacking step multiplies it."""
    for step in steps:
        if step.kind == "pack" and shape:
            shape = (*shape[:-1], shape[-1] // dtypes.ROWS[dtypes.UNPACKED[dtype]].packing)
        elif step.kind == "unpack" and shape:
            shape = (*shape[:-1], shape[-1] * dtypes.ROWS[dtypes.UNPACKED[step.dtype]].packing)
        dtype = step.dtype
    return shape


def _also(shared_with: str) -> str:
    return f", and {shared_with}" if shared_with else ""


@lru_cache(maxsize=1024)
def _outcome(route: Route, source: str, target: str, readonly: bool, nonempty: bool, src_notes: tuple,
             generation: int, owner: str | None = None):
    """What the result is (copied? shares memory? writable?) and what the user should know."""
    src_adapter, dst_adapter = registry.get(source), registry.get(target)
    final = route.final
    shares = final.shared and nonempty
    writable = (not dst_adapter.immutable) and not final.readonly
    notes = list(src_notes)
    alias = None
    # the alias text up to its first ": " is what convert's warning says (core.convert.alias_warning)
    if shares and writable and src_adapter.immutable and owner is not None:
        # not a tensor nobody writes: its owner's own storage (a tf.Variable's), which every later
        # read of it sees, changed without an assignment its framework knows of
        alias = (f"the {target} result is writable and shares memory with {owner}: writing to it changes "
                 f"that owner's value in place (every later read of it sees the write, which {source} does "
                 f"not know of as an assignment); pass copy=True (or on_alias='copy') to write safely")
    elif shares and writable and src_adapter.immutable:
        alias = (f"the {target} result is writable and shares memory with an immutable {source} tensor"
                 f"{_also(src_adapter.shared_with)}: writing to it changes that tensor too (and whatever it "
                 f"aliases: where that is read-only "
                 f"memory, such as a numpy.memmap opened mode='r' that reached {source} without a copy, a "
                 f"write kills the process); pass copy=True (or on_alias='copy') to write safely")
    if alias is not None:
        notes.append(alias)
    if shares and final.layout != CONTIGUOUS and dst_adapter.kept_layout_note:
        notes.append(f"the {target} result keeps the input's layout, zero-copy: {dst_adapter.kept_layout_note}")
    if shares and dst_adapter.immutable and not src_adapter.immutable and not readonly:
        notes.append(f"the {target} result shares the {source} input's memory: writing to the input "
                     f"afterwards changes it; pass copy=True to decouple them")
    return any(s.copies for s in route.steps), shares, writable, tuple(notes), alias
