"""decompose_ops: an instruction the gpu target has no kernel for becomes instructions it has kernels
for (MIGraphX rewrites such ops for its gpu target the same way): attention into dot + softmax +
pointwise, nll_loss into gathers + pointwise + reductions, quantizelinear into pointwise, rnn/gru/lstm
unrolled into per-step GEMMs + pointwise, ...

One small function per op, in the ``DECOMPOSITIONS`` table (op name -> function(builder, ins) returning
the replacement value, or the list of tuple elements for an op with a tuple result). A decomposition
reads only shapes and attributes, never input values, so whether it lowers is decided once per op and
input shapes by decomposing a copy (``decomposition_supported``): the partitioner claims it exactly
when every instruction it emits has a kernel. A function raises ``Unsupported`` for a case it cannot
reproduce exactly. The ref target never runs this pass: the op's own ``compute`` stays the oracle,
and tests check every decomposition against it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ir.operation import make_op
from ....ir.shape import Shape
from ....ir.weights import WeightCache
from ....passes.dead_code_elimination import DEAD_CODE_ELIMINATION as DCE
from ....passes.manager import Pass
from ....passes.pipelines import ref_pipeline, with_weights
from ....passes.simplify_qdq import SIMPLIFY_QDQ
from ..kernels.spec import Unsupported
from ..support import kernel_supported
from .attention import decompose_attention, decompose_rotary_embedding
from .builder import Builder
from .control import decompose_scan
from .conv import decompose_convolution_backwards
from .linalg import decompose_einsum, decompose_lrn
from .loss import decompose_nll_loss
from .quant import decompose_dequantizelinear, decompose_dynamicquantizelinear, decompose_quantizelinear
from .rnn import decompose_recurrent
from .scatter import (
    decompose_max_unpool,
    decompose_scatter_elements,
    decompose_scatternd,
    decompose_tensor_scatter,
)
from .sequence import decompose_reverse_sequence
from .signal import decompose_dft

Decomposition = Callable[[Builder, Instruction], "Instruction | list[Instruction]"]

DECOMPOSITIONS: dict[str, Decomposition] = {
    "attention": decompose_attention,
    "rotary_embedding": decompose_rotary_embedding,
    "nll_loss": decompose_nll_loss,
    "quantizelinear": decompose_quantizelinear,
    "dequantizelinear": decompose_dequantizelinear,
    "dynamicquantizelinear": decompose_dynamicquantizelinear,
    "einsum": decompose_einsum,
    "lrn": decompose_lrn,
    "reverse_sequence": decompose_reverse_sequence,
    "convolution_backwards": decompose_convolution_backwards,
    **{k: decompose_recurrent for k in ("rnn", "gru", "lstm")},
    "tensor_scatter": decompose_tensor_scatter,
    "max_unpool": decompose_max_unpool,
    "dft": decompose_dft,
    "scan": decompose_scan,
    **{f"scatter_{r}": decompose_scatter_elements for r in ("none", "add", "mul", "max", "min")},
    **{f"scatternd_{r}": decompose_scatternd for r in ("none", "add", "mul", "max", "min")},
}


@functools.lru_cache(maxsize=4096)
def _check(op: object, shapes: tuple[Shape, ...]) -> str | None:
    """Why the decomposition of ``op`` on inputs of ``shapes`` does not lower (None: it does)."""
    m = Module("decompose_check")
    args = [m.add_parameter(f"x{i}", s) for i, s in enumerate(shapes)]
    ins = m.add_instruction(op, args)  # type: ignore[arg-type]
    try:
        _replace(m, ins, DECOMPOSITIONS[ins.name](Builder(m, ins), ins))
    except Unsupported as e:
        return f"{ins.name}: {e}"
    for new in m.instructions:
        reason = None if new is ins or new.is_param() else kernel_supported(new)
        if reason is not None:
            return f"{ins.name} (decomposed): {reason}"
    return None


def decomposition_supported(
    ins: Instruction, reason: str | None = None, cc: tuple[int, int] | None = None
) -> str | None:
    """None when ``ins`` lowers through its decomposition; else why not (``reason``: the kernel's;
    ``cc``: as ``instruction_supported``'s)."""
    if ins.name == "get_tuple_elem":  # an element of a decomposed tuple is a plain value
        src = ins.inputs[0]
        return _decomposes(src, cc) if src.name in DECOMPOSITIONS else reason
    return _decomposes(ins, cc) if ins.name in DECOMPOSITIONS else reason


def _decomposes(ins: Instruction, cc: tuple[int, int] | None) -> str | None:
    if ins.module_args:
        return _check_with_modules(ins, cc)
    return _check(ins.op, tuple(a.shape for a in ins.inputs))


def _check_with_modules(ins: Instruction, cc: tuple[int, int] | None) -> str | None:
    """``_check`` for an op owning submodules (scan): decomposed on a copy, and what it inlines from
    them may itself decompose. Not memoised: a key would have to hold the submodules' contents."""
    from ..support import instruction_supported  # support imports this package

    m = Module("decompose_check")
    args = [m.add_parameter(f"x{i}", a.shape) for i, a in enumerate(ins.inputs)]
    copy = m.add_instruction(ins.op, args, ins.module_args)
    try:
        DECOMPOSITIONS[copy.name](Builder(m, copy), copy)
    except Unsupported as e:
        return str(e)
    for new in m.instructions:
        reason = None if new is copy or new.is_param() else instruction_supported(new, cc)
        if reason is not None:
            return f"{ins.name} (decomposed): {reason}"
    return None


def _replace(m: Module, ins: Instruction, new: Instruction | list[Instruction]) -> None:
    """Point the users of ``ins`` (of its tuple elements, for a list) at ``new``."""
    if isinstance(new, Instruction):
        m.replace_all_uses(ins, _same_shape(m, ins, new))
        return
    for user in list(dict.fromkeys(ins.outputs)):
        if user.name != "get_tuple_elem":
            raise Unsupported(f"{ins.name}: its tuple is read by {user.name}")
        m.replace_all_uses(user, _same_shape(m, user, new[user.op.index]))  # type: ignore[attr-defined]


def _same_shape(m: Module, old: Instruction, new: Instruction) -> Instruction:
    """``new`` laid out like ``old`` (users computed their shapes from old's strides)."""
    if new.shape == old.shape:
        return new
    if old.shape.standard() and new.shape.lens == old.shape.lens and new.shape.type == old.shape.type:
        return m.insert_instruction(old, make_op("contiguous"), [new])
    raise Unsupported(f"{old.name}: decomposed to {new.shape}, expected {old.shape}")


def decompose_ops(m: Module) -> bool:
    """Replace each instruction without a gpu kernel whose decomposition lowers by that decomposition.
    An unrolled scan inlines its body's instructions, which may need decomposing in turn: sweep again."""
    changed, again = False, True
    done: set[int] = set()  # replaced, left to DCE with their get_tuple_elem users
    while again:
        again = False
        for ins in m:
            if ins.name not in DECOMPOSITIONS or id(ins) in done or kernel_supported(ins) is None:
                continue
            if decomposition_supported(ins) is not None:
                continue  # left alone: the lowering refuses it with its own reason
            _replace(m, ins, DECOMPOSITIONS[ins.name](Builder(m, ins), ins))
            done.add(id(ins))
            again = again or bool(ins.module_args)
            changed = True
    return changed


DECOMPOSE_OPS = Pass("decompose_ops", decompose_ops)


def gpu_pipeline(
    weights: WeightCache | None = None, use_blas: bool = True, use_dnn: bool = True
) -> list[Pass]:
    """The gpu target's passes: dot/convolution of dequantised int8/fp8 operands become quant_dot /
    quant_convolution first (MIGraphX's gpu pipeline does too; the ref keeps dequantise-first as its
    oracle), then decompositions, so the shared simplifications see their parts (``weights``: see
    ``ref_pipeline``); fusions next, on the simplified chains they match, library epilogues only for
    the libraries that load (``use_blas``: cuBLASLt, ``use_dnn``: cuDNN); the layout of convolutions'
    activations last (layout.py), on the fused instructions the lowering runs. Run-time dims before all:
    their check reads the program as parsed (runtime_dims.py)."""
    from ..fuse import fusion_passes
    from ..fuse.horizontal import FUSE_HORIZONTAL_DOTS, fuse_horizontal_dots
    from ..layout import layout_pass
    from ..runtime_dims import DIMS_AS_INPUTS

    return [
        DIMS_AS_INPUTS,
        SIMPLIFY_QDQ,
        DCE,
        DECOMPOSE_OPS,
        DCE,
        *[with_weights(FUSE_HORIZONTAL_DOTS, fuse_horizontal_dots, weights), DCE] * use_blas,
        *ref_pipeline(weights),
        *fusion_passes(use_blas, use_dnn),
        layout_pass(use_blas, use_dnn),
    ]


__all__ = ["DECOMPOSE_OPS", "DECOMPOSITIONS", "decompose_ops", "decomposition_supported", "gpu_pipeline"]
