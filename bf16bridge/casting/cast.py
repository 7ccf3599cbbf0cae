"""Cast a model's weights to a lower precision, keeping numerically sensitive layers in float32.

``cast_tree`` casts the floating leaves of any tree ``convert_tree`` walks (a torch state dict,
flax/jax parameters, a Keras weight list, nested dicts and lists), each in its own framework;
which leaves stay float32 is decided by name, by a policy that is data (``DEFAULT_POLICY``,
``HEAD_POLICY``: a tuple of ``Rule``). ``cast_module`` casts a model object in place (a torch
``nn.Module``), keeping layers by their type (``DEFAULT_KEEP_TYPES``), and hooks the kept ones
so the model still runs on the new dtype. Both return a ``CastReport``: every leaf, what
happened to it and why, and the bytes before and after. docs/casting.md has the tables.

Nothing here names a framework: the module walk is ``Adapter.submodules`` and
``Adapter.cast_module``, a leaf's cast is ``Adapter.astype``.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from bf16bridge.adapters.hooks import CastHooks
from bf16bridge.core.autograph import plain_python
from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.trees import walk as trees
from bf16bridge.errors import Bf16BridgeError, InvalidArgumentError, UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.core.plan import size

T = TypeVar("T")
M = TypeVar("M")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One line of a cast policy: the leaves it keeps, and why.

    ``pattern`` is a regular expression searched (case-insensitive) in a leaf's label: its path
    with ``.`` between keys (``h.0.ln_1.weight``, ``params.LayerNorm_0.scale``;
    a Keras variable: its ``path`` with ``/`` read as ``.``). ``sibling=True``: the rule keeps
    every leaf of a layer (the label up to its last ``.``) holding a leaf whose last key matches
    ``pattern`` (a layer with a ``running_var`` is a batch norm, whatever it is called).
    For ``cast_module``'s ``keep_types``, ``pattern`` is matched in full against the names of a
    module's class and its bases."""

    name: str
    pattern: str
    why: str
    sibling: bool = False

    def __post_init__(self):
        try:
            re.compile(self.pattern)
        except re.error as err:
            raise InvalidArgumentError(
                f"Rule {self.name!r}: {self.pattern!r} is not a regular expression ({err}); "
                "escape special characters with re.escape"
            ) from err


def _key(words: str) -> str:
    """A pattern matching one whole key of a label (a component between dots)."""
    return rf"(?:^|\.)(?:{words})(?:\.|$)"


#: What cast_tree keeps in float32 by default, by name (docs/casting.md says why, with real names).
DEFAULT_POLICY: tuple[Rule, ...] = (
    Rule("norm", _key(r"[^.]*norm[^.]*"),
         "a normalisation layer (LayerNorm, RMSNorm, BatchNorm, GroupNorm, layer_normalization, norm1, "
         "input_layernorm...): it divides by a standard deviation computed from the data, so an error in "
         "its scale multiplies every activation after it, and its weights are one vector a layer: "
         "keeping them costs almost nothing"),
    Rule("norm-abbreviation", _key(r"(?:ln|bn|gn|rms)(?:_[a-z0-9]+|\d*)"),
         "a normalisation layer by its usual short name (GPT-2 ln_1, ln_2, ln_f; CLIP ln_pre, ln_post; "
         "torchvision ResNet bn1, bn2, bn3)"),
    Rule("batch-statistics", r"(?:^|\.)(?:running_mean|running_var|moving_mean|moving_variance)$",
         "the running mean and variance of a batch norm: a momentum update (0.1 x a nearby value) "
         "rounds away in bf16's 8 bits, so the statistics would stop moving if training went on"),
    Rule("batch-norm-layer", r"running_var|moving_variance", sibling=True,
         why="a layer that holds a running variance is a batch norm whatever its name (torchvision "
             "ResNet's downsample.1)"),
    Rule("rotary", r"(?:^|\.)inv_freq$",
         "rotary position frequencies (Llama, GPT-NeoX): position x inv_freq loses whole radians at "
         "long positions in bf16; the model code computes these angles in float32"),
)

