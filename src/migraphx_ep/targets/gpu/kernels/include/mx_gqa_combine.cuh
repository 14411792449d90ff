// mx_gqa_combine.cuh: GroupQueryAttention's flash-decoding combine: merges the splits'
// (max, sum, acc[D]).
// The constants it reads are listed in mx_gqa.cuh.
#ifndef MX_GQA_COMBINE_CUH
#define MX_GQA_COMBINE_CUH
#include "mx_gqa.cuh"

// ---- combine: a warp per output row (b, s, hq), lanes across D -----------------------------------
struct mx_gqa_combine_args {
  const float* pr;
  const T* sink;
  T* out;
  IDX NROWS, NS;
};

MX_DEV void mx_gqa_combine(const mx_gqa_combine_args& a) {
  const u32 lane = threadIdx.x % 32u;
  const u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32u;
  if (row >= a.NROWS) return;
  const float* pr = a.pr + row * a.NS * (D + 2u);
  const float x = EXTRA == 2 ? mx_ld(a.sink[row % HQ]) : EXTRA == 1 ? 0.0f : mx_ninf();
  float mx = x;
  for (u64 k = 0; k < a.NS; ++k) mx = fmaxf(mx, pr[k * (D + 2u)]);
  float den = EXTRA ? expf(x - mx) : 0.0f;
  for (u64 k = 0; k < a.NS; ++k) {
    const float mk = pr[k * (D + 2u)];
    if (mk != mx_ninf()) den += pr[k * (D + 2u) + 1u] * expf(mk - mx);  // empty splits are skipped
  }
  for (u32 d = lane; d < D; d += 32u) {
    float y = 0.0f;
    for (u64 k = 0; k < a.NS; ++k) {
      const float mk = pr[k * (D + 2u)];
      if (mk != mx_ninf()) y += pr[k * (D + 2u) + 2u + d] * expf(mk - mx);
    }
    a.out[row * D + d] = mx_cvt<T>(y / den);
  }
}

#endif  // MX_GQA_COMBINE_CUH
