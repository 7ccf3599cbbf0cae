"""Casting a model's floating weights (``cast_tree``, ``cast_module``), keeping the layers bf16 harms."""

from bf16bridge.casting.cast import (
    DEFAULT_KEEP_TYPES, DEFAULT_POLICY, FLOATING, HEAD_POLICY, HEAD_TYPES, KEEP_DTYPE, CastReport, LeafCast, Rule,
    cast_module, cast_tree,
)

__all__ = ["DEFAULT_KEEP_TYPES", "DEFAULT_POLICY", "FLOATING", "HEAD_POLICY", "HEAD_TYPES", "KEEP_DTYPE", "CastReport",
           "LeafCast", "Rule", "cast_module", "cast_tree"]
