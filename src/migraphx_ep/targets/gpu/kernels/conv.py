"""Fallback convolution for the IR ``convolution`` when cuDNN is absent (or cannot take the case):
a direct kernel, one thread per output element, correctness first.

y[n, m, o...] = sum over c < C/group and window k... of x[n, g*C/group + c, o*s + k*d - p] * w[m, c, k]
with g = m / (M/group). Output elements are walked in the output's memory order (NCHW or NHWC), so
neighbouring threads read neighbouring inputs and the same filter taps. Floats accumulate with fma in
float (double for double); int32 accumulates in uint32, wrapping like the ref's int32 matmul. The same
kernel runs ``quant_convolution``: int8 data and weights into an int32 result (uint32 accumulator), fp8
E4M3 decoded to float (``kernels/quant.py``) into a float result.
"""

from __future__ import annotations

from ....ir.dtypes import DType
from ....ir.operation import Op
from ....ir.shape import Shape
from .data import index_kernel
from .prelude import NARROW, c_type, check_strides, offset
from .quant import FP8_LOADERS, with_fp8
from .spec import KernelSpec, Unsupported


def conv_supported(op: Op, x: Shape, w: Shape, out: Shape) -> str | None:
    if x.ndim() < 3 or w.ndim() != x.ndim() or out.ndim() != x.ndim():
        return f"convolution of {list(x.lens)} with {list(w.lens)}"
    if x.type != w.type:
        return f"convolution of {x.type.name} with {w.type.name} weights"
    try:
        if x.type not in FP8_LOADERS:
            c_type(x.type)
        c_type(out.type)
        check_strides(x, w, out)
        op.attrs(x.ndim() - 2)  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - Unsupported or the op's own ShapeError
        return str(e)
    return None


def conv_kernel(name: str, op: Op, x: Shape, w: Shape, out: Shape) -> KernelSpec:
    why = conv_supported(op, x, w, out)
    if why:
        raise Unsupported(why)
    t = x.type
    k = x.ndim() - 2
    pad, st, dil = op.attrs(k)  # type: ignore[attr-defined]
    group = op.group  # type: ignore[attr-defined]
    cg, mg = w.lens[1], w.lens[0] // group
    load = FP8_LOADERS.get(t)
    if load is not None:
        acc, mac = "float", f"acc = fmaf({load}(xv), {load}(wv), acc);"
    elif t in NARROW or t == DType.float_type:
        acc, mac = "float", "acc = fmaf(mx_ld(xv), mx_ld(wv), acc);"
    elif t == DType.double_type:
        acc, mac = "double", "acc = fma(xv, wv, acc);"
    else:
        acc, mac = "u32", "acc += (u32)xv * (u32)wv;"
    body = [
        f"const IDX g = o1 / {mg}u;",
        f"{acc} acc = 0;",
        f"for (IDX c = 0; c < {cg}u; ++c) {{",
        f"  const IDX xb = {offset(['o0', f'(g * {cg}u + c)'], x.strides[:2], 'IDX')};",
        f"  const IDX wb = {offset(['o1', 'c'], w.strides[:2], 'IDX')};",
    ]
    ind = "  "
    for i in range(k):
        body.append(f"{ind}for (int k{i} = 0; k{i} < {w.lens[2 + i]}; ++k{i}) {{")
        ind += "  "
        body.append(f"{ind}const i64 s{i} = (i64)o{2 + i} * {st[i]}ll - {pad[i]}ll + k{i} * {dil[i]}ll;")
        body.append(f"{ind}if (s{i} < 0 || s{i} >= {x.lens[2 + i]}ll) continue;")
    xs = offset([f"(IDX)s{i}" for i in range(k)], x.strides[2:], "IDX")
    ws = offset([f"(IDX)k{i}" for i in range(k)], w.strides[2:], "IDX")
    ct = "u8" if load else c_type(t)
    body.append(f"{ind}const {ct} xv = in0[xb + {xs}], wv = in1[wb + {ws}];")
    body.append(f"{ind}{mac}")
    for i in range(k, -1, -1):
        body.append("  " * i + "}")
    body.append(f"out0[oo] = mx_cvt<{c_type(out.type)}>(({'i32' if acc == 'u32' else acc})acc);")
    spec = index_kernel(name, [x, w], [ct, ct], out, c_type(out.type), body)
    return with_fp8(spec) if load else spec
