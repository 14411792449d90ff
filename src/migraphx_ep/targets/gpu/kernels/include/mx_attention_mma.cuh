// mx_attention_mma.cuh: the tensor-core pieces of fused attention's mma schedule (attention_mma.py).
//
// The kernel defines, before including this, mx_e (the 16-bit storage type, mx_f16 or mx_bf16) and the
// macro MX_MMA_AB, the PTX name of that type in mma.sync ("f16" or "bf16"): a macro rather than a
// branch on mx_e, so the asm string stays one literal, the text the generator used to splice in.
// Before sm_80, and on a host compiling this source with a shim (how it is tested), mx_mma swaps the
// fragments through shared memory and multiplies them in float: the same layouts, slowly.
#ifndef MX_ATTENTION_MMA_CUH
#define MX_ATTENTION_MMA_CUH
#include "mx_prelude.cuh"
#include "mx_attention.cuh"

#ifndef MX_MMA_AB
#error "define MX_MMA_AB (\"f16\" or \"bf16\") before including mx_attention_mma.cuh"
#endif
MX_DEV u32 mx_ld32(const u16* p) { return *reinterpret_cast<const u32*>(p); }
MX_DEV u16 mx_bits(float x) { return mx_cvt<mx_e>(x).bits; }
MX_DEV u32 mx_pack(float lo, float hi) { return (u32)mx_bits(lo) | ((u32)mx_bits(hi) << 16); }
MX_DEV float mx_lo(u32 x) { return mx_ld(mx_e{(u16)(x & 0xffffu)}); }
MX_DEV float mx_hi(u32 x) { return mx_ld(mx_e{(u16)(x >> 16)}); }
// c += a * b for one warp: A 16x16 row-major (4 regs), B 16x8 column-major (2 regs), C 16x8 float.
MX_DEV void mx_mma(float* c, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32." MX_MMA_AB "." MX_MMA_AB ".f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __shared__ float mx_fa[4][16][17], mx_fb[4][16][9];
  const u32 lane = threadIdx.x % 32u, w = threadIdx.x / 32u, g = lane / 4u, t2 = lane % 4u * 2u;
  float (*A)[17] = mx_fa[w];
  float (*B)[9] = mx_fb[w];
  A[g][t2] = mx_lo(a[0]); A[g][t2 + 1] = mx_hi(a[0]);
  A[g + 8][t2] = mx_lo(a[1]); A[g + 8][t2 + 1] = mx_hi(a[1]);
  A[g][t2 + 8] = mx_lo(a[2]); A[g][t2 + 9] = mx_hi(a[2]);
  A[g + 8][t2 + 8] = mx_lo(a[3]); A[g + 8][t2 + 9] = mx_hi(a[3]);
  B[t2][g] = mx_lo(b[0]); B[t2 + 1][g] = mx_hi(b[0]); B[t2 + 8][g] = mx_lo(b[1]); B[t2 + 9][g] = mx_hi(b[1]);
  __syncwarp();
  for (int k = 0; k < 16; ++k) {
    c[0] += A[g][k] * B[k][t2]; c[1] += A[g][k] * B[k][t2 + 1];
    c[2] += A[g + 8][k] * B[k][t2]; c[3] += A[g + 8][k] * B[k][t2 + 1];
  }
  __syncwarp();
#endif
}

// Asynchronous global -> shared copies (sm_80's cp.async): 16 bytes, or 16 zero bytes where `valid` is
// false (keys past the end: their V rows must be zeros, not garbage, since 0 * NaN is NaN). The copies
// of one commit group land after mx_cp_wait<N> (at most N newer groups still in flight) and a barrier.
// Elsewhere a plain copy, done at once, so the waits have nothing to wait for.
MX_DEV void mx_cp16(u16* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
#else
  if (valid) *reinterpret_cast<mx_vec<u16, 8>*>(dst) = *reinterpret_cast<const mx_vec<u16, 8>*>(src);
  else *reinterpret_cast<mx_vec<u16, 8>*>(dst) = mx_vec<u16, 8>{};
#endif
}
MX_DEV void mx_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> MX_DEV void mx_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// The B fragments of two m16n8k16 MMAs from a row-major 16 x 16 tile of 16-bit elements (row stride
// `st` elements; rows are the k index, columns n): b[0..1] for columns 0-7, b[2..3] for columns 8-15.
// On sm_80+ one ldmatrix.x4.trans (each lane names one 16-byte row: lanes 0-7 rows 0-7 and 8-15 rows
// 8-15 of the left half, 16-31 the same rows of the right half); elsewhere the same values read directly.
MX_DEV void mx_ldsm_x4_trans(u32* b, const u16* tile, u32 st) {
  const u32 lane = threadIdx.x % 32u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const u16* row = tile + (lane % 16u) * st + (lane / 16u) * 8u;
  const u32 a = (u32)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(a));
#else
  const u32 g = lane / 4u, t2 = lane % 4u * 2u;
  for (u32 q = 0; q < 4; ++q) {  // q: columns (q / 2) * 8 on, rows (q % 2) * 8 on
    const u16* c = tile + (q % 2u) * 8u * st + (q / 2u) * 8u + g;
    b[q] = (u32)c[t2 * st] | ((u32)c[(t2 + 1u) * st] << 16);
  }
#endif
}

#endif  // MX_ATTENTION_MMA_CUH
