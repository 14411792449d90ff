// GPU memory for ORT (the plugin-EP interfaces): which CUDA devices we advertise, the caching allocator
// ORT allocates our nodes' inputs and outputs with, and the data transfer ORT copies them with. With
// these, a fused node's inputs and outputs live in device memory: ORT copies numpy feeds in and fetches
// out through us, and IOBinding hands device buffers (ORT's, CuPy's, torch's) straight to Compute.
//
// Advertised only where a CUDA driver and GPU exist (and MIGRAPHX_EP_DEVICE_IO is not 0): elsewhere the EP
// keeps CPU-memory I/O, so CI and hosts without a GPU see no difference. Memory infos use NVIDIA's vendor id
// and the CUDA ordinal with alignment 0, which is what ORT's Python 'cuda' device is, so
// OrtValue.ortvalue_from_numpy(x, 'cuda', 0) and io.bind_input(..., 'cuda', 0, ...) match it exactly.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_driver.h"
#include "ort_api.h"

namespace mgx {

inline constexpr uint32_t kNvidiaVendorId = 0x10DE;

// The CUDA devices device-resident I/O can use; probed once per process.
class GpuDevices {
 public:
  static GpuDevices& get() noexcept;
  int count() const noexcept { return count_; }
  const std::string& why_not() const noexcept { return why_not_; }
  const CudaDriver& cuda() const noexcept { return *cuda_; }
  // Makes the primary context of `ordinal` current on this thread (retained on first use).
  void make_current(int ordinal);
  // Retains `ordinal`'s primary context on a thread of its own, once per process; does nothing for an
  // ordinal that does not exist (whoever uses it reports that) and ignores the driver's errors (the
  // next make_current meets them again and reports them).
  void retain_in_background(int ordinal) noexcept;
  // Our DEFAULT memory info for `ordinal`, alive as long as the process (ORT keeps the pointer).
  const OrtMemoryInfo* memory_info(int ordinal);
  // The stream ORT's copies (our data transfer) go on, on `ordinal`'s primary context, made current.
  CuHandle transfer_stream(int ordinal);

 private:
  GpuDevices() noexcept;
  const CudaDriver* cuda_ = nullptr;
  int count_ = 0;
  std::string why_not_;
  std::mutex mutex_;
  std::vector<CuHandle> contexts_;
  std::vector<bool> warming_;
  std::vector<CuHandle> transfer_streams_;
  std::vector<OrtMemoryInfo*> infos_;
};

// Whether our EpDevices advertise GPU memory (then fused nodes' inputs and outputs live there).
inline bool device_io() noexcept { return GpuDevices::get().count() > 0; }

// Whether `device` is GPU memory we can reach (NVIDIA, a probed ordinal), and which ordinal.
bool is_our_gpu(const OrtMemoryDevice* device, int* ordinal = nullptr) noexcept;
bool is_cpu(const OrtMemoryDevice* device) noexcept;

// migraphx_mem_limit, migraphx_arena_extend_strategy, migraphx_external_alloc/_free/_empty_cache.
struct AllocatorSettings {
  size_t mem_limit = 0;  // 0: no limit
  bool power_of_two = true;
  void* (*external_alloc)(size_t) = nullptr;
  void (*external_free)(void*) = nullptr;
  void (*external_empty_cache)() = nullptr;
};

// A caching device allocator: freed blocks are kept per (rounded) size and reused, so steady-state Runs
// never call cuMemAlloc/cuMemFree (cuMemFree synchronises the device). With external functions, they
// allocate and free instead (their owner, e.g. torch's caching allocator, does the caching).
class GpuAllocator : public OrtAllocator {
 public:
  GpuAllocator(int ordinal, AllocatorSettings settings);
  ~GpuAllocator();
  GpuAllocator(const GpuAllocator&) = delete;
  GpuAllocator& operator=(const GpuAllocator&) = delete;

  void* allocate(size_t bytes);
  void release(void* p);
  size_t in_use() const;

 private:
  void trim_locked();  // frees every cached block (and empties the external cache)
  int ordinal_;
  AllocatorSettings settings_;
  const OrtMemoryInfo* info_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<CuDevicePtr>> cached_;  // block size -> free blocks
  std::unordered_map<CuDevicePtr, size_t> sizes_;                // live blocks
  size_t reserved_ = 0;                                          // live + cached bytes
  size_t in_use_ = 0;
};

// ORT's copies between CPU memory and our GPU memory (and GPU to GPU). Synchronous: we are not stream
// aware, so ORT expects a copy to be complete when CopyTensors returns.
OrtDataTransferImpl* gpu_data_transfer() noexcept;

// For the Python path of Compute: copies a device tensor to host memory, and host bytes into a device
// tensor (synchronous; the primary context of the tensor's device is made current).
void copy_device_to_host(const OrtValue* src, void* dst, size_t bytes);
void copy_host_to_device(const void* src, OrtValue* dst, size_t bytes);

}  // namespace mgx
