"""The tensor-core schedule of fused attention (half and bfloat16, head dims up to 128).

A block of 4 warps owns 64 query rows of one (batch, head), a warp 16 of them; with few such blocks the
warps split each key tile instead (``key_warps``: 2 or 4 warps share 16 rows, a block owns 32 or 16).
Per tile of 64 keys, K and V (rows: keys, row-major) come into one of two shared-memory stages with
16-byte ``cp.async`` copies issued a tile ahead, so a tile lands while the previous one computes. Each
warp computes its 16 x (its keys) scores with ``mma.sync.m16n8k16`` (float accumulators), turns them into
logits (rounding, scale, the bias it loaded before waiting for the tile, hidden keys), updates its rows'
running max and sum, and multiplies the probabilities, rounded to the element type, by V with more MMAs
whose B fragments ``ldmatrix.trans`` reads from row-major V. The probabilities stay in registers: an
MMA's accumulator fragment (rows g and g+8, columns 2t and 2t+1 of an 8-column tile) is, two tiles side
by side, exactly the A fragment of the next one (PTX ISA, "Matrix Fragments for mma.m16n8k16"). Warps that
split the keys merge their partial softmaxes through shared memory at the end. Exponentials use the fast
``__expf``: the probabilities are rounded to 16 bits for the MMA anyway.

Head dims are padded to multiples of 16 with zero columns in shared memory. Row strides in shared memory
are padded by 8 elements, so a warp's 32-bit fragment loads and ldmatrix rows hit different banks. Tiles
come in as 16-byte copies when a tensor's head columns are contiguous and its other strides and address
allow (a run-time flag and an alignment test), and K needs no scaling on the way; element by element,
synchronously, otherwise.

The fragment, copy and MMA helpers are in ``include/mx_attention_mma.cuh``. Before sm_80, and on a host
compiling this source with a shim (how it is tested), they fall back to plain loads and stores, and
``mx_mma`` swaps the fragments through shared memory and multiplies them in float: the same layouts,
slowly.
"""

from __future__ import annotations

import dataclasses

from ....ir.dtypes import DType
from ....ir.operation import Op
from ....ir.shape import Shape
from ....switches import env_int
from .attention import HEADER, NEG_INF, THREADS, Problem, Source
from .headers import include
from .prelude import PRELUDE
from .spec import KERNEL_SYMBOL, KernelSpec

BM = BN = 64  # query rows a block owns without a key split, keys a tile
PAD = 8  # elements added to every shared row: 16 bytes, keeps vector stores aligned
# Blocks of BM rows under which the warps split the keys in 4, and in 2 (key_warps). Measured on an H100
# (tools/attention_bench.py: CUDA graphs of 50 launches, fp16, 12 heads, d 64), microseconds for splits
# 1 / 2 / 4:
# seq 128 batch 1 (24 blocks) 9.1 / 7.4 / 6.0, GPT-2 causal batch 1 7.6 / 7.0 / 5.0, seq 384 batch 1
# (72) 17.5 / 15.5 / 16.5, seq 128 batch 8 (192) 11.9 / 11.3 / 17.6, batch 32 (768) 31.7 / 34.4 / 48.5.
SPLIT4_BELOW, SPLIT2_BELOW = 48, 264


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def _tile(dst: str, ptr: str, at: str, rows: int, cols: int, st: int, **kw: str) -> list[str]:
    """Load rows ``first + r`` (``r < rows``; those at or past ``limit`` zero when ``zero``) x columns
    ``c < cols`` of a tensor into shared ``dst[r * st + c]`` as element bits, through ``conv`` (a float
    function of an element), synchronously. With a vector flag ``vec`` (C), whole 8-column vectors when
    it holds."""
    first, limit, conv = kw["first"], kw["limit"], kw["conv"]
    zero, vec = kw.get("zero") == "1", kw.get("vec")
    scalar = [
        f"for (u32 e = tid; e < {rows * cols}u; e += {THREADS}u) {{",
        f"  const u32 r = e / {cols}u, c = e % {cols}u;",
        f"  const auto row = {first} + r;",
        f"  {'' if zero else f'if (row < {limit}) '}{dst}[r * {st}u + c] = "
        + (f"row < {limit} ? mx_bits({conv}({ptr}[{at}(b, h, row, c)])) : (u16)0;" if zero
           else f"mx_bits({conv}({ptr}[{at}(b, h, row, c)]));"),
        "}",
    ]  # fmt: skip
    if vec is None:
        return ["    " + x for x in scalar]
    v8 = cols // 8
    vector = [
        f"if ({vec}) for (u32 e = tid; e < {rows * v8}u; e += {THREADS}u) {{",
        f"  const u32 r = e / {v8}u, c = e % {v8}u * 8u;",
        f"  const auto row = {first} + r;",
        "  mx_vec<u16, 8> w = {};",
        f"  if (row < {limit}) {{",
        f"    const auto x = *reinterpret_cast<const mx_vec<mx_e, 8>*>({ptr} + {at}(b, h, row, c));",
        f"    MX_UNROLL for (int q = 0; q < 8; ++q) w.v[q] = mx_bits({conv}(x.v[q]));",
        "  }",
        f"  {'' if zero else f'if (row < {limit}) '}"
        + f"*reinterpret_cast<mx_vec<u16, 8>*>({dst} + r * {st}u + c) = w;",
        "} else {",
        *["  " + x for x in scalar],
        "}",
    ]
    return ["    " + x for x in vector]


