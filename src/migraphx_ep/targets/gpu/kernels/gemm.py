"""Fallback GEMM for the IR ``dot`` and ``quant_dot`` when cuBLASLt is absent (or cannot take the case).

A classic shared-memory tiled kernel: 64x64 output tiles, K in steps of 16, 256 threads each owning a
4x4 register tile (rows ``ty + 16i``, cols ``tx + 16j``, so shared reads are broadcasts or consecutive).
Operands are any strided views: each tile is loaded along whichever of its dims has the smaller stride,
so row- and column-major operands both load coalesced. Floats accumulate with fma in float (double for
double); integers accumulate in their unsigned wrap type, which equals numpy's wrapping int matmul.
``quant_dot``: int8 operands accumulate the same way into an int32 result (exact modulo 2^32, as the
ref's int32 matmul); fp8 E4M3 operands are decoded to float (``kernels/quant.py``) and accumulate in float.
"""

from __future__ import annotations

from ....ir.dtypes import DType, to_numpy
from ....ir.shape import Shape
from .prelude import (
    BLOCK,
    NARROW,
    PRELUDE,
    c_type,
    check_strides,
    compute_type,
    index_type,
    signature,
    span,
    walk,
)
from .quant import FP8_HEADER, FP8_LOADERS
from .spec import KernelSpec, Unsupported

BM = BN = 64
BK = 16
_GRID_CAP = 65535  # gridDim.y and .z limits; bigger problems loop


def gemm_supported(a: Shape, b: Shape, out: Shape) -> str | None:
    if a.ndim() < 2 or a.ndim() != b.ndim() or a.lens[:-2] != b.lens[:-2] or a.lens[-1] != b.lens[-2]:
        return f"dot of {list(a.lens)} and {list(b.lens)}"
    if a.type != b.type or a.type == DType.bool_type:
        return f"dot of {a.type.name} and {b.type.name}"
    try:
        if a.type not in FP8_LOADERS:
            c_type(a.type)
        c_type(out.type)
        check_strides(a, b, out)
    except Unsupported as e:
        return str(e)
    return None


def _acc(t: DType) -> tuple[str, str]:
    """(accumulator type, multiply-add statement on ``acc``, ``x``, ``y``)."""
    if t in NARROW or t == DType.float_type:
        return "float", "acc[i][j] = fmaf(x, y, acc[i][j]);"
    if t == DType.double_type:
        return "double", "acc[i][j] = fma(x, y, acc[i][j]);"
    w = "u64" if to_numpy(t).itemsize == 8 else "u32"
    return w, f"acc[i][j] += ({w})x * ({w})y;"


def _tile_load(
    var: str, rows: int, cols: int, row_fast: bool, guard: str, off: str, ct: str, load: str = "mx_ld"
) -> list[str]:
    """Copy a rows x cols tile into shared ``var`` (stored [col][row] for A, [row][col] for B by the
    caller's ``off``), walking the dim with the smaller stride fastest across threads."""
    fast = rows if row_fast else cols
    lines = ["#pragma unroll", f"    for (int q = 0; q < {rows * cols // BLOCK}; ++q) {{"]
    lines.append(f"      const int e = threadIdx.x + q * {BLOCK};")
    if row_fast:
        lines.append(f"      const int r = e % {fast}, c = e / {fast};")
    else:
        lines.append(f"      const int c = e % {fast}, r = e / {fast};")
    lines.append(f"      {var} = ({guard}) ? ({ct}){load}({off}) : ({ct})0;")
    lines.append("    }")
    return lines


