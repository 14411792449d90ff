"""Run one block of a generated kernel on the host with cooperating threads (no GPU needed).

``test_kernel_host.py`` calls a kernel once per thread, so only kernels whose threads never talk to each
other run there. Here every thread of the block is a fiber (``ucontext``) on one OS thread, and the CUDA
built-ins that make threads cooperate are real: ``__syncthreads`` waits for every thread of the block,
``__shfl_xor_sync`` exchanges values among the 32 lanes of a warp, ``__shared__`` memory is one copy for
the block. A barrier some threads never reach (a divergent shuffle, a ``__syncthreads`` inside a
branch that not every thread takes, a thread that exits while others wait) is reported as a deadlock
instead of hanging, which is stricter than a GPU. Grid-stride loops cover all the work with one block
(``gridDim.x == 1``), so the numbers can be compared with the ref.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from migraphx_ep.targets.gpu.kernels.spec import KernelSpec

from .hostcc import GXX, host_library

HAVE_GXX = GXX is not None

SHIM = r"""
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <ucontext.h>
// CUDA's float overloads of the math library (``exp(float)`` is float there, double in C's header).
using std::isinf; using std::exp; using std::log; using std::sqrt; using std::pow; using std::fabs;
using std::expm1; using std::log1p; using std::tanh; using std::erf; using std::sin; using std::cos;
using std::tan; using std::asin; using std::acos; using std::atan; using std::sinh; using std::cosh;
using std::asinh; using std::acosh; using std::atanh; using std::ceil; using std::floor;
using std::nearbyint; using std::fmod; using std::copysign;
struct mx_dim3 { unsigned x, y, z; };
static mx_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, gridDim = {1, 1, 1}, blockDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
// The four PTX conversions, by the compiler's own IEEE half (round to nearest even).
static inline float mx_h2f(unsigned short h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
static inline unsigned short mx_half_bits(_Float16 f) { unsigned short h; std::memcpy(&h, &f, 2); return h; }
static inline unsigned short mx_f2h(float x) { return mx_half_bits((_Float16)x); }
static inline unsigned short mx_d2h(double x) { return mx_half_bits((_Float16)x); }  // one rounding
static inline unsigned short mx_f2bf(float x) {
  unsigned b; std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

namespace mx_sim {
enum { RUN = 0, WARP = 1, BLOCK = 2 };
static const int STACK = 1 << 16;
static int nt, cur;
static ucontext_t sched_ctx, *ctx;
static char* stacks;
static int* state;
static bool* done;
static unsigned long long* slot;
static void (*entry)();
static void trampoline() { entry(); done[cur] = true; }
static void wait_at(int kind) { state[cur] = kind; swapcontext(&ctx[cur], &sched_ctx); }
// Returns 0 when every thread finished, 1 on a deadlock.
static int run(void (*f)(), int threads) {
  nt = threads; entry = f;
  ctx = new ucontext_t[nt]; stacks = (char*)std::malloc((size_t)nt * STACK);
  state = new int[nt](); done = new bool[nt](); slot = new unsigned long long[nt]();
  for (int i = 0; i < nt; ++i) {
    getcontext(&ctx[i]);
    ctx[i].uc_stack.ss_sp = stacks + (size_t)i * STACK; ctx[i].uc_stack.ss_size = STACK;
    ctx[i].uc_link = &sched_ctx;
    makecontext(&ctx[i], trampoline, 0);
  }
  int rc = 0;
  for (;;) {
    for (int i = 0; i < nt; ++i)
      if (!done[i] && state[i] == RUN) { cur = i; threadIdx.x = i; swapcontext(&sched_ctx, &ctx[i]); }
    int alive = 0, at_block = 0;
    for (int i = 0; i < nt; ++i) { alive += !done[i]; at_block += !done[i] && state[i] == BLOCK; }
    if (!alive) break;
    bool released = false;
    for (int w = 0; w < nt; w += 32) {  // a warp's shuffle waits for all 32 lanes, none exited
      bool all = true;
      for (int i = w; i < w + 32; ++i) all = all && !done[i] && state[i] == WARP;
      if (all) { for (int i = w; i < w + 32; ++i) state[i] = RUN; released = true; }
    }
    if (!released && at_block == nt) {  // __syncthreads: every thread of the block, none exited
      for (int i = 0; i < nt; ++i) state[i] = RUN;
      released = true;
    }
    if (!released) { rc = 1; break; }
  }
  delete[] ctx; std::free(stacks); delete[] state; delete[] done; delete[] slot;
  return rc;
}
}  // namespace mx_sim
static inline void __syncthreads() { mx_sim::wait_at(mx_sim::BLOCK); }
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) {
  mx_sim::slot[mx_sim::cur] = v;
  mx_sim::wait_at(mx_sim::WARP);
  const unsigned r = (unsigned)mx_sim::slot[mx_sim::cur ^ m];
  mx_sim::wait_at(mx_sim::WARP);  // nobody overwrites a slot before every lane has read
  return r;
}
// Calls kernel ``f`` with pointers ``p`` then unsigned sizes ``s`` (its parameter types, in order).
template <class A> static A mx_sim_arg(void** p, unsigned long long* s, int np, int i) {
  if constexpr (std::is_pointer_v<A>) return (A)p[i];
  else return (A)s[i - np];
}
template <class... A, size_t... I>
static void mx_sim_call(void (*f)(A...), void** p, unsigned long long* s, int np, std::index_sequence<I...>) {
  f(mx_sim_arg<A>(p, s, np, (int)I)...);
}
template <class... A> static void mx_sim_call(void (*f)(A...), void** p, unsigned long long* s, int np) {
  mx_sim_call(f, p, s, np, std::index_sequence_for<A...>{});
}
static void** mx_sim_p; static unsigned long long* mx_sim_s; static int mx_sim_np;
"""

RUNNER = r"""
static void mx_sim_entry() { mx_sim_call(%s, mx_sim_p, mx_sim_s, mx_sim_np); }
extern "C" int mx_sim_launch(void** p, unsigned long long* s, int np, int threads) {
  mx_sim_p = p; mx_sim_s = s; mx_sim_np = np; blockDim.x = threads;
  return mx_sim::run(mx_sim_entry, threads);
}
"""


def build(spec: KernelSpec, tmp: Path) -> ctypes.CDLL:
    return host_library(SHIM + spec.source + RUNNER % spec.name, tmp)


def launch(spec: KernelSpec, tmp: Path, ptrs: list[int]) -> int:
    """Run ``spec`` as one block of ``spec.block[0]`` cooperating threads on raw addresses ``ptrs``
    (inputs, outputs, then the error slot of a checked kernel); returns nothing but fails on a deadlock."""
    lib = build(spec, tmp)
    cptrs = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
    sizes = (ctypes.c_ulonglong * max(len(spec.args), 1))(*spec.args)
    fn = lib.mx_sim_launch
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    rc = fn(cptrs, sizes, len(ptrs), spec.block[0])
    assert rc == 0, f"{spec.name}: threads deadlocked at a barrier (divergent shuffle or __syncthreads)"
    return rc


def run_block(spec: KernelSpec, tmp: Path, ins: list[np.ndarray], outs: list[np.ndarray]) -> int:
    """``launch`` over arrays ``ins`` into ``outs`` (written in place; laid out as the kernel's shapes
    say); returns the code a checked kernel left in its error slot (0: none)."""
    err = np.zeros(1, np.int32)
    ptrs = [a.ctypes.data for a in (*ins, *outs)] + ([err.ctypes.data] if spec.checks else [])
    launch(spec, tmp, ptrs)
    return int(err[0])
