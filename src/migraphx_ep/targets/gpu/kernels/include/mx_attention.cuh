// mx_attention.cuh: what both fused-attention schedules (kernels/attention.py, attention_mma.py) share.
//
// MX_SMEM declares the dynamic shared memory; a host test shim defines it first (a static buffer).
#ifndef MX_ATTENTION_CUH
#define MX_ATTENTION_CUH
#include "mx_prelude.cuh"

#ifndef MX_SMEM
#define MX_SMEM extern __shared__ __align__(16) u8 mx_smem[]
#endif
struct mx_fmaxf_f { MX_DEV float operator()(float a, float b) const { return fmaxf(a, b); } };

#endif  // MX_ATTENTION_CUH
