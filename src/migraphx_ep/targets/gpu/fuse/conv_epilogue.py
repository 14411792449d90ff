"""fuse_conv_epilogue: ``convolution`` + per-channel bias (+ residual) (+ relu) becomes one ``fused_conv``
instruction that owns the chain (STYLE §6), lowered to one cuDNN call with its fused epilogue, or, for a
1x1 convolution on channels-last activations, one cuBLASLt GEMM with it.

The rule is ``epilogue.py``'s, bias along dim 1, for the convolutions cuDNN takes (``dnn_conv``). The
gpu pipeline runs it only where cuDNN loads; ``MIGRAPHX_EP_CONV_EPILOGUE=kernel`` turns it off (the
epilogue then runs as one generated pointwise kernel after a plain cuDNN convolution).
"""

from __future__ import annotations

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ops.fused import FusedConv
from ....passes.manager import Pass
from ....passes.rewrite import Pattern, Predicate, op, var
from ....switches import env_choice
from ..libcalls import dnn_conv
from .epilogue import EpilogueRule, bias_along, both


def _on_dnn(ins: Instruction) -> bool:
    return dnn_conv(ins.op, ins.shape)


def _conv(when: Predicate) -> Pattern:
    return op("convolution", var("x"), var("w"), bind="product", when=both(when, _on_dnn))


def _channels(v: Instruction) -> int:
    return 1


CONV_EPILOGUE = EpilogueRule("fuse_conv_epilogue", FusedConv, ("x", "w"), _conv, bias_along(_channels))


def fuse_conv_epilogue(m: Module) -> bool:
    if env_choice("MIGRAPHX_EP_CONV_EPILOGUE", "cudnn", ("cudnn", "kernel")) == "kernel":
        return False
    return CONV_EPILOGUE.apply(m)


FUSE_CONV_EPILOGUE = Pass("fuse_conv_epilogue", fuse_conv_epilogue)

__all__ = ["CONV_EPILOGUE", "FUSE_CONV_EPILOGUE", "fuse_conv_epilogue"]
