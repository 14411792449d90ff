// mx_fp8.cuh: fp8 E4M3 bytes to float and back, in software.
//
// Decoding is exact for every code (NaN stays NaN), so the generated GEMM and convolution take fp8
// operands on any GPU. Products of two E4M3 values have at most 8 significant bits, so a float fma adds
// each one exactly and only the running sums round: the ref's float32 matmul up to summation order. fp8
// has no storage type in the prelude (c_type), so kernels read it as raw u8 and decode where they load.
// mx_to_e4m3fn is the way back: float to E4M3FN rounded to nearest even, as ml_dtypes' astype (a
// magnitude rounding past 448 is NaN, or 448 when saturating); quantize_fp8_kernel uses it.
//
// E4M3FN (OCP): bias 7, no infinity, NaN = S.1111.111. E4M3FNUZ: bias 8, 0x80 is the only NaN, no -0.
#ifndef MX_FP8_CUH
#define MX_FP8_CUH
#include "mx_prelude.cuh"

MX_DEV float mx_e4m3fn(u8 v) {
  const u32 s = (u32)(v & 0x80u) << 24, e = (v >> 3) & 15u, m = v & 7u;
  if (e == 15u && m == 7u) return __int_as_float((int)(s | 0x7fc00000u));
  if (e == 0u) { const float f = (float)m * 0.001953125f; return s ? -f : f; }  // m * 2^-9
  return __int_as_float((int)(s | ((e + 120u) << 23) | (m << 20)));
}
MX_DEV float mx_e4m3fnuz(u8 v) {
  if (v == 0x80u) return __int_as_float(0x7fc00000);
  const u32 s = (u32)(v & 0x80u) << 24, e = (v >> 3) & 15u, m = v & 7u;
  if (e == 0u) { const float f = (float)m * 0.0009765625f; return s ? -f : f; }  // m * 2^-10
  return __int_as_float((int)(s | ((e + 119u) << 23) | (m << 20)));
}
MX_DEV u8 mx_to_e4m3fn(float f, bool saturate) {
  const u32 b = __float_as_uint(f), s = (b >> 24) & 0x80u, a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return (u8)(s | 0x7fu);  // NaN
  // Past 448 (0x43e00000) up to 464 (the tie with 480, which E4M3FN spends on NaN) rounds to 448.
  if (a > 0x43e00000u) return (u8)(s | ((saturate || a <= 0x43e80000u) ? 0x7eu : 0x7fu));
  if (a < 0x3c800000u) return (u8)(s | (u32)rintf(__uint_as_float(a) * 512.0f));  // subnormal: 2^-9 units
  const u32 r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // 3 mantissa bits, ties to even
  return (u8)(s | (r - (120u << 3)));  // exponent bias 127 -> 7
}

#endif  // MX_FP8_CUH
