// mx_gqa_update.cuh: GroupQueryAttention's KV-cache update: present_key/value from the past and the
// new rows (keys rotated).
// The constants it reads are listed in mx_gqa.cuh.
#ifndef MX_GQA_UPDATE_CUH
#define MX_GQA_UPDATE_CUH
#include "mx_gqa.cuh"

// ---- update: a thread per V-element chunk of present (grid-stride) --------------------------------
struct mx_gqa_update_args {
  const T *k, *v, *pk, *pv;
  const i32 *sk, *tot;
  const T *cs, *sn;
  T *ok, *ov;
  i32* err;
  IDX B, S, L, LP, M;
  IDX KS0, KS1, VS0, VS1, PKS0, PKS1, PKS2, PVS0, PVS1, PVS2;  // strides (b, s) and (b, h, l)
};

// A chunk: one vector access where the address allows it (strided inputs may not allow it).
MX_DEV mx_vec<T, V> mx_gqa_vec(const T* p) {
  if (((u64)p & (sizeof(mx_vec<T, V>) - 1u)) == 0u) return *reinterpret_cast<const mx_vec<T, V>*>(p);
  mx_vec<T, V> w;
  MX_UNROLL for (u32 q = 0; q < V; ++q) w.v[q] = p[q];
  return w;
}

// The ref's run-time checks in its order (GroupQueryAttention.run_lengths): the first failing code.
MX_DEV i32 mx_gqa_check(const mx_gqa_update_args& a) {
  const i64 total = a.tot[0], S = a.S, B = a.B, LP = a.LP, L = a.L;
  const i64 want = HAS_PAST ? (total > LP ? total : LP) : total;
  if (want != L) return 1;
  const bool first = total == S;
  if (!first && S > 1 && B != 1) return 2;
  i64 maxp = 0;
  for (i64 b = 0; b < B; ++b) {
    const i64 t = (i64)a.sk[b] + 1, p = first ? 0 : t - S;
    if (t < 1 || p < 0 || p > LP || p + S > L) return 3;
    if (p > maxp) maxp = p;
  }
  for (i64 b = 0; b < B; ++b) {
    const i64 t = (i64)a.sk[b] + 1, p = first ? 0 : t - S;
    if (t > p + S) return 4;
  }
  if (ROTARY && maxp + S - 1 >= (i64)a.M) return 5;
  return 0;
}

// present[b, h, l] = past[b, h, l] for l < P_b, the new row l - P_b (keys rotated at position l, rounded
// to T as ORT stores them) for l < P_b + S, else zero.
MX_DEV void mx_gqa_update(const mx_gqa_update_args& a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const i32 code = mx_gqa_check(a);
    if (code) mx_fail(a.err, code);
  }
  const bool first = (i64)a.tot[0] == (i64)a.S;
  const IDX n = a.B * HKV * a.L * (D / V);
  for (IDX c = blockIdx.x * blockDim.x + threadIdx.x; c < n; c += gridDim.x * blockDim.x) {
    const u32 d0 = (u32)(c % (D / V)) * V;
    IDX r = c / (D / V);
    const IDX l = r % a.L;
    r /= a.L;
    const IDX h = r % HKV, b = r / HKV;
    i64 t;
    const i64 p = mx_gqa_past(a.sk, b, first, a.S, a.LP, a.L, &t);
    if (p < 0) continue;
    mx_vec<T, V> kw, vw;
    if ((i64)l < p) {
      kw = mx_gqa_vec(a.pk + b * a.PKS0 + h * a.PKS1 + l * a.PKS2 + d0);
      vw = mx_gqa_vec(a.pv + b * a.PVS0 + h * a.PVS1 + l * a.PVS2 + d0);
    } else if ((i64)l < p + (i64)a.S) {
      const IDX s = (IDX)((i64)l - p);
      const T* kr = a.k + b * a.KS0 + s * a.KS1 + h * D;
      kw = mx_gqa_vec(kr + d0);
      vw = mx_gqa_vec(a.v + b * a.VS0 + s * a.VS1 + h * D + d0);
      if (ROTARY && d0 < RD) {
        if (l >= a.M) continue;  // reported by check 5
        const T* cr = a.cs + (u64)l * HALF;
        const T* sr = a.sn + (u64)l * HALF;
        MX_UNROLL for (u32 q = 0; q < V; ++q) kw.v[q] = mx_cvt<T>(mx_gqa_rot(kr, d0 + q, cr, sr));
      }
    } else {
      MX_UNROLL for (u32 q = 0; q < V; ++q) kw.v[q] = vw.v[q] = mx_cvt<T>(0.0f);
    }
    *reinterpret_cast<mx_vec<T, V>*>(a.ok + c * V) = kw;
    *reinterpret_cast<mx_vec<T, V>*>(a.ov + c * V) = vw;
  }
}

#endif  // MX_GQA_UPDATE_CUH
