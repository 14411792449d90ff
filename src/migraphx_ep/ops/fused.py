"""Fused ops of the gpu target's fusion passes (``targets/gpu/fuse/``): layernorm, GEMM and convolution
with their epilogues, chains of elementwise ops, each one instruction that owns the subgraph it stands
for as its one submodule.

As for ``fused_attention``: the submodule is the matched chain, unchanged, so the op's meaning is the
submodule's (``compute_with_modules`` runs it: the ref semantics, ``verify`` and the lowering simulator
need nothing else). The attributes only describe the chain for the kernel or library call replacing it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.module import Module
from ..ir.operation import ModuleOp, RunModule, op_class, register_op
from ..ir.shape import Shape, ShapeError, follow_channels_last


def body_output(name: str, inputs: list[Shape], body: Module, same_type: bool = True) -> Shape:
    """The one value a fused op's ``body`` returns, once its parameters match ``inputs`` (type and dims)
    and, with ``same_type``, the value has the first input's type; a ShapeError naming ``name`` if not."""
    params = list(body.get_parameter_shapes().values())
    if len(params) != len(inputs):
        raise ShapeError(f"{name}: submodule takes {len(params)} parameters, given {len(inputs)}")
    for p, s in zip(params, inputs, strict=True):
        if (p.type, p.lens) != (s.type, s.lens):
            raise ShapeError(f"{name}: submodule expects {p}, given {s}")
    outs = body.get_output_shapes()
    if len(outs) != 1 or (same_type and outs[0].type != inputs[0].type):
        raise ShapeError(f"{name}: submodule returns {outs}, expected one {inputs[0].type.name} value")
    return outs[0]


@op_class
class FusedOp(ModuleOp):
    """A chain as one op: its inputs are the body's parameters in order, its output the body's one
    value, of the first input's type unless ``converts`` (the body may then widen its input and narrow
    its result). Laid out standard (the kernel or library call writes it so) unless ``layout_from``
    says which inputs' channels-last layout it keeps (the gpu target's layout pass made them so)."""

    converts: ClassVar[bool] = False

    def arity(self) -> int:
        raise NotImplementedError(self.name)

    def layout_from(self, inputs: list[Shape], out: Shape) -> list[Shape]:
        return []

    def compute_shape_with_modules(self, inputs: list[Shape], mods: list[Module]) -> Shape:
        if len(mods) != 1 or len(inputs) != self.arity():
            raise ShapeError(
                f"{self.name}: needs one submodule and {self.arity()} inputs, given {len(inputs)}"
            )
        out = body_output(self.name, inputs, mods[0], same_type=not self.converts).as_standard()
        return follow_channels_last(out, self.layout_from(inputs, out))

    def compute_with_modules(
        self, out: Shape, args: list[np.ndarray], mods: list[Module], run: RunModule
    ) -> np.ndarray:
        body = mods[0]
        (res,) = run(body, dict(zip(body.get_parameter_names(), args, strict=True)))
        res = np.asarray(res)
        return np.ascontiguousarray(res).reshape(res.shape)  # ascontiguousarray alone makes 0-d 1-d


@register_op
@op_class
class FusedLayernorm(FusedOp):
    """Inputs: x, then gamma when ``scale``, then beta when ``bias`` (both in x's dims, broadcast over
    the dims before ``axis``). The body: (x - mean) / sqrt(var + ``epsilon``) over the dims from
    ``axis`` on (any of its three spellings), times gamma, plus beta; x may be widened from half to
    float first and the norm narrowed back before gamma (the kernel computes in float either way)."""

    name: ClassVar[str] = "fused_layernorm"
    converts: ClassVar[bool] = True
    axis: int = -1
    epsilon: float = 1e-5
    scale: bool = False
    bias: bool = False

    def arity(self) -> int:
        return 1 + self.scale + self.bias


@op_class
class FusedEpilogue(FusedOp):
    """Inputs: the product's two operands, then the bias when ``bias`` (broadcast along the output
    channels), then the residual when ``residual`` (the output's dims, standard). The body: the product,
    + bias, + residual, then relu when ``relu``."""

    bias: bool = False
    residual: bool = False
    relu: bool = False

    def arity(self) -> int:
        return 2 + self.bias + self.residual


@register_op
@op_class
class FusedGemm(FusedEpilogue):
    """``dot`` with its epilogue: one cuBLASLt call (bias along the last dim)."""

    name: ClassVar[str] = "fused_gemm"


@register_op
@op_class
class FusedConv(FusedEpilogue):
    """``convolution`` with its epilogue: one cuDNN call, or one cuBLASLt GEMM for a 1x1 convolution on
    channels-last activations (bias along dim 1)."""

    name: ClassVar[str] = "fused_conv"

    def layout_from(self, inputs: list[Shape], out: Shape) -> list[Shape]:
        return inputs[:1]  # the activations' layout, as ``convolution``


@register_op
@op_class
class FusedPointwise(FusedOp):
    """A chain of elementwise ops: one generated kernel. Inputs: the body's parameters, any number, any
    types (a compare's bool, a convert's source); one-element constants the chain reads are literals
    inside the body, so the kernel source carries them. Its output is the chain's last value."""

    name: ClassVar[str] = "fused_pointwise"
    converts: ClassVar[bool] = True

    def compute_shape_with_modules(self, inputs: list[Shape], mods: list[Module]) -> Shape:
        if len(mods) != 1:
            raise ShapeError(f"{self.name}: needs one submodule, given {len(mods)}")
        out = body_output(self.name, inputs, mods[0], same_type=False).as_standard()
        return follow_channels_last(out, self.layout_from(inputs, out))

    def layout_from(self, inputs: list[Shape], out: Shape) -> list[Shape]:
        return [s for s in inputs if s.lens == out.lens]  # elementwise: its full-size inputs' layout


__all__ = [
    "body_output",
    "FusedConv",
    "FusedEpilogue",
    "FusedGemm",
    "FusedLayernorm",
    "FusedOp",
    "FusedPointwise",
]
