"""Elementwise ops: numpy meaning + C++ expression, one line each."""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType, FLOAT_TYPES, SIGNED_INT_TYPES
from .base import binary, unary

SIGNED = FLOAT_TYPES | SIGNED_INT_TYPES

binary("add", np.add, "{0} + {1}")  # a + b
binary("sub", np.subtract, "{0} - {1}")
binary("mul", np.multiply, "{0} * {1}")
unary("relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), "max({0}, decltype({0})(0))", types=SIGNED)
unary("neg", np.negative, "-{0}", types=SIGNED)
unary("exp", np.exp, "exp({0})", types=FLOAT_TYPES)
unary("identity", lambda x: x, "{0}", types=FLOAT_TYPES | SIGNED_INT_TYPES | {DType.bool_type})
