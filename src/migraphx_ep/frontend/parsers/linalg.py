"""Det (one ``det`` op) and AffineGrid (a constant base grid times theta: ``dot``, no new op)."""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ops.linalg import DET_TYPES
from ..context import NodeDesc, ParseContext
from ..table import Unsupported, onnx_op
from .pointwise import check_attrs

# ORT runs float/double AffineGrid in a kernel; narrow floats go through the schema's function body,
# which rounds every step (and fails for some sizes), so there is no single answer to match.
AFFINE_TYPES = frozenset({DType.float_type, DType.double_type})


@onnx_op("Det")
def parse_det(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ())
    x = args[0]
    if x.shape.type not in DET_TYPES:
        raise Unsupported(f"Det of {x.shape.type.name}")
    if x.shape.ndim() < 2 or x.shape.lens[-1] != x.shape.lens[-2]:
        raise Unsupported(f"Det needs (*, M, M) matrices, got {list(x.shape.lens)}")
    return ctx.add("det", [x])


def base_grid(spatial: list[int], align_corners: bool) -> np.ndarray:
    """(prod(spatial), k+1) homogeneous points [x, y, (z), 1]; x runs along the last spatial dim."""
    axes = []
    for n in spatial:
        if align_corners:
            axes.append(np.linspace(-1.0, 1.0, n))
        else:
            axes.append((2.0 * np.arange(n) + 1.0) / n - 1.0)  # pixel centres
    mesh = np.meshgrid(*axes, indexing="ij")
    cols = [m.ravel() for m in reversed(mesh)] + [np.ones(int(np.prod(spatial)))]
    return np.stack(cols, axis=1)


@onnx_op("AffineGrid", min_opset=20)
def parse_affine_grid(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("align_corners",))
    theta, size_in = args
    align = int(node.attr("align_corners", 0))
    if align not in (0, 1):
        raise Unsupported(f"AffineGrid: align_corners={align}")
    t = theta.shape
    if t.type not in AFFINE_TYPES:
        raise Unsupported(f"AffineGrid of {t.type.name} (ORT evaluates narrow floats step by step)")
    if t.ndim() != 3 or t.lens[1:] not in ((2, 3), (3, 4)):
        raise Unsupported(f"AffineGrid: theta must be (N, 2, 3) or (N, 3, 4), got {list(t.lens)}")
    size = ctx.const_ints(size_in, "AffineGrid size")
    n, k = t.lens[0], t.lens[1]
    if len(size) != k + 2 or size[0] != n or min(size) < 1:
        raise Unsupported(f"AffineGrid: size {size} does not fit theta {list(t.lens)}")
    spatial = size[2:]
    if align and 1 in spatial:
        # A lone sample: ONNX's reference puts it at -1, ORT (Eigen's LinSpaced) at +1.
        raise Unsupported(f"AffineGrid: align_corners=1 with a spatial size of 1 ({spatial})")
    grid = ctx.literal(base_grid(spatial, bool(align)).astype(t.dtype))
    points = ctx.broadcast_to(grid, (n, *grid.shape.lens))
    flow = ctx.add("dot", [points, ctx.add("transpose", [theta], permutation=[0, 2, 1])])
    return ctx.add("reshape", [flow], dims=[n, *spatial, k])
