"""Passes: each a small named unit ``apply(module) -> changed`` in its own file (STYLE.md §4)."""

from .dead_code_elimination import DEAD_CODE_ELIMINATION, dead_code_elimination
from .eliminate_common_subexpression import ELIMINATE_COMMON_SUBEXPRESSION, eliminate_common_subexpression
from .eliminate_identity import ELIMINATE_IDENTITY, eliminate_identity
from .manager import Pass, run_passes
from .normalize_ops import NORMALIZE_OPS, normalize_ops
from .propagate_constant import PROPAGATE_CONSTANT, propagate_constant
from .simplify_algebra import (
    SIMPLIFY_ALGEBRA,
    SIMPLIFY_ALGEBRA_FAST_MATH,
    simplify_algebra,
    simplify_algebra_fast_math,
)
from .simplify_reshapes import SIMPLIFY_RESHAPES, simplify_reshapes

__all__ = [
    "DEAD_CODE_ELIMINATION",
    "ELIMINATE_COMMON_SUBEXPRESSION",
    "ELIMINATE_IDENTITY",
    "NORMALIZE_OPS",
    "PROPAGATE_CONSTANT",
    "Pass",
    "SIMPLIFY_ALGEBRA",
    "SIMPLIFY_ALGEBRA_FAST_MATH",
    "SIMPLIFY_RESHAPES",
    "dead_code_elimination",
    "eliminate_common_subexpression",
    "eliminate_identity",
    "normalize_ops",
    "propagate_constant",
    "run_passes",
    "simplify_algebra",
    "simplify_algebra_fast_math",
    "simplify_reshapes",
]
