"""The tensor-core schedule of fused attention (half and bfloat16, head dims up to 128).

A block of 4 warps owns 64 query rows of one (batch, head), a warp 16 of them. Per tile of 64 keys:
K (rows: keys) and V (transposed: rows are head columns) go through shared memory; each warp computes
its 16 x 64 scores with ``mma.sync.m16n8k16`` (float accumulators), turns them into logits (rounding,
scale, bias, hidden keys), updates its rows' running max and sum, and multiplies the probabilities,
rounded to the element type, by V with more MMAs. The probabilities stay in registers: an MMA's
accumulator fragment (rows g and g+8, columns 2t and 2t+1 of an 8-column tile) is, two tiles side by
side, exactly the A fragment of the next one (PTX ISA, "Matrix Fragments for mma.m16n8k16").
Exponentials use the fast ``__expf``: the probabilities are rounded to 16 bits for the MMA anyway.

Head dims are padded to multiples of 16 with zero columns in shared memory. Row strides in shared memory
are padded by 8 elements, so the 32-bit fragment loads of a warp hit 32 different banks. Tiles come in
as 16-byte vectors when a tensor's head columns are contiguous and its other strides and address allow
(a run-time flag and an alignment test), element by element otherwise.

The fragment helpers and ``mx_mma`` are in ``include/mx_attention_mma.cuh``. Before sm_80, and on a host
compiling this source with a shim (how it is tested), ``mx_mma`` swaps the fragments through shared memory
and multiplies them in float: the same layouts, slowly.
"""

from __future__ import annotations

from ....ir.dtypes import DType
from ....ir.operation import Op
from ....ir.shape import Shape
from .attention import HEADER, NEG_INF, THREADS, Problem, Source
from .headers import include
from .prelude import PRELUDE
from .spec import KernelSpec

BM = BN = 64
PAD = 8  # elements added to every shared row: 16 bytes, keeps vector stores aligned


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def _tile(dst: str, ptr: str, at: str, rows: int, cols: int, st: int, **kw: str) -> list[str]:
    """Load rows ``first + r`` (``r < rows``; those at or past ``limit`` zero when ``zero``) x columns
    ``c < cols`` of a tensor into shared ``dst`` as element bits, through ``conv`` (a float function of an
    element); ``dst[r * st + c]``, or ``dst[c * st + r]`` with ``transpose``. With a vector flag ``vec``
    (C), whole 8-column vectors when it holds."""
    first, limit, conv = kw["first"], kw["limit"], kw["conv"]
    zero, transpose, vec = kw.get("zero") == "1", kw.get("transpose") == "1", kw.get("vec")
    where = "c * {st}u + r" if transpose else "r * {st}u + c"
    here = where.format(st=st)
    scalar = [
        f"for (u32 e = tid; e < {rows * cols}u; e += {THREADS}u) {{",
        f"  const u32 r = e / {cols}u, c = e % {cols}u;",
        f"  const auto row = {first} + r;",
        f"  {'' if zero else f'if (row < {limit}) '}{dst}[{here}] = "
        + (f"row < {limit} ? mx_bits({conv}({ptr}[{at}(b, h, row, c)])) : (u16)0;" if zero
           else f"mx_bits({conv}({ptr}[{at}(b, h, row, c)]));"),
        "}",
    ]  # fmt: skip
    if vec is None:
        return ["    " + x for x in scalar]
    v8 = cols // 8
    put = (
        f"MX_UNROLL for (int q = 0; q < 8; ++q) {dst}[(c + q) * {st}u + r] = w.v[q];"
        if transpose
        else f"*reinterpret_cast<mx_vec<u16, 8>*>({dst} + r * {st}u + c) = w;"
    )
    vector = [
        f"if ({vec}) for (u32 e = tid; e < {rows * v8}u; e += {THREADS}u) {{",
        f"  const u32 r = e / {v8}u, c = e % {v8}u * 8u;",
        f"  const auto row = {first} + r;",
        "  mx_vec<u16, 8> w = {};",
        f"  if (row < {limit}) {{",
        f"    const auto x = *reinterpret_cast<const mx_vec<mx_e, 8>*>({ptr} + {at}(b, h, row, c));",
        f"    MX_UNROLL for (int q = 0; q < 8; ++q) w.v[q] = mx_bits({conv}(x.v[q]));",
        "  }",
        f"  {'' if zero else f'if (row < {limit}) '}{put}",
        "} else {",
        *["  " + x for x in scalar],
        "}",
    ]
    return ["    " + x for x in vector]


