"""Elementwise ONNX ops: generic by-name mapping with multidirectional broadcasting."""

from __future__ import annotations

from ..context import NodeDesc, ParseContext
from ..table import onnx_op

BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul"}
UNARY = {"Relu": "relu", "Neg": "neg", "Exp": "exp"}


@onnx_op(*BINARY)
def parse_binary(ctx: ParseContext, node: NodeDesc, args):
    a, b = args
    return ctx.elementwise(BINARY[node.op_type], a, b)


@onnx_op(*UNARY)
def parse_unary(ctx: ParseContext, node: NodeDesc, args):
    return ctx.add(UNARY[node.op_type], [args[0]])


@onnx_op("Identity")
def parse_identity(ctx: ParseContext, node: NodeDesc, args):
    return args[0]
