"""dead_code_elimination: remove instructions whose results nothing reads."""

from __future__ import annotations

from ..ir.module import Module
from .manager import Pass


def dead_code_elimination(m: Module) -> bool:
    if m.get_return() is None:
        return False  # without a return, the last instruction is the output: nothing is provably dead
    changed = False
    for ins in reversed(m.instructions[:]):
        if ins.outputs or ins.is_return() or ins.is_param():
            continue
        m.remove_instruction(ins)
        changed = True
    return changed


DEAD_CODE_ELIMINATION = Pass("dead_code_elimination", dead_code_elimination)