#: What keep_head=True keeps besides: the output head, by name. A tree where none matches keeps
#: its last layer (the leaves sharing the label prefix of the last floating leaf, in the tree's order).
HEAD_POLICY: tuple[Rule, ...] = (
    Rule("head", _key(r"lm_head|head|heads|[a-z0-9]+_head|classifier|cls|score|qa_outputs|embed_out|"
                      r"predictions|logits"),
         "the output head (lm_head, classifier, head, score...): its outputs are the logits, where a "
         "rounding error moves a probability or flips the top choice"),
    Rule("head-top-level", r"^(?:fc|output)(?:\.|$)",
         "the output head under a top-level name (torchvision ResNet fc, Meta's Llama output)"),
)

#: What cast_module keeps in float32 by default: modules whose class or a base of it is named so.
DEFAULT_KEEP_TYPES: tuple[Rule, ...] = (
    Rule("batch-norm", r".*BatchNorm.*|_NormBase",
         "batch norm: statistics over the batch and running averages, which bf16 stops updating"),
    Rule("instance-norm", r".*InstanceNorm.*", "instance norm: statistics over each sample's plane"),
    Rule("layer-norm", r".*LayerNorm.*", "layer norm: mean and variance over each row"),
    Rule("group-norm", r".*GroupNorm.*", "group norm: mean and variance over channel groups"),
    Rule("rms-norm", r".*RMSNorm.*", "RMS norm (Llama, Mistral, Gemma): root mean square over each row"),
    Rule("local-response-norm", r"LocalResponseNorm|CrossMapLRN2d",
         "local response norm: a sum of squares over neighbouring channels"),
)

#: keep_head=True in cast_module: when no module name matches HEAD_POLICY, the last module of
#: one of these classes (in the model's registration order) is the head.
HEAD_TYPES: tuple[str, ...] = ("Linear", "LazyLinear", "Dense")

#: the dtype kept leaves end in
KEEP_DTYPE = "float32"

_ACTIONS = ("cast", "kept", "unchanged", "skipped")


@dataclasses.dataclass(frozen=True)
class LeafCast:
    """What a cast did to one leaf."""

    path: str  # its label (dotted path)
    action: str  # "cast", "kept" (the policy kept it in float32), "unchanged" (already the dtype), "skipped"
    before: str  # dtype name before
    after: str  # dtype name after
    nbytes_before: int
    nbytes_after: int
    rule: str = ""  # the rule that kept it ("norm", "type layer-norm", "head"...)
    why: str = ""  # the rule's reason, or why it was skipped

    def __str__(self) -> str:
        change = self.before if self.before == self.after else f"{self.before} -> {self.after}"
        how = f" [{self.rule}]" if self.rule else (f" ({self.why})" if self.action == "skipped" and self.why else "")
        return f"{self.path}: {self.action} {change}{how}"


@dataclasses.dataclass(frozen=True)
class CastReport:
    """What ``cast_tree`` or ``cast_module`` did, leaf by leaf.

    ``leaves``: every tensor leaf in the order walked. ``cast`` / ``kept`` / ``unchanged`` /
    ``skipped``: those rows. ``bytes_before`` / ``bytes_after``: the sum over every leaf (a
    tensor shared by several paths counted each time it appears). ``notes``: what else the call
    did (hooks installed, ties kept together, in place or not)."""

    dtype: str
    leaves: tuple[LeafCast, ...]
    notes: tuple[str, ...] = ()
    #: how many leaves str() lists one by one before it summarises the rest
    SHOWN = 40

    def _where(self, action: str) -> tuple[LeafCast, ...]:
        return tuple(r for r in self.leaves if r.action == action)

    @property
    def cast(self) -> tuple[LeafCast, ...]:
        return self._where("cast")

    @property
    def kept(self) -> tuple[LeafCast, ...]:
        return self._where("kept")

    @property
    def unchanged(self) -> tuple[LeafCast, ...]:
        return self._where("unchanged")

    @property
    def skipped(self) -> tuple[LeafCast, ...]:
        return self._where("skipped")

    @property
    def bytes_before(self) -> int:
        return sum(r.nbytes_before for r in self.leaves)

    @property
    def bytes_after(self) -> int:
        return sum(r.nbytes_after for r in self.leaves)

    def __str__(self) -> str:
        lines = [f"cast to {self.dtype}: {len(self.leaves)} leaves, "
                 f"{size(self.bytes_before)} -> {size(self.bytes_after)}"]
        for action in _ACTIONS:
            rows = self._where(action)
            if rows:
                lines.append(f"  {action:<9} {len(rows):>5} leaves, {size(sum(r.nbytes_before for r in rows))}"
                             f" -> {size(sum(r.nbytes_after for r in rows))}")
        rules: dict[str, int] = {}
        for r in self.kept:
            rules[r.rule] = rules.get(r.rule, 0) + 1
        if rules:
            lines.append("  kept by: " + ", ".join(f"{k} ({n})" for k, n in rules.items()))
        lines.extend(f"  note: {n}" for n in self.notes)
        # the interesting rows first: kept and skipped, then the casts
        ordered = sorted(self.leaves, key=lambda r: ("kept", "skipped", "unchanged", "cast").index(r.action))
        lines.extend(f"    {r}" for r in ordered[:self.SHOWN])
        if len(ordered) > self.SHOWN:
            lines.append(f"    ... {len(ordered) - self.SHOWN} more (report.leaves lists every one)")
        return "\n".join(lines)


