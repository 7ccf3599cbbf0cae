"""Casting a model's floating weights (``cast_tree``, ``cast_module``), keeping the layers bf16 harms.

``rules`` holds the policies (data: ``Rule`` tuples) and the dtypes a cast targets; ``report`` what
a cast did (``CastReport``); ``tree`` casts a tree of weights; ``module`` a model object in place.
Nothing here names a framework: a leaf's cast is ``Adapter.cast``, a model's walk ``CastHooks``.
"""

from bf16bridge.casting.module import cast_module
from bf16bridge.casting.report import CastReport, LeafCast
from bf16bridge.casting.rules import (
    DEFAULT_KEEP_TYPES, DEFAULT_POLICY, FLOATING, HEAD_POLICY, HEAD_TYPES, KEEP_DTYPE, Rule,
)
from bf16bridge.casting.tree import cast_tree

__all__ = ["DEFAULT_KEEP_TYPES", "DEFAULT_POLICY", "FLOATING", "HEAD_POLICY", "HEAD_TYPES", "KEEP_DTYPE", "CastReport",
           "LeafCast", "Rule", "cast_module", "cast_tree"]
