"""Linear quantisation as pointwise chains and reductions (``ops/quant.py`` is the meaning).

Every step is one IR op in the ref's compute type (float32, or float64 for double scales), so the
chain rounds exactly where ``compute`` does; float8 results keep their refusal (no kernel type).
"""

from __future__ import annotations

import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.instruction import Instruction
from ..kernels.spec import Unsupported
from .builder import Builder


def _compute_type(scale: Instruction) -> DType:
    return DType.double_type if scale.shape.type == DType.double_type else DType.float_type


def decompose_quantizelinear(b: Builder, ins: Instruction) -> Instruction:
    # y = clip(nan_to_num(rint(x / s) + zp), lo, hi): rint is nearbyint (half to even); NaN gives 0.
    x, s, *zp = ins.inputs
    out = ins.shape.type
    if to_numpy(out).kind not in "iu":
        raise Unsupported(f"output type {out.name} (float8 has no kernel type)")
    ct = _compute_type(s)
    q = b.pw("nearbyint", b.pw("div", b.convert(x, ct), b.convert(s, ct)))
    if zp:
        q = b.pw("add", q, b.convert(zp[0], ct))
    if to_numpy(out).itemsize > 2:
        q = b.pw("where", b.pw("isnan", q), 0, q)
    # else clip keeps a NaN and converting it to an 8/16-bit integer gives 0 (the low bits of x86's
    # "integer indefinite", numpy's astype and the prelude's mx_cvt alike): nan_to_num's 0 without
    # reading q twice, so the whole chain stays one fused kernel (a value with two readers ends one).
    info = np.iinfo(to_numpy(out))
    return b.convert(b.pw("clip", q, int(info.min), int(info.max), t=ct), out)


def decompose_dequantizelinear(b: Builder, ins: Instruction) -> Instruction:
    # y = (x - zp) * s: the difference is exact in int64, converted once, then scaled.
    x, s, *zp = ins.inputs
    ct = _compute_type(s)
    if to_numpy(x.shape.type).kind not in "iu":
        raise Unsupported(f"input type {x.shape.type.name} (float8 has no kernel type)")
    d = b.convert(x, DType.int64_type)
    if zp:
        d = b.pw("sub", d, b.convert(zp[0], DType.int64_type))
    y = b.pw("mul", b.convert(d, ct), b.convert(s, ct))
    return b.convert(y, ins.shape.type)


def decompose_dynamicquantizelinear(b: Builder, ins: Instruction) -> list[Instruction]:
    """(y, scale, zero point) with the range taken from the data and 0, as ``compute`` does."""
    f32, u8 = DType.float_type, DType.uint8_type
    x = ins.inputs[0]
    axes = list(range(x.shape.ndim()))
    mn = b.reduce("reduce_min", x, axes, keep=False)
    mx = b.reduce("reduce_max", x, axes, keep=False)
    # Python's min(0.0, m) / max(0.0, m) of numpy's min / max: a NaN anywhere makes m NaN and the
    # range [0, 0] (the IR's reductions skip NaN, so "any NaN" is its own reduction); the identity of
    # an empty reduction gives 0 too.
    clean = b.pw("not", b.reduce("reduce_max", b.pw("isnan", x), axes, keep=False))
    lo = b.pw("where", b.pw("logical_and", clean, b.pw("less", mn, 0, t=f32)), mn, 0)
    hi = b.pw("where", b.pw("logical_and", clean, b.pw("greater", mx, 0, t=f32)), mx, 0)
    scale = b.pw("div", b.pw("sub", hi, lo), 255)
    zero = b.pw("equal", scale, 0)  # then zp = 0 and y = 0, whatever the data
    zp = b.pw("clip", b.pw("nearbyint", b.pw("sub", 0, b.pw("div", lo, scale), t=f32)), 0, 255)
    zp = b.pw("where", zero, 0, zp)
    y = b.pw("add", b.pw("nearbyint", b.pw("div", x, scale)), zp)
    y = b.pw("clip", b.pw("where", b.pw("isnan", y), 0, y), 0, 255)
    y = b.pw("where", zero, 0, y)
    return [b.convert(y, u8), scale, b.convert(zp, u8)]
