// mx_gqa.cuh: what the GroupQueryAttention kernels share (kernels/gqa.py generates the kernels).
//
// A generated kernel defines the constants this code reads (T, IDX, WARPS, D, HQ, HKV, G, HALF, RD, the
// flags INTERLEAVED, ROTARY, HAS_PAST, CAUSAL, and SCALE, CAP, WINDOW, EXTRA; for the attend kernel also
// E, HW, KU, VEC, SPLIT and OUT), then includes one of mx_gqa_update.cuh, mx_gqa_attend.cuh or
// mx_gqa_combine.cuh (each includes this one) and calls its mx_gqa_update, mx_gqa_attend or
// mx_gqa_combine with its pointers and run-time sizes (null pointers for absent inputs). One header per
// kernel, so each source compiles only its own section.
#ifndef MX_GQA_CUH
#define MX_GQA_CUH
#include "mx_prelude.cuh"

constexpr u32 V = 16u / sizeof(T);  // elements per 16-byte chunk: D and HALF are multiples of it
MX_DEV float mx_ninf() { return __int_as_float((int)0xff800000u); }

// P_b of batch b (T_b in *t), or -1 where its lengths are out of range (the update kernel reports it):
// nothing is then read or written for that batch entry.
MX_DEV i64 mx_gqa_past(const i32* sk, u64 b, bool first, i64 S, i64 LP, i64 L, i64* t) {
  *t = (i64)sk[b] + 1;
  const i64 p = first ? 0 : *t - S;
  return (*t < 1 || p < 0 || p > LP || p + S > L || *t > p + S) ? -1 : p;
}

// Element d < RD of row x rotated by the cos/sin table rows cr, sr: numpy's float32 products, no fma.
MX_DEV float mx_gqa_rot(const T* x, u32 d, const T* cr, const T* sr) {
  u32 j, i1, i2;
  bool re;
  if (INTERLEAVED) { j = d / 2u; i1 = d & ~1u; i2 = i1 + 1u; re = (d & 1u) == 0u; }
  else { re = d < HALF; j = re ? d : d - HALF; i1 = j; i2 = j + HALF; }
  const float c = mx_ld(cr[j]), s = mx_ld(sr[j]), x1 = mx_ld(x[i1]), x2 = mx_ld(x[i2]);
  return re ? mx_mul_rn(c, x1) - mx_mul_rn(s, x2) : mx_mul_rn(s, x1) + mx_mul_rn(c, x2);
}

#endif  // MX_GQA_CUH
