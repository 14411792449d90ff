"""Linear quantisation as pointwise chains and reductions (``ops/quant.py`` is the meaning).

Every step is one IR op in the ref's compute type (float32, or float64 for double scales), so the
chain rounds exactly where ``compute`` does; float8 inputs and results only convert (the prelude's
codecs; quantizelinear into E4M3FN has a kernel of its own and comes here only when that refuses).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ....ir.dtypes import DType, to_numpy
from ....ir.instruction import Instruction
from .builder import Builder


def _compute_type(scale: Instruction) -> DType:
    return DType.double_type if scale.shape.type == DType.double_type else DType.float_type


def decompose_quantizelinear(b: Builder, ins: Instruction) -> Instruction:
    # y = clip(nan_to_num(rint(x / s) + zp), lo, hi): rint is nearbyint (half to even); NaN gives 0.
    x, s, *zp = ins.inputs
    out = ins.shape.type
    ct = _compute_type(s)
    q = b.pw("div", b.convert(x, ct), b.convert(s, ct))
    if to_numpy(out).kind not in "iu":
        # float8 (saturate_cast): x / s + zp unrounded, clipped to the finite range when saturating (clip
        # keeps NaN, as the ref's does), then one conversion, through float as ml_dtypes' from double.
        if zp:
            q = b.pw("add", q, b.convert(zp[0], ct))
        if ins.op.saturate:  # type: ignore[attr-defined]
            hi = float(ml_dtypes.finfo(to_numpy(out)).max)
            q = b.pw("clip", q, -hi, hi, t=ct)
        return b.convert(q, out)
    q = b.pw("nearbyint", q)
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
    # y = (x - zp) * s: an integer difference is exact in int64, converted once, then scaled; float8
    # values convert exactly to the compute type, where the ref subtracts them.
    x, s, *zp = ins.inputs
    ct = _compute_type(s)
    if to_numpy(x.shape.type).kind in "iu":
        d = b.convert(x, DType.int64_type)
        if zp:
            d = b.pw("sub", d, b.convert(zp[0], DType.int64_type))
        d = b.convert(d, ct)
    else:
        d = b.convert(x, ct)
        if zp:
            d = b.pw("sub", d, b.convert(zp[0], ct))
    y = b.pw("mul", d, b.convert(s, ct))
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
