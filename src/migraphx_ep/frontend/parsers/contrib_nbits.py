"""com.microsoft block-quantised weights: MatMulNBits and GatherBlockQuantized, as decompositions.

Both unpack their uint8 blobs with shift/and (low bits first), dequantise block-wise as
``(q - zero_point) * scale`` in float32 and round once to the output type, which is what ORT's CPU
kernels do (tests/ops/test_contrib_nbits.py). Built from existing ops only, so every target that runs
bit ops, gather, pointwise and dot runs them, and a constant weight folds at compile time.

MatMulNBits ``accuracy_level`` 4 lets ORT's CPU kernel quantise A to int8 per block; we compute the
float (dequantise-then-matmul) meaning at every level, which is what the op specifies and what ORT
computes at levels 0-3 (the tests compare level 4 with a tolerance measured from that int8 step).
"""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ..context import NodeDesc, ParseContext, normalize_axis
from ..table import Unsupported, onnx_op
from .pointwise import check_attrs

MS = "com.microsoft"
NBITS_TYPES = {DType.float_type, DType.half_type}  # ORT's CPU kernels: no bf16 to check against
F32 = DType.float_type


def unpack_bits(ctx: ParseContext, x: Instruction, bits: int) -> Instruction:
    """uint8 (..., n) -> uint8 (..., n * 8 / bits): each byte holds 8/bits values, low bits first."""
    if bits == 8:
        return x
    per = 8 // bits
    mask = ctx.literal(np.uint8((1 << bits) - 1))
    parts = []
    for i in range(per):
        shifted = ctx.elementwise("shift_right", x, ctx.literal(np.uint8(bits * i))) if i else x
        part = ctx.elementwise("bitwise_and", shifted, mask)
        parts.append(ctx.add("unsqueeze", [part], axes=[x.shape.ndim()]))
    both = ctx.add("concat", parts, axis=x.shape.ndim())
    return ctx.add("reshape", [both], dims=[*x.shape.lens[:-1], x.shape.lens[-1] * per])


def _last(ctx: ParseContext, x: Instruction, n: int) -> Instruction:
    """The first ``n`` entries of the last axis."""
    if x.shape.lens[-1] == n:
        return x
    return ctx.add("slice", [x], axes=[x.shape.ndim() - 1], starts=[0], ends=[n])