# -- arguments -----------------------------------------------------------------------------------

#: the dtypes a cast may target, and the floating leaves it casts: bf16 and the standard floats.
#: The narrow floats (fp8, fp6, fp4) are quantised formats whose values mean something only with
#: their scales: a cast neither makes nor reads them (their leaves are skipped, saying so)
FLOATING = ("bfloat16", "float16", "float32", "float64")


def _target(dtype, what: str) -> str:
    """The bridge name of the target dtype, or our error listing the choices."""
    name = dtype if isinstance(dtype, str) else None
    if name is None and dtype is not None:  # (np.dtype(None) is float64: a cast to it without a word)
        try:
            name = dtypes.name_of_numpy(np.dtype(dtype))
        except TypeError:
            name = None
    if name in FLOATING:
        return name
    if name is not None and _narrow_float(name):
        raise InvalidArgumentError(
            f"{what}: a cast to {name} needs scales (quantisation), which this cast does not compute; "
            f"choose one of {', '.join(FLOATING)}"
        )
    if name in dtypes.ROWS:
        raise InvalidArgumentError(
            f"{what}: {name} is not a floating dtype; a cast changes the precision of floating weights "
            f"(integer and bool leaves stay as they are); choose one of {', '.join(FLOATING)}"
        )
    raise InvalidArgumentError(
        f"{what}: {dtype!r} is not a dtype name bf16bridge knows; pass one of {', '.join(FLOATING)} "
        "(a name, such as 'bfloat16', or a numpy dtype)"
    )


def _rules(rules, what: str, default_why: str) -> tuple[Rule, ...]:
    if rules is None:
        return ()
    if isinstance(rules, (str, Rule)):
        rules = (rules,)
    elif not isinstance(rules, Iterable):
        rules = (rules,)  # refused below, naming it (iterating it raised Python's own TypeError)
    out = []
    for r in rules:
        if isinstance(r, Rule):
            out.append(r)
        elif isinstance(r, str):
            out.append(Rule(r, r, default_why))
        else:
            raise InvalidArgumentError(
                f"{what}: {r!r} is neither a pattern (str) nor a bf16bridge.casting.cast.Rule; "
                f"pass patterns such as 'lm_head' or Rule(name, pattern, why)"
            )
    return tuple(out)


def _keep_dtype(keep_dtype, what: str) -> str | None:
    return None if keep_dtype is None else _target(keep_dtype, f"{what} keep_dtype")


# -- leaves ---------------------------------------------------------------------------------------

def _describe(x) -> tuple[Any, str, tuple]:
    """(adapter, dtype name, shape) of a tensor leaf; reads no data."""
    adapter = registry.get(registry.framework_of(x))
    empty = adapter.no_data(x)  # (a freed torch storage: its cast raised torch's own error)
    if empty is not None:
        raise UnsupportedTypeError(empty)
    shape, name = adapter.shape_dtype(x)
    return adapter, name, tuple(shape)


