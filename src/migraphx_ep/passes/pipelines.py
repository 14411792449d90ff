"""Pass pipelines per target: plain lists with DCE between steps (MIGraphX ``target.cpp``)."""

from __future__ import annotations

from .dead_code_elimination import DEAD_CODE_ELIMINATION
from .manager import Pass


def ref_pipeline() -> list[Pass]:
    return [DEAD_CODE_ELIMINATION]
