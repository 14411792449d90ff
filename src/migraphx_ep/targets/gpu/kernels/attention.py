"""Fused attention (``fused_attention``): flash-attention forward, one kernel for the whole chain.

A block owns a tile of query rows of one (batch, head); it walks the keys in tiles through shared
memory, keeps a running row max and sum (online softmax) and rescales its output accumulator as the max
grows, so scores and probabilities never reach global memory. Q, K^T, V, the bias and the output are any
strided views: their (batch, head, row, col) strides other than 0 and 1, S, L and the head count are
run-time arguments (``Params``), so a new sequence length or batch compiles nothing; the head dims are
constants (they size the register tiles).

Two schedules (``attention_kernel`` picks):

* ``mma`` (``attention_mma.py``): half and bfloat16 with head dims up to 128: tensor cores
  (``mma.sync.m16n8k16``, float accumulators), 64 query rows per block of 4 warps, 64 keys per tile;
* ``simt`` (here): every float type and head dims up to 256: a warp owns ``RW`` query rows, a lane a key
  of each 32-key tile for the scores and 32-column slices of the output.

What is rounded follows the chain the op stands for, as the unfused kernels would round it: the product
(and Q, K and the scores after each scale, the scores after the bias) to the element type; the softmax
runs in float, and the probabilities are rounded to the element type where tensor cores multiply them.
NaN and infinities come out where the ref gives them: a row whose scores are all -inf gives 0/0 (NaN),
as the IR softmax does; keys past the end, and hidden by ``causal``, take no part.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ....ir.dtypes import DType
from ....ir.module import Module
from ....ir.operation import Op
from ....ir.shape import Shape
from ....switches import env_int
from ..views import strided_reshape
from .headers import include
from .params import Params
from .prelude import PRELUDE, c_literal, c_type, index_type, offset, signature, span
from .spec import KernelSpec, Unsupported

TYPES = frozenset({DType.half_type, DType.bf16_type, DType.float_type})
MAX_HEAD = 256
THREADS = 128  # 4 warps, both schedules
NEG_INF = c_literal(float("-inf"), DType.float_type)

# What both schedules include after the prelude (MX_SMEM, mx_fmaxf_f): include/mx_attention.cuh.
HEADER = include("mx_attention.cuh")


@dataclass(frozen=True)
class Problem:
    """The op on concrete shapes: sizes and every tensor's (batch, head, row, col) strides (K's rows are
    keys, its cols the head dim; the output's as the op computes it, before ``out_perm``)."""

    t: DType
    b: int
    h: int
    s: int
    l: int  # noqa: E741 - the key count's usual name
    d: int
    dv: int
    q: tuple[int, int, int, int]
    k: tuple[int, int, int, int]
    v: tuple[int, int, int, int]
    bias: tuple[int, int, int, int] | None
    o: tuple[int, int, int, int]


