"""Generated kernels run on the host with warps: the same source, compiled by g++ with a shim for CUDA's
built-ins, every thread of a block an OS thread. ``__shfl_xor_sync`` exchanges through the warp's slots
between two barriers of its 32 threads, so kernels whose lanes cooperate (warp reductions) run as they
would on a GPU, only slowly: tests keep their sizes tiny. Blocks run one after another.

A kernel must leave whole warps at a time (``return`` before a shuffle by some lanes only would hang
here and is undefined on a GPU). Half precision uses g++'s ``_Float16`` (round to nearest even, like
``cvt.rn.f16.f32``).
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np

from migraphx_ep.targets.gpu.kernels.spec import KernelSpec

from .hostcc import GXX, host_library  # noqa: F401 - test_gqa_kernels reads hostwarp.GXX

SHIM = r"""
#include <math.h>
#include <string.h>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
struct mx_dim3 { unsigned x, y, z; };
static thread_local mx_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0};
static mx_dim3 gridDim = {1, 1, 1}, blockDim = {32, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
static inline float mx_h2f(unsigned short h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline unsigned short mx_bits16(_Float16 f) { unsigned short h; memcpy(&h, &f, 2); return h; }
static inline unsigned short mx_f2h(float x) { return mx_bits16((_Float16)x); }
static inline unsigned short mx_d2h(double x) { return mx_bits16((_Float16)x); }
static inline unsigned short mx_f2bf(float x) {
  unsigned u; memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
struct mx_barrier_t {
  std::mutex m; std::condition_variable cv; unsigned arrived = 0, gen = 0; unsigned slot[32];
  void wait(unsigned n) {
    std::unique_lock<std::mutex> lk(m);
    const unsigned g = gen;
    if (++arrived == n) { arrived = 0; ++gen; cv.notify_all(); }
    else cv.wait(lk, [&] { return gen != g; });
  }
};
static mx_barrier_t* mx_warps;
static mx_barrier_t* mx_block;
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) {
  mx_barrier_t& w = mx_warps[threadIdx.x / 32u];
  const unsigned lane = threadIdx.x % 32u;
  w.slot[lane] = v;
  w.wait(32);
  const unsigned r = w.slot[lane ^ (unsigned)m];
  w.wait(32);
  return r;
}
static inline void __syncthreads() { mx_block->wait(blockDim.x); }
struct mx_any { void* p; template <class P> operator P*() const { return (P*)p; } };
"""

LAUNCHER = r"""
extern "C" void mx_launch(void** p, const unsigned long long* a, unsigned gx, unsigned gy, unsigned bx) {
  gridDim = {gx, gy, 1};
  blockDim = {bx, 1, 1};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      std::vector<mx_barrier_t> warps((bx + 31) / 32);
      mx_barrier_t block;
      mx_warps = warps.data();
      mx_block = &block;
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < bx; ++t)
        ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, 0}; CALL; });
      for (auto& th : ts) th.join();
    }
}
"""


def build(spec: KernelSpec, tmp: Path) -> ctypes.CDLL:
    """The kernel and a launcher as a shared library (named by the hash of the source and headers)."""
    n_ptr = spec.n_inputs + spec.n_outputs + (1 if spec.checks else 0)
    scalar = "unsigned long long" if spec.arg_bits == 64 else "unsigned"
    args = [f"mx_any{{p[{i}]}}" for i in range(n_ptr)] + [f"({scalar})a[{i}]" for i in range(len(spec.args))]
    source = SHIM + spec.source + LAUNCHER.replace("CALL", f"{spec.name}({', '.join(args)})")
    return host_library(source, tmp, ["-pthread"])


def aligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` at a 256-byte aligned address, as the arena places buffers."""
    raw = np.empty(a.nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    out = raw[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def launch_pointers(spec: KernelSpec, tmp: Path, pointers: list[int]) -> int:
    """Run ``spec`` on these addresses (inputs, then outputs); returns what it left in its error slot."""
    assert re.search(rf"\b{spec.name}\(", spec.source)
    lib = build(spec, tmp)
    err = np.zeros(1, np.int32)
    ptrs = list(pointers) + ([err.ctypes.data] if spec.checks else [])
    argv = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
    vals = (ctypes.c_ulonglong * max(len(spec.args), 1))(*spec.args)
    lib.mx_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_uint] * 3
    lib.mx_launch(argv, vals, spec.grid[0], spec.grid[1], spec.block[0])
    return int(err[0])


def launch(spec: KernelSpec, tmp: Path, ins: list[np.ndarray], outs: list[np.ndarray]) -> int:
    """Run ``spec`` over ``ins`` into ``outs`` (in place; pass ``aligned`` arrays where the kernel makes
    vector accesses); returns what it left in its error slot."""
    return launch_pointers(spec, tmp, [a.ctypes.data for a in (*ins, *outs)])