def _kv_tile(dst: str, ptr: str, at: str, cols: int, st: int, conv: str, vec: str | None) -> list[str]:
    """Keys ``j`` .. ``j + BN`` of K or V into shared ``dst`` (row-major, rows past L zero). With the
    vector flag ``vec`` and an exact ``conv`` (no scaling), 16-byte ``cp.async`` copies that land while
    the previous tile computes; otherwise synchronous loads (``_tile``), which the barrier before the
    tile's use covers as well."""
    sync = _tile(dst, ptr, at, BN, cols, st, first="j", limit="L", conv=conv, zero="1")
    if vec is None or conv != "mx_ld":
        return sync
    v8 = cols // 8
    return [
        f"    if ({vec}) for (u32 e = tid; e < {BN * v8}u; e += {THREADS}u) {{",
        f"      const u32 r = e / {v8}u, c = e % {v8}u * 8u;",
        "      const auto row = j + r;",
        f"      mx_cp16({dst} + r * {st}u + c, {ptr} + (row < L ? {at}(b, h, row, c) : 0), row < L);",
        "    } else {",
        *["  " + x for x in sync],
        "    }",
    ]


def _vec_flag(src: Source, ptr: str, strides: tuple[int, int, int, int], cols: int) -> str | None:
    """C condition for 16-byte loads of a tensor's rows (None: its head columns are not contiguous)."""
    if strides[3] != 1 or cols % 8:
        return None
    flag = src.params(int(all(x % 8 == 0 for x in strides[:3])))
    return f"{flag} != 0 && (u64){ptr} % 16u == 0"


def forced_key_warps() -> int:
    """``MIGRAPHX_EP_ATTENTION_KEY_WARPS`` (0: not forced)."""
    forced = env_int("MIGRAPHX_EP_ATTENTION_KEY_WARPS", 0, 0)
    if forced not in (0, 1, 2, 4):
        raise ValueError(f"MIGRAPHX_EP_ATTENTION_KEY_WARPS={forced}: 1, 2 or 4")
    return forced


