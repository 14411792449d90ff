"""fuse_gemm_epilogue: ``dot`` + bias (+ residual) (+ relu) becomes one ``fused_gemm`` instruction that
owns the chain (STYLE §6), lowered to one cuBLASLt call whose epilogue adds the bias row and the residual
(as C) and applies the relu (CUBLASLT_EPILOGUE_RELU_BIAS / _RELU).

The rule is ``epilogue.py``'s, bias along the last axis. The gpu pipeline runs it only where cuBLASLt
loads: generated GEMM kernels have no epilogue (there the adds and the relu stay pointwise kernels).

First, a residual added to a reshaped product moves inside the reshape: GPT-2's Conv1D is
``reshape(x2d @ W + b) + residual`` (the GEMM on rows, the residual in [B, S, E]), which becomes
``reshape(x2d @ W + b + reshape(residual))``, so the residual joins the epilogue. Both reshapes are
views of standard buffers; the sum is the same element for element.
"""

from __future__ import annotations

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ops.fused import FusedGemm
from ....passes.dead_code_elimination import dead_code_elimination
from ....passes.manager import Pass
from ....passes.rewrite import Builder, Pattern, Predicate, Rule, any_of, apply_rules, once, op, var
from ..libcalls import EPILOGUE_TYPES
from .epilogue import EpilogueRule, bias_along, both


def _epilogue_type(ins: Instruction) -> bool:
    return ins.shape.type in EPILOGUE_TYPES


def _gemm(when: Predicate) -> Pattern:
    return op("dot", var("a"), var("b"), bind="product", when=both(when, _epilogue_type))


def _last_axis(v: Instruction) -> int:
    return v.shape.ndim() - 1


GEMM_EPILOGUE = EpilogueRule("fuse_gemm_epilogue", FusedGemm, ("a", "b"), _gemm, bias_along(_last_axis))


def _standard(v: Instruction) -> bool:
    return v.shape.standard()


def _standard_once(v: Instruction) -> bool:
    return once(v) and v.shape.standard()


_PRODUCT = any_of(
    op("add", _gemm(once), var("bias", bias_along(_last_axis)), bind="inner", when=_standard_once),
    op("dot", var("a"), var("b"), bind="inner", when=both(_standard_once, _epilogue_type)),
)
_RESHAPED_SUM = op("add", op("reshape", _PRODUCT, bind="view", when=once), var("residual", _standard))


def _lift(r: Builder) -> Instruction:
    inner = r.inner
    residual = r.op("reshape", r.residual, dims=list(inner.shape.lens))
    return r.op("reshape", r.op("add", inner, residual), dims=list(r.root.shape.lens))


LIFT_RESHAPE = Rule(_RESHAPED_SUM, _lift, None, "residual into a reshaped GEMM")


def fuse_gemm_epilogue(m: Module) -> bool:
    lifted = False if GEMM_EPILOGUE.skips(m) else apply_rules(m, [LIFT_RESHAPE])
    if lifted:
        dead_code_elimination(m)  # the old reshape still reads the product: it would not be read once
    return GEMM_EPILOGUE.apply(m) or lifted


FUSE_GEMM_EPILOGUE = Pass("fuse_gemm_epilogue", fuse_gemm_epilogue)

__all__ = ["FUSE_GEMM_EPILOGUE", "GEMM_EPILOGUE", "fuse_gemm_epilogue"]
