"""Device pieces of the quantised GEMM/convolution lowering (``targets/gpu/quant.py``).

* ``FP8_HEADER``: the line including ``include/mx_fp8.cuh``: fp8 E4M3 bytes to float in software,
  exact for every code, and ``mx_to_e4m3fn`` back (as ml_dtypes' ``astype``), so the generated GEMM and
  convolution take fp8 operands on any GPU. These generators compute in ``c_type``'s types, which have
  no float8, so the kernels here read it as raw ``u8`` and decode where they load (the prelude's codecs,
  which pointwise kernels use through ``elem_type``); ``quantize_fp8_kernel`` encodes.
* ``im2col_kernel``: a convolution's windows as the rows of a K-major matrix (``ops.quant.Im2col``),
  the A operand of quant_convolution run as one quant_dot-style GEMM.
"""

from __future__ import annotations

import dataclasses
import math

from ....ir.dtypes import DType
from ....ir.operation import Op
from ....ir.shape import Shape
from .data import index_kernel, raw_type
from .headers import include
from .prelude import PRELUDE, c_type, decompose, offset
from .spec import KernelSpec, Unsupported

FP8_HEADER = include("mx_fp8.cuh")  # fp8 E4M3 decode/encode, after the prelude
# fp8 type -> the mx_fp8.cuh function that loads one of its bytes as float
FP8_LOADERS = {DType.fp8e4m3fn_type: "mx_e4m3fn", DType.fp8e4m3fnuz_type: "mx_e4m3fnuz"}


def with_fp8(spec: KernelSpec) -> KernelSpec:
    """``spec`` including ``mx_fp8.cuh`` right after the prelude (for generators that emit the prelude)."""
    if not spec.source.startswith(PRELUDE):
        raise Unsupported(f"{spec.name}: source does not start with the prelude")
    return dataclasses.replace(spec, source=PRELUDE + FP8_HEADER + spec.source[len(PRELUDE) :])


def im2col_kernel(name: str, op: Op, x: Shape, out: Shape) -> KernelSpec:
    """out[n * prod(O) + o, (k... * C) + c] = x[n, c, o * stride - pad + k * dilation], 0 outside x and in
    the columns past prod(kernel) * C; ``op`` is an ``im2col`` (its kernel, padding, stride, dilation).
    Bytes are copied as they are, so any 1-byte element type (int8, fp8) and any x strides work."""
    if x.type_size() != 1 or out.type != x.type or out.ndim() != 2 or not out.standard():
        raise Unsupported(f"im2col of {x} into {out}: 1-byte elements into a standard matrix")
    k = x.ndim() - 2
    ks, pad, st, dil = op.kernel, op.padding, op.stride, op.dilation  # type: ignore[attr-defined]
    n, c, *spatial = x.lens
    want = op.compute_shape([x])
    o_lens = op.out_spatial(x)  # type: ignore[attr-defined]
    taps = math.prod(ks) * c
    if want.lens != out.lens:
        raise Unsupported(f"im2col: output {out} does not match {list(want.lens)}")
    body = decompose("o0", [n, *o_lens], "r", "IDX") + decompose("o1", [*ks, c], "t", "IDX")
    inside = [f"o1 < {taps}u"]
    for i in range(k):
        body.append(f"const i64 s{i} = (i64)r{i + 1} * {st[i]}ll - {pad[i]}ll + (i64)t{i} * {dil[i]}ll;")
        inside.append(f"s{i} >= 0 && s{i} < {spatial[i]}ll")
    terms = [f"r0 * {x.strides[0]}u", f"t{k} * {x.strides[1]}u"]
    terms += [f"(IDX)s{i} * {x.strides[2 + i]}u" for i in range(k)]
    raw = raw_type(x.type)
    body.append(f"out0[oo] = ({' && '.join(inside)}) ? in0[{' + '.join(terms)}] : ({raw})0;")
    return index_kernel(name, [x], [raw], out, raw, body)


def quantize_fp8_kernel(name: str, op: Op, ins: list[Shape], out: Shape) -> KernelSpec:
    """``quantizelinear`` into fp8e4m3fn: out = e4m3fn(x / scale + zero_point) in float32, saturating
    as ``op.saturate`` says (``ops.quant.Quantizelinear``; its float32 compute type)."""
    x, s, *zp = ins
    if out.type != DType.fp8e4m3fn_type:
        raise Unsupported(f"quantizelinear to {out.type.name}: only fp8e4m3fn has a gpu kernel")
    if s.type not in _F32_SCALES or x.type not in _F32_SCALES | {DType.int32_type}:
        raise Unsupported(
            f"quantizelinear of {x.type.name} by {s.type.name} scales into fp8 (float32 math only)"
        )
    o = [f"o{d}" for d in range(out.ndim())]
    xo, so = offset(o, x.strides, "IDX"), offset(o, s.strides, "IDX")
    body = [f"float q = (float)mx_ld(in0[{xo}]) / (float)mx_ld(in1[{so}]);"]
    if zp:
        body.append(f"q = q + mx_e4m3fn(in2[{offset(o, zp[0].strides, 'IDX')}]);")
    body.append(f"out0[oo] = mx_to_e4m3fn(q, {'true' if op.saturate else 'false'});")  # type: ignore[attr-defined]
    in_c = [c_type(x.type), c_type(s.type)] + ["u8"] * len(zp)
    return with_fp8(index_kernel(name, ins, in_c, out, "u8", body))


_F32_SCALES = frozenset({DType.float_type, DType.half_type, DType.bf16_type})

__all__ = ["FP8_HEADER", "FP8_LOADERS", "im2col_kernel", "quantize_fp8_kernel", "with_fp8"]
