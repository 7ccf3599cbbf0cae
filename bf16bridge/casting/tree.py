"""``cast_tree``: cast the floating leaves of a tree of weights, each in its own framework.

The leaves are walked once (their labels, dtypes and shapes), the policy decides which are kept
(by name; ``keep_head``: the output head too), tied leaves (one tensor under several paths) follow
the kept one, and each leaf is cast with its adapter's ``astype`` (``Adapter.cast``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from bf16bridge.casting.report import CastReport, LeafCast, nbytes
from bf16bridge.casting.rules import (DEFAULT_POLICY, HEAD_POLICY, KEEP_DTYPE, Decide, Rule, is_floating,
                                      keep_dtype_of, rules_of, skip_why, target_dtype)
from bf16bridge.core import registry
from bf16bridge.core.autograph import plain_python
from bf16bridge.errors import Bf16BridgeError, InvalidArgumentError, UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.trees import walk as trees

T = TypeVar("T")


@dataclasses.dataclass(slots=True)
class TreeLeaf:
    """One tensor leaf of the tree, as the first walk found it."""

    tensor: Any
    label: str  # its dotted path (a variable wrapper's own path where it has one)
    adapter: Any  # its framework's adapter
    dtype: str  # its dtype name
    shape: tuple


@plain_python
def cast_tree(tree: T, dtype="bfloat16", *, keep=None, policy: Iterable[Rule | str] | None = None,
              keep_head: bool = False, keep_dtype: str | None = KEEP_DTYPE) -> tuple[T, CastReport]:
    """Cast the floating tensors of a tree to ``dtype``, each in its own framework, keeping
    normalisation layers (and, with ``keep_head=True``, the output head) in float32.

    ``tree``: anything ``convert_tree`` walks (a torch state dict, flax/jax parameters, an nnx
    State, a Keras weight list, nested dicts, lists, tuples, namedtuples). ``policy``: the rules
    that keep leaves, by name (default ``DEFAULT_POLICY``); ``keep``: patterns or ``Rule``s kept
    besides. ``keep_dtype``: the dtype kept leaves end in (default float32; None: as they are).

    Returns the new tree (new containers; the input untouched) and a ``CastReport``. Integer,
    bool and complex leaves are skipped; a leaf already at ``dtype`` is handed back as it is (no
    copy); the same tensor under several paths (tied weights) stays one tensor, kept if any of
    its paths is kept. Rounding is the framework's own (nearest, ties to even; docs/casting.md
    says where the frameworks differ: NaN bits, float64)."""
    target = target_dtype(dtype, "cast_tree")
    kdt = keep_dtype_of(keep_dtype, "cast_tree")
    rules = (DEFAULT_POLICY if policy is None else rules_of(policy, "cast_tree policy", "in the policy given"))
    rules = rules + rules_of(keep, "cast_tree keep", "asked for (keep=)")
    if not isinstance(keep_head, bool):
        raise InvalidArgumentError(f"cast_tree: keep_head must be True or False; got {keep_head!r}")
    found = _collect(tree)
    keeping = _keeping(found, rules, keep_head)
    rows, results = _cast_leaves(found, keeping, target, kdt)
    it = iter(results)
    out_tree = trees.map_leaves(lambda x, path: next(it), tree, strict=True, as_is=_not_cast)
    unknown = [f.label for f in found if any(d is None for d in f.shape)]
    notes = (f"{len(unknown)} leaves ({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}) have a "
             "dimension not known while traced (None): their bytes count 0",) if unknown else ()
    return out_tree, CastReport(target, tuple(rows), notes)


def _collect(tree) -> list[TreeLeaf]:
    """Every tensor leaf of ``tree`` in the walk's order, with its label, adapter, dtype and shape."""
    found: list[TreeLeaf] = []

    def collect(x, path):
        try:
            adapter, name, shape = _describe(x)
        except Bf16BridgeError as err:
            raise type(err)(f"at {trees.where(path)}: {err}") from err
        found.append(TreeLeaf(x, _label(path, _wrapper_path(tree, path, x)), adapter, name, shape))
        return x

    # a model object in the tree is refused, naming cast_module; a plain object holding tensors is
    # walked only where one of them is floating (cast, or kept by a rule its name is not seen by)
    trees.map_leaves(collect, tree, strict=True, as_is=_not_cast)
    return found


def _keeping(found: list[TreeLeaf], rules: tuple[Rule, ...], keep_head: bool) -> list[Rule | None]:
    """The rule that keeps each leaf (None: cast), by the policy and, with ``keep_head``, the head."""
    labels = [f.label for f in found]
    decide = Decide(rules, labels)
    keeping: list[Rule | None] = [decide(f.label) if is_floating(f.dtype) else None for f in found]
    if keep_head:
        head = _head_rule(labels, [is_floating(f.dtype) and k is None for f, k in zip(found, keeping)],
                          [len(f.shape) for f in found])
        keeping = [k if k is not None or not is_floating(f.dtype) else head(f.label) for f, k in zip(found, keeping)]
    return keeping


