"""Linear algebra beyond ``dot``: the determinant of (batches of) square matrices."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes

DET_TYPES = frozenset({DType.half_type, DType.bf16_type, DType.float_type, DType.double_type})


@register_op
@op_class
class Det(Op):
    """ONNX Det: x (*, M, M) -> (*). LU with partial pivoting (LAPACK ``getrf``) as ORT's Eigen does.

    Narrow floats factor in float32 and round once (ORT converts them to float); a 0x0 matrix has
    determinant 1.
    """

    name: ClassVar[str] = "det"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types(DET_TYPES).min_ndims(2)
        x = inputs[0]
        if x.lens[-1] != x.lens[-2]:
            raise ShapeError(f"{self.name}: matrices {list(x.lens[-2:])} are not square")
        return Shape(x.type, x.lens[:-2])

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        work = np.float64 if x.dtype == np.float64 else np.float32
        with np.errstate(all="ignore"):
            r = np.linalg.det(x.astype(work))
        return np.asarray(r).astype(out.dtype).reshape(out.lens)
