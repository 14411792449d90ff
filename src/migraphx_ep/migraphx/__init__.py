"""The MIGraphX Python API over this compiler: ``import migraphx_ep.migraphx as migraphx``.

Thin wrappers where the real API differs from the IR (``shape.type()`` is a method, ``program.run``
returns ``argument``s); the IR objects themselves (instructions, ops, targets) are used as they are.
"""

from .. import ops as _ops  # noqa: F401 - fills the op table
from ..ir.instruction import Instruction as instruction
from ..ir.program import Target as target
from ..ir.shape import DynamicDimension as dynamic_dimension
from ..targets import TargetError, get_target
from .parse import parse_onnx, parse_onnx_buffer, parse_tf
from .program import autocast_fp8, load, module, op, program, quantize_fp16, quantize_int8, save
from .values import (
    argument,
    argument_from_pointer,
    create_argument,
    fill_argument,
    generate_argument,
    generate_inputs,
    shape,
)

__all__ = [
    "TargetError",
    "argument",
    "argument_from_pointer",
    "autocast_fp8",
    "create_argument",
    "dynamic_dimension",
    "fill_argument",
    "generate_argument",
    "generate_inputs",
    "get_target",
    "instruction",
    "load",
    "module",
    "op",
    "parse_onnx",
    "parse_onnx_buffer",
    "parse_tf",
    "program",
    "quantize_fp16",
    "quantize_int8",
    "save",
    "shape",
    "target",
]
