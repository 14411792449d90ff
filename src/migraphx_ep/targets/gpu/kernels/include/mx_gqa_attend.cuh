// mx_gqa_attend.cuh: GroupQueryAttention's attention rows: an online softmax per (b, s, kv head,
// group of query heads).
// The constants it reads are listed in mx_gqa.cuh.
#ifndef MX_GQA_ATTEND_CUH
#define MX_GQA_ATTEND_CUH
#include "mx_gqa.cuh"

// ---- attend: a warp per (b, s, kv head, group of HW query heads); lanes hold E elements of D --------
struct mx_gqa_attend_args {
  const T *q, *pk, *pv;
  const i32 *sk, *tot;
  const T *cs, *sn, *sink;
  OUT* out;
  IDX S, L, LP, M, QS0, QS1, NROWS, MINC;
};

// Row j's E elements of lane e0 / E (zero where !ok or past D). Present rows are 256-byte aligned
// buffers and E divides D when VEC, so the vector load is aligned.
MX_DEV void mx_gqa_row(const T* p, u32 e0, float* x, bool ok) {
  if (VEC && ok) { mx_ldv<(int)(VEC ? E : 1u)>(p, x); return; }
  MX_UNROLL for (u32 e = 0; e < E; ++e) x[e] = ok && e0 + e < D ? mx_ld(p[e]) : 0.0f;
}

