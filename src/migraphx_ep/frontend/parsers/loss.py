"""Loss parsers: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12+)."""

from __future__ import annotations

from ...ir.dtypes import DType
from ..context import NodeDesc, ParseContext
from ..table import Unsupported, onnx_op

LOSS_DTYPES = {DType.half_type, DType.float_type, DType.double_type, DType.bf16_type}


def loss_attrs(node: NodeDesc) -> dict:
    red = node.attr("reduction", "mean")
    red = red.decode() if isinstance(red, bytes) else str(red)
    if red not in ("none", "sum", "mean"):
        raise Unsupported(f"{node.op_type} reduction {red!r}")
    ii = node.attr("ignore_index")
    return dict(reduction=red, ignore_index=int(ii or 0), has_ignore=ii is not None)


def nll_args(node: NodeDesc, args) -> list:
    x, t = args[0], args[1]
    w = args[2] if len(args) > 2 else None
    if x.shape.type not in LOSS_DTYPES:
        raise Unsupported(f"{node.op_type} of {x.shape.type.name}")
    if x.shape.ndim() < 2:
        raise Unsupported(f"{node.op_type} needs input of rank >= 2")
    if t.shape.type not in (DType.int32_type, DType.int64_type):
        raise Unsupported(f"{node.op_type} target of {t.shape.type.name}")
    if t.shape.lens != (x.shape.lens[0],) + x.shape.lens[2:]:
        raise Unsupported(f"{node.op_type} target dims {list(t.shape.lens)} for input {list(x.shape.lens)}")
    if w is not None and (w.shape.lens != (x.shape.lens[1],) or w.shape.type != x.shape.type):
        raise Unsupported(f"{node.op_type} weight must be ({x.shape.lens[1]},) of the input type")
    return [x, t] + ([w] if w is not None else [])


@onnx_op("NegativeLogLikelihoodLoss", min_opset=12)
def parse_nll_loss(ctx: ParseContext, node: NodeDesc, args):
    return ctx.add("nll_loss", nll_args(node, args), **loss_attrs(node))


@onnx_op("SoftmaxCrossEntropyLoss", min_opset=12)
def parse_softmax_cross_entropy_loss(ctx: ParseContext, node: NodeDesc, args):
    ins = nll_args(node, args)
    log_prob = ctx.add("logsoftmax", [ins[0]], axis=1)
    loss = ctx.add("nll_loss", [log_prob] + ins[1:], **loss_attrs(node))
    return [loss, log_prob]
