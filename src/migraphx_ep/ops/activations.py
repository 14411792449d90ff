"""Activation functions: elementwise ops, some with float attributes.

``cpp`` is the device meaning (see ``ops.base``): ``{0}`` the input, ``{C}`` the
compute type, ``{name}`` an attribute of the op. Formulas follow
ORT's CPU kernels where those are the numerically stable form (softplus, mish), which equal ONNX's
textbook formula wherever that one does not overflow.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import FLOAT_TYPES
from ..ir.operation import op_class, register_op
from ..ir.shape import Shape
from .base import UnaryOp, unary
from .pointwise import NARROW_FLOATS, erf, f32


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.zeros((), x.dtype), x)  # log(1 + exp(x)) without overflow


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1 + erf(x.astype(np.float64) / np.sqrt(2.0)))).astype(x.dtype)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))).astype(x.dtype)


unary("sigmoid", f32(_sigmoid), "(({C})1 / (({C})1 + exp(-{0})))", types=FLOAT_TYPES)
unary("softsign", f32(lambda x: x / (1 + np.abs(x))), "({0} / (({C})1 + fabs({0})))", types=FLOAT_TYPES)
unary("softplus", f32(_softplus), "mx_softplus({0})", types=FLOAT_TYPES)
unary(
    "mish",
    f32(lambda x: x * np.tanh(_softplus(x))),
    "({0} * tanh(mx_softplus({0})))",
    types=FLOAT_TYPES,
)
unary(
    "hard_swish",
    f32(lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "({0} * mx_min(mx_max({0} / ({C})6 + ({C})0.5, ({C})0), ({C})1))",
    types=FLOAT_TYPES,
)
# Device: numpy's (0.5 * x) in x's type times (1 + erf(x / sqrt 2)) in double, then back to x's type.
unary(
    "gelu",
    f32(_gelu),
    "(({C})((double)(({C})0.5 * {0}) * (1.0 + erf((double){0} / 1.4142135623730951))))",
    types=FLOAT_TYPES,
)
unary(
    "gelu_tanh",
    f32(_gelu_tanh),
    "(({C})(0.5 * (double){0} * (1.0 + tanh(0.7978845608028654 * ((double){0} + 0.044715 * "
    "((double){0} * (double){0} * (double){0}))))))",
    types=FLOAT_TYPES,
)


@op_class
class AttrUnaryOp(UnaryOp):
    """A unary op whose formula reads attributes: subclasses define ``apply(self, x)``."""

    types: ClassVar[frozenset] = frozenset(FLOAT_TYPES)

    def apply(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def compute(self, out: Shape, args: list[np.ndarray]) -> np.ndarray:
        x = args[0]
        if x.dtype in NARROW_FLOATS:
            x = x.astype(np.float32)
        with np.errstate(all="ignore"):
            return np.asarray(self.apply(x)).astype(out.dtype, copy=False)


@register_op
@op_class
class LeakyRelu(AttrUnaryOp):
    name: ClassVar[str] = "leaky_relu"
    cpp: ClassVar[str] = "({0} >= 0 ? {0} : {alpha} * {0})"
    alpha: float = 0.01

    def apply(self, x):
        return np.where(x >= 0, x, self.alpha * x)


@register_op
@op_class
class Elu(AttrUnaryOp):
    name: ClassVar[str] = "elu"
    cpp: ClassVar[str] = "({0} >= 0 ? {0} : {alpha} * expm1({0}))"
    alpha: float = 1.0

    def apply(self, x):
        return np.where(x >= 0, x, self.alpha * np.expm1(x))


@register_op
@op_class
class Selu(AttrUnaryOp):
    name: ClassVar[str] = "selu"
    cpp: ClassVar[str] = "({0} > 0 ? {gamma} * {0} : {gamma} * ({alpha} * expm1({0})))"
    alpha: float = 1.67326319217681884765625
    gamma: float = 1.05070102214813232421875

    def apply(self, x):
        return np.where(x > 0, self.gamma * x, self.gamma * (self.alpha * np.expm1(x)))


@register_op
@op_class
class Celu(AttrUnaryOp):
    name: ClassVar[str] = "celu"
    cpp: ClassVar[str] = "(mx_max({0}, ({C})0) + mx_min(({C})0, {alpha} * expm1({0} / {alpha})))"
    alpha: float = 1.0

    def apply(self, x):
        a = np.asarray(self.alpha, x.dtype)
        return np.maximum(x, 0) + np.minimum(0, a * np.expm1(x / a))


@register_op
@op_class
class ThresholdedRelu(AttrUnaryOp):
    name: ClassVar[str] = "thresholded_relu"
    cpp: ClassVar[str] = "({0} > {alpha} ? {0} : ({C})0)"
    alpha: float = 1.0

    def apply(self, x):
        return np.where(x > self.alpha, x, 0)


@register_op
@op_class
class HardSigmoid(AttrUnaryOp):
    name: ClassVar[str] = "hard_sigmoid"
    # mx_mul_rn: no fused multiply-add, so the device rounds twice as numpy does
    cpp: ClassVar[str] = "mx_min(mx_max(mx_mul_rn({alpha}, {0}) + {beta}, ({C})0), ({C})1)"
    alpha: float = 0.2
    beta: float = 0.5

    def apply(self, x):
        return np.clip(self.alpha * x + self.beta, 0, 1)


@register_op
@op_class
class Shrink(AttrUnaryOp):
    name: ClassVar[str] = "shrink"
    cpp: ClassVar[str] = "({0} < {neg_lambd} ? {0} + {bias} : ({0} > {lambd} ? {0} - {bias} : ({C})0))"
    types: ClassVar[frozenset] = frozenset(FLOAT_TYPES) | UnaryOp.types
    lambd: float = 0.5
    bias: float = 0.0

    def apply(self, x):
        if x.dtype.kind in "iu":
            # Integer Shrink: compare and shift in double, then back to the integer type like ORT.
            xf = x.astype(np.float64)
            return np.where(xf < -self.lambd, xf + self.bias, np.where(xf > self.lambd, xf - self.bias, 0))
        return np.where(x < -self.lambd, x + self.bias, np.where(x > self.lambd, x - self.bias, 0))


@register_op
@op_class
class QuickGelu(AttrUnaryOp):
    """com.microsoft QuickGelu: ``x * sigmoid(alpha * x)``."""

    name: ClassVar[str] = "quick_gelu"
    cpp: ClassVar[str] = "({0} * (({C})1 / (({C})1 + exp(-({alpha} * {0})))))"
    alpha: float = 1.702

    def apply(self, x):
        return x * _sigmoid(self.alpha * x)
