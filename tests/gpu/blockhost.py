"""Run a generated kernel's blocks on the host: g++ compiles the same source with a shim, and every CUDA
thread of a block is an OS thread, so kernels whose threads cooperate (``__syncthreads``, ``__syncwarp``,
warp shuffles through memory, dynamic shared memory) run as written. Blocks run one after another.

Slow (a barrier is a round of context switches), so for small shapes only; test_kernel_host.py's
thread-at-a-time launcher is the cheap one for kernels whose threads never talk to each other.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np

from migraphx_ep.targets.gpu.kernels.headers import HEADERS, INCLUDE_DIR
from migraphx_ep.targets.gpu.kernels.spec import KernelSpec

HAVE_GXX = shutil.which("g++") is not None

SHIM = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
using std::isinf;
struct mx_dim3 { unsigned x, y, z; };
static thread_local mx_dim3 threadIdx = {0, 0, 0};
static mx_dim3 blockIdx = {0, 0, 0}, gridDim = {1, 1, 1}, blockDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) alignas(n)
static std::barrier<>* mx_block_barrier;
static std::barrier<>* mx_warp_barrier[32];
static unsigned mx_lanes[1024];
static inline void __syncthreads() { mx_block_barrier->arrive_and_wait(); }
static inline void __syncwarp(unsigned = 0xffffffffu) {
  mx_warp_barrier[threadIdx.x / 32]->arrive_and_wait();
}
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) {
  mx_lanes[threadIdx.x] = v;
  __syncwarp();
  const unsigned r = mx_lanes[threadIdx.x ^ (unsigned)m];
  __syncwarp();
  return r;
}
alignas(16) static unsigned char mx_host_smem[256 * 1024];
#define MX_SMEM unsigned char* mx_smem = mx_host_smem
float mx_h2f(unsigned short h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
template <class F> unsigned short mx_to_h(F x) {  // one rounding, as cvt.rn.f16.f32 / .f64
  _Float16 f = (_Float16)x;
  unsigned short h;
  std::memcpy(&h, &f, 2);
  return h;
}
unsigned short mx_f2h(float x) { return mx_to_h(x); }
unsigned short mx_d2h(double x) { return mx_to_h(x); }
unsigned short mx_f2bf(float x) {  // round to nearest even, NaN stays NaN (cvt.rn.bf16.f32)
  unsigned u; std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
static inline float __fmul_rn(float a, float b) { return a * b; }
#define __expf expf  // glibc declares its own __expf
static inline double __dmul_rn(double a, double b) { return a * b; }
struct mx_any { void* p; template <class T> operator T*() const { return (T*)p; } };
"""

LAUNCH = r"""
extern "C" void mx_launch(void** ptrs, const unsigned long long* sc, unsigned grid, unsigned nt) {
  gridDim.x = grid; blockDim.x = nt;
  for (unsigned bx = 0; bx < grid; ++bx) {
    blockIdx.x = bx;
    std::barrier<> block(nt);
    mx_block_barrier = &block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (unsigned w = 0; w < nt / 32; ++w) {
      warps.emplace_back(new std::barrier<>(32));
      mx_warp_barrier[w] = warps.back().get();
    }
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < nt; ++t) threads.emplace_back([=] { threadIdx.x = t; $CALL; });
    for (auto& th : threads) th.join();
  }
}
"""


def build(spec: KernelSpec, tmp: Path) -> ctypes.CDLL:
    ptrs = [f"mx_any{{ptrs[{k}]}}" for k in range(spec.n_inputs + spec.n_outputs)]
    call = f"{spec.name}({', '.join(ptrs + [f'sc[{k}]' for k in range(len(spec.args))])})"
    source = SHIM + spec.source + LAUNCH.replace("$CALL", call)
    key = hashlib.sha256((HEADERS.digest + source).encode()).hexdigest()[:16]
    src, lib = tmp / f"{key}.cpp", tmp / f"{key}.so"
    if not lib.exists():
        src.write_text(source)
        cmd = ["g++", "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread", "-I", str(INCLUDE_DIR)]
        cmd += ["-o", str(lib), str(src)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


def launch(spec: KernelSpec, tmp: Path, ins: list[np.ndarray], out: np.ndarray) -> None:
    """Run every block of ``spec`` over ``ins`` (flat buffers the kernel indexes with its own strides)
    into ``out`` in place."""
    assert spec.grid[1:] == (1, 1) and spec.block[1:] == (1, 1) and spec.block[0] % 32 == 0
    assert spec.shared_bytes <= 256 * 1024 and not spec.checks
    lib = build(spec, tmp)
    arrays = [np.ascontiguousarray(a) for a in ins]
    ptrs = (ctypes.c_void_p * (len(arrays) + 1))(*[a.ctypes.data for a in arrays], out.ctypes.data)
    scalars = (ctypes.c_ulonglong * max(len(spec.args), 1))(*spec.args)
    lib.mx_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    lib.mx_launch(ptrs, scalars, spec.grid[0], spec.block[0])