def _cast_leaves(found: list[TreeLeaf], keeping: list, target: str, kdt: str | None) -> tuple[list, list]:
    """The report's rows and the new leaves; a tensor under several paths is cast once, and kept if
    any of its paths is."""
    same = [f.adapter.same_data(f.tensor) if is_floating(f.dtype) else None for f in found]
    tied: dict[Any, tuple[Rule, str]] = {}
    for key, rule, f in zip(same, keeping, found):
        if rule is not None:
            tied.setdefault(key, (rule, f.label))
    rows: list[LeafCast] = []
    results: list = []
    done: dict[Any, Any] = {}
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN or an overflow to inf is the rounding's, no error
        for f, rule, key in zip(found, keeping, same):
            x, label, name = f.tensor, f.label, f.dtype
            n0 = nbytes(x, f.shape, name)
            if not is_floating(name):
                rows.append(LeafCast(label, "skipped", name, name, n0, n0, why=skip_why(name)))
                results.append(x)
                continue
            why = ""
            if rule is None and key in tied:
                rule, other = tied[key]
                why = f"the same tensor as {other}, which {rule.name} keeps: {rule.why}"
            to = target if rule is None else (kdt or name)
            action = "cast" if rule is None else "kept"
            if name == to:
                out, action = x, ("unchanged" if rule is None else action)
            elif (key, to) in done:
                out = done[key, to]
            else:
                out = done[key, to] = _cast_one(f, to)
            rows.append(LeafCast(label, action, name, to, n0, nbytes(out, f.shape, to),
                                 rule=rule.name if rule else "", why=why or (rule.why if rule else "")))
            results.append(out)
    return rows, results


def _cast_one(f: TreeLeaf, to: str):
    """Leaf ``f`` cast to ``to`` by its adapter; our error where the result would not be ``to``."""
    # a framework that cannot hold the dtype here might narrow it silently: refused as convert refuses it
    refused = f.adapter.cannot_hold(to)
    if refused is not None:
        raise UnsupportedDtypeError(f"at {f.label}: cannot cast {f.dtype} to {to}: {refused}")
    try:
        out = f.adapter.cast(f.tensor, to)
    except Bf16BridgeError as err:
        raise type(err)(f"at {f.label}: {err}") from err
    got = f.adapter.shape_dtype(out)[1]
    if got != to:  # the report says the dtype the result has, or the call fails
        raise UnsupportedDtypeError(f"at {f.label}: {f.adapter.name} cast {f.dtype} to {got}, not {to}; "
                                    "the leaf is refused rather than reported as what it is not")
    return out


# -- leaves ---------------------------------------------------------------------------------------

def _describe(x) -> tuple[Any, str, tuple]:
    """(adapter, dtype name, shape) of a tensor leaf; reads no data."""
    adapter = registry.get(registry.framework_of(x))
    empty = adapter.no_data(x)  # (a tensor whose storage was freed: our error, not the framework's)
    if empty is not None:
        raise UnsupportedTypeError(empty)
    shape, name = adapter.shape_dtype(x)
    return adapter, name, tuple(shape)


def _not_cast(x) -> bool:
    """Whether cast_tree hands the tensor ``x`` back as it is whatever its policy: it is not floating."""
    try:
        return not is_floating(_describe(x)[1])
    except Bf16BridgeError:
        return False


def _label(path, wrapper_path: str | None) -> str:
    if wrapper_path is not None:
        return wrapper_path.replace("/", ".")
    return ".".join(str(k) for k in path)


def _wrapper_path(tree, path, leaf) -> str | None:
    """The ``path`` a variable wrapper at ``path`` names itself by (a Keras variable:
    ``dense/kernel``), when the walk took its value; followed through plain containers only."""
    node = tree
    for k in path:
        if isinstance(node, Mapping):
            node = node.get(k)
        elif isinstance(node, (list, tuple)) and isinstance(k, int) and -len(node) <= k < len(node):
            node = node[k]
        else:
            return None
    if node is leaf or node is None:
        return None
    p = getattr(node, "path", None)
    return p if isinstance(p, str) and p else None


def _head_rule(labels: Sequence[str], candidates: Sequence[bool], ndims: Sequence[int]) -> Decide:
    """The head decision for a tree: HEAD_POLICY, or, where no key is named like a head, the
    last layer: the leaves sharing the label prefix of the last candidate (a floating leaf the
    policy does not keep already: flax's batch_stats come after its params). A flat list (labels
    "0", "1"...: a Keras get_weights()) has no prefix: its last layer is the trailing run of
    candidates up to and including the last one of two or more dimensions (kernel and bias)."""
    by_name = Decide(HEAD_POLICY, labels)
    if any(by_name(lab) for lab in labels):
        return by_name
    last = next((lab for lab, c in zip(reversed(labels), reversed(candidates)) if c), None)
    if last is None:
        return by_name
    layer = last.rpartition(".")[0]
    if layer:
        pattern, what = "^" + re.escape(layer) + r"\.", layer
    else:
        run: list[str] = []
        for lab, c, nd in zip(reversed(labels), reversed(candidates), reversed(ndims)):
            if c:
                run.append(lab)
                if nd >= 2:
                    break
        else:  # no leaf of two or more dimensions: the last leaf alone
            run = [last]
        pattern = "^(?:" + "|".join(map(re.escape, reversed(run))) + ")$"
        what = ", ".join(reversed(run)) + (": the trailing leaves up to the last one of two or more dimensions"
                                           if len(run) > 1 else "")
    rule = Rule("head (last layer)", pattern,
                f"keep_head=True and no key is named like a head, so the last layer ({what}) is taken as the head")
    return Decide((rule,), labels)