def _nbytes(x, shape, name: str) -> int:
    if any(d is None for d in shape):  # traced with a dimension not known yet (a tf.function's None): said
        return 0  # by the report's notes
    if name in dtypes.ROWS:
        return math.prod(shape) * dtypes.itemsize(name)
    n = getattr(x, "nbytes", None)  # a dtype the bridge does not carry: as the framework says
    return int(n) if isinstance(n, int) else 0


def _not_cast(x) -> bool:
    """Whether cast_tree hands the tensor ``x`` back as it is whatever its policy: it is not floating."""
    try:
        return not _is_floating(_describe(x)[1])
    except Bf16BridgeError:
        return False


def _is_floating(name: str) -> bool:
    return name in FLOATING


def _narrow_float(name: str) -> bool:
    """An fp8 / fp6 / fp4 row of the dtype table (a carried float that is no cast target)."""
    row = dtypes.ROWS.get(name)
    return row is not None and row.kind == "float" and name not in FLOATING


def _skip_why(name: str) -> str:
    if _narrow_float(name):
        return "a quantised float: its values need their scales; cast it with them"
    return "not floating" if name in dtypes.ROWS else "a dtype bf16bridge does not carry"


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


class _Decide:
    """A policy applied to labels: the rule that keeps a leaf, or None."""

    def __init__(self, rules: Sequence[Rule], labels: Sequence[str]):
        self.plain = [(r, re.compile(r.pattern, re.IGNORECASE)) for r in rules if not r.sibling]
        self.layers: dict[str, Rule] = {}
        for r in rules:
            if r.sibling:
                rx = re.compile(r.pattern, re.IGNORECASE)
                for label in labels:
                    layer, _, last = label.rpartition(".")
                    if rx.fullmatch(last):
                        self.layers.setdefault(layer, r)

    def __call__(self, label: str) -> Rule | None:
        for r, rx in self.plain:
            if rx.search(label):
                return r
        return self.layers.get(label.rpartition(".")[0]) if self.layers else None


def _head_rule(labels: Sequence[str], candidates: Sequence[bool], ndims: Sequence[int]) -> _Decide:
    """The head decision for a tree: HEAD_POLICY, or, where no key is named like a head, the
    last layer: the leaves sharing the label prefix of the last candidate (a floating leaf the
    policy does not keep already: flax's batch_stats come after its params). A flat list (labels
    "0", "1"...: a Keras get_weights()) has no prefix: its last layer is the trailing run of
    candidates up to and including the last one of two or more dimensions (kernel and bias)."""
    by_name = _Decide(HEAD_POLICY, labels)
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
    return _Decide((rule,), labels)


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
    target = _target(dtype, "cast_tree")
    kdt = _keep_dtype(keep_dtype, "cast_tree")
    rules = (DEFAULT_POLICY if policy is None else _rules(policy, "cast_tree policy", "in the policy given"))
    rules = rules + _rules(keep, "cast_tree keep", "asked for (keep=)")
    if not isinstance(keep_head, bool):
        raise InvalidArgumentError(f"cast_tree: keep_head must be True or False; got {keep_head!r}")

    # first walk: every leaf, its label and dtype
    found: list[tuple[Any, str, Any, str, tuple]] = []

    def collect(x, path):
        try:
            adapter, name, shape = _describe(x)
        except Bf16BridgeError as err:
            raise type(err)(f"at {trees.where(path)}: {err}") from err
        found.append((x, _label(path, _wrapper_path(tree, path, x)), adapter, name, shape))
        return x

    # a model object in the tree: refused, naming cast_module; a plain object holding tensors in its
    # attributes only where one of them is floating (cast, or kept by a rule its name is not seen by)
    trees.map_leaves(collect, tree, strict=True, as_is=_not_cast)
    labels = [f[1] for f in found]
    decide = _Decide(rules, labels)

    # which leaves the policy keeps; a tensor under several paths is kept if any path is
    keeping: list[Rule | None] = [decide(label) if _is_floating(name) else None for _, label, _, name, _ in found]
    if keep_head:
        head = _head_rule(labels, [_is_floating(f[3]) and k is None for f, k in zip(found, keeping)],
                          [len(f[4]) for f in found])
        keeping = [k if k is not None or not _is_floating(f[3]) else head(f[1]) for f, k in zip(found, keeping)]
    same = [adapter.same_data(x) if _is_floating(name) else None for x, _, adapter, name, _ in found]
    tied: dict[Any, tuple[Rule, str]] = {}
    for key, rule, (_, label, *_) in zip(same, keeping, found):
        if rule is not None:
            tied.setdefault(key, (rule, label))

    rows: list[LeafCast] = []
    results: list = []
    done: dict[Any, Any] = {}
    with np.errstate(invalid="ignore", over="ignore"):  # numpy warns on a NaN or an overflow to inf: the
        # rounding defines both, no error
        for (x, label, adapter, name, shape), rule, key in zip(found, keeping, same):
            n0 = _nbytes(x, shape, name)
            if not _is_floating(name):
                rows.append(LeafCast(label, "skipped", name, name, n0, n0,
                                     why=_skip_why(name)))
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
                # a framework that cannot hold the dtype here may narrow it without a word (jax without
                # x64 makes float64 float32): refused as convert refuses it
                refused = adapter.cannot_hold(to)
                if refused is not None:
                    raise UnsupportedDtypeError(f"at {label}: cannot cast {name} to {to}: {refused}")
                try:
                    out = adapter.cast(x, to)
                except Bf16BridgeError as err:
                    raise type(err)(f"at {label}: {err}") from err
                got = adapter.shape_dtype(out)[1]
                if got != to:  # the report says the dtype the result has, or the call fails
                    raise UnsupportedDtypeError(f"at {label}: {adapter.name} cast {name} to {got}, not {to}; "
                                                "the leaf is refused rather than reported as what it is not")
                done[key, to] = out
            rows.append(LeafCast(label, action, name, to, n0, _nbytes(out, shape, to),
                                 rule=rule.name if rule else "", why=why or (rule.why if rule else "")))
            results.append(out)

    it = iter(results)
    out_tree = trees.map_leaves(lambda x, path: next(it), tree, strict=True, as_is=_not_cast)
    unknown = [label for _, label, _, _, shape in found if any(d is None for d in shape)]
    notes = (f"{len(unknown)} leaves ({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}) have a "
             "dimension not known while traced (None): their bytes count 0",) if unknown else ()
    return out_tree, CastReport(target, tuple(rows), notes)