def key_warps(p: Problem) -> int:
    """Warps that split each key tile (1, 2 or 4; the block's 4 warps cover ``4 / key_warps`` groups of
    16 query rows). A warp runs its rows' whole chain alone, so with few (batch, head, row tile) blocks
    the kernel takes as long as one warp's walk over every key: at BERT-base seq 128 batch 1 (24 blocks
    of 64 rows), 4700 instructions a warp at 5 cycles each. Splitting the keys cuts that walk by the
    split and multiplies the blocks, at the price of combining the warps' partial softmaxes through shared
    memory at the end. ``MIGRAPHX_EP_ATTENTION_KEY_WARPS`` forces a split."""
    forced = forced_key_warps()
    if forced:
        return forced
    blocks = p.b * p.h * -(-p.s // BM)
    return 4 if blocks < SPLIT4_BELOW else 2 if blocks < SPLIT2_BELOW else 1


def mma_kernel(name: str, op: Op, p: Problem, inputs: list[Shape], out: Shape) -> KernelSpec:
    """The kernel at ``p``'s key split; the other splits are its ``others``: the block count, hence
    the split, changes with batch and sequence, and a never-seen shape should find its kernel compiled.
    """
    kw = key_warps(p)
    spec = _mma_kernel(name, op, p, inputs, out, kw)
    if forced_key_warps():
        return spec

    def others() -> list[KernelSpec]:
        return [_mma_kernel(KERNEL_SYMBOL, op, p, inputs, out, k) for k in (1, 2, 4) if k != kw]

    return dataclasses.replace(spec, others=others)


def _mma_kernel(name: str, op: Op, p: Problem, inputs: list[Shape], out: Shape, kw: int) -> KernelSpec:
    rg = 4 // kw  # row groups of 16 a block
    bm, keys = 16 * rg, BN // kw  # a block's query rows, a warp's keys of each tile
    src = Source(name, op, p, inputs, out, bm)
    D, DV = p.d, p.dv
    DP, DVP = _round16(D), _round16(DV)
    qst, kst, vst = DP + PAD, DP + PAD, DVP + PAD
    nv = DVP // 8
    vq, vk, vv = (_vec_flag(src, f"in{k}", st, n) for k, st, n in ((0, p.q, D), (1, p.k, D), (2, p.v, DV)))
    kconv = "mx_kin" if op.k_scale != 1.0 else "mx_ld"  # type: ignore[attr-defined]
    kv = BN * (kst + vst)  # one stage of K and V
    fetch = [  # the K and V tile of keys j .. j + BN into stage `into`
        "  auto fetch = [&](auto j, u32 into) {",
        f"    u16* Kd = Ks + into * {kv}u;",
        f"    u16* Vd = Kd + {BN * kst}u;",
        *["  " + x for x in _kv_tile("Kd", "in1", "k_at", D, kst, kconv, vk)],
        *["  " + x for x in _kv_tile("Vd", "in2", "v_at", DV, vst, "mx_ld", vv)],
        "    mx_cp_commit();",
        "  };",
    ]
    bias = src.p.bias is not None
    nk = keys // 8  # the warp's 8-key score tiles
    body = [
        "  MX_SMEM;",
        "  u16* Qs = reinterpret_cast<u16*>(mx_smem);  // [BM][QST]",
        f"  u16* Ks = Qs + {bm * qst};  // 2 stages of K [BN][KST] then V [BN][VST], row-major",
        *src.prologue(bm),
        "  const u32 g = lane / 4u, t2 = lane % 4u * 2u;",
        f"  const u32 rg = warp % {rg}u, kw = warp / {rg}u;  // the warp's 16 rows, its share of each tile",
        "  (void)kw;",
        f"  const bool vq = {vq or 'false'}, vk = {vk or 'false'}, vv = {vv or 'false'};",
        "  (void)vk; (void)vv;",
        "  // Zero everything first: padded head columns read as zeros, and so do Q's rows past S",
        f"  for (u32 e = tid; e < {(bm * qst + 2 * kv) // 8}u; e += {THREADS}u)",
        "    reinterpret_cast<mx_vec<u16, 8>*>(Qs)[e] = mx_vec<u16, 8>{};",
        "  __syncthreads();",
        *fetch,
        "  if (jend > 0) fetch((decltype(jend))0, 0u);  // the first tile flies while Q loads",
        *_tile("Qs", "in0", "q_at", bm, D, qst, first="i0", limit="S", conv="mx_qin", vec=vq and "vq"),
        f"  float o[{nv}][4], m[2] = {{{NEG_INF}, {NEG_INF}}}, l[2] = {{0.f, 0.f}};",
        f"  MX_UNROLL for (int n = 0; n < {nv}; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;",
        "  const auto ia = i0 + rg * 16u + g, ib = ia + 8u;",
        "  u32 stage = 0;",
        f"  for ({src.idx} j0 = 0; j0 < jend; j0 += {BN}u, stage ^= 1u) {{",
        f"    if (j0 + {BN}u < jend) fetch(j0 + {BN}u, stage ^ 1u);  // the next tile, into the other stage",
        "    else mx_cp_commit();  // an empty group: the wait below always leaves one group in flight",
        f"    const auto jw = j0 + kw * {keys}u;  // the warp's first key",
        *(
            [
                f"    float bv[{nk}][4];  // this tile's bias: loads that fly while the tile lands",
                f"    MX_UNROLL for (int n = 0; n < {nk}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e) {{",
                "      const auto i = e < 2 ? ia : ib;",
                "      const auto j = jw + n * 8u + t2 + (e & 1);",
                f"      bv[n][e] = ({src.visible('i', 'j')}) ? mx_ld(in3[bias_at(b, h, i, j)]) : 0.f;",
                "    }",
            ]
            if bias
            else []
        ),
        "    mx_cp_wait<1>();",
        "    __syncthreads();  // this stage's copies (and Q) are visible to every warp",
        f"    const u16* Kt = Ks + stage * {kv}u + kw * {keys * kst}u;",
        f"    const u16* Vt = Ks + stage * {kv}u + {BN * kst}u + kw * {keys * vst}u;",
        f"    float s[{nk}][4];",
        f"    MX_UNROLL for (int n = 0; n < {nk}; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;",
        f"    MX_UNROLL for (int kk = 0; kk < {DP // 16}; ++kk) {{",
        f"      const u16* qa = Qs + (rg * 16u + g) * {qst}u + kk * 16 + t2;",
        f"      const u32 a[4] = {{mx_ld32(qa), mx_ld32(qa + {8 * qst}), mx_ld32(qa + 8),",
        f"                         mx_ld32(qa + {8 * qst + 8})}};",
        f"      MX_UNROLL for (int n = 0; n < {nk}; ++n) {{",
        f"        const u16* kb = Kt + (n * 8 + g) * {kst}u + kk * 16 + t2;",
        "        const u32 bb[2] = {mx_ld32(kb), mx_ld32(kb + 8)};",
        "        mx_mma(s[n], a, bb);",
        "      }",
        "    }",
        f"    float top[2] = {{{NEG_INF}, {NEG_INF}}}, mu[2], alpha[2], sum[2] = {{0.f, 0.f}};",
        f"    MX_UNROLL for (int n = 0; n < {nk}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e) {{",
        "      const auto i = e < 2 ? ia : ib;",
        "      const auto j = jw + n * 8u + t2 + (e & 1);",
        f"      s[n][e] = {src.logit('s[n][e]', 'i', 'j', 'bv[n][e]' if bias else None)};",
        "      top[e / 2] = fmaxf(top[e / 2], s[n][e]);",
        "    }",
        "    MX_UNROLL for (int r = 0; r < 2; ++r) {  // a row lives in the 4 lanes of a quad",
        "      const float mn = fmaxf(m[r], mx_warp_reduce<4>(top[r], mx_fmaxf_f()));",
        f"      mu[r] = mn == {NEG_INF} ? 0.f : mn;  // all hidden so far: exp(-inf) = 0",
        "      alpha[r] = __expf(m[r] - mu[r]);  // the fast exp: half/bfloat16 probabilities",
        "      m[r] = mn;",
        "    }",
        f"    MX_UNROLL for (int n = 0; n < {nk}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e) {{",
        "      s[n][e] = __expf(s[n][e] - mu[e / 2]);",
        "      sum[e / 2] += s[n][e];",
        "    }",
        "    MX_UNROLL for (int r = 0; r < 2; ++r)",
        "      l[r] = l[r] * alpha[r] + mx_warp_reduce<4>(sum[r], mx_sum_f());",
        f"    MX_UNROLL for (int n = 0; n < {nv}; ++n) {{",
        "      o[n][0] *= alpha[0]; o[n][1] *= alpha[0]; o[n][2] *= alpha[1]; o[n][3] *= alpha[1];",
        "    }",
        f"    MX_UNROLL for (int kk = 0; kk < {keys // 16}; ++kk) {{",
        "      const float* p0 = s[2 * kk];  // keys 16kk + 2t (+1), rows g and g + 8",
        "      const float* p1 = s[2 * kk + 1];  // the same 8 keys on",
        "      const u32 a[4] = {mx_pack(p0[0], p0[1]), mx_pack(p0[2], p0[3]), mx_pack(p1[0], p1[1]),",
        "                        mx_pack(p1[2], p1[3])};",
        f"      MX_UNROLL for (int n = 0; n < {nv}; n += 2) {{  // V's B fragments, two column tiles a load",
        "        u32 bb[4];",
        f"        mx_ldsm_x4_trans(bb, Vt + kk * 16u * {vst}u + n * 8u, {vst}u);",
        "        mx_mma(o[n], a, bb);",
        "        mx_mma(o[n + 1], a, bb + 2);",
        "      }",
        "    }",
        "    __syncthreads();  // every warp is done with this stage before the next fetch refills it",
        "  }",
        *(_store(DV, nv) if kw == 1 else _combine(kw, bm, DV, DVP)),
    ]
    ab = "bf16" if p.t == DType.bf16_type else "f16"
    # The PTX type of mma.sync: a macro the header splices into its asm string (one literal).
    head = (
        PRELUDE + HEADER + src.functions() + f'#define MX_MMA_AB "{ab}"\n' + include("mx_attention_mma.cuh")
    )
    source = head + src.signature(THREADS) + " {\n" + "\n".join(body) + "\n}\n"
    shared = 2 * (bm * qst + 2 * kv)
    return src.spec(source, THREADS, shared)


def _store(DV: int, nv: int) -> list[str]:  # noqa: N803 - the sizes' names in the kernel
    """One warp per row group: its accumulators over its row sums are the output."""
    return [
        f"  MX_UNROLL for (int n = 0; n < {nv}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e) {{",
        "    const auto i = e < 2 ? ia : ib;",
        "    const u32 d = n * 8u + t2 + (e & 1);",
        f"    if (i < S && d < {DV}u) out0[o_at(b, h, i, d)] = mx_cvt<mx_e>(o[n][e] / l[e / 2]);",
        "  }",
    ]


def _combine(kw: int, bm: int, DV: int, DVP: int) -> list[str]:  # noqa: N803
    """``kw`` warps hold partial softmaxes of the same rows over different keys: each leaves its row
    maxima, sums and accumulators in shared memory (the K/V stages are free now), and the block merges
    them, every partial scaled by exp(its max - the row's max). A row no key reaches keeps 0 / 0 (NaN),
    as one warp would give it."""
    return [
        "  float* Os = reinterpret_cast<float*>(Ks);  // [KW][BM][DVP] partial accumulators",
        f"  float* Ms = Os + {kw * bm * DVP}u;  // [KW][BM] row maxima, then [KW][BM] row sums",
        f"  float* Ls = Ms + {kw * bm}u;",
        "  const u32 ra = rg * 16u + g, rb = ra + 8u;",
        "  if (t2 == 0u) {  // the 4 lanes of a quad hold the same row max and sum",
        f"    Ms[kw * {bm}u + ra] = m[0]; Ms[kw * {bm}u + rb] = m[1];",
        f"    Ls[kw * {bm}u + ra] = l[0]; Ls[kw * {bm}u + rb] = l[1];",
        "  }",
        f"  MX_UNROLL for (int n = 0; n < {DVP // 8}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e)",
        f"    Os[(kw * {bm}u + (e < 2 ? ra : rb)) * {DVP}u + n * 8u + t2 + (e & 1)] = o[n][e];",
        "  __syncthreads();",
        f"  for (u32 e = tid; e < {bm * DV}u; e += {THREADS}u) {{",
        f"    const u32 r = e / {DV}u, d = e % {DV}u;",
        "    const auto i = i0 + r;",
        "    if (i >= S) continue;",
        f"    float top = {NEG_INF};",
        f"    MX_UNROLL for (int w = 0; w < {kw}; ++w) top = fmaxf(top, Ms[w * {bm} + r]);",
        f"    const float mu = top == {NEG_INF} ? 0.f : top;",
        "    float sum = 0.f, acc = 0.f;",
        f"    MX_UNROLL for (int w = 0; w < {kw}; ++w) {{",
        f"      const float f = __expf(Ms[w * {bm} + r] - mu);",
        f"      sum += Ls[w * {bm} + r] * f;",
        f"      acc += Os[(w * {bm} + r) * {DVP} + d] * f;",
        "    }",
        "    out0[o_at(b, h, i, d)] = mx_cvt<mx_e>(acc / sum);",
        "  }",
    ]


__all__ = ["forced_key_warps", "key_warps", "mma_kernel"]
