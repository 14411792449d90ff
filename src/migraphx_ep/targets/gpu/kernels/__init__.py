"""Generated CUDA kernels for the gpu target: IR op + shapes -> ``KernelSpec`` (source, launch shape).

``kernel_for`` dispatches on the op's name; ``supported`` answers the partitioner's question (can this
instruction get a kernel?) without generating or compiling anything. Fused pointwise expressions go to
``pointwise_kernel`` and layer-norm rows to ``layernorm_kernel`` directly (the lowering builds those).
A resize kernel reads a second input besides the op's own: its coordinate tables (``resize_table``).
"""

from __future__ import annotations

from collections.abc import Callable

from ....ir.dtypes import DType
from ....ir.operation import Op
from ....ir.shape import Shape
from .conv import conv_kernel, conv_supported
from .data import (
    INDEX_TYPES,
    concat_kernel,
    onehot_kernel,
    pad_kernel,
    raw_type,
    reverse_kernel,
    scan_kernel,
    trilu_kernel,
)
from .gather import gather_elements_kernel, gather_kernel, gathernd_kernel
from .gemm import gemm_kernel, gemm_supported
from .linalg import det_kernel, det_supported
from .pointwise import POINTWISE_OPS, pointwise_kernel, pointwise_supported
from .pooling import pooling_indices_kernel, pooling_kernel
from .prelude import PRELUDE, c_type
from .reduce import REDUCE_OPS, SOFTMAX_OPS, reduce_kernel, reduce_supported
from .resize import resize_kernel, resize_supported, resize_table
from .rows import layernorm_kernel, softmax_kernel, softmax_supported
from .sampling import SAMPLING_OPS, grid_sample_kernel, roi_align_kernel, sampling_supported
from .spec import KernelSpec, PwConst, PwExpr, PwInput, PwOp, Unsupported

Make = Callable[[str, Op, list[Shape], Shape], KernelSpec]
_KERNELS: dict[str, Make] = {
    **{n: lambda name, op, i, o: reduce_kernel(name, op, i[0], o) for n in REDUCE_OPS},
    **{n: lambda name, op, i, o: softmax_kernel(name, op, i[0], o) for n in SOFTMAX_OPS},
    "gather": lambda name, op, i, o: gather_kernel(name, op, i[0], i[1], o),
    "gather_elements": lambda name, op, i, o: gather_elements_kernel(name, op, i[0], i[1], o),
    "gathernd": lambda name, op, i, o: gathernd_kernel(name, op, i[0], i[1], o),
    "concat": concat_kernel,
    "pad": lambda name, op, i, o: pad_kernel(name, op, i[0], o),
    "pooling": lambda name, op, i, o: pooling_kernel(name, op, i[0], o),
    "pooling_indices": lambda name, op, i, o: pooling_indices_kernel(name, op, i[0], o),
    "det": lambda name, op, i, o: det_kernel(name, op, i[0], o),
    "resize": lambda name, op, i, o: resize_kernel(name, op, i[0], o),
    "onehot": lambda name, op, i, o: onehot_kernel(name, op, i[0], i[1], o),
    "trilu": lambda name, op, i, o: trilu_kernel(name, op, i[0], o),
    "reverse": lambda name, op, i, o: reverse_kernel(name, op, i[0], o),
    "prefix_scan_sum": lambda name, op, i, o: scan_kernel(name, op, i[0], o),
    "dot": lambda name, op, i, o: gemm_kernel(name, i[0], i[1], o),
    "convolution": lambda name, op, i, o: conv_kernel(name, op, i[0], i[1], o),
    "grid_sample": lambda name, op, i, o: grid_sample_kernel(name, op, i[0], i[1], o),
    "roi_align": lambda name, op, i, o: roi_align_kernel(name, op, i[0], i[1], i[2], o),
}
_COMPUTED = frozenset({"pooling", "pooling_indices", "prefix_scan_sum"})  # c_type's types (no float8)


def _check(op: Op, inputs: list[Shape], out: Shape) -> str | None:
    """Why ``op`` cannot get a kernel (None: it can); cheap: no source is built."""
    name = op.name
    if name in REDUCE_OPS:
        return reduce_supported(op, inputs, out)
    if name in SOFTMAX_OPS:
        return softmax_supported(op, inputs, out)
    if name == "dot":
        return gemm_supported(inputs[0], inputs[1], out)
    if name == "convolution":
        return conv_supported(op, inputs[0], inputs[1], out)
    if any(s.type == DType.tuple_type for s in (*inputs, out)) or any(
        st < 0 for s in (*inputs, out) for st in s.strides
    ):
        return f"{name}: tuple values or negative strides"
    if name in ("gather", "gather_elements", "gathernd") and inputs[1].type not in INDEX_TYPES:
        return f"{name} with {inputs[1].type.name} indices"
    if name == "resize":
        return resize_supported(op, inputs[0])
    if name == "det":
        return det_supported(inputs[0])
    if name in SAMPLING_OPS:
        return sampling_supported(op, inputs, out)
    if name == "pooling" and op.mode not in ("max", "average", "lpnorm"):  # type: ignore[attr-defined]
        return f"pooling mode {op.mode}"  # type: ignore[attr-defined]
    if name in _COMPUTED or name == "onehot":
        c_type(inputs[0].type)
    raw_type(out.type)
    return None


def supported(op: Op, inputs: list[Shape], out: Shape) -> str | None:
    """None when ``kernel_for`` (or ``pointwise_kernel``) can make a kernel for ``op``; else why not."""
    if op.name in POINTWISE_OPS or op.name == "contiguous":
        return pointwise_supported(op, [s.type for s in inputs]) if op.name != "contiguous" else None
    if op.name not in _KERNELS:
        return f"no gpu kernel for {op.name}"
    try:
        return _check(op, inputs, out)
    except Unsupported as e:
        return str(e)


def kernel_for(name: str, op: Op, inputs: list[Shape], out: Shape) -> KernelSpec:
    """The kernel computing ``op`` on ``inputs`` (strided views) into ``out``; the symbol is ``name``."""
    if op.name in POINTWISE_OPS or op.name == "contiguous":
        expr = PwOp(op, tuple(PwInput(i) for i in range(len(inputs))), out.type)
        return pointwise_kernel(name, expr, inputs, out)
    make = _KERNELS.get(op.name)
    if make is None:
        raise Unsupported(f"no gpu kernel for {op.name}")
    why = _check(op, inputs, out)
    if why:
        raise Unsupported(why)
    return make(name, op, inputs, out)


__all__ = [
    "POINTWISE_OPS",
    "PRELUDE",
    "KernelSpec",
    "PwConst",
    "PwExpr",
    "PwInput",
    "PwOp",
    "Unsupported",
    "conv_kernel",
    "gemm_kernel",
    "kernel_for",
    "layernorm_kernel",
    "pointwise_kernel",
    "pointwise_supported",
    "reduce_kernel",
    "resize_table",
    "softmax_kernel",
    "supported",
]