# -- modules ---------------------------------------------------------------------------------------

def _adapter_for_module(model):
    held = registry.held_by_library(model)
    if held is not None:  # a Keras model, under its torch backend a torch Module too: its weights sit
        # in the model's own parameter dict, not on its layers, so keep_types would miss its norms
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
        by_name = _Decide((rule,), names)
        for n in names:
            if by_name(n) is not None:
                return n, Rule(rule.name, rule.pattern, "keep_head=True: " + rule.why)
    for s in reversed(subs):
        if s.name and set(s.type_names) & set(HEAD_TYPES):
            return s.name, Rule("head (last linear)", "",
                                f"keep_head=True and no module is named like a head: the last "
                                f"{'/'.join(HEAD_TYPES)} module is taken as the head")
    return None, None


def _under(name: str, ancestor: str) -> bool:
    return name == ancestor or ancestor == "" or name.startswith(ancestor + ".")


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
    target = _target(dtype, "cast_module")
    if keep_dtype is None:
        raise InvalidArgumentError(
            "cast_module: keep_dtype=None (kept leaves left as they are) is cast_tree's; a kept module's "
            "hooks cast its inputs to one dtype: pass keep_dtype='float32' (the default) or the dtype to keep")
    kdt = _keep_dtype(keep_dtype, "cast_module") or KEEP_DTYPE
    for flag, value in (("keep_head", keep_head), ("inplace", inplace), ("autocast_kept", autocast_kept)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"cast_module: {flag} must be True or False; got {value!r}")
    matchers = _type_matchers(keep_types)
    name_rules = _rules(keep, "cast_module keep", "asked for (keep=)")
    adapter, subs = _adapter_for_module(model)
    if not inplace:
        try:
            model = _copy.deepcopy(model)
        except Exception as err:  # noqa: BLE001 - a member deepcopy cannot copy (a lock, a file): said, and the way out
            raise UnsupportedTypeError(
                f"cast_module(inplace=False) copies the model first (copy.deepcopy), which failed: "
                f"{type(err).__name__}: {err}; cast it in place (inplace=True, the default), or cast a copy "
                "you make yourself") from err
        adapter, subs = _adapter_for_module(model)

    head_name, head_rule = _find_head(subs) if keep_head else (None, None)
    labels = [_join(s.name, n) for s in subs for n, _ in s.leaves]
    by_name = _Decide(name_rules, labels)

    # each leaf: kept (its module's type, the head above it, a name pattern) or cast
    found: list[list] = []  # [label, tensor, dtype name, shape, rule or None, why]
    members: list[list[int]] = []  # per module, its own leaves' places in found
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
            r = rule or (by_name(label) if _is_floating(name) else None)
            own.append(len(found))
            found.append([label, t, name, tuple(shape), r, r.why if r else ""])
        members.append(own)
    # to a fixed point: a leaf tied to a kept one is kept with it (a parameter shared by a kept and a
    # cast module: tied embeddings and head); a module with some of its own floating leaves kept keeps
    # them all (a Linear with its weight kept and its bias cast would get no hooks and could not run),
    # which may keep a leaf tied to another module's, and so on
    notes: list[str] = []
    changed = True
    while changed:
        changed = False
        tied: dict[int, tuple[Rule, str]] = {}
        for label, t, name, _, rule, _ in found:
            if rule is not None and _is_floating(name):
                tied.setdefault(id(t), (rule, label))
        for f in found:
            if f[4] is None and _is_floating(f[2]) and id(f[1]) in tied:
                rule, other = tied[id(f[1])]
                f[4], f[5] = rule, f"the same tensor as {other}, which {rule.name} keeps: {rule.why}"
                notes.append(f"{f[0]} is tied to {other}: kept in {kdt} with it")
                changed = True
        for s, own in zip(subs, members):
            floating = [found[i] for i in own if _is_floating(found[i][2])]
            kept = [f for f in floating if f[4] is not None]
            if kept and len(kept) < len(floating):
                first, r = kept[0][0], kept[0][4]
                for f in floating:
                    if f[4] is None:
                        f[4] = r
                        f[5] = (f"{kept[0][5]}; kept with {first}, of the same module ({s.name or 'the model'}), "
                                "so that module computes in one dtype")
                changed = True

    rows: list[LeafCast] = []
    plan: dict[int, str] = {}
    for label, t, name, shape, rule, why in found:
        n0 = _nbytes(t, shape, name)
        if not _is_floating(name):
            rows.append(LeafCast(label, "skipped", name, name, n0, n0,
                                 why=_skip_why(name)))
            continue
        to = target if rule is None else kdt
        action = "kept" if rule is not None else ("unchanged" if name == to else "cast")
        if name != to:
            plan[id(t)] = to
        rows.append(LeafCast(label, action, name, to, n0, _nbytes(t, shape, to),
                             rule=rule.name if rule else "", why=why))

    # hooks: the head, the modules kept by type (with parameters or not: LocalResponseNorm has
    # none, and no bf16 kernel here), and every other module whose own floating leaves are all
    # kept (a tied embedding); not those inside the head: its hooks already give them float32
    hooks: list[tuple[str, str, str]] = []
    if autocast_kept:
        state = {r.path: r.action for r in rows if r.action != "skipped"}
        for s in subs:
            actions = [state[_join(s.name, n)] for n, _ in s.leaves if _join(s.name, n) in state]
            if head_name is not None and s.name == head_name:
                hooks.append((s.name, kdt, kdt))
            elif head_name is not None and _under(s.name, head_name):
                continue
            elif s.name in by_type or (actions and all(a == "kept" for a in actions)):
                hooks.append((s.name, kdt, target))
    registry.hooks(adapter.name, CastHooks).cast_module(model, plan, hooks)
    if hooks:
        notes.append(f"forward hooks on {len(hooks)} kept module(s): floating inputs to {kdt}, outputs to {target}"
                     + (f"; the head ({head_name or 'the model'}) returns {kdt}" if head_name is not None else ""))
    notes.append("cast in place: the model passed in is the one returned" if inplace
                 else "cast a deep copy: the model passed in is untouched")
    return model, CastReport(target, tuple(rows), tuple(dict.fromkeys(notes)))


def _join(module: str, leaf: str) -> str:
    return f"{module}.{leaf}" if module else leaf
