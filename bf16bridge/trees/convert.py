"""convert_tree() and plan_tree(): every tensor leaf of a tree converted (or planned), the tree's
structure kept, what the leaves would warn said once per call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, TypeVar

from bf16bridge.core import fastpath, registry
from bf16bridge.core.adapter import UnalignedImport
from bf16bridge.core.autograph import plain_python
from bf16bridge.core.convert import (Device, Fallback, OnAlias, OnGrad, Target, check_keywords, convert, find_device,
                                     plan)
from bf16bridge.core.warn import gathered, warn, warn_gathered
from bf16bridge.errors import (Bf16BridgeError, DeviceError, InvalidArgumentError, UnsupportedDtypeError,
                               UnsupportedTypeError)
from bf16bridge.trees import walk

if TYPE_CHECKING:
    from bf16bridge.core.plan import TreePlan

T = TypeVar("T")
OnUnsupported = Literal["raise", "keep"]


@plain_python
def convert_tree(tree: T, to: Target | str, *, copy: bool | None = None, fallback: Fallback = "error",
                 for_compute: bool = False, on_alias: OnAlias = "warn", on_grad: OnGrad = "warn",
                 on_unsupported: OnUnsupported = "raise", unwrap: bool = False, device: Device = None) -> T:
    """Convert every tensor leaf of a tree, keeping its structure.

    The tree: dicts (every dict type keeps its type: defaultdict with its factory, OrderedDict,
    a torch state dict's ``_metadata``), other mappings, lists, tuples, namedtuples, and, once
    their library is imported, jax pytree nodes (flax linen/nnx state and Variables, equinox
    modules, registered dataclasses) and optree-registered nodes. A wrapper that holds a tensor
    in ``.value`` and is no tree node (a ``keras.Variable``) becomes its converted value;
    ``unwrap=True``: every such wrapper does (an nnx.State's Params become plain tensors).

    Returns new containers of the same types; the input is not modified. Leaves that are not
    tensors and hold none (ints, strings, None, dtypes, other objects) are kept as they are.
    A tensor leaf that cannot cross raises our error naming its path, and so does an object that
    holds tensors the walk does not enter (a torch model, a tf ragged or sparse tensor, a set of
    tensors, a generator), naming the way out. ``on_unsupported="keep"``: a leaf that cannot
    cross at all (``plan`` refuses it, or its values do: int64 values past int32 under
    ``fallback="auto"`` to a jax without x64) is kept as it is, and the call warns once naming how many
    and where; a refusal the caller chose (``copy=False``, ``on_alias="error"``,
    ``on_grad="error"``) still raises.
    What a leaf's conversion would warn about (aliases, dropped gradients) is said once per
    call, with how many leaves it concerns (an alias once per process, as ``convert`` says it).
    ``device``: every tensor leaf lands there, as ``convert``'s ``device=`` (a device the target
    framework does not have is refused before any leaf is converted).
    """
    check_keywords(copy, fallback, for_compute, on_alias, on_grad)
    if on_unsupported not in ("raise", "keep"):
        raise InvalidArgumentError(f"on_unsupported must be 'raise' or 'keep'; got {on_unsupported!r}")
    # the target and the device once, up front: an unknown or unhashable one is the call's fault, not a
    # leaf's (a leaf's error would be kept silently under on_unsupported="keep")
    find_device(registry.resolve(to), device)
    kept: list[str] = []
    with gathered() as pending:
        leaf = _leaf_converter(to, (copy, fallback, for_compute, on_alias, on_grad, device), pending,
                               kept if on_unsupported == "keep" else None)
        out = walk.map_leaves(leaf, tree, unwrap_values=unwrap, strict=True,
                              as_is=_as_is(to, copy, fallback, for_compute, device))
    warn_gathered(pending, lambda n: f"{n} lea{'f' if n == 1 else 'ves'} of this tree: ")
    if kept:
        n = len(kept)
        warn(f"on_unsupported='keep' kept {n} lea{'f' if n == 1 else 'ves'} of this tree as "
             f"{'it is' if n == 1 else 'they are'}, not in {registry.resolve(to)}: {', '.join(kept[:3])}"
             f"{f' and {n - 3} more' if n > 3 else ''} (bb.plan_tree says why of each)")
    return out


def _leaf_converter(to, keywords: tuple, pending: dict, kept: list | None) -> Callable[[Any, tuple], Any]:
    """convert_tree's function of a leaf and its path. The fast path's lookup is asked once per leaf
    type for the whole call (a tree is converted under one state of the adapters); what a cached
    plan warns is counted in ``pending``. ``kept``: the paths of leaves kept as they are
    (on_unsupported="keep"), or None where a leaf that cannot cross raises."""
    copy, fallback, for_compute, on_alias, on_grad, device = keywords
    kw = dict(copy=copy, fallback=fallback, for_compute=for_compute, on_alias=on_alias, on_grad=on_grad,
              device=device)
    # type -> (its adapter's fast_key, whether it reads alignment, the cached plans by key, the adapters'
    # state: None where they have none), or False: no plans for the type
    fasts: dict = {}

    def lookup(t: type):
        fast = fastpath.plans(t, to, copy, fallback, for_compute, on_alias, on_grad, device)
        if fast is None:
            return False
        return fast.fast_key, fast.alignment, fast.plans, None if fast.state is None else (fast.state(),)

    def leaf(x, path):
        try:
            got = fasts.get(type(x))
            if got is None:
                got = fasts[type(x)] = lookup(type(x))
            if got is not False:
                fast_key, alignment, table, state = got
                k = fast_key(x, alignment)
                hit = None if k is None else table.get(k) if state is None else table.get((k, state[0]))
                if hit is not None:
                    run, messages = hit
                    try:
                        y = run(x)
                    except UnalignedImport:  # as in convert: planned afresh
                        return convert(x, to, **kw)
                    if messages is not None:
                        for message in messages:
                            pending[message] = pending.get(message, 0) + 1
                    return y
            return convert(x, to, **kw)
        except Bf16BridgeError as err:
            # (a plain dtype refusal of the values, which plan cannot foresee: int64 values past int32
            # under fallback='auto' to a jax without x64; no refusal the caller chose raises this class)
            if kept is not None and (type(err) is UnsupportedDtypeError
                                     or _cannot_cross(x, to, fallback, for_compute, device)):
                kept.append(walk.where(path))
                return x
            raise type(err)(f"at {walk.where(path)}: {err}") from err

    return leaf


def _as_is(to, copy, fallback, for_compute, device=None) -> Callable[[Any], bool]:
    """Whether ``convert`` with these keywords hands a tensor back as it is (the same object: not a
    detached torch tensor, not a tf.Variable's value, no copy, no other dtype), asked only of a
    tensor already of the target framework, and converted only where its plan copies nothing. The
    trees' walk keeps a plain object whose tensors (in its attributes) all would be: nothing in it
    changes. The answer is the plan's, so it is asked once per type and ``Adapter.fast_key`` in a
    call, for a type the fast path keys plans by (a tf.Variable, whose plans are never kept, and a
    tensor without a fast key, are asked on their own each time)."""
    target = registry.resolve(to)
    known: dict = {}  # (type, whether the key reads alignment, fast key) -> the answer

    def key(x):
        fast = fastpath.plans(type(x), target, copy, fallback, for_compute, "allow", "drop", device)
        if fast is None:
            return None
        k = fast.fast_key(x, fast.alignment)  # (alignment read where the fast path reads it)
        return None if k is None else (type(x), fast.alignment, k)

    def as_is(x) -> bool:
        if copy is True or registry.tensor_framework(x) != target:
            return False
        k = key(x)
        answer = known.get(k) if k is not None else None
        if answer is not None:
            return answer
        try:
            answer = (not plan(x, target, fallback=fallback, for_compute=for_compute, device=device).copies
                      and convert(x, target, copy=copy, fallback=fallback, for_compute=for_compute, on_alias="allow",
                                  on_grad="drop", device=device) is x)
        except Bf16BridgeError:
            answer = False
        k = k or key(x)  # (the conversion just asked may have made the type's plans)
        if k is not None:
            known[k] = answer
        return answer

    return as_is


def _cannot_cross(x, to, fallback, for_compute, device=None) -> bool:
    """Whether the leaf ``x`` cannot cross to ``to`` at all (what ``on_unsupported="keep"`` keeps):
    planned with the caller's fallback, but without the refusals the caller chose (``copy=False``,
    ``on_grad="error"``, ``on_alias="error"``), it still has no route: not a tensor, a dtype or a
    device the target cannot hold."""
    try:
        plan(x, to, fallback=fallback, for_compute=for_compute, device=device)
    except (UnsupportedTypeError, UnsupportedDtypeError, DeviceError):
        return True
    except Bf16BridgeError:
        return False
    return False


@plain_python
def plan_tree(tree, to: Target | str, *, copy: bool | None = None, fallback: Fallback = "error",
              for_compute: bool = False, device: Device = None) -> TreePlan:
    """What ``convert_tree(tree, to, ...)`` would do, leaf by leaf and in total, without doing it."""
    check_keywords(copy, fallback, for_compute, "warn", "warn")
    find_device(registry.resolve(to), device)  # the call's fault, not each leaf's
    leaves: list = []

    def leaf(x, path):
        try:
            leaves.append((walk.where(path), plan(x, to, copy=copy, fallback=fallback, for_compute=for_compute,
                                                 device=device)))
        except Bf16BridgeError as err:
            leaves.append((walk.where(path), err))
        return x

    walk.map_leaves(leaf, tree, strict=True, as_is=_as_is(to, copy, fallback, for_compute, device))
    from bf16bridge.core.plan import TreePlan  # (records load on first use)

    return TreePlan(tuple(leaves))
