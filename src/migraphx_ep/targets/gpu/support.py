"""What the gpu target can run: the partitioner's question per instruction (``instruction_supported``),
answered by a kernel, a library call or a view of its own (``kernel_supported``), or else by a
decomposition into instructions that have one (``decompose/``), and per module (``unsupported``).
"""

from __future__ import annotations

from ...ir.instruction import Instruction
from ...ir.module import Module
from ...ir.operation import OPS, ModuleOp, Op
from . import kernels as K
from .gqa import gqa_supported
from .kernels.attention import attention_supported
from .libcalls import GEMM_TYPES
from .quant import device_reason, quant_supported
from .views import is_view

# What fuse/ makes besides fused_attention: each one step (a kernel or a library call), or, where its
# library does not load, the steps of its body.
FUSED = frozenset({"fused_layernorm", "fused_gemm", "fused_conv", "fused_pointwise"})


IDENTITY: Op = OPS["identity"]()  # a pointwise copy (bit_cast's view, the lowering's relayouts)


def instruction_supported(ins: Instruction, cc: tuple[int, int] | None = None) -> str | None:
    """None when the gpu target can lower ``ins`` alone, with a kernel of its own or through its
    decomposition (``decompose``); else why not (the partitioner's question). ``cc``: the GPU's compute
    capability, for what needs a newer one (fp8); None when unknown (nothing is refused for it)."""
    if ins.name == "dimensions_of":  # the pipeline's first pass reads it from an input (runtime_dims.py)
        return None if ins.inputs[0].is_param() else "dimensions_of of a computed value"
    reason = kernel_supported(ins)
    if reason is None:
        return device_reason(ins, cc)
    from .decompose import decomposition_supported  # decompose builds on this module

    return decomposition_supported(ins, reason, cc)


def kernel_supported(ins: Instruction) -> str | None:
    """None when ``ins`` lowers to a step of its own (a kernel, a library call, a view); else why not."""
    if ins.is_param() or ins.is_literal() or ins.is_return() or is_view(ins):
        return None
    if ins.name == "fused_attention":
        return attention_supported(ins.op, [a.shape for a in ins.inputs], ins.shape, ins.module_args[0])
    if ins.name in FUSED:  # made by fuse/ from instructions with kernels: each lowers as its body does
        return next(filter(None, map(kernel_supported, ins.module_args[0].instructions)), None)
    if isinstance(ins.op, ModuleOp) or ins.module_args:
        return f"{ins.name}: control flow does not run on the gpu target"
    if ins.name == "bit_cast":  # a view of the same bytes (element widths are equal)
        return K.pointwise_supported(IDENTITY, [ins.inputs[0].shape.type, ins.shape.type])
    if ins.name == "layout":  # a copy kernel into the layout, or none (conv_lowering.laid_out)
        return K.pointwise_supported(IDENTITY, [ins.shape.type, ins.shape.type])
    if ins.name == "group_query_attention":
        return gqa_supported(ins)
    if ins.name == "get_tuple_elem" and ins.inputs[0].name == "group_query_attention":
        return kernel_supported(ins.inputs[0])
    if ins.name in ("quant_dot", "quant_convolution", "quantizelinear"):
        return quant_supported(ins)
    if ins.name in ("dot", "convolution", "reshape", "flatten", "contiguous"):
        if ins.name == "convolution" and ins.shape.type not in GEMM_TYPES:
            return K.supported(ins.op, [a.shape for a in ins.inputs], ins.shape)
        if ins.name == "dot" and ins.shape.type not in GEMM_TYPES:
            return K.supported(ins.op, [a.shape for a in ins.inputs], ins.shape)
        return None
    if ins.name in K.POINTWISE_OPS:  # a lone one; fuse/pointwise.py's is_pointwise when supported
        return K.pointwise_supported(ins.op, [a.shape.type for a in ins.inputs])
    return K.supported(ins.op, [a.shape for a in ins.inputs], ins.shape)


def unsupported(module: Module, cc: tuple[int, int] | None = None) -> str | None:
    """Why the gpu target cannot lower ``module`` (its first instruction without a kernel), or None."""
    for ins in module.instructions:
        reason = instruction_supported(ins, cc)
        if reason is not None:
            return reason
    return None


__all__ = ["FUSED", "IDENTITY", "instruction_supported", "kernel_supported", "unsupported"]
