"""convert(), plan(), convert_tree(): run the planner's route and check it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import registry
from .errors import Bf16BridgeError, CopyRequiredError, UnsupportedTypeError

if TYPE_CHECKING:
    from .routes import Plan


_ROUTES = None


def _routes():
    global _ROUTES
    if _ROUTES is None:
        from . import routes  # the planner loads on first use

        _ROUTES = routes
    return _ROUTES


def _describe(x, to):
    source = registry.framework_of(x)
    target = registry.resolve(to)
    # a missing target framework fails here, naming its pip extra
    alignment = registry.get(target).dlpack_unaligned != "ok"
    return source, target, registry.get(source).describe(x, alignment=alignment)


def plan(x, to: str, *, copy: bool | None = None, fallback: str = "error",
         for_compute: bool = False) -> Plan:
    """What ``convert(x, to, ...)`` with the same keywords would do, without doing it."""
    source, target, src = _describe(x, to)
    return _routes().plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute)


def convert(x, to: str, *, copy: bool | None = None, fallback: str = "error", for_compute: bool = False):
    """Move tensor ``x`` to framework ``to`` ("numpy", "torch", "jax", "tensorflow" or an alias).

    bf16 stays bf16 bit for bit, like every other dtype both sides hold.
    ``copy=None``: zero-copy where the route allows, a copy otherwise;
    ``copy=True``: always a fresh copy; ``copy=False``: zero-copy or CopyRequiredError.
    ``fallback`` decides what happens when the target cannot hold bf16: "error"
    (default), "float32" (exact widening), "bits" (raw uint16), or "auto": the
    capability probe chooses (bf16 where the target holds it, float32 where it
    cannot, and with ``for_compute=True`` float32 where the hardware has no bf16
    arithmetic). ``plan(x, to, ...)`` shows the route, the decision and its
    reason, and whether the result shares memory and is writable.
    """
    source, target, src = _describe(x, to)
    p = _routes().plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute)
    value, here = src.value, source
    for step in p.steps:
        out = step.run(value)
        if copy is False and step.verify and not step.copies and p.nbytes:
            # the framework decides whether it copies; check, so copy=False is never a lie
            before = registry.get(here).data_ptr(value)
            after = registry.get(step.framework).data_ptr(out)
            if before != after:
                raise CopyRequiredError(
                    f"copy=False, but {step.label} copied this {source} input; pass copy=None to allow it"
                )
        value, here = out, step.framework
    return value


def to_numpy(x, **kwargs):
    """``convert(x, "numpy", ...)``"""
    return convert(x, "numpy", **kwargs)


def to_torch(x, **kwargs):
    """``convert(x, "torch", ...)``"""
    return convert(x, "torch", **kwargs)


def to_jax(x, **kwargs):
    """``convert(x, "jax", ...)``"""
    return convert(x, "jax", **kwargs)


def to_tensorflow(x, **kwargs):
    """``convert(x, "tensorflow", ...)``"""
    return convert(x, "tensorflow", **kwargs)


def convert_tree(tree, to: str, **kwargs):
    """Convert every tensor leaf of nested dicts, lists and tuples (namedtuples too).

    Returns new containers of the same types; the input is not modified.
    Leaves that are not tensors of a registered framework (ints, strings,
    None) are kept as they are. An error names the path of the leaf.
    """
    return _tree(tree, to, kwargs, ())


def _tree(node, to, kwargs, path):
    if isinstance(node, Mapping):
        items = {k: _tree(v, to, kwargs, path + (k,)) for k, v in node.items()}
        try:
            return type(node)(items)
        except TypeError:
            return items
    if isinstance(node, (list, tuple)):
        items = [_tree(v, to, kwargs, path + (i,)) for i, v in enumerate(node)]
        if hasattr(node, "_fields"):  # namedtuple
            return type(node)(*items)
        return type(node)(items)
    try:
        registry.framework_of(node)
    except UnsupportedTypeError:
        return node
    try:
        return convert(node, to, **kwargs)
    except Bf16BridgeError as err:
        where = "".join(f"[{p!r}]" for p in path) or "the root"
        raise type(err)(f"at {where}: {err}") from err
