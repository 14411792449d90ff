"""fuse_gemm_epilogue: ``dot`` + bias (+ residual) (+ relu) becomes one ``fused_gemm`` instruction that
owns the chain (STYLE §6), lowered to one cuBLASLt call whose epilogue adds the bias row and the residual
(as C) and applies the relu (CUBLASLT_EPILOGUE_RELU_BIAS / _RELU).

The rule is ``epilogue.py``'s, bias along the last axis. The gpu pipeline runs it only where cuBLASLt
loads: generated GEMM kernels have no epilogue (there the adds and the relu stay pointwise kernels).
"""

from __future__ import annotations

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ops.fused import FusedGemm
from ....passes.rewrite import Pattern, Predicate, op, var
from ..lowering import EPILOGUE_TYPES
from .epilogue import EpilogueRule, bias_along, both


def _epilogue_type(ins: Instruction) -> bool:
    return ins.shape.type in EPILOGUE_TYPES


def _gemm(when: Predicate) -> Pattern:
    return op("dot", var("a"), var("b"), bind="product", when=both(when, _epilogue_type))


def _last_axis(v: Instruction) -> int:
    return v.shape.ndim() - 1


GEMM_EPILOGUE = EpilogueRule("fuse_gemm_epilogue", FusedGemm, ("a", "b"), _gemm, bias_along(_last_axis))


def fuse_gemm_epilogue(m: Module) -> bool:
    return GEMM_EPILOGUE.apply(m)


FUSE_GEMM_EPILOGUE = GEMM_EPILOGUE.as_pass()

__all__ = ["FUSE_GEMM_EPILOGUE", "GEMM_EPILOGUE", "fuse_gemm_epilogue"]
