"""Checkpoint keys: a tree's tensor leaves flattened to dotted keys, and nested back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bf16bridge.adapters.hooks import CastHooks
from bf16bridge.core import registry
from bf16bridge.trees import walk as trees
from bf16bridge.errors import CheckpointError, InvalidArgumentError
from bf16bridge.checkpoints import format as fmt

SEP = "."


def _key(path: tuple) -> str:
    parts = []
    for p in path:
        if isinstance(p, bool) or not isinstance(p, (str, int)):
            raise InvalidArgumentError(
                f"at {trees.where(path)}: a checkpoint key is made of strings and list positions; "
                f"{p!r} ({type(p).__name__}) is neither: use string keys")
        parts.append(str(p))
    return SEP.join(parts)


_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _refuse_values(node, path: tuple, empty: list) -> None:
    """Refuse what the walk kept as it was (numbers, strings, None, a model object, a set, any other
    object): a file holds tensors only, and a leaf left out would be lost without a word. The paths
    of empty containers below the root (no tensor, so no key: not in the file) go to ``empty``."""
    if node is trees.SLOT:
        return
    if isinstance(node, (Mapping, list, tuple, *trees.SEQUENCES)) and not len(node) and path:
        empty.append(path)
    if isinstance(node, Mapping):
        for k, v in node.items():
            _refuse_values(v, path + (k,), empty)
    elif isinstance(node, (list, tuple, *trees.SEQUENCES)):
        for i, v in enumerate(node):
            _refuse_values(v, path + (i,), empty)
    elif isinstance(node, _PLAIN):
        raise InvalidArgumentError(
            f"at {trees.where(path)}: {type(node).__name__} {node!r:.40} is not a tensor; a checkpoint holds "
            "tensors only: put strings in metadata={...}, make numbers arrays, or leave them out")
    else:  # a container the walk rebuilt (a dataclass, a jax pytree node), or an object it kept as it was
        found = trees.children(node)
        if found is not None:  # its children as any others; its static fields (not among them) are its own
            keys, values, _ = found
            if not keys and path:
                empty.append(path)
            for k, v in zip(keys, values):
                if v is None:  # a pytree's None is an empty subtree, as jax takes it (eqx.filter's
                    empty.append(path + (k,))  # left-out fields): said as an empty container is
                    continue
                _refuse_values(v, path + (k,), empty)
            return
        why = registry.not_a_tensor(node)  # a model with weights, a tf ragged tensor: what it is, the way out
        if why is not None:
            raise InvalidArgumentError(f"at {trees.where(path)}: {why}")
        t = type(node)
        what = f"{t.__module__}.{t.__qualname__}"
        if any(registry.hooks(a.name, CastHooks).submodules(node) is not None for a in registry.imported()):
            raise InvalidArgumentError(
                f"at {trees.where(path)}: {what} is a model object, not a tree of tensors; save its weights "
                "(a torch module's state_dict(), a flax model's parameters)")
        raise InvalidArgumentError(
            f"at {trees.where(path)}: {what} is neither a tensor nor a container bf16bridge walks (dicts, "
            "lists, tuples, deques, dataclasses, jax pytrees); a checkpoint holds tensors only: convert it "
            "or leave it out" + ("; for a module of a tree library, save its arrays alone (equinox: "
                                 "eqx.filter(model, eqx.is_array))" if callable(node) else ""))


def leaves(tree) -> tuple[list[tuple[str, Any]], list[tuple]]:
    """``(key, tensor)`` for every tensor of ``tree``, keys joined with "."; colliding keys refused.
    And the paths of the empty containers below the root, which hold no tensor and so no key."""
    found: list[tuple[tuple, Any]] = []

    def take(x, path):
        found.append((path, x))
        return trees.SLOT

    skeleton = trees.map_leaves(take, tree, unwrap_values=True)
    empty: list[tuple] = []
    _refuse_values(skeleton, (), empty)
    if found and found[0][0] == () and len(found) == 1 and skeleton is trees.SLOT:
        raise InvalidArgumentError("a bare tensor has no key: pass a dict, {'weight': x}")
    out: dict[str, tuple] = {}
    for path, x in found:
        key = _key(path)
        if key in out:
            raise InvalidArgumentError(
                f"key {key!r}: {trees.where(out[key][0])} and {trees.where(path)} both flatten to it; "
                "rename one (keys join their parts with '.')")
        if key == fmt.METADATA_KEY:
            raise InvalidArgumentError(f"key {key!r} is the format's own (it holds the metadata): rename it")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidArgumentError(f"key {key!r} cannot be written as UTF-8 ({err.reason})") from None
        out[key] = (path, x)
    return [(k, x) for k, (_, x) in out.items()], empty


def nest(flat: Mapping[str, Any], path: str) -> dict:
    """``{"a.b": x}`` -> ``{"a": {"b": x}}``; a key that is also another's prefix is refused."""
    out: dict = {}
    for key, value in flat.items():
        parts = key.split(SEP)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CheckpointError(f"{path}: key {key!r} nests under {SEP.join(parts[:i + 1])!r}, which is a "
                                      "tensor; load with nested=False")
            node = child
        if parts[-1] in node:
            raise CheckpointError(f"{path}: key {key!r} is a tensor and a prefix of other keys; "
                                  "load with nested=False")
        node[parts[-1]] = value
    return out
