"""What a cast keeps, and in which dtype: the rules (``Rule``), the default policies, and the
dtypes a cast targets.

A policy is data: a tuple of ``Rule``, each a pattern over leaf labels (``DEFAULT_POLICY``,
``HEAD_POLICY``) or over a module's class names (``DEFAULT_KEEP_TYPES``). ``Decide`` applies a
policy to the labels of one tree. docs/casting.md says why each rule is there.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.errors import InvalidArgumentError


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

#: the dtypes a cast may target, and the floating leaves it casts: bf16 and the standard floats.
#: The narrow floats (fp8, fp6, fp4) mean something only with their scales: a cast skips them, saying so
FLOATING = ("bfloat16", "float16", "float32", "float64")


class Decide:
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


# -- arguments -----------------------------------------------------------------------------------

def target_dtype(dtype, what: str) -> str:
    """The bridge name of the target dtype, or our error listing the choices."""
    name = dtype if isinstance(dtype, str) else None
    if name is None and dtype is not None:  # (np.dtype(None) is float64: a cast to it without a word)
        try:
            name = dtypes.name_of_numpy(np.dtype(dtype))
        except TypeError:
            name = None
    if name in FLOATING:
        return name
    if name is not None and narrow_float(name):
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


def rules_of(rules, what: str, default_why: str) -> tuple[Rule, ...]:
    """``keep=`` / ``policy=`` as rules: a pattern (str), a ``Rule``, or an iterable of them."""
    if rules is None:
        return ()
    if isinstance(rules, (str, Rule)):
        rules = (rules,)
    elif not isinstance(rules, Iterable):
        rules = (rules,)  # refused below, naming it (iterating it would raise Python's own TypeError)
    out = []
    for r in rules:
        if isinstance(r, Rule):
            out.append(r)
        elif isinstance(r, str):
            out.append(Rule(r, r, default_why))
        else:
            raise InvalidArgumentError(
                f"{what}: {r!r} is neither a pattern (str) nor a bf16bridge.casting.Rule; "
                f"pass patterns such as 'lm_head' or Rule(name, pattern, why)"
            )
    return tuple(out)


def keep_dtype_of(keep_dtype, what: str) -> str | None:
    """``keep_dtype=`` as a bridge dtype name (None: kept leaves stay as they are)."""
    return None if keep_dtype is None else target_dtype(keep_dtype, f"{what} keep_dtype")


# -- leaves' dtypes -------------------------------------------------------------------------------

def is_floating(name: str) -> bool:
    """Whether a leaf of dtype ``name`` is one a cast changes."""
    return name in FLOATING


def narrow_float(name: str) -> bool:
    """An fp8 / fp6 / fp4 row of the dtype table (a carried float that is no cast target)."""
    row = dtypes.ROWS.get(name)
    return row is not None and row.kind == "float" and name not in FLOATING


def skip_why(name: str) -> str:
    """Why a leaf of dtype ``name`` is skipped, in the report's words."""
    if narrow_float(name):
        return "a quantised float: its values need their scales; cast it with them"
    return "not floating" if name in dtypes.ROWS else "a dtype bf16bridge does not carry"
