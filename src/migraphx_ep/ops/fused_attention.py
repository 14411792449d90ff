"""``fused_attention``: softmax(Q K^T * c + bias) V as one instruction that owns the subgraph it stands for.

The gpu target's ``fuse_attention`` pass (``targets/gpu/fuse/attention.py``) replaces the GEMM, scale,
mask, softmax, GEMM (and output transpose) chain that exporters emit by this op; its submodule is that
chain, unchanged, so the op's meaning is the submodule's (``compute_with_modules`` runs it: the ref
semantics, ``verify`` and the lowering simulator need nothing else). The attributes only describe the
chain for the kernel that replaces it (``kernels/attention.py``).
"""

from __future__ import annotations

from typing import ClassVar

from ..ir.module import Module
from ..ir.operation import op_class, register_op
from ..ir.shape import Shape, ShapeError
from .fused import FusedOp, body_output

MASKS = ("none", "bias")


@register_op
@op_class
class FusedAttention(FusedOp):
    """Inputs: Q (..., S, D), K^T (..., D, L) as the first product reads it, V (..., L, Dv), then the
    additive bias (..., S, L) when ``mask`` is ``"bias"``; batch dims (B, H) or (N,); any strides (the
    transposes in front of the products stay views: the kernel reads through their strides). Q, K^T and
    V may also be what their heads are split from (a strided slice of a fused QKV projection): the body
    then starts with that reshape and transpose, which the kernel reads as strides too.

    The chain, in the submodule's order: Q * ``q_scale``, K^T * ``k_scale``, their product, * ``scale``,
    / ``divisor``, + bias, softmax over keys, times V, then the output permuted by ``out_perm`` (empty:
    none). A factor of 1.0 is an op the chain does not have (x * 1 and x / 1 are exact). ``causal``: the
    chain adds a constant mask hiding key j from query i when j > i + L - S (the kernel skips those
    keys). The output is standard: the layout its reader wants, so a head merge after it is a view.
    """

    name: ClassVar[str] = "fused_attention"
    scale: float = 1.0
    divisor: float = 1.0
    q_scale: float = 1.0
    k_scale: float = 1.0
    mask: str = "none"
    causal: bool = False
    head_dim: int = 0
    value_dim: int = 0
    out_perm: tuple[int, ...] = ()

    def arity(self) -> int:
        return 3 + (self.mask == "bias")

    def compute_shape_with_modules(self, inputs: list[Shape], mods: list[Module]) -> Shape:
        if self.mask not in MASKS:
            raise ShapeError(f"{self.name}: mask {self.mask!r} is not one of {MASKS}")
        if len(mods) != 1 or len(inputs) != 3 + (self.mask == "bias"):
            raise ShapeError(
                f"{self.name}: needs one submodule and Q, K^T, V (and the bias with mask 'bias')"
            )
        out = body_output(self.name, inputs, mods[0])
        if out.ndim() not in (3, 4):
            raise ShapeError(f"{self.name}: submodule returns {out}, expected rank 3 or 4")
        rank = out.ndim()
        perm = list(self.out_perm) or list(range(rank))
        if sorted(perm) != list(range(rank)) or out.lens[perm.index(rank - 1)] != self.value_dim:
            raise ShapeError(f"{self.name}: out_perm {perm} and value_dim {self.value_dim} do not fit {out}")
        return out.as_standard()


__all__ = ["MASKS", "FusedAttention"]