def _bh(lens: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(B, H) and their strides: rank 4 has both, rank 3 one batch dim (H = 1)."""
    if len(lens) == 4:
        return (lens[0], lens[1]), (strides[0], strides[1])
    return (lens[0], 1), (strides[0], 0)


def problem(op: Op, inputs: list[Shape], out: Shape) -> Problem:
    q, kt, v = inputs[:3]
    (bsz, heads), qb = _bh(q.lens, q.strides)
    *_, s, d = q.lens
    lk, dv = v.lens[-2], v.lens[-1]
    _, kb = _bh(kt.lens, kt.strides)
    _, vb = _bh(v.lens, v.strides)
    bias = None
    if len(inputs) > 3:
        bb = _bh(inputs[3].lens, inputs[3].strides)[1]
        bias = (*bb, *inputs[3].strides[-2:])
    perm = tuple(op.out_perm) or tuple(range(out.ndim()))  # type: ignore[attr-defined]
    logical = [0] * out.ndim()
    for k, p in enumerate(perm):
        logical[p] = out.strides[k]
    ob = _bh(tuple(out.lens[perm.index(i)] for i in range(out.ndim())), tuple(logical))[1]
    return Problem(
        q.type, bsz, heads, s, lk, d, dv,
        (*qb, *q.strides[-2:]), (*kb, kt.strides[-1], kt.strides[-2]), (*vb, *v.strides[-2:]),
        bias, (*ob, *logical[-2:]),
    )  # fmt: skip


def operand_shapes(body: Module, inputs: list[Shape]) -> list[Shape] | None:
    """What the products of a ``fused_attention`` body read, as views of the op's ``inputs``: a
    parameter may reach its product through reshapes and transposes (GPT-2's heads split off a QKV
    slice), replayed here on its strides with reshapes as strided views. None when one is no view."""
    out = []
    for param, shape in zip(body.get_parameters(), inputs, strict=True):
        ins = param
        while len(ins.outputs) == 1 and ins.outputs[0].name in ("reshape", "transpose"):
            ins = ins.outputs[0]
            shape = (
                strided_reshape(shape, ins.shape.lens)  # type: ignore[assignment]
                if ins.name == "reshape"
                else ins.op.compute_shape([shape])
            )
            if shape is None:
                return None
        out.append(shape)
    return out


def attention_supported(op: Op, inputs: list[Shape], out: Shape, body: Module | None = None) -> str | None:
    """None when ``attention_kernel`` makes a kernel for ``op`` on these shapes (the op's inputs, read
    through ``body``'s views when given); else why not."""
    if body is not None:
        shapes = operand_shapes(body, inputs)
        if shapes is None:
            return "fused attention whose operands are not views of its inputs"
        inputs = shapes
    q, kt, v = inputs[:3]
    if any(x.type != q.type for x in (*inputs, out)) or q.type not in TYPES:
        return f"fused attention of {q.type.name} (kernels for half, bfloat16, float)"
    if q.ndim() not in (3, 4) or any(x.ndim() != q.ndim() for x in (kt, v, *inputs[3:])):
        return f"fused attention of rank {q.ndim()}"
    d, dv, s, lk = q.lens[-1], v.lens[-1], q.lens[-2], kt.lens[-1]
    if not (0 < d <= MAX_HEAD and 0 < dv <= MAX_HEAD):
        return f"fused attention with head dims {d}, {dv} (1..{MAX_HEAD})"
    if s == 0 or lk == 0 or q.elements() == 0 or v.elements() == 0:
        return "fused attention of empty tensors"
    if any(st < 0 for x in (*inputs, out) for st in x.strides):
        return "fused attention of negative strides"
    if getattr(op, "causal", False) and lk < s:
        return "causal fused attention with fewer keys than queries"
    return None


# Fewer blocks than this and the SIMT kernel leaves the GPU idle where the unfused batched GEMMs do not.
# Measured on an H100 (132 SMs; bench/run.py graph replay, fused vs MIGRAPHX_EP_DISABLE_PASSES=
# fuse_attention), when the tensor-core kernel had no key split: BERT-base seq 128 fp16 at batch 1 (24
# blocks) 0.856 vs 0.748 ms, GPT-2 fp16 at batch 1 0.837 vs 0.776 ms; at batch 8 (192 blocks) 1.201 vs
# 1.338 ms. The tensor-core kernel splits the keys among its warps when blocks are few
# (attention_mma.key_warps) and beats the unfused chain at every size measured
# (tools/attention_bench.py, H100, fp16, 12 heads, d 64, microseconds fused / unfused: seq 128 batch 1
# 6.0 / 10.5, GPT-2 batch 1 5.0 / 11.5, seq 384 batch 1 15.5 / 17.3), so the gate holds for the SIMT
# schedule only. MIGRAPHX_EP_ATTENTION_MIN_BLOCKS changes it (0: fuse whatever the kernel can run, as
# the tests of the fusion itself do).
MIN_BLOCKS = 128


def attention_worthwhile(q: Shape, d: int, dv: int) -> str | None:
    """None when the fused kernel beats the unfused chain: always for the tensor-core schedule, with
    enough blocks (``MIN_BLOCKS``) for the SIMT one; ``q`` is the query (..., S, D). Else why the chain
    stays unfused."""
    need = env_int("MIGRAPHX_EP_ATTENTION_MIN_BLOCKS", MIN_BLOCKS, 0)
    if mma_eligible(q.type, d, dv):
        return None
    heads = q.elements() // max(1, q.lens[-2] * q.lens[-1])
    blocks = heads * -(-q.lens[-2] // (4 * simt_rows(max(d, dv))))
    if blocks < need:
        return f"fused attention would run {blocks} blocks (< {need}: the unfused GEMMs are faster)"
    return None


def mma_eligible(t: DType, d: int, dv: int) -> bool:
    """Tensor cores for half/bfloat16 with head dims up to 128 (``MIGRAPHX_EP_ATTENTION_MMA=0``: never)."""
    if os.environ.get("MIGRAPHX_EP_ATTENTION_MMA", "1") in ("", "0"):
        return False
    return t in (DType.half_type, DType.bf16_type) and max(d, dv) <= 128


def use_mma(p: Problem) -> bool:
    """The tensor-core schedule for this problem (``mma_eligible``)."""
    return mma_eligible(p.t, p.d, p.dv)


def attention_kernel(
    name: str, op: Op, inputs: list[Shape], out: Shape, body: Module | None = None
) -> KernelSpec:
    """The kernel computing ``op`` (a ``fused_attention``) on ``inputs`` into ``out`` (standard); with
    ``body`` (the op's submodule), the inputs are read through its views (``operand_shapes``)."""
    why = attention_supported(op, inputs, out, body)
    if why:
        raise Unsupported(why)
    if body is not None:
        inputs = operand_shapes(body, inputs)  # type: ignore[assignment]
    p = problem(op, inputs, out)
    if use_mma(p):
        from .attention_mma import mma_kernel

        return mma_kernel(name, op, p, inputs, out)
    return simt_kernel(name, op, p, inputs, out)


# -- pieces both schedules share --------------------------------------------------------------------------
class Source:
    """Run-time sizes, index lambdas and the score chain of one kernel."""

    def __init__(self, name: str, op: Op, p: Problem, inputs: list[Shape], out: Shape, rows: int) -> None:
        self.name, self.p, self.op = name, p, op
        self.idx = index_type(span(*inputs, out), p.b * p.h * p.s, p.b * p.h * p.l)
        self.params = Params(self.idx)
        self.S, self.L, self.H = self.params(p.s), self.params(p.l), self.params(p.h)
        self.tiles = -(-p.s // rows)  # query tiles per (batch, head)
        self.TILES = self.params(self.tiles)
        self.et = c_type(p.t)

    def at(self, fn: str, strides: tuple[int, ...], names: tuple[str, str]) -> str:
        """``auto fn = [&](b, h, r, c) -> idx``: the element offset of a tensor. Batch, head and row
        strides are always arguments (a dim of 1 or a broadcast must not change the source); a column
        stride of 1 stays in it (vector loads)."""
        idx = self.idx
        dims = ["b", "h", names[0], names[1]]
        off = offset(dims, [self.params(x) for x in strides[:3]] + [self.params.stride(strides[3])], idx)
        args = ", ".join(f"{idx} {n}" for n in dims)
        return f"  auto {fn} = [&]({args}) -> {idx} {{ return {off}; }};"

    def lambdas(self) -> list[str]:
        p = self.p
        lines = [self.at("q_at", p.q, ("i", "d")), self.at("k_at", p.k, ("j", "d")),
                 self.at("v_at", p.v, ("j", "d")), self.at("o_at", p.o, ("i", "d"))]  # fmt: skip
        if p.bias is not None:
            lines.append(self.at("bias_at", p.bias, ("i", "j")))
        return lines

    def functions(self) -> str:
        """``mx_qin``/``mx_kin`` (Q and K elements as the product reads them) and ``mx_logit`` (a product
        to the value softmax reads), each rounding where the chain rounds."""
        t, op = self.p.t, self.op
        e = self.et

        def scaled(factor: float) -> str:
            if factor == 1.0:
                return "mx_ld(x)"
            return f"mx_round<{e}>(mx_ld(x) * {c_literal(factor, t)})"

        chain = [f"  s = mx_round<{e}>(s);"]
        if op.scale != 1.0:  # type: ignore[attr-defined]
            chain.append(f"  s = mx_round<{e}>(s * {c_literal(op.scale, t)});")  # type: ignore[attr-defined]
        if op.divisor != 1.0:  # type: ignore[attr-defined]
            chain.append(f"  s = mx_round<{e}>(s / {c_literal(op.divisor, t)});")  # type: ignore[attr-defined]
        if self.p.bias is not None:
            chain.append(f"  s = mx_round<{e}>(s + bias);")
        return (
            f"typedef {e} mx_e;\n"
            f"MX_DEV float mx_qin(mx_e x) {{ return {scaled(op.q_scale)}; }}\n"  # type: ignore[attr-defined]
            f"MX_DEV float mx_kin(mx_e x) {{ return {scaled(op.k_scale)}; }}\n"  # type: ignore[attr-defined]
            "MX_DEV float mx_logit(float s, float bias) {\n" + "\n".join(chain) + "\n  return s;\n}\n"
        )

    def prologue(self, rows: int) -> list[str]:
        """Block -> (query tile, head, batch); ``jend``: keys past it are hidden from every row here."""
        idx, S, L = self.idx, self.S, self.L
        causal = getattr(self.op, "causal", False)
        end = f"({L} < i0 + {rows}u + {L} - {S} ? {L} : i0 + {rows}u + {L} - {S})" if causal else L
        return [
            f"  const {idx} S = {S}, L = {L};",
            f"  {idx} blk = blockIdx.x;",
            f"  const {idx} tile = blk % {self.TILES}; blk /= {self.TILES};",
            f"  const {idx} h = blk % {self.H}, b = blk / {self.H};",
            f"  const {idx} i0 = tile * {rows}u;",
            f"  const {idx} jend = {end};",
            "  const u32 tid = threadIdx.x, lane = tid % 32u, warp = tid / 32u;",
            *self.lambdas(),
        ]

    def visible(self, i: str, j: str) -> str:
        """C condition: key ``j`` takes part in row ``i``'s softmax."""
        cond = f"{j} < L && {i} < S"
        if getattr(self.op, "causal", False):
            cond += f" && {j} + S <= {i} + L"
        return cond

    def logit(self, acc: str, i: str, j: str, bias: str | None = None) -> str:
        """C expression: the product ``acc`` of row ``i`` and key ``j`` as softmax reads it; ``bias`` is
        the bias element when the caller loaded it already (read from ``in3`` here otherwise)."""
        if bias is None:
            bias = f"mx_ld(in3[bias_at(b, h, {i}, {j})])" if self.p.bias is not None else "0.f"
        return f"({self.visible(i, j)}) ? mx_logit({acc}, {bias}) : {NEG_INF}"

    def signature(self, threads: int) -> str:
        n_in = 3 + (self.p.bias is not None)
        return signature(self.name, ["mx_e"] * n_in, ["mx_e"], threads=threads, scalars=self.params.decls())

    def spec(self, source: str, threads: int, shared: int) -> KernelSpec:
        grid = (self.tiles * self.p.h * self.p.b, 1, 1)
        bits = 64 if self.idx == "u64" else 32
        n_in = 3 + (self.p.bias is not None)
        args = tuple(self.params.values)
        return KernelSpec(self.name, source, grid, (threads, 1, 1), shared, n_in, 1, (), args, bits)


# -- the SIMT schedule ------------------------------------------------------------------------------------
SIMT_KEYS = 32  # a key per lane


def simt_rows(d: int) -> int:
    """Query rows per warp: fewer for wide heads, so Q's tile and the accumulators stay small."""
    return 8 if d <= 64 else 4 if d <= 128 else 2


def simt_kernel(name: str, op: Op, p: Problem, inputs: list[Shape], out: Shape) -> KernelSpec:
    rw = simt_rows(max(p.d, p.dv))
    bm, bn = 4 * rw, SIMT_KEYS
    cv = -(-p.dv // 32)  # output columns per lane
    src = Source(name, op, p, inputs, out, bm)
    D, DV, DVP = p.d, p.dv, cv * 32
    body = [
        "  MX_SMEM;",
        "  float* Qs = reinterpret_cast<float*>(mx_smem);  // [BM][D]",
        f"  float* Ks = Qs + {bm * D};  // [BN][D + 1]: a lane reads its key's row without bank conflicts",
        f"  float* Vs = Ks + {bn * (D + 1)};  // [BN][DVP], columns past DV zero",
        f"  float* Ps = Vs + {bn * DVP};  // [4 warps][RW][BN]: probabilities of this tile",
        *src.prologue(bm),
        f"  for (u32 e = tid; e < {bm * D}u; e += {THREADS}u) {{",
        f"    const u32 r = e / {D}u, d = e % {D}u;",
        "    const auto i = i0 + r;",
        "    Qs[e] = i < S ? mx_qin(in0[q_at(b, h, i, d)]) : 0.f;",
        "  }",
        f"  float m[{rw}], l[{rw}], acc[{rw}][{cv}];",
        f"  MX_UNROLL for (int r = 0; r < {rw}; ++r) {{",
        f"    m[r] = {NEG_INF}; l[r] = 0.f;",
        f"    MX_UNROLL for (int c = 0; c < {cv}; ++c) acc[r][c] = 0.f;",
        "  }",
        f"  for ({src.idx} j0 = 0; j0 < jend; j0 += {bn}u) {{",
        "    __syncthreads();  // every warp is done with the previous tile",
        f"    for (u32 e = tid; e < {bn * D}u; e += {THREADS}u) {{",
        f"      const u32 r = e / {D}u, d = e % {D}u;",
        "      const auto j = j0 + r;",
        f"      Ks[r * {D + 1}u + d] = j < L ? mx_kin(in1[k_at(b, h, j, d)]) : 0.f;",
        "    }",
        f"    for (u32 e = tid; e < {bn * DVP}u; e += {THREADS}u) {{",
        f"      const u32 r = e / {DVP}u, d = e % {DVP}u;",
        "      const auto j = j0 + r;",
        f"      Vs[e] = j < L && d < {DV}u ? mx_ld(in2[v_at(b, h, j, d)]) : 0.f;",
        "    }",
        "    __syncthreads();",
        f"    float s[{rw}];",
        f"    MX_UNROLL for (int r = 0; r < {rw}; ++r) s[r] = 0.f;",
        f"    const float* kr = Ks + lane * {D + 1}u;",
        f"    const float* qw = Qs + warp * {rw * D}u;",
        f"    for (int d = 0; d < {D}; ++d) {{",
        "      const float kv = kr[d];",
        f"      MX_UNROLL for (int r = 0; r < {rw}; ++r) s[r] += qw[r * {D} + d] * kv;",
        "    }",
        "    const auto j = j0 + lane;",
        f"    MX_UNROLL for (int r = 0; r < {rw}; ++r) {{",
        f"      const auto i = i0 + warp * {rw}u + r;",
        f"      const float x = {src.logit('s[r]', 'i', 'j')};",
        "      const float mn = fmaxf(m[r], mx_warp_reduce<32>(x, mx_fmaxf_f()));",
        "      const float mu = mn == " + NEG_INF + " ? 0.f : mn;  // all hidden so far: exp(-inf) = 0",
        "      const float alpha = expf(m[r] - mu), pr = expf(x - mu);",
        "      l[r] = l[r] * alpha + mx_warp_reduce<32>(pr, mx_sum_f());",
        "      m[r] = mn;",
        f"      Ps[(warp * {rw}u + r) * {bn}u + lane] = pr;",
        f"      MX_UNROLL for (int c = 0; c < {cv}; ++c) acc[r][c] *= alpha;",
        "    }",
        "    __syncwarp();",
        f"    const float* pw = Ps + warp * {rw * bn}u;",
        f"    for (int jj = 0; jj < {bn}; ++jj) {{",
        f"      MX_UNROLL for (int c = 0; c < {cv}; ++c) {{",
        f"        const float vv = Vs[jj * {DVP} + lane + 32 * c];",
        f"        MX_UNROLL for (int r = 0; r < {rw}; ++r) acc[r][c] += pw[r * {bn} + jj] * vv;",
        "      }",
        "    }",
        "  }",
        f"  MX_UNROLL for (int r = 0; r < {rw}; ++r) {{",
        f"    const auto i = i0 + warp * {rw}u + r;",
        "    if (i >= S) continue;",
        f"    MX_UNROLL for (int c = 0; c < {cv}; ++c) {{",
        "      const u32 d = lane + 32u * c;",
        f"      if (d < {DV}u) out0[o_at(b, h, i, d)] = mx_cvt<mx_e>(acc[r][c] / l[r]);",
        "    }",
        "  }",
    ]
    source = PRELUDE + HEADER + src.functions() + src.signature(THREADS) + " {\n" + "\n".join(body) + "\n}\n"
    shared = 4 * (bm * D + bn * (D + 1) + bn * DVP + 4 * rw * bn)
    return src.spec(source, THREADS, shared)


__all__ = [
    "MAX_HEAD",
    "Problem",
    "attention_kernel",
    "attention_supported",
    "operand_shapes",
    "problem",
    "use_mma",
]
