"""Linear quantisation: quantizelinear, dequantizelinear, dynamicquantizelinear, quant_dot and
quant_convolution (MIGraphX's int8/fp8 GEMM and convolution: quantised inputs, wide accumulation).

Scales and zero points arrive already broadcast to the data's dims (the parser expands per-axis and
blocked forms), so each op is a plain elementwise formula. Arithmetic is float32 for every float type
below 64 bits, which is what ORT's CPU kernels do for fp16/bf16.
"""

from __future__ import annotations

from typing import ClassVar

import ml_dtypes
import numpy as np

from ..ir.dtypes import FLOAT_TYPES, INT_TYPES, DType
from ..ir.operation import Op, op_class, register_op
from ..ir.shape import Shape, ShapeError, check_shapes
from .nn import Convolution, _pad_spatial, conv_forward, conv_output_lens, windows

QUANT_INT = frozenset({DType.int8_type, DType.uint8_type, DType.int16_type, DType.uint16_type})
FP8 = frozenset({DType.fp8e4m3fn_type, DType.fp8e4m3fnuz_type, DType.fp8e5m2_type, DType.fp8e5m2fnuz_type})
SCALE_TYPES = frozenset({DType.float_type, DType.half_type, DType.bf16_type, DType.double_type})


def compute_type(t: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if t == np.float64 else np.dtype(np.float32)


def saturate_cast(x: np.ndarray, dtype: np.dtype, saturate: bool) -> np.ndarray:
    """Round to nearest even into a float8 type; saturate clamps finite overflow and ±inf to ±max."""
    if saturate:
        hi = float(ml_dtypes.finfo(dtype).max)
        x = np.where(np.isnan(x), x, np.clip(x, -hi, hi))
    return x.astype(dtype)


@register_op
@op_class
class Quantizelinear(Op):
    """y = saturate(round_half_even(x / scale) + zero_point); inputs x, scale[, zero_point]."""

    name: ClassVar[str] = "quantizelinear"
    out_type: DType = DType.uint8_type  # used when there is no zero point input
    saturate: bool = True  # float8 outputs only

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "out_type", DType(self.out_type))

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2, 3).same_dims()
        check_shapes(self.name, inputs[:1]).types(FLOAT_TYPES | {DType.int32_type})
        check_shapes(self.name, inputs[1:2]).types(SCALE_TYPES)
        out = inputs[2].type if len(inputs) == 3 else self.out_type
        if out not in QUANT_INT | FP8:
            raise ShapeError(f"quantizelinear: output type {out.name} is not a quantised type")
        return Shape(out, inputs[0].lens)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        ct = compute_type(args[1].dtype)
        with np.errstate(all="ignore"):
            q = args[0].astype(ct) / args[1].astype(ct)
            if out.type in FP8:
                if len(args) == 3:
                    q = q + args[2].astype(ct)
                return saturate_cast(q, out.dtype, self.saturate)
            info = np.iinfo(out.dtype)
            q = np.rint(q)
            if len(args) == 3:
                q = q + args[2].astype(ct)
            return np.clip(np.nan_to_num(q, nan=0.0), info.min, info.max).astype(out.dtype)

    def attributes(self) -> dict:
        return {"out_type": int(self.out_type), "saturate": self.saturate}


@register_op
@op_class
class Dequantizelinear(Op):
    """y = (x - zero_point) * scale, in the scale's type; inputs x, scale[, zero_point]."""

    name: ClassVar[str] = "dequantizelinear"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2, 3).same_dims()
        check_shapes(self.name, inputs[:1]).types(QUANT_INT | FP8 | {DType.int32_type})
        check_shapes(self.name, inputs[1:2]).types(SCALE_TYPES)
        if len(inputs) == 3 and inputs[2].type != inputs[0].type:
            raise ShapeError("dequantizelinear: zero point type must match the data type")
        return Shape(inputs[1].type, inputs[0].lens)

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        ct = compute_type(args[1].dtype)
        x = args[0]
        if x.dtype.kind in "iu":
            # the difference is exact in int64, then converted once (ORT: int32 difference, then float)
            d = x.astype(np.int64) - (args[2].astype(np.int64) if len(args) == 3 else 0)
            d = d.astype(ct)
        else:
            d = x.astype(ct) - (args[2].astype(ct) if len(args) == 3 else 0)
        return (d * args[1].astype(ct)).astype(out.dtype)


