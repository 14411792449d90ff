"""Col2Im, TensorScatter and BitCast: one op each (``col2im``, ``tensor_scatter``, ``bit_cast``)."""

from __future__ import annotations

from ...ir.dtypes import DType, to_numpy
from ...ops.base import NUMERIC_TYPES
from ..context import NodeDesc, ParseContext, normalize_axis, onnx_type
from ..table import Unsupported, onnx_op
from .pointwise import check_attrs


def spatial_attr(node: NodeDesc, name: str, n: int, default: int) -> list[int]:
    v = [int(x) for x in node.attr(name, [default] * n)]
    if len(v) != n:
        raise Unsupported(f"{node.op_type}: {name} {v} needs {n} values")
    return v


@onnx_op("Col2Im", min_opset=18)
def parse_col2im(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("dilations", "pads", "strides"))
    x, image_in, block_in = args
    if x.shape.type not in NUMERIC_TYPES:
        raise Unsupported(f"Col2Im of {x.shape.type.name} (overlapping blocks are summed)")
    image = ctx.const_ints(image_in, "Col2Im image_shape")
    block = ctx.const_ints(block_in, "Col2Im block_shape")
    k = len(image)
    if k < 1 or len(block) != k:
        raise Unsupported(f"Col2Im: image_shape {image} and block_shape {block} differ in length")
    return ctx.add(
        "col2im",
        [x],
        image_shape=image,
        block_shape=block,
        strides=spatial_attr(node, "strides", k, 1),
        pads=spatial_attr(node, "pads", 2 * k, 0),
        dilations=spatial_attr(node, "dilations", k, 1),
    )


@onnx_op("TensorScatter", min_opset=24)
def parse_tensor_scatter(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("axis", "mode"))
    mode = node.attr("mode", "linear")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("linear", "circular"):
        raise Unsupported(f"TensorScatter: mode {mode!r}")
    past = args[0]
    axis = normalize_axis(int(node.attr("axis", -2)), past.shape.ndim(), "TensorScatter axis")
    if axis == 0:
        raise Unsupported("TensorScatter: axis 0 is the batch dim")
    ins = [a for a in args if a is not None]
    return ctx.add("tensor_scatter", ins, axis=axis, circular=mode == "circular")


@onnx_op("BitCast", min_opset=26)
def parse_bitcast(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("to",))
    x = args[0]
    to = onnx_type(int(node.attr("to")))
    if DType.bool_type in (x.shape.type, to):
        raise Unsupported("BitCast to or from bool (not every byte is a bool; ORT has no kernel)")
    if x.shape.type_size() != to_numpy(to).itemsize:
        raise Unsupported(f"BitCast: {x.shape.type.name} and {to.name} differ in width")
    return ctx.add("bit_cast", [x], target_type=to)
