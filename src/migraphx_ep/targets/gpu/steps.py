"""What the lowering produces: device steps over buffers (``Buf``: a storage, a byte offset and a strided
shape), and the plan that gives every storage its lifetime and arena offset. The executable
(``executable.py``) binds and launches these steps; the numpy simulator (``simulate.py``) runs them without
a GPU; ``quant.py`` and ``gqa.py`` emit them for their ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...ir.dtypes import DType
from ...ir.operation import Op
from ...ir.shape import Shape
from .kernels.spec import KernelSpec, PwExpr
from .memory import Storage, plan


@dataclass(eq=False)
class Buf:
    """Where a value lives: ``offset`` bytes into ``storage``, laid out as ``shape`` (strides in elements)."""

    storage: Storage
    offset: int
    shape: Shape


@dataclass(eq=False)
class Step:
    label: str
    reads: list[Buf]
    writes: list[Buf]


@dataclass(eq=False)
class KernelStep(Step):
    spec: KernelSpec = None  # type: ignore[assignment]
    # What the kernel computes, for the numpy step simulator (``simulate.py``) and debugging:
    # a pointwise expression, or the op (with ``args`` = extra attributes such as layernorm's).
    expr: PwExpr | None = None
    op: Op | None = None
    args: dict = field(default_factory=dict)


@dataclass(eq=False)
class GemmStep(Step):
    """D = A @ B (+ bias row) (+ C) over ``batch`` matrices; layouts are (row, col, batch) strides.
    ``dtype`` is A's and B's; D has its buffer's type (int32 / float for int8 / fp8: ``quant.py``)."""

    dtype: DType = DType.float_type
    batch: int = 1
    m: int = 0
    n: int = 0
    k: int = 0
    layouts: tuple = ()  # (a, b, c) each (row_stride, col_stride, batch_stride)
    has_bias: bool = False
    has_residual: bool = False
    relu: bool = False
    conv_op: Op | None = None  # set when this GEMM is a 1x1 convolution (for the generated fallback)


@dataclass(eq=False)
class ConvStep(Step):
    op: Op = None  # type: ignore[assignment]
    has_bias: bool = False
    has_residual: bool = False
    relu: bool = False


@dataclass
class Lowered:
    steps: list[Step]
    storages: list[Storage]
    inputs: dict[str, Buf]  # parameter name -> its copied-in buffer
    outputs: list[Buf | np.ndarray]  # a device buffer, or a constant computed at compile time
    weights: list[Storage] = field(default_factory=list)


def plan_lowered(lowered: Lowered) -> int:
    """Give every storage its lifetime (in steps) and arena offset; returns the arena's size."""
    steps = lowered.steps
    for st in lowered.storages:
        st.first, st.last = (-1, -1) if st.kind == "input" else (len(steps), -1)
    for i, step in enumerate(steps):
        for b in step.writes:
            b.storage.first = min(b.storage.first, i)
            b.storage.last = max(b.storage.last, i)
        for b in step.reads:
            b.storage.last = max(b.storage.last, i)
    for o in lowered.outputs:
        if isinstance(o, Buf):
            o.storage.last = len(steps)
    for st in lowered.storages:
        if st.first > st.last:  # written and never read: it still needs its own bytes
            st.last = st.first
    return plan(lowered.storages)


__all__ = ["Buf", "ConvStep", "GemmStep", "KernelStep", "Lowered", "Step", "plan_lowered"]
