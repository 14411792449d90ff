// Large copies between pageable host memory (numpy arrays ORT hands over, the arrays it returns) and the
// GPU, faster than the driver's own pageable path, which moves 6-14 GB/s host to device and, into freshly
// allocated arrays, as little as 3 GB/s back (page faults on one thread). A pageable copy of at least
// kStagedMinToDevice / kStagedMinToHost bytes goes through a ring of pinned buffers in chunks of up to
// 4 MiB: host threads fill chunk k while chunk k-1's DMA runs (host to device), or empty chunk k while
// chunk k+1's DMA runs (device to host). Measured on the H100 machine (16 cores; tools/copy_bandwidth.py
// --sweep, 2026-11-25), median ms, driver against staged with 8 threads: 2 MiB 0.174 / 0.148 in,
// 0.203 / 0.144 out; 8 MiB 0.62 / 0.51 in, 0.64 / 0.35 out; 16 MiB 1.10 / 0.82 in, 1.14 / 0.42 out;
// 64 MiB 9.4 / 2.9 in, 23.4 / 7.9 out. Into the GPU, 2-4 MiB read faster in one run and slower in the
// next (2 MiB: 0.163 against 0.177 ms, then 0.275 against 0.213); out of it, below 2 MiB the gain was
// not reliable (1.5 MiB: 0.12 against 0.19 ms in one run, 0.28 against 0.26 in the next).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

#include "cuda_driver.h"

namespace mgx {

// The smallest copy staged, each way (below, the driver's copy was as fast, or the gain was noise).
inline constexpr size_t kStagedMinToDevice = size_t{8} << 20;
inline constexpr size_t kStagedMinToHost = size_t{2} << 20;

// Each copies `n` bytes and returns true with them landed, or returns false having copied nothing when
// staging does not apply: fewer bytes than the direction's smallest staged copy, host memory the driver
// knows (pinned or registered: its DMA is direct already), staging off (MIGRAPHX_EP_COPY_THREADS below 2),
// no pinned memory to be had, or another thread staging right now (its copy then goes the driver's way
// beside it instead of waiting).
// The caller has made `ordinal`'s primary context current; `stream` belongs to it.
bool staged_htod(const CudaDriver& cuda, int ordinal, CuDevicePtr dst, const void* src, size_t n, CuHandle stream);
bool staged_dtoh(const CudaDriver& cuda, int ordinal, void* dst, CuDevicePtr src, size_t n, CuHandle stream);

// Host threads that copy a staged chunk (MIGRAPHX_EP_COPY_THREADS; default half the cores, at most 8).
size_t copy_threads() noexcept;

// memcpy of host memory, split over the staging pool's threads from kHostCopyMin bytes (one thread while
// a staged copy holds the pool, in a forked child, or with fewer than 2 copy threads). Into fresh memory
// most of a large copy is the kernel faulting in and zeroing its pages: the threads share that too.
inline constexpr size_t kHostCopyMin = size_t{4} << 20;
void host_copy(void* dst, const void* src, size_t n);

// Staged copies made so far (tests: proof the staged path ran).
uint64_t staged_copy_count() noexcept;

// Turns staging off and on and sets its chunk size (at most 4 MiB), threads and smallest copy (both ways),
// at run time: measurements compare settings in one process. 0 keeps a value.
void set_staging(bool on, size_t chunk_bytes, size_t threads, size_t min_bytes) noexcept;
void reset_staging() noexcept;  // back to the defaults

// The Python functions above and copy_to_device (host_staging_py.cpp).
void register_staging(pybind11::module_& m);

}  // namespace mgx
