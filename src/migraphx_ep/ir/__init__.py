"""The compiler's IR, modelled on MIGraphX: shape, argument, operation, instruction, module, program."""

from .argument import Argument
from .dtypes import DType, UnsupportedTypeError
from .evaluate import RunError, run_module
from .instruction import Instruction
from .module import Module, ModuleError
from .operation import OPS, Literal, ModuleOp, Op, Param, Return, make_op, register_op
from .program import CompileOptions, Program
from .shape import DynamicDimension, Shape, ShapeCheck, ShapeError, check_shapes

__all__ = [
    "OPS",
    "Argument",
    "CompileOptions",
    "DType",
    "DynamicDimension",
    "Instruction",
    "Literal",
    "Module",
    "ModuleError",
    "ModuleOp",
    "Op",
    "Param",
    "Program",
    "Return",
    "RunError",
    "Shape",
    "ShapeCheck",
    "ShapeError",
    "UnsupportedTypeError",
    "check_shapes",
    "make_op",
    "register_op",
    "run_module",
]