@register_op
@op_class
class Dynamicquantizelinear(Op):
    """ONNX DynamicQuantizeLinear: uint8 asymmetric quantisation with range from the data (and 0).

    Output is a tuple (y, scale, zero_point); read it with ``get_tuple_elem``.
    """

    name: ClassVar[str] = "dynamicquantizelinear"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).types({DType.float_type})
        return Shape.tuple_of(
            [
                Shape(DType.uint8_type, inputs[0].lens),
                Shape(DType.float_type, ()),
                Shape(DType.uint8_type, ()),
            ]
        )

    def compute(self, out: Shape, args: list[np.ndarray]) -> list[np.ndarray]:
        x = args[0].astype(np.float32)
        lo = np.float32(min(0.0, float(x.min()))) if x.size else np.float32(0)
        hi = np.float32(max(0.0, float(x.max()))) if x.size else np.float32(0)
        scale = np.float32((hi - lo) / np.float32(255))
        with np.errstate(all="ignore"):
            zp = np.clip(np.rint(np.float32(0) - lo / scale), 0, 255) if scale else np.float32(0)
            y = np.clip(np.rint(x / scale) + zp, 0, 255) if scale else np.full(x.shape, zp)
        return [np.nan_to_num(y).astype(np.uint8), np.asarray(scale, np.float32), np.asarray(zp, np.uint8)]


# int8 products accumulate exactly in int32 (MIGraphX ``quant_dot``); fp8 ones in float32.
QUANT_GEMM_TYPES = frozenset({DType.int8_type, DType.fp8e4m3fn_type, DType.fp8e4m3fnuz_type})


def quant_acc_type(t: DType) -> DType:
    return DType.int32_type if t == DType.int8_type else DType.float_type


@register_op
@op_class
class QuantDot(Op):
    """Batched matrix product of int8 (-> int32) or fp8 E4M3 (-> float32) operands of one type."""

    name: ClassVar[str] = "quant_dot"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_type().same_ndims().min_ndims(2).types(QUANT_GEMM_TYPES)
        a, b = inputs
        if a.lens[:-2] != b.lens[:-2] or a.lens[-1] != b.lens[-2]:
            raise ShapeError(f"quant_dot: {list(a.lens)} x {list(b.lens)} do not multiply")
        return Shape(quant_acc_type(a.type), (*a.lens[:-1], b.lens[-1]))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        acc = out.dtype if out.type == DType.int32_type else np.dtype(np.float32)
        return np.matmul(args[0].astype(acc), args[1].astype(acc)).astype(out.dtype, copy=False)


@register_op
@op_class
class QuantConvolution(Convolution):
    """``convolution`` of int8 (-> int32) or fp8 E4M3 (-> float32) data and weights of one type."""

    name: ClassVar[str] = "quant_convolution"

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(2).same_type().types(QUANT_GEMM_TYPES)
        x, w = inputs
        p, s, d = self.attrs(x.ndim() - 2)
        return Shape(quant_acc_type(x.type), conv_output_lens(self.name, x, w, p, s, d, self.group))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x, w = args
        p, s, d = self.attrs(x.ndim - 2)
        acc = out.dtype if out.type == DType.int32_type else np.dtype(np.float32)
        return conv_forward(x, w, p, s, d, self.group, out.lens, acc).astype(out.dtype, copy=False)


@register_op
@op_class
class Im2col(Op):
    """A convolution's windows as matrix rows (MIGraphX ``im2col``): row ``n * prod(O) + o`` holds the
    window of output pixel ``o`` of image ``n`` in (kernel..., channel) order, channels fastest (KRSC),
    zeros where the window leaves the input and in the columns past ``prod(kernel) * C`` up to
    ``columns``. The gpu target runs quant_convolution as this matrix times the KRSC weights."""

    name: ClassVar[str] = "im2col"
    kernel: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()  # begins then ends per spatial axis
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    columns: int = 0  # 0: exactly prod(kernel) * C

    def out_spatial(self, x: Shape) -> tuple[int, ...]:
        w = Shape(x.type, (1, x.lens[1], *self.kernel))
        return conv_output_lens(self.name, x, w, self.padding, self.stride, self.dilation, 1)[2:]

    def compute_shape(self, inputs: list[Shape]) -> Shape:
        check_shapes(self.name, inputs).has(1).min_ndims(3)
        x = inputs[0]
        k = x.ndim() - 2
        if not (len(self.kernel) == len(self.stride) == len(self.dilation) == k == len(self.padding) // 2):
            raise ShapeError(f"im2col: kernel/padding/stride/dilation do not match {k} spatial dims")
        taps = int(np.prod(self.kernel)) * x.lens[1]
        if self.columns and self.columns < taps:
            raise ShapeError(f"im2col: {self.columns} columns cannot hold {taps} taps")
        rows = x.lens[0] * int(np.prod(self.out_spatial(x)))
        return Shape(x.type, (rows, self.columns or taps))

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        k = x.ndim - 2
        o = self.out_spatial(Shape.of(x))
        xp = _pad_spatial(x, self.padding)
        win = windows(xp, o, self.kernel, self.stride, self.dilation)  # (N, C, *O, *K)
        cols = win.transpose(0, *range(2, 2 + 2 * k), 1).reshape(x.shape[0] * int(np.prod(o)), -1)
        res = np.zeros(out.lens, x.dtype)
        res[:, : cols.shape[1]] = cols
        return res


__all__ = ["FP8", "QUANT_GEMM_TYPES", "INT_TYPES", "QUANT_INT", "SCALE_TYPES", "saturate_cast"]
