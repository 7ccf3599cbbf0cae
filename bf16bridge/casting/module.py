"""``cast_module``: cast a model object in place, keeping layers by their type, and hook the kept ones.

Its steps: collect every module's own leaves and the rule that keeps each (the module's type, the
head above it, a name pattern); propagate what is kept to tied leaves and to whole modules; write
the report and the plan of casts; choose the kept modules' hooks; let the framework's
``CastHooks.cast_module`` apply both.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterable
from typing import Any, TypeVar

from bf16bridge.adapters.hooks import CastHooks
from bf16bridge.casting.report import CastReport, LeafCast, nbytes
from bf16bridge.casting.rules import (DEFAULT_KEEP_TYPES, HEAD_POLICY, HEAD_TYPES, KEEP_DTYPE, Decide, Rule,
                                      is_floating, keep_dtype_of, rules_of, skip_why, target_dtype)
from bf16bridge.core import registry
from bf16bridge.core.autograph import plain_python
from bf16bridge.errors import InvalidArgumentError, UnsupportedTypeError

M = TypeVar("M")


@dataclasses.dataclass(slots=True)
class ModuleLeaf:
    """One parameter or buffer of a module, and the rule that keeps it (None: cast)."""

    label: str  # the module's dotted name and the leaf's
    tensor: Any
    dtype: str  # its dtype name
    shape: tuple
    rule: Rule | None
    why: str  # why it is kept ("" when cast)


@plain_python
def cast_module(model: M, dtype="bfloat16", *, keep_head: bool = False, keep_types=DEFAULT_KEEP_TYPES,
                keep=None, keep_dtype: str | None = KEEP_DTYPE, inplace: bool = True,
                autocast_kept: bool = True) -> tuple[M, CastReport]:
    """Cast a model's floating parameters and buffers to ``dtype``, keeping normalisation
    layers, found by their type (``keep_types``, default ``DEFAULT_KEEP_TYPES``), in float32.

    ``keep_head=True`` keeps the output head too: the first module named like a head
    (``HEAD_POLICY``: lm_head, classifier, head, score, a top-level fc...), else the last
    ``Linear``; all of it, submodules included. ``keep``: patterns or ``Rule``s over parameter
    names (``h.0.attn.c_attn.weight``) kept besides. ``keep_types``: classes, class-name
    patterns or ``Rule``s (matched against the names of a module's class and its bases).
    ``keep_dtype``: the dtype kept leaves end in (float32; None is refused here: the hooks need one).
    A ``keep`` pattern that matches some of a module's own floating leaves keeps all of them (its
    weight and its bias), so the module runs in one dtype behind its hooks; the report says which.

    ``inplace=True`` (the default, as torch's ``Module.to``): the model itself changes and is
    returned; ``inplace=False``: a deep copy is cast, the model is untouched.
    ``autocast_kept=True``: each kept module gets forward hooks that cast its floating inputs to
    ``keep_dtype`` and its floating outputs to ``dtype`` (the head's outputs stay in
    ``keep_dtype``), so the model runs on ``dtype`` inputs; a second cast_module replaces them.
    A parameter shared by a kept and a cast module (tied embeddings and head) is kept, and said so."""
    target, kdt = _dtypes(dtype, keep_dtype)
    for flag, value in (("keep_head", keep_head), ("inplace", inplace), ("autocast_kept", autocast_kept)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"cast_module: {flag} must be True or False; got {value!r}")
    matchers = _type_matchers(keep_types)
    name_rules = rules_of(keep, "cast_module keep", "asked for (keep=)")
    adapter, subs = _adapter_for_module(model)
    if not inplace:
        model = _deep_copy(model)
        adapter, subs = _adapter_for_module(model)
    head_name, head_rule = _find_head(subs) if keep_head else (None, None)
    found, members, by_type = _collect(subs, adapter, matchers, name_rules, head_name, head_rule)
    notes = _propagate(found, subs, members, kdt)
    rows, plan = _report(found, target, kdt)
    hooks = _hooks(subs, rows, head_name, by_type, kdt, target) if autocast_kept else []
    registry.hooks(adapter.name, CastHooks).cast_module(model, plan, hooks)
    if hooks:
        notes.append(f"forward hooks on {len(hooks)} kept module(s): floating inputs to {kdt}, outputs to {target}"
                     + (f"; the head ({head_name or 'the model'}) returns {kdt}" if head_name is not None else ""))
    notes.append("cast in place: the model passed in is the one returned" if inplace
                 else "cast a deep copy: the model passed in is untouched")
    return model, CastReport(target, tuple(rows), tuple(dict.fromkeys(notes)))


def _dtypes(dtype, keep_dtype) -> tuple[str, str]:
    """The target dtype and the kept leaves' dtype, or our error."""
    target = target_dtype(dtype, "cast_module")
    if keep_dtype is None:
        raise InvalidArgumentError(
            "cast_module: keep_dtype=None (kept leaves left as they are) is cast_tree's; a kept module's "
            "hooks cast its inputs to one dtype: pass keep_dtype='float32' (the default) or the dtype to keep")
    return target, keep_dtype_of(keep_dtype, "cast_module") or KEEP_DTYPE


def _deep_copy(model):
    """``copy.deepcopy(model)``, or our error saying the way out."""
    try:
        return copy.deepcopy(model)
    except Exception as err:  # noqa: BLE001 - a member deepcopy cannot copy (a lock, a file): said, and the way out
        raise UnsupportedTypeError(
            f"cast_module(inplace=False) copies the model first (copy.deepcopy), which failed: "
            f"{type(err).__name__}: {err}; cast it in place (inplace=True, the default), or cast a copy "
            "you make yourself") from err


# -- collect: each module's own leaves, and what keeps each ----------------------------------------

def _collect(subs, adapter, matchers, name_rules, head_name, head_rule) -> tuple[list[ModuleLeaf], list, set]:
    """Every module's own leaves, each with the rule that keeps it (its module's type, the head
    above it, a name pattern) or None; per module, its leaves' places in that list; and the names
    of the modules kept by their type."""
    labels = [_join(s.name, n) for s in subs for n, _ in s.leaves]
    by_name = Decide(name_rules, labels)
    found: list[ModuleLeaf] = []
    members: list[list[int]] = []
    by_type: set[str] = set()
    type_rules: dict[tuple, Rule | None] = {}  # a module's class decides: asked once a class
    for s in subs:
        if s.classes not in type_rules:
            type_rules[s.classes] = _kept_by_type(matchers, s)
        rule = type_rules[s.classes]
        if rule is not None:
            by_type.add(s.name)
        if rule is None and head_name is not None and _under(s.name, head_name):
            rule = head_rule
        own = []
        for leaf_name, t in s.leaves:
            label = _join(s.name, leaf_name)
            shape, name = adapter.shape_dtype(t)
            r = rule or (by_name(label) if is_floating(name) else None)
            own.append(len(found))
            found.append(ModuleLeaf(label, t, name, tuple(shape), r, r.why if r else ""))
        members.append(own)
    return found, members, by_type


def _adapter_for_module(model):
    held = registry.held_by_library(model)
    # a library's model that holds its weights itself, not on its layers: keep_types would miss its norms
    if held is not None:
        raise UnsupportedTypeError(f"cast_module: {held}; cast them with cast_tree(model.weights), whose "
                                   "name policy keeps the norms by their Keras paths")
    for adapter in registry.imported():
        mods = registry.hooks(adapter.name, CastHooks).submodules(model)
        if mods is not None:
            return adapter, mods
    t = type(model)
    raise UnsupportedTypeError(
        f"cast_module: {t.__module__}.{t.__qualname__} is not a model any imported framework walks "
        "(a torch nn.Module); for a tree of weights (a state dict, flax params, a Keras weight list) "
        "use cast_tree"
    )


def _type_matchers(keep_types) -> list[tuple[str, str, Any]]:
    """(rule name, why, matcher) per keep_types entry: a compiled pattern over class names, or a class."""
    if keep_types is None:
        return []
    if isinstance(keep_types, (str, Rule, type)) or not isinstance(keep_types, Iterable):
        keep_types = (keep_types,)  # (one that is none of these is refused below, naming it)
    out: list[tuple[str, str, Any]] = []
    for k in keep_types:
        if isinstance(k, Rule):
            out.append((f"type {k.name}", k.why, re.compile(k.pattern)))
        elif isinstance(k, str):
            rule = Rule(f"type {k}", k, "asked for (keep_types=)")  # a bad pattern: our error, naming it
            out.append((rule.name, rule.why, re.compile(k)))
        elif isinstance(k, type):
            out.append((f"type {k.__name__}", "asked for (keep_types=)", k))
        else:
            raise InvalidArgumentError(
                f"cast_module keep_types: {k!r} is not a class, a class-name pattern (str) or a Rule"
            )
    return out


def _kept_by_type(matchers, sub) -> Rule | None:
    for name, why, m in matchers:
        if isinstance(m, type):
            if m in sub.classes:
                return Rule(name, "", why)
        elif any(m.fullmatch(n) for n in sub.type_names):
            return Rule(name, m.pattern, why)
    return None


def _find_head(subs) -> tuple[str | None, Rule | None]:
    """The head module's name for keep_head=True, and the rule that names it."""
    names = [s.name for s in subs if s.name]
    # rule by rule, then module by module: a module named like a head wins over a top-level fc
    # registered before it (a hidden layer named fc; the head's hooks return float32 to what follows)
    for rule in HEAD_POLICY:
        by_name = Decide((rule,), names)
        for n in names:
            if by_name(n) is not None:
                return n, Rule(rule.name, rule.pattern, "keep_head=True: " + rule.why)
    for s in reversed(subs):
        if s.name and set(s.type_names) & set(HEAD_TYPES):
            return s.name, Rule("head (last linear)", "",
                                f"keep_head=True and no module is named like a head: the last "
                                f"{'/'.join(HEAD_TYPES)} module is taken as the head")
    return None, None


# -- propagate: ties and whole modules, to a fixed point -------------------------------------------

def _propagate(found: list[ModuleLeaf], subs, members: list, kdt: str) -> list[str]:
    """Keep a leaf tied to a kept one, and all of a module's own floating leaves where some are kept
    (it computes in one dtype), until nothing changes; the notes that say which ties were kept."""
    notes: list[str] = []
    changed = True
    while changed:
        changed = _keep_tied(found, notes, kdt)
        changed = _keep_modules_whole(found, subs, members) or changed
    return notes


def _keep_tied(found: list[ModuleLeaf], notes: list[str], kdt: str) -> bool:
    """A leaf that is the same tensor as a kept one (tied embeddings and head) is kept with it."""
    tied: dict[int, tuple[Rule, str]] = {}
    for f in found:
        if f.rule is not None and is_floating(f.dtype):
            tied.setdefault(id(f.tensor), (f.rule, f.label))
    changed = False
    for f in found:
        if f.rule is None and is_floating(f.dtype) and id(f.tensor) in tied:
            rule, other = tied[id(f.tensor)]
            f.rule, f.why = rule, f"the same tensor as {other}, which {rule.name} keeps: {rule.why}"
            notes.append(f"{f.label} is tied to {other}: kept in {kdt} with it")
            changed = True
    return changed


def _keep_modules_whole(found: list[ModuleLeaf], subs, members: list) -> bool:
    """A module with some of its own floating leaves kept keeps them all (a layer with its weight
    kept and its bias cast would get no hooks and could not run)."""
    changed = False
    for s, own in zip(subs, members):
        floating = [found[i] for i in own if is_floating(found[i].dtype)]
        kept = [f for f in floating if f.rule is not None]
        if kept and len(kept) < len(floating):
            first = kept[0]
            for f in floating:
                if f.rule is None:
                    f.rule = first.rule
                    f.why = (f"{first.why}; kept with {first.label}, of the same module ({s.name or 'the model'}), "
                             "so that module computes in one dtype")
            changed = True
    return changed


# -- report and hooks ----------------------------------------------------------------------------

def _report(found: list[ModuleLeaf], target: str, kdt: str) -> tuple[list[LeafCast], dict[int, str]]:
    """The report's rows, and the plan of casts (a tensor's ``id()`` -> the dtype it becomes)."""
    rows: list[LeafCast] = []
    plan: dict[int, str] = {}
    for f in found:
        n0 = nbytes(f.tensor, f.shape, f.dtype)
        if not is_floating(f.dtype):
            rows.append(LeafCast(f.label, "skipped", f.dtype, f.dtype, n0, n0, why=skip_why(f.dtype)))
            continue
        to = target if f.rule is None else kdt
        action = "kept" if f.rule is not None else ("unchanged" if f.dtype == to else "cast")
        if f.dtype != to:
            plan[id(f.tensor)] = to
        rows.append(LeafCast(f.label, action, f.dtype, to, n0, nbytes(f.tensor, f.shape, to),
                             rule=f.rule.name if f.rule else "", why=f.why))
    return rows, plan


def _hooks(subs, rows: list[LeafCast], head_name: str | None, by_type: set, kdt: str,
           target: str) -> list[tuple[str, str, str]]:
    """(module name, input dtype, output dtype) for each module that gets forward hooks: the head, the
    modules kept by type (with leaves or none), and every other module whose own floating leaves are
    all kept; not those inside the head, whose hooks already give them ``kdt``."""
    hooks: list[tuple[str, str, str]] = []
    state = {r.path: r.action for r in rows if r.action != "skipped"}
    for s in subs:
        actions = [state[_join(s.name, n)] for n, _ in s.leaves if _join(s.name, n) in state]
        if head_name is not None and s.name == head_name:
            hooks.append((s.name, kdt, kdt))
        elif head_name is not None and _under(s.name, head_name):
            continue
        elif s.name in by_type or (actions and all(a == "kept" for a in actions)):
            hooks.append((s.name, kdt, target))
    return hooks


def _under(name: str, ancestor: str) -> bool:
    return name == ancestor or ancestor == "" or name.startswith(ancestor + ".")


def _join(module: str, leaf: str) -> str:
    return f"{module}.{leaf}" if module else leaf
