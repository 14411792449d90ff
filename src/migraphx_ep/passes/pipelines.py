"""Pass pipelines per target: plain lists with DCE between steps (MIGraphX ``target.cpp``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..ir.weights import WeightCache
from .dead_code_elimination import DEAD_CODE_ELIMINATION as DCE
from .eliminate_common_subexpression import ELIMINATE_COMMON_SUBEXPRESSION
from .eliminate_identity import ELIMINATE_IDENTITY
from .manager import Pass
from .normalize_ops import NORMALIZE_OPS
from .propagate_constant import PROPAGATE_CONSTANT, propagate_constant
from .simplify_algebra import SIMPLIFY_ALGEBRA
from .simplify_reshapes import SIMPLIFY_RESHAPES


def ref_pipeline(weights: WeightCache | None = None) -> list[Pass]:
    """``weights``: the subgraph's cache of weight-only results (``ir/weights.py``), shared by the
    compiles of its input shapes; constant folding takes what an earlier compile computed from it."""
    # Exact rewrites only: ref is the oracle, so even with fast_math it must not change a single bit.
    return [
        NORMALIZE_OPS,
        ELIMINATE_IDENTITY,
        DCE,
        SIMPLIFY_RESHAPES,
        DCE,
        SIMPLIFY_ALGEBRA,
        DCE,
        with_weights(PROPAGATE_CONSTANT, propagate_constant, weights),
        DCE,
        ELIMINATE_COMMON_SUBEXPRESSION,
        DCE,
    ]


def with_weights(default: Pass, apply: Callable[..., bool], weights: WeightCache | None) -> Pass:
    """``default``, or the same pass (same name, so the env switches still name it) bound to ``weights``."""
    if weights is None:
        return default
    return Pass(default.name, functools.partial(apply, weights=weights))
