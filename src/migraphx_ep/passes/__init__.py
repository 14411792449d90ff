"""Passes: each a small named unit ``apply(module) -> changed`` in its own file (STYLE.md §4)."""

from .dead_code_elimination import DEAD_CODE_ELIMINATION, dead_code_elimination
from .manager import Pass, run_passes

__all__ = ["DEAD_CODE_ELIMINATION", "Pass", "dead_code_elimination", "run_passes"]
