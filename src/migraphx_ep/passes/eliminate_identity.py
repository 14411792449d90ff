"""eliminate_identity: remove ``identity`` instructions by pointing their users at the input."""

from __future__ import annotations

from ..ir.module import Module
from .manager import Pass
from .rewrite import replace_value


def eliminate_identity(m: Module) -> bool:
    changed = False
    for ins in m:
        # Users whose stored layout would change keep reading the identity (it then stays).
        if ins.name == "identity" and len(ins.inputs) == 1:
            changed |= replace_value(m, ins, ins.inputs[0], partial=True)
    return changed


ELIMINATE_IDENTITY = Pass("eliminate_identity", eliminate_identity)
