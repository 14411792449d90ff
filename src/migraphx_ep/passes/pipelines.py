"""Pass pipelines per target: plain lists with DCE between steps (MIGraphX ``target.cpp``)."""

from __future__ import annotations

from .dead_code_elimination import DEAD_CODE_ELIMINATION as DCE
from .eliminate_common_subexpression import ELIMINATE_COMMON_SUBEXPRESSION
from .eliminate_identity import ELIMINATE_IDENTITY
from .manager import Pass
from .normalize_ops import NORMALIZE_OPS
from .propagate_constant import PROPAGATE_CONSTANT
from .simplify_algebra import SIMPLIFY_ALGEBRA
from .simplify_reshapes import SIMPLIFY_RESHAPES


def ref_pipeline() -> list[Pass]:
    # Exact rewrites only: ref is the oracle, so even with fast_math it must not change a single bit.
    return [
        NORMALIZE_OPS,
        ELIMINATE_IDENTITY,
        DCE,
        SIMPLIFY_RESHAPES,
        DCE,
        SIMPLIFY_ALGEBRA,
        DCE,
        PROPAGATE_CONSTANT,
        DCE,
        ELIMINATE_COMMON_SUBEXPRESSION,
        DCE,
    ]
