#include "device_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "host_staging.h"
#include "run_trace.h"

namespace mgx {
namespace {

constexpr size_t kBlockAlign = 256;  // what cuMemAlloc guarantees and our kernels' vector loads assume

size_t round_up(size_t bytes, bool power_of_two) {
  size_t n = (bytes + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  if (n == 0) n = kBlockAlign;
  if (!power_of_two) return n;
  size_t p = kBlockAlign;
  while (p < n) p <<= 1;
  return p;
}

bool device_io_disabled() noexcept {
  const char* v = std::getenv("MIGRAPHX_EP_DEVICE_IO");
  return v != nullptr && (std::strcmp(v, "0") == 0);
}

const void* tensor_data(const OrtValue* v) {
  const void* p = nullptr;
  check(api().ort->GetTensorData(v, &p));
  return p;
}

}  // namespace

GpuDevices::GpuDevices() noexcept {
  std::string why;
  cuda_ = cuda_driver(&why);
  if (cuda_ == nullptr) {
    why_not_ = why;
    return;
  }
  if (device_io_disabled()) {
    why_not_ = "MIGRAPHX_EP_DEVICE_IO=0";
    return;
  }
  int n = 0;
  if (cuda_->init(0) != 0 || cuda_->device_get_count(&n) != 0 || n <= 0) {
    why_not_ = "no CUDA device";
    return;
  }
  count_ = n;
  contexts_.assign(static_cast<size_t>(n), nullptr);
  warming_.assign(static_cast<size_t>(n), false);
  infos_.assign(static_cast<size_t>(n), nullptr);
}

GpuDevices& GpuDevices::get() noexcept {
  static GpuDevices* devices = new GpuDevices();  // never destroyed: ORT may outlive static destructors
  return *devices;
}

void GpuDevices::make_current(int ordinal) {
  if (ordinal < 0 || ordinal >= count_) {
    throw OrtError(ORT_INVALID_ARGUMENT, "CUDA device " + std::to_string(ordinal) + " does not exist (" +
                                             std::to_string(count_) + " found)");
  }
  CuHandle ctx = nullptr;
  {
    std::lock_guard<std::mutex> g(mutex_);
    ctx = contexts_[static_cast<size_t>(ordinal)];
    if (ctx == nullptr) {
      int dev = 0;
      cuda_->check(cuda_->device_get(&dev, ordinal), "cuDeviceGet");
      // The primary context: the one the Python target, torch, CuPy and ORT's CUDA EP use, so device
      // pointers move freely between them.
      cuda_->check(cuda_->primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      contexts_[static_cast<size_t>(ordinal)] = ctx;
    }
  }
  cuda_->check(cuda_->ctx_set_current(ctx), "cuCtxSetCurrent");
}

void GpuDevices::retain_in_background(int ordinal) noexcept {
  if (ordinal < 0 || ordinal >= count_) return;
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (warming_[static_cast<size_t>(ordinal)] || contexts_[static_cast<size_t>(ordinal)] != nullptr) return;
    warming_[static_cast<size_t>(ordinal)] = true;
  }
  try {
    // Detached: the process may end first, and the object it uses is never destroyed.
    std::thread([this, ordinal] {
      try {
        make_current(ordinal);
      } catch (...) {  // NOLINT(bugprone-empty-catch) - reported by the next make_current
      }
    }).detach();
  } catch (...) {  // NOLINT(bugprone-empty-catch) - no thread: the context is made when first needed
  }
}

CuHandle GpuDevices::transfer_stream(int ordinal) {
  make_current(ordinal);
  std::lock_guard<std::mutex> g(mutex_);
  if (transfer_streams_.size() < contexts_.size()) transfer_streams_.resize(contexts_.size(), nullptr);
  CuHandle& s = transfer_streams_[static_cast<size_t>(ordinal)];
  // A blocking stream (flags 0): ordered after work on the legacy default stream, as the synchronous
  // copies were (torch's default stream writing a tensor ORT then copies); waiting for it is a stream
  // sync, which stays legal while another thread captures a graph (a context sync is not).
  if (s == nullptr) cuda_->check(cuda_->stream_create(&s, 0), "cuStreamCreate");
  return s;
}

const OrtMemoryInfo* GpuDevices::memory_info(int ordinal) {
  std::lock_guard<std::mutex> g(mutex_);
  OrtMemoryInfo*& info = infos_.at(static_cast<size_t>(ordinal));
  if (info == nullptr) {
    check(api().ort->CreateMemoryInfo_V2("MIGraphX", OrtMemoryInfoDeviceType_GPU, kNvidiaVendorId, ordinal,
                                         OrtDeviceMemoryType_DEFAULT, /*alignment=*/0, OrtDeviceAllocator,
                                         &info));
  }
  return info;
}

bool is_our_gpu(const OrtMemoryDevice* device, int* ordinal) noexcept {
  const OrtEpApi& ep = *api().ep;
  if (device == nullptr || ep.MemoryDevice_GetDeviceType(device) != OrtMemoryInfoDeviceType_GPU ||
      ep.MemoryDevice_GetVendorId(device) != kNvidiaVendorId ||
      ep.MemoryDevice_GetMemoryType(device) != OrtDeviceMemoryType_DEFAULT) {
    return false;
  }
  const int id = static_cast<int>(ep.MemoryDevice_GetDeviceId(device));
  if (id < 0 || id >= GpuDevices::get().count()) return false;
  if (ordinal != nullptr) *ordinal = id;
  return true;
}

bool is_cpu(const OrtMemoryDevice* device) noexcept {
  return device != nullptr && api().ep->MemoryDevice_GetDeviceType(device) == OrtMemoryInfoDeviceType_CPU;
}

// --- allocator -------------------------------------------------------------------------------------
GpuAllocator::GpuAllocator(int ordinal, AllocatorSettings settings)
    : OrtAllocator{}, ordinal_(ordinal), settings_(settings), info_(GpuDevices::get().memory_info(ordinal)) {
  version = ORT_API_VERSION;
  Alloc = [](OrtAllocator* self, size_t bytes) noexcept -> void* {
    try {
      return static_cast<GpuAllocator*>(self)->allocate(bytes);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", kEpName, e.what());  // Alloc cannot return a status: ORT reports null
      return nullptr;
    }
  };
  Free = [](OrtAllocator* self, void* p) noexcept {
    try {
      static_cast<GpuAllocator*>(self)->release(p);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", kEpName, e.what());
    }
  };
  Info = [](const OrtAllocator* self) noexcept { return static_cast<const GpuAllocator*>(self)->info_; };
  Reserve = Alloc;  // initializers and other long-lived blocks: the same pool
}

GpuAllocator::~GpuAllocator() {
  try {
    std::lock_guard<std::mutex> g(mutex_);
    trim_locked();  // blocks ORT still holds are its to free; at release there are none
  } catch (...) {
  }
}

void* GpuAllocator::allocate(size_t bytes) {
  if (settings_.external_alloc != nullptr) {
    void* p = settings_.external_alloc(bytes);
    if (p == nullptr) throw OrtError(ORT_FAIL, "migraphx_external_alloc returned null for " + std::to_string(bytes) + " bytes");
    std::lock_guard<std::mutex> g(mutex_);
    sizes_[reinterpret_cast<CuDevicePtr>(p)] = bytes;
    in_use_ += bytes;
    return p;
  }
  const size_t size = round_up(bytes, settings_.power_of_two);
  std::lock_guard<std::mutex> g(mutex_);
  auto hit = cached_.find(size);
  if (hit != cached_.end() && !hit->second.empty()) {
    CuDevicePtr p = hit->second.back();
    hit->second.pop_back();
    sizes_[p] = size;
    in_use_ += size;
    return reinterpret_cast<void*>(p);
  }
  if (settings_.mem_limit != 0 && reserved_ + size > settings_.mem_limit) trim_locked();
  if (settings_.mem_limit != 0 && reserved_ + size > settings_.mem_limit) {
    throw OrtError(ORT_FAIL, "allocating " + std::to_string(bytes) + " bytes on GPU " + std::to_string(ordinal_) +
                                 " would exceed migraphx_mem_limit=" + std::to_string(settings_.mem_limit) +
                                 " (" + std::to_string(in_use_) + " bytes in use)");
  }
  const CudaDriver& cuda = GpuDevices::get().cuda();
  GpuDevices::get().make_current(ordinal_);
  CuDevicePtr p = 0;
  if (cuda.mem_alloc(&p, size) != 0) {
    trim_locked();  // out of memory: give the cache back and try once more
    cuda.check(cuda.mem_alloc(&p, size), "cuMemAlloc");
  }
  sizes_[p] = size;
  reserved_ += size;
  in_use_ += size;
  return reinterpret_cast<void*>(p);
}

void GpuAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  const auto p = reinterpret_cast<CuDevicePtr>(ptr);
  std::lock_guard<std::mutex> g(mutex_);
  auto it = sizes_.find(p);
  if (it == sizes_.end()) throw OrtError(ORT_FAIL, "Free of a pointer this allocator did not allocate");
  const size_t size = it->second;
  sizes_.erase(it);
  in_use_ -= size;
  if (settings_.external_free != nullptr) {
    settings_.external_free(ptr);
    return;
  }
  cached_[size].push_back(p);
}

size_t GpuAllocator::in_use() const {
  std::lock_guard<std::mutex> g(mutex_);
  return in_use_;
}

void GpuAllocator::trim_locked() {
  if (settings_.external_empty_cache != nullptr) settings_.external_empty_cache();
  bool any = false;
  for (auto& kv : cached_) any = any || !kv.second.empty();
  if (!any) return;
  const CudaDriver& cuda = GpuDevices::get().cuda();
  GpuDevices::get().make_current(ordinal_);
  for (auto& kv : cached_) {
    for (CuDevicePtr p : kv.second) {
      cuda.mem_free(p);
      reserved_ -= kv.first;
    }
    kv.second.clear();
  }
}

// --- data transfer ---------------------------------------------------------------------------------
namespace {

bool ORT_API_CALL can_copy(const OrtDataTransferImpl*, const OrtMemoryDevice* src,
                           const OrtMemoryDevice* dst) noexcept {
  const bool src_gpu = is_our_gpu(src), dst_gpu = is_our_gpu(dst);
  // Never CPU to CPU: ORT takes the first transfer that says yes, and ours is asked before the CPU EP's.
  return (src_gpu && (dst_gpu || is_cpu(dst))) || (is_cpu(src) && dst_gpu);
}

// Issues one copy on its device's transfer stream and returns that stream (nullptr: nothing to copy);
// copy_tensors synchronises each stream once, after the last copy on it.
CuHandle copy_one(const OrtValue* src, OrtValue* dst) {
  const OrtEpApi& ep = *api().ep;
  size_t bytes = 0, dst_bytes = 0;
  check(api().ort->GetTensorSizeInBytes(src, &bytes));
  check(api().ort->GetTensorSizeInBytes(dst, &dst_bytes));
  if (bytes != dst_bytes) {
    throw OrtError(ORT_INVALID_ARGUMENT, "copy of " + std::to_string(bytes) + " bytes into a tensor of " +
                                             std::to_string(dst_bytes));
  }
  if (bytes == 0) return nullptr;
  int src_ord = -1, dst_ord = -1;
  const bool src_gpu = is_our_gpu(ep.Value_GetMemoryDevice(src), &src_ord);
  const bool dst_gpu = is_our_gpu(ep.Value_GetMemoryDevice(dst), &dst_ord);
  const CudaDriver& cuda = GpuDevices::get().cuda();
  void* out = nullptr;
  check(api().ort->GetTensorMutableData(dst, &out));
  const void* in = tensor_data(src);
  // One stream per device and, in copy_tensors, a sync of it: every copy has landed when CopyTensors
  // returns (the host-to-device copy from pageable memory would otherwise return once staged, before
  // the DMA: a Run on our non-blocking streams could read it half old), without a context sync
  // (illegal while another thread captures).
  CuHandle stream = GpuDevices::get().transfer_stream(src_gpu ? src_ord : dst_ord);
  const auto dptr = [](const void* p) { return reinterpret_cast<CuDevicePtr>(p); };
  if (src_gpu && dst_gpu) {
    cuda.check(cuda.memcpy_dtod_async(dptr(out), dptr(in), bytes, stream), "cuMemcpyDtoDAsync");
  } else if (src_gpu) {
    if (!staged_dtoh(cuda, src_ord, out, dptr(in), bytes, stream)) {
      cuda.check(cuda.memcpy_dtoh_async(out, dptr(in), bytes, stream), "cuMemcpyDtoHAsync");
    }
  } else if (!staged_htod(cuda, dst_ord, dptr(out), in, bytes, stream)) {
    cuda.check(cuda.memcpy_htod_async(dptr(out), in, bytes, stream), "cuMemcpyHtoDAsync");
  }
  return stream;
}

// The trace's direction of a CopyTensors call (its first tensor's) and how many tensors it copies.
uint32_t trace_direction(const OrtValue** src, OrtValue** dst, size_t n) noexcept {
  if (n == 0) return 0;
  const OrtEpApi& ep = *api().ep;
  const bool from = is_our_gpu(ep.Value_GetMemoryDevice(src[0])), to = is_our_gpu(ep.Value_GetMemoryDevice(dst[0]));
  const uint32_t dir = from && to ? kD2D : from ? kD2H : kH2D;
  return dir | static_cast<uint32_t>(n) << 4;
}

// ORT hands a Run's feeds (and its fetches) over in one call: one sync per device for all of them, not
// one per tensor. On an error the copies already issued are waited for too, so no DMA still writes into
// a buffer ORT frees on the way out.
OrtStatus* ORT_API_CALL copy_tensors(OrtDataTransferImpl*, const OrtValue** src, OrtValue** dst, OrtSyncStream**,
                                     size_t n) noexcept {
  if (trace_enabled()) trace_mark(TraceMark::kCopyBegin, trace_direction(src, dst, n));
  struct End {
    ~End() { trace_mark(TraceMark::kCopyEnd); }
  } end;
  std::vector<CuHandle> streams;
  const auto wait_all = [&streams](bool checked) {
    const CudaDriver& cuda = GpuDevices::get().cuda();
    for (CuHandle s : streams) {
      const CuResult r = cuda.stream_synchronize(s);
      if (checked) cuda.check(r, "cuStreamSynchronize");
    }
  };
  try {
    for (size_t i = 0; i < n; ++i) {
      CuHandle s = copy_one(src[i], dst[i]);
      if (s != nullptr && std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
    }
    wait_all(true);
    return nullptr;
  } catch (...) {
    try {
      wait_all(false);
    } catch (...) {  // the driver itself failed: the original error is the one to report
    }
    return status_from_exception("CopyTensors");
  }
}

void ORT_API_CALL release_transfer(OrtDataTransferImpl*) noexcept {}  // one shared, static instance

}  // namespace

OrtDataTransferImpl* gpu_data_transfer() noexcept {
  static OrtDataTransferImpl impl = [] {
    OrtDataTransferImpl t{};
    t.ort_version_supported = ORT_API_VERSION;
    t.Release = release_transfer;
    t.CanCopy = can_copy;
    t.CopyTensors = copy_tensors;
    return t;
  }();
  return &impl;
}

void copy_device_to_host(const OrtValue* src, void* dst, size_t bytes) {
  int ordinal = 0;
  if (bytes == 0) return;
  if (!is_our_gpu(api().ep->Value_GetMemoryDevice(src), &ordinal)) throw OrtError(ORT_FAIL, "not our GPU memory");
  const CudaDriver& cuda = GpuDevices::get().cuda();
  CuHandle stream = GpuDevices::get().transfer_stream(ordinal);
  const auto p = reinterpret_cast<CuDevicePtr>(tensor_data(src));
  const auto not_device = [&] {
    return OrtError(ORT_INVALID_ARGUMENT, "a tensor bound as GPU memory has an address that is not device memory "
                                          "(a host buffer bound with device_type 'cuda'?)");
  };
  try {
    if (staged_dtoh(cuda, ordinal, dst, p, bytes, stream)) return;
  } catch (const OrtError&) {
    if (cuda.memory_type(p) != 2) throw not_device();
    throw;
  }
  CuResult r = cuda.memcpy_dtoh_async(dst, p, bytes, stream);
  if (r == 0) r = cuda.stream_synchronize(stream);
  if (r != 0 && cuda.memory_type(p) != 2) throw not_device();
  cuda.check(r, "cuMemcpyDtoHAsync");
}

void copy_host_to_device(const void* src, OrtValue* dst, size_t bytes) {
  int ordinal = 0;
  if (bytes == 0) return;
  if (!is_our_gpu(api().ep->Value_GetMemoryDevice(dst), &ordinal)) throw OrtError(ORT_FAIL, "not our GPU memory");
  void* out = nullptr;
  check(api().ort->GetTensorMutableData(dst, &out));
  const CudaDriver& cuda = GpuDevices::get().cuda();
  CuHandle stream = GpuDevices::get().transfer_stream(ordinal);  // and a sync: the DMA has landed (copy_one)
  const auto to = reinterpret_cast<CuDevicePtr>(out);
  if (staged_htod(cuda, ordinal, to, src, bytes, stream)) return;
  cuda.check(cuda.memcpy_htod_async(reinterpret_cast<CuDevicePtr>(out), src, bytes, stream), "cuMemcpyHtoDAsync");
  cuda.check(cuda.stream_synchronize(stream), "cuStreamSynchronize");
}

}  // namespace mgx