def _vec_flag(src: Source, ptr: str, strides: tuple[int, int, int, int], cols: int) -> str | None:
    """C condition for 16-byte loads of a tensor's rows (None: its head columns are not contiguous)."""
    if strides[3] != 1 or cols % 8:
        return None
    flag = src.params(int(all(x % 8 == 0 for x in strides[:3])))
    return f"{flag} != 0 && (u64){ptr} % 16u == 0"


def mma_kernel(name: str, op: Op, p: Problem, inputs: list[Shape], out: Shape) -> KernelSpec:
    src = Source(name, op, p, inputs, out, BM)
    D, DV = p.d, p.dv
    DP, DVP = _round16(D), _round16(DV)
    qst, kst, vst = DP + PAD, DP + PAD, BN + PAD
    nv = DVP // 8
    vq, vk, vv = (_vec_flag(src, f"in{k}", st, n) for k, st, n in ((0, p.q, D), (1, p.k, D), (2, p.v, DV)))
    body = [
        "  MX_SMEM;",
        "  u16* Qs = reinterpret_cast<u16*>(mx_smem);  // [BM][QST]",
        f"  u16* Ks = Qs + {BM * qst};  // [BN][KST]",
        f"  u16* Vt = Ks + {BN * kst};  // [DVP][VST]: V transposed, so its B fragments are element pairs",
        *src.prologue(BM),
        "  const u32 g = lane / 4u, t2 = lane % 4u * 2u;",
        "  const bool vq = "
        + (vq or "false")
        + ", vk = "
        + (vk or "false")
        + ", vv = "
        + (vv or "false")
        + ";",
        "  // Q and K: zero first, so padded head columns and Q's rows past S read as zeros",
        f"  for (u32 e = tid; e < {(BM * qst + BN * kst) // 8}u; e += {THREADS}u)",
        "    reinterpret_cast<mx_vec<u16, 8>*>(Qs)[e] = mx_vec<u16, 8>{};",
        "  __syncthreads();",
        *_tile(
            "Qs",
            "in0",
            "q_at",
            BM,
            D,
            qst,
            first="i0",
            limit="S",
            conv="mx_qin",
            vec="vq" if vq else None,
        ),
        f"  float o[{nv}][4], m[2] = {{{NEG_INF}, {NEG_INF}}}, l[2] = {{0.f, 0.f}};",
        f"  MX_UNROLL for (int n = 0; n < {nv}; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;",
        "  const auto ia = i0 + warp * 16u + g, ib = ia + 8u;",
        f"  for ({src.idx} j0 = 0; j0 < jend; j0 += {BN}u) {{",
        "    __syncthreads();  // every warp is done with the previous tile",
        *_tile(
            "Ks",
            "in1",
            "k_at",
            BN,
            D,
            kst,
            first="j0",
            limit="L",
            conv="mx_kin",
            zero="1",
            vec="vk" if vk else None,
        ),
        *_tile(
            "Vt",
            "in2",
            "v_at",
            BN,
            DV,
            vst,
            first="j0",
            limit="L",
            conv="mx_ld",
            zero="1",
            transpose="1",
            vec="vv" if vv else None,
        ),
        "    __syncthreads();",
        f"    float s[{BN // 8}][4];",
        f"    MX_UNROLL for (int n = 0; n < {BN // 8}; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;",
        f"    MX_UNROLL for (int kk = 0; kk < {DP // 16}; ++kk) {{",
        f"      const u16* qa = Qs + (warp * 16u + g) * {qst}u + kk * 16 + t2;",
        f"      const u32 a[4] = {{mx_ld32(qa), mx_ld32(qa + {8 * qst}), mx_ld32(qa + 8),",
        f"                         mx_ld32(qa + {8 * qst + 8})}};",
        f"      MX_UNROLL for (int n = 0; n < {BN // 8}; ++n) {{",
        f"        const u16* kb = Ks + (n * 8 + g) * {kst}u + kk * 16 + t2;",
        "        const u32 bb[2] = {mx_ld32(kb), mx_ld32(kb + 8)};",
        "        mx_mma(s[n], a, bb);",
        "      }",
        "    }",
        f"    float top[2] = {{{NEG_INF}, {NEG_INF}}}, mu[2], alpha[2], sum[2] = {{0.f, 0.f}};",
        f"    MX_UNROLL for (int n = 0; n < {BN // 8}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e) {{",
        "      const auto i = e < 2 ? ia : ib;",
        "      const auto j = j0 + n * 8u + t2 + (e & 1);",
        f"      s[n][e] = {src.logit('s[n][e]', 'i', 'j')};",
        "      top[e / 2] = fmaxf(top[e / 2], s[n][e]);",
        "    }",
        "    MX_UNROLL for (int r = 0; r < 2; ++r) {  // a row lives in the 4 lanes of a quad",
        "      const float mn = fmaxf(m[r], mx_warp_reduce<4>(top[r], mx_fmaxf_f()));",
        f"      mu[r] = mn == {NEG_INF} ? 0.f : mn;  // all hidden so far: exp(-inf) = 0",
        "      alpha[r] = __expf(m[r] - mu[r]);  // the fast exp: half/bfloat16 probabilities",
        "      m[r] = mn;",
        "    }",
        f"    MX_UNROLL for (int n = 0; n < {BN // 8}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e) {{",
        "      s[n][e] = __expf(s[n][e] - mu[e / 2]);",
        "      sum[e / 2] += s[n][e];",
        "    }",
        "    MX_UNROLL for (int r = 0; r < 2; ++r)",
        "      l[r] = l[r] * alpha[r] + mx_warp_reduce<4>(sum[r], mx_sum_f());",
        f"    MX_UNROLL for (int n = 0; n < {nv}; ++n) {{",
        "      o[n][0] *= alpha[0]; o[n][1] *= alpha[0]; o[n][2] *= alpha[1]; o[n][3] *= alpha[1];",
        "    }",
        f"    MX_UNROLL for (int kk = 0; kk < {BN // 16}; ++kk) {{",
        "      const float* p0 = s[2 * kk];  // keys 16kk + 2t (+1), rows g and g + 8",
        "      const float* p1 = s[2 * kk + 1];  // the same 8 keys on",
        "      const u32 a[4] = {mx_pack(p0[0], p0[1]), mx_pack(p0[2], p0[3]), mx_pack(p1[0], p1[1]),",
        "                        mx_pack(p1[2], p1[3])};",
        f"      MX_UNROLL for (int n = 0; n < {nv}; ++n) {{",
        f"        const u16* vb = Vt + (n * 8 + g) * {vst}u + kk * 16 + t2;",
        "        const u32 bb[2] = {mx_ld32(vb), mx_ld32(vb + 8)};",
        "        mx_mma(o[n], a, bb);",
        "      }",
        "    }",
        "  }",
        f"  MX_UNROLL for (int n = 0; n < {nv}; ++n) MX_UNROLL for (int e = 0; e < 4; ++e) {{",
        "    const auto i = e < 2 ? ia : ib;",
        "    const u32 d = n * 8u + t2 + (e & 1);",
        f"    if (i < S && d < {DV}u) out0[o_at(b, h, i, d)] = mx_cvt<mx_e>(o[n][e] / l[e / 2]);",
        "  }",
    ]
    ab = "bf16" if p.t == DType.bf16_type else "f16"
    # The PTX type of mma.sync: a macro the header splices into its asm string (one literal).
    head = (
        PRELUDE + HEADER + src.functions() + f'#define MX_MMA_AB "{ab}"\n' + include("mx_attention_mma.cuh")
    )
    source = head + src.signature(THREADS) + " {\n" + "\n".join(body) + "\n}\n"
    shared = 2 * (BM * qst + BN * kst + DVP * vst)
    return src.spec(source, THREADS, shared)


__all__ = ["mma_kernel"]