MX_DEV void mx_gqa_attend(const mx_gqa_attend_args& a) {
  const u32 lane = threadIdx.x % 32u;
  const u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32u;
  if (row >= a.NROWS) return;  // whole warps leave: the shuffles below need every lane
  constexpr u32 NSUB = G / HW;
  const u32 sub = (u32)(row % NSUB);
  u64 r = row / NSUB;
  const u32 h = (u32)(r % HKV);
  r /= HKV;
  const u64 s = r % a.S, b = r / a.S;
  i64 t;
  const i64 p = mx_gqa_past(a.sk, b, (i64)a.tot[0] == (i64)a.S, a.S, a.LP, a.L, &t);
  if (p < 0) return;  // the update kernel reports it
  const i64 pos = p + (i64)s;
  if (ROTARY && pos >= (i64)a.M) return;
  i64 hi = CAUSAL && pos + 1 < t ? pos + 1 : t;
  i64 lo = WINDOW > 0 && pos - WINDOW + 1 > 0 ? pos - WINDOW + 1 : 0;
  if (lo >= hi) { lo = 0; hi = 1; }  // nothing to attend (a padding row): key 0, as the ref does
  // This block's share of the keys: gridDim.y splits of at least MINC keys (flash decoding).
  const i64 ns = gridDim.y;
  i64 chunk = (hi - lo + ns - 1) / ns;
  if (chunk < (i64)a.MINC) chunk = (i64)a.MINC;
  const i64 j0 = lo + (i64)blockIdx.y * chunk, j1 = hi < j0 + chunk ? hi : j0 + chunk;
  const u32 hq0 = h * G + sub * HW, e0 = lane * E;
  const u64 orow = (b * a.S + s) * HQ + hq0;  // output row (b, s, hq0)
  if (SPLIT && j0 >= j1) {  // no keys here: an empty partial (max -inf), which the combine skips
    MX_UNROLL for (u32 i = 0; i < HW; ++i) {
      float* o = (float*)a.out + ((orow + i) * gridDim.y + blockIdx.y) * (D + 2u);
      if (lane == 0u) { o[0] = mx_ninf(); o[1] = 0.0f; }
    }
    return;
  }
  float qv[HW][E], m[HW], l[HW], acc[HW][E];
  MX_UNROLL for (u32 i = 0; i < HW; ++i) {  // queries rotated and rounded like the keys
    const T* qr = a.q + b * a.QS0 + s * a.QS1 + (hq0 + i) * D;
    MX_UNROLL for (u32 e = 0; e < E; ++e) {
      const u32 d = e0 + e;
      float x = 0.0f;
      if (d < D) {
        if (ROTARY && d < RD) x = mx_round<T>(mx_gqa_rot(qr, d, a.cs + pos * HALF, a.sn + pos * HALF));
        else x = mx_ld(qr[d]);
      }
      qv[i][e] = x;
      acc[i][e] = 0.0f;
    }
    m[i] = mx_ninf();
    l[i] = 0.0f;
  }
  const bool mine = e0 < D;
  const u64 base = ((u64)b * HKV + h) * a.L * D + e0;
  for (i64 j = j0; j < j1; j += KU) {  // KU keys a step: their warp reductions overlap
    float sc[KU][HW];
    MX_UNROLL for (u32 u = 0; u < KU; ++u) {
      float kv[E];
      mx_gqa_row(a.pk + base + (u64)(j + u) * D, e0, kv, mine && j + u < j1);
      MX_UNROLL for (u32 i = 0; i < HW; ++i) {
        float x = 0.0f;
        MX_UNROLL for (u32 e = 0; e < E; ++e) x += qv[i][e] * kv[e];
        sc[u][i] = x;
      }
    }
    MX_UNROLL for (int w = 16; w > 0; w >>= 1)
      MX_UNROLL for (u32 u = 0; u < KU; ++u)
        MX_UNROLL for (u32 i = 0; i < HW; ++i) sc[u][i] += mx_shfl_xor(sc[u][i], w);
    MX_UNROLL for (u32 i = 0; i < HW; ++i) {  // online softmax: rescale by the new running max
      float mx = m[i];
      MX_UNROLL for (u32 u = 0; u < KU; ++u) {
        float x = sc[u][i] * SCALE;
        if (CAP > 0.0f) x = tanhf(x / CAP) * CAP;
        sc[u][i] = j + u < j1 ? x : mx_ninf();
        mx = fmaxf(mx, sc[u][i]);
      }
      const float corr = expf(m[i] - mx);
      m[i] = mx;
      l[i] *= corr;
      MX_UNROLL for (u32 e = 0; e < E; ++e) acc[i][e] *= corr;
      MX_UNROLL for (u32 u = 0; u < KU; ++u) {
        sc[u][i] = expf(sc[u][i] - mx);
        l[i] += sc[u][i];
      }
    }
    MX_UNROLL for (u32 u = 0; u < KU; ++u) {
      float vv[E];
      mx_gqa_row(a.pv + base + (u64)(j + u) * D, e0, vv, mine && j + u < j1);
      MX_UNROLL for (u32 i = 0; i < HW; ++i)
        MX_UNROLL for (u32 e = 0; e < E; ++e) acc[i][e] += sc[u][i] * vv[e];
    }
  }
  MX_UNROLL for (u32 i = 0; i < HW; ++i) {
    if (SPLIT) {  // (max, sum, acc[D]) of this split
      float* o = (float*)a.out + ((orow + i) * gridDim.y + blockIdx.y) * (D + 2u);
      if (lane == 0u) { o[0] = m[i]; o[1] = l[i]; }
      MX_UNROLL for (u32 e = 0; e < E; ++e) if (e0 + e < D) o[2u + e0 + e] = acc[i][e];
    } else {
      float den = l[i], c = 1.0f;
      if (EXTRA) {  // the extra logit joins the denominator (smooth softmax: 0; head sink: per head)
        const float x = EXTRA == 2 ? mx_ld(a.sink[hq0 + i]) : 0.0f, m2 = fmaxf(m[i], x);
        c = expf(m[i] - m2);
        den = den * c + expf(x - m2);
      }
      T* o = (T*)a.out + (orow + i) * D;
      MX_UNROLL for (u32 e = 0; e < E; ++e) if (e0 + e < D) o[e0 + e] = mx_cvt<T>(acc[i][e] * c / den);
    }
  }
}

#endif  // MX_GQA_ATTEND_CUH
