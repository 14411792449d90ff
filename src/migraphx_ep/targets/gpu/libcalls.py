"""What the library calls take (cuBLASLt GEMMs, cuDNN convolutions): the fusion passes read it to decide
what to fuse into a call's epilogue, the lowering to decide what to call. It sits apart from both so the
passes never import the lowering."""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.operation import Op
from ...ir.shape import Shape

GEMM_TYPES = frozenset({DType.float_type, DType.half_type, DType.bf16_type, DType.double_type})

# cuBLASLt has bias/residual epilogues for these; double GEMMs run plain with separate adds.
EPILOGUE_TYPES = frozenset({DType.float_type, DType.half_type, DType.bf16_type})


def dnn_conv(op: Op, out: Shape) -> bool:
    """A convolution cuDNN runs (with its fused epilogue): a float type, 1-3 spatial dims, symmetric
    padding."""
    if out.type not in GEMM_TYPES or out.ndim() not in (3, 4, 5):
        return False
    pad = op.padding  # type: ignore[attr-defined]
    k = len(pad) // 2
    return tuple(pad[:k]) == tuple(pad[k:])


__all__ = ["EPILOGUE_TYPES", "GEMM_TYPES", "dnn_conv"]