def _zero_points(
    ctx: ParseContext, zp: Instruction | None, bits: int, rows: int, blocks: int, what: str
) -> Instruction:
    """Zero points as float32 (rows, blocks): packed uint8, unpacked float, or the default 2^(bits-1)."""
    if zp is None:
        return ctx.literal(np.full((rows, blocks), 1 << (bits - 1), np.float32))
    if zp.shape.type == DType.uint8_type:
        packed = -(-blocks * bits // 8)
        if zp.shape.elements() != rows * packed:
            raise Unsupported(f"{what} packed zero_points of dims {list(zp.shape.lens)}")
        z = unpack_bits(ctx, ctx.add("reshape", [zp], dims=[rows, packed]), bits)
        return ctx.convert(_last(ctx, z, blocks), F32)
    if zp.shape.elements() != rows * blocks:
        raise Unsupported(f"{what} zero_points of dims {list(zp.shape.lens)}")
    return ctx.convert(ctx.add("reshape", [zp], dims=[rows, blocks]), F32)


def _block_size(node: NodeDesc, default: int = 0) -> int:
    bs = int(node.attr("block_size", default))
    if bs < 16 or bs & (bs - 1):
        raise Unsupported(f"{node.op_type} block_size {bs} is not a power of two >= 16")
    return bs


@onnx_op("MatMulNBits", domain=MS)
def parse_matmul_nbits(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("K", "N", "bits", "block_size", "accuracy_level", "weight_prepacked"))
    a, b, scales = args[:3]
    zp, g_idx, bias = (args[i] if len(args) > i else None for i in (3, 4, 5))
    k, n, bits = int(node.attr("K", 0)), int(node.attr("N", 0)), int(node.attr("bits", 4))
    bs = _block_size(node)
    if int(node.attr("weight_prepacked", 0)) != 0:
        raise Unsupported("MatMulNBits with prepacked weights is not supported")
    if int(node.attr("accuracy_level", 0)) not in range(5):
        raise Unsupported("MatMulNBits accuracy_level must be 0..4")
    if bits not in (2, 4, 8):
        raise Unsupported(f"MatMulNBits with {bits}-bit weights is not supported")
    t = a.shape.type
    if t not in NBITS_TYPES or scales.shape.type != t:
        raise Unsupported(f"MatMulNBits of {t.name} with {scales.shape.type.name} scales")
    blocks = -(-k // bs)
    if k <= 0 or n <= 0 or a.shape.ndim() < 1 or a.shape.lens[-1] != k:
        raise Unsupported(f"MatMulNBits A of dims {list(a.shape.lens)} with K={k}, N={n}")
    if b.shape.type != DType.uint8_type or b.shape.lens != (n, blocks, bs * bits // 8):
        raise Unsupported(f"MatMulNBits B must be uint8 ({n}, {blocks}, {bs * bits // 8}), got {b.shape}")
    if scales.shape.elements() != n * blocks:
        raise Unsupported(f"MatMulNBits scales of dims {list(scales.shape.lens)}")
    if zp is not None and zp.shape.type not in (DType.uint8_type, t):
        raise Unsupported(f"MatMulNBits zero_points of {zp.shape.type.name}")
    if zp is not None and zp.shape.type != DType.uint8_type and bits == 8:
        raise Unsupported("MatMulNBits: 8-bit weights with float zero points (ORT's CPU EP rejects them)")
    if g_idx is not None:
        # Deprecated; only the identity grouping (k // block_size) is the plain blocked meaning.
        g = ctx.const(g_idx)
        if g is None or g.shape != (k,) or not np.array_equal(g, np.arange(k) // bs):
            raise Unsupported("MatMulNBits with a non-trivial (or non-constant) g_idx is not supported")
    if bias is not None and (bias.shape.lens != (n,) or bias.shape.type != t):
        raise Unsupported(f"MatMulNBits bias of dims {list(bias.shape.lens)}")
    # W (N, blocks, bs) = (q - zp) * scale, then (K, N) for the dot.
    q = ctx.add("reshape", [unpack_bits(ctx, b, bits)], dims=[n, blocks, bs])
    z = ctx.add("reshape", [_zero_points(ctx, zp, bits, n, blocks, "MatMulNBits")], dims=[n, blocks, 1])
    s = ctx.add("reshape", [ctx.convert(scales, F32)], dims=[n, blocks, 1])
    w = ctx.elementwise("mul", ctx.elementwise("sub", ctx.convert(q, F32), z), s)
    w = _last(ctx, ctx.add("reshape", [w], dims=[n, blocks * bs]), k)
    w = ctx.add("transpose", [w], permutation=[1, 0])
    lead = list(a.shape.lens[:-1])
    a2 = ctx.add("reshape", [ctx.convert(a, F32)], dims=[int(np.prod(lead, dtype=np.int64)), k])
    y = ctx.add("dot", [a2, w])
    if bias is not None:
        y = ctx.elementwise("add", y, ctx.convert(bias, F32))
    return ctx.convert(ctx.add("reshape", [y], dims=[*lead, n]), t)


@onnx_op("GatherBlockQuantized", domain=MS)
def parse_gather_block_quantized(ctx: ParseContext, node: NodeDesc, args):
    check_attrs(node, ("bits", "block_size", "quantize_axis", "gather_axis"))
    data, idx, scales = args[:3]
    zp = args[3] if len(args) > 3 else None
    if data.shape.type != DType.uint8_type:
        raise Unsupported(f"GatherBlockQuantized of {data.shape.type.name} data is not supported")
    bits, bs = int(node.attr("bits", 4)), _block_size(node, 128)
    if bits not in (2, 4, 8):
        raise Unsupported(f"GatherBlockQuantized with {bits}-bit data is not supported")
    r = data.shape.ndim()
    if r < 2:
        raise Unsupported("GatherBlockQuantized of 1-D data is not supported")
    qaxis = normalize_axis(int(node.attr("quantize_axis", 1)), r, "quantize_axis")
    gaxis = normalize_axis(int(node.attr("gather_axis", 0)), r, "gather_axis")
    if gaxis != 0 or qaxis != r - 1:
        raise Unsupported("GatherBlockQuantized: only gather_axis 0 with the last axis quantised")
    t = scales.shape.type
    if t not in NBITS_TYPES or idx.shape.type not in (DType.int32_type, DType.int64_type):
        raise Unsupported(f"GatherBlockQuantized with {t.name} scales, {idx.shape.type.name} indices")
    width = data.shape.lens[-1] * (8 // bits)  # logical size of the quantised axis
    blocks = -(-width // bs)
    rows = data.shape.lens[:-1]
    if scales.shape.lens != (*rows, blocks):
        raise Unsupported(f"GatherBlockQuantized scales of dims {list(scales.shape.lens)}")
    if zp is not None and (
        zp.shape.type != DType.uint8_type or zp.shape.lens != (*rows, -(-blocks * bits // 8))
    ):
        raise Unsupported(f"GatherBlockQuantized zero_points {zp.shape}")
    # Unlike Gather, an index outside [-s, s) gives a zero slice: gather a safe row, then zero it.
    size = data.shape.lens[0]
    itype = np.int64 if idx.shape.type == DType.int64_type else np.int32
    in_range = ctx.add(
        "logical_and",
        [
            ctx.elementwise("greater_or_equal", idx, ctx.literal(itype(-size))),
            ctx.elementwise("less", idx, ctx.literal(itype(size))),
        ],
    )
    safe = ctx.elementwise("where", in_range, idx, ctx.literal(itype(0)))
    q = unpack_bits(ctx, ctx.add("gather", [data, safe], axis=0), bits)
    lens, last = q.shape.lens, q.shape.ndim() - 1
    # Per-element scale and zero point: gather the block index (j // block_size) on the last axis.
    block_of = ctx.literal((np.arange(width) // bs).astype(np.int64))
    s = ctx.convert(ctx.add("gather", [scales, safe], axis=0), F32)
    s = ctx.add("gather", [s, block_of], axis=last)
    if zp is None:
        z = ctx.broadcast_to(ctx.literal(np.float32(1 << (bits - 1))), lens)
    else:
        zg = unpack_bits(ctx, ctx.add("gather", [zp, safe], axis=0), bits)
        z = ctx.add("gather", [ctx.convert(_last(ctx, zg, blocks), F32), block_of], axis=last)
    y = ctx.convert(ctx.elementwise("mul", ctx.elementwise("sub", ctx.convert(q, F32), z), s), t)
    keep = ctx.add("reshape", [in_range], dims=[*idx.shape.lens, *([1] * (len(lens) - idx.shape.ndim()))])
    zero = ctx.convert(ctx.literal(np.float32(0)), t)
    return ctx.elementwise("where", keep, y, zero)