def gemm_kernel(name: str, a: Shape, b: Shape, out: Shape) -> KernelSpec:
    """out[..., m, n] = sum_k a[..., m, k] * b[..., k, n] for the IR ``dot`` (batch dims equal), or for
    ``quant_dot`` when ``out`` is int32 (int8 operands) or float (fp8 operands)."""
    why = gemm_supported(a, b, out)
    if why:
        raise Unsupported(why)
    t = a.type
    *_, m, k = a.lens
    n = b.lens[-1]
    r = a.ndim()
    batch = walk([a, b, out], list(range(r - 2)), out.strides)
    nb = batch.size()
    load = FP8_LOADERS.get(t, "mx_ld")
    fp8 = t in FP8_LOADERS
    ct = "float" if fp8 else compute_type(t)
    acc, fma = _acc(DType.float_type if fp8 else t)
    # quant_dot's int32 result takes the whole accumulator (the ``dot`` of int8 wraps to int8).
    res = compute_type(out.type) if out.type != t else ct
    head = PRELUDE + FP8_HEADER if fp8 else PRELUDE
    sig = signature(name, ["u8" if fp8 else c_type(t)] * 2, [c_type(out.type)])
    if nb == 0 or m == 0 or n == 0:
        return KernelSpec(name, head + sig + " {}\n", (1, 1, 1), (BLOCK, 1, 1), 0, 2)
    idx = index_type(span(a, b, out))
    sam, sak = a.strides[-2:]
    sbk, sbn = b.strides[-2:]
    som, son = out.strides[-2:]
    blines, (ba, bb, bo) = batch.offsets("z", "q", idx)
    src = [
        f"  __shared__ {ct} As[{BK}][{BM + 1}];",
        f"  __shared__ {ct} Bs[{BK}][{BN + 1}];",
        "  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;",
        f"  for ({idx} z = blockIdx.z; z < {nb}u; z += gridDim.z) {{",
        *[f"    {x}" for x in blines],
        f"    const {idx} ba = {ba}, bb = {bb}, bo = {bo};",
        f"  for ({idx} m0 = blockIdx.y * {BM}u; m0 < {m}u; m0 += gridDim.y * {BM}u) {{",
        f"    const {idx} n0 = blockIdx.x * {BN}u;",
        f"    {acc} acc[4][4] = {{}};",
        f"    for ({idx} k0 = 0; k0 < {k}u; k0 += {BK}u) {{",
    ]
    a_off = f"in0[ba + (m0 + r) * {sam}u + (k0 + c) * {sak}u]"
    src += _tile_load("As[c][r]", BM, BK, sam < sak, f"m0 + r < {m}u && k0 + c < {k}u", a_off, ct, load)
    b_off = f"in1[bb + (k0 + r) * {sbk}u + (n0 + c) * {sbn}u]"
    src += _tile_load("Bs[r][c]", BK, BN, sbk < sbn, f"k0 + r < {k}u && n0 + c < {n}u", b_off, ct, load)
    src += [
        "      __syncthreads();",
        "#pragma unroll",
        f"      for (int kk = 0; kk < {BK}; ++kk) {{",
        f"        {ct} av[4], bv[4];",
        "#pragma unroll",
        "        for (int i = 0; i < 4; ++i) { av[i] = As[kk][ty + 16 * i]; bv[i] = Bs[kk][tx + 16 * i]; }",
        "#pragma unroll",
        "        for (int i = 0; i < 4; ++i)",
        "#pragma unroll",
        f"          for (int j = 0; j < 4; ++j) {{ const {ct} x = av[i], y = bv[j]; {fma} }}",
        "      }",
        "      __syncthreads();",
        "    }",
        "#pragma unroll",
        "    for (int i = 0; i < 4; ++i)",
        "#pragma unroll",
        "      for (int j = 0; j < 4; ++j) {",
        f"        const {idx} mm = m0 + ty + 16 * i, nn = n0 + tx + 16 * j;",
        f"        if (mm < {m}u && nn < {n}u)",
        f"          out0[bo + mm * {som}u + nn * {son}u] = mx_cvt<{c_type(out.type)}>(({res})acc[i][j]);",
        "      }",
        "  }",
        "  }",
    ]
    grid = (-(-n // BN), min(-(-m // BM), _GRID_CAP), min(nb, _GRID_CAP))
    if grid[0] > 2**31 - 1:
        raise Unsupported(f"dot with {n} columns")
    return KernelSpec(name, head + sig + " {\n" + "\n".join(src) + "\n}\n", grid, (BLOCK, 1, 1), 0, 2)
