// mx_fp8.cuh: fp8 E4M3 bytes to float and back for the quantised GEMM, convolution and quantizelinear.
//
// Decoding is exact for every code (NaN stays NaN), so the generated GEMM and convolution take fp8
// operands on any GPU. Products of two E4M3 values have at most 8 significant bits, so a float fma adds
// each one exactly and only the running sums round: the ref's float32 matmul up to summation order.
// These kernels read fp8 as raw u8 and decode where they load; mx_to_e4m3fn is the way back, rounded to
// nearest even as ml_dtypes' astype (a magnitude rounding past 448 is NaN, or 448 when saturating);
// quantize_fp8_kernel uses it. The codecs are the prelude's (mx_from_f8, mx_to_f8): one definition.
//
// E4M3FN (OCP): bias 7, no infinity, NaN = S.1111.111. E4M3FNUZ: bias 8, 0x80 is the only NaN, no -0.
#ifndef MX_FP8_CUH
#define MX_FP8_CUH
#include "mx_prelude.cuh"

MX_DEV float mx_e4m3fn(u8 v) { return mx_from_f8<mx_fp8e4m3fn>(v); }
MX_DEV float mx_e4m3fnuz(u8 v) { return mx_from_f8<mx_fp8e4m3fnuz>(v); }
MX_DEV u8 mx_to_e4m3fn(float f, bool saturate) { return mx_to_f8<mx_fp8e4m3fn>(f, saturate).bits; }

#endif  // MX_FP8_CUH
