#include "host_staging.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mgx {
namespace {

constexpr size_t kSlotBytes = size_t{4} << 20;  // bytes per pinned buffer: the largest chunk
constexpr size_t kSlots = 4;                      // pinned buffers per device
constexpr size_t kPiece = size_t{256} << 10;      // no thread copies less: waking one costs more
constexpr size_t kMaxThreads = 16;

std::atomic<uint64_t> staged_copies{0};

size_t read_threads() noexcept {
  const char* v = std::getenv("MIGRAPHX_EP_COPY_THREADS");
  if (v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != nullptr && *end == '\0' && n >= 0) return std::min(static_cast<size_t>(n), kMaxThreads);
  }
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::min<size_t>(8, std::max<size_t>(1, cores / 2));
}

// What a staged copy does (set_staging changes it for measurements; the defaults are the measured best).
struct Settings {
  bool on = true;
  size_t chunk = 0;    // 0: by the copy's size (auto_chunk)
  size_t threads = 0;  // 0: copy_threads()
  size_t min_to_device = kStagedMinToDevice, min_to_host = kStagedMinToHost;
};
Settings settings;  // under settings_mutex

// memcpy split over up to `threads` threads (the caller is one): detached workers that wait for the next
// job; the pool grows to the most threads asked for and never shrinks.
class CopyPool {
 public:
  void copy(char* dst, const char* src, size_t n, size_t threads) {
    grow(threads - 1);
    const size_t parts = std::min(threads, std::max<size_t>(1, n / kPiece));
    if (parts <= 1) {
      std::memcpy(dst, src, n);
      return;
    }
    {
      std::lock_guard<std::mutex> g(mutex_);
      job_ = Job{dst, src, n, parts};
      next_.store(0, std::memory_order_relaxed);
      busy_ = workers_;
      ++generation_;
    }
    wake_.notify_all();
    run_pieces();
    // Every worker checks in before the next job may overwrite this one (a worker reads it unlocked).
    std::unique_lock<std::mutex> l(mutex_);
    done_.wait(l, [this] { return busy_ == 0; });
  }

 private:
  // A new worker waits for the job after the current one: it must never take up a job already handed out
  // (only this thread writes generation_, so it reads it unlocked here).
  void grow(size_t workers) {
    for (; workers_ < workers; ++workers_) std::thread([this, seen = generation_] { work(seen); }).detach();
  }

  struct Job {
    char* dst = nullptr;
    const char* src = nullptr;
    size_t n = 0, parts = 0;
  };

  void run_pieces() {
    const size_t step = (job_.n / job_.parts + 63) & ~size_t{63};  // cache-line aligned pieces
    for (size_t k = next_.fetch_add(1); k < job_.parts; k = next_.fetch_add(1)) {
      const size_t begin = std::min(job_.n, k * step);
      const size_t end = k + 1 == job_.parts ? job_.n : std::min(job_.n, begin + step);
      if (end > begin) std::memcpy(job_.dst + begin, job_.src + begin, end - begin);
    }
  }

  void work(uint64_t seen) {
    std::unique_lock<std::mutex> l(mutex_);
    for (;;) {
      wake_.wait(l, [&] { return generation_ != seen; });
      seen = generation_;
      l.unlock();
      run_pieces();
      l.lock();
      if (--busy_ == 0) done_.notify_one();
    }
  }

  size_t workers_ = 0;  // grown only by the copying thread, while no job runs
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  size_t busy_ = 0;
  Job job_;
  std::atomic<size_t> next_{0};
};

// One device's pinned buffers and, per buffer, the event of the last DMA that used it.
struct Ring {
  std::vector<char*> slots;
  std::vector<CuHandle> done;
};

std::mutex staging_mutex;                  // one staged copy at a time, process-wide
std::mutex settings_mutex;                 // guards `settings`
std::vector<std::unique_ptr<Ring>> rings;  // per CUDA ordinal; null: not made yet
std::vector<char> ring_failed;             // per CUDA ordinal: pinned memory could not be had
CopyPool* pool = nullptr;                  // never destroyed: its threads outlive static destructors

// `ordinal`'s ring, made at its first staged copy (null when pinned memory or events cannot be had). Under
// staging_mutex, with the ordinal's context current.
Ring* ring(const CudaDriver& cuda, int ordinal) {
  const auto i = static_cast<size_t>(ordinal);
  if (rings.size() <= i) {
    rings.resize(i + 1);
    ring_failed.resize(i + 1, 0);
  }
  if (rings[i] != nullptr || ring_failed[i] != 0) return rings[i].get();
  auto r = std::make_unique<Ring>();
  bool ok = true;
  for (size_t s = 0; ok && s < kSlots; ++s) {
    void* p = nullptr;
    CuHandle e = nullptr;
    ok = cuda.mem_host_alloc(&p, kSlotBytes, /*CU_MEMHOSTALLOC_PORTABLE*/ 1) == 0;
    if (ok) r->slots.push_back(static_cast<char*>(p));
    ok = ok && cuda.event_create(&e, /*CU_EVENT_DISABLE_TIMING*/ 2) == 0;
    if (ok) r->done.push_back(e);
  }
  if (!ok) {  // give back what was had; the driver's copies serve this device from now on
    for (char* p : r->slots) cuda.mem_free_host(p);
    for (CuHandle e : r->done) cuda.event_destroy(e);
    ring_failed[i] = 1;
    return nullptr;
  }
  if (pool == nullptr) pool = new CopyPool();
  rings[i] = std::move(r);
  return rings[i].get();
}

size_t threads_now() { return settings.threads != 0 ? settings.threads : copy_threads(); }

// The process the rings and the pool were made in: a forked child inherits them without the pool's
// threads (a copy would wait for them forever) and without a usable CUDA context, so it never stages.
const pid_t owner_pid = getpid();

bool applies(const CudaDriver& cuda, const void* host, size_t n, bool to_device) {
  if (getpid() != owner_pid) return false;
  {
    std::lock_guard<std::mutex> g(settings_mutex);
    const size_t least = to_device ? settings.min_to_device : settings.min_to_host;
    if (!settings.on || n < least || threads_now() < 2) return false;
  }
  return cuda.can_stage() && cuda.memory_type(reinterpret_cast<CuDevicePtr>(host)) == 0;  // 0: pageable
}

// Measured (tools/copy_bandwidth.py --sweep): up to 2 MiB one chunk (all threads on it, then one DMA)
// beat smaller pipelined chunks, whose per-chunk wake-ups and waits cost more than the overlap gains;
// up to 12 MiB 2 MiB chunks did best, above that 4 MiB (a whole pinned buffer).
size_t auto_chunk(size_t n) {
  if (n <= kSlotBytes / 2) return n;
  return n <= 3 * kSlotBytes ? kSlotBytes / 2 : kSlotBytes;
}

// This copy's chunk size and threads (settings may change under a measurement while it runs).
std::pair<size_t, size_t> snapshot(size_t n) {
  std::lock_guard<std::mutex> g(settings_mutex);
  return {settings.chunk != 0 ? settings.chunk : auto_chunk(n), threads_now()};
}

}  // namespace

size_t copy_threads() noexcept {
  static const size_t threads = read_threads();
  return threads;
}

uint64_t staged_copy_count() noexcept { return staged_copies.load(); }

void reset_staging() noexcept {
  std::lock_guard<std::mutex> g(settings_mutex);
  settings = Settings{};
}

void set_staging(bool on, size_t chunk_bytes, size_t threads, size_t min_bytes) noexcept {
  std::lock_guard<std::mutex> g(settings_mutex);
  settings.on = on;
  if (chunk_bytes != 0) settings.chunk = std::min(std::max(chunk_bytes, kPiece), kSlotBytes);
  if (threads != 0) settings.threads = std::min(threads, kMaxThreads);
  if (min_bytes != 0) settings.min_to_device = settings.min_to_host = min_bytes;
}

bool staged_htod(const CudaDriver& cuda, int ordinal, CuDevicePtr dst, const void* src, size_t n,
                 CuHandle stream) {
  if (!applies(cuda, src, n, /*to_device=*/true)) return false;
  std::unique_lock<std::mutex> l(staging_mutex, std::try_to_lock);
  Ring* r = l.owns_lock() ? ring(cuda, ordinal) : nullptr;
  if (r == nullptr) return false;
  const auto [chunk, threads] = snapshot(n);
  const char* from = static_cast<const char*>(src);
  for (size_t off = 0, k = 0; off < n; off += chunk, ++k) {
    const size_t len = std::min(chunk, n - off), s = k % kSlots;
    cuda.check(cuda.event_synchronize(r->done[s]), "cuEventSynchronize");  // its last DMA has read it
    pool->copy(r->slots[s], from + off, len, threads);
    cuda.check(cuda.memcpy_htod_async(dst + off, r->slots[s], len, stream), "cuMemcpyHtoDAsync");
    cuda.check(cuda.event_record(r->done[s], stream), "cuEventRecord");
  }
  cuda.check(cuda.stream_synchronize(stream), "cuStreamSynchronize");
  staged_copies.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool staged_dtoh(const CudaDriver& cuda, int ordinal, void* dst, CuDevicePtr src, size_t n, CuHandle stream) {
  if (!applies(cuda, dst, n, /*to_device=*/false)) return false;
  std::unique_lock<std::mutex> l(staging_mutex, std::try_to_lock);
  Ring* r = l.owns_lock() ? ring(cuda, ordinal) : nullptr;
  if (r == nullptr) return false;
  const auto [chunk, threads] = snapshot(n);
  const size_t chunks = (n + chunk - 1) / chunk;
  const auto fetch = [&, chunk = chunk](size_t k) {  // chunk k's DMA into its buffer
    const size_t off = k * chunk, s = k % kSlots;
    cuda.check(cuda.memcpy_dtoh_async(r->slots[s], src + off, std::min(chunk, n - off), stream),
               "cuMemcpyDtoHAsync");
    cuda.check(cuda.event_record(r->done[s], stream), "cuEventRecord");
  };
  char* to = static_cast<char*>(dst);
  try {
    for (size_t k = 0; k < std::min(kSlots, chunks); ++k) fetch(k);
    for (size_t k = 0; k < chunks; ++k) {
      const size_t off = k * chunk, s = k % kSlots;
      cuda.check(cuda.event_synchronize(r->done[s]), "cuEventSynchronize");
      pool->copy(to + off, r->slots[s], std::min(chunk, n - off), threads);
      if (k + kSlots < chunks) fetch(k + kSlots);
    }
  } catch (...) {
    cuda.stream_synchronize(stream);  // no DMA may still write a buffer the next copy fills
    throw;
  }
  staged_copies.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void host_copy(void* dst, const void* src, size_t n) {
  auto* to = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(src);
  size_t threads = 1;
  std::unique_lock<std::mutex> l(staging_mutex, std::defer_lock);
  if (n >= kHostCopyMin && getpid() == owner_pid && l.try_lock()) {  // a staged copy holds the pool: don't wait
    {
      std::lock_guard<std::mutex> g(settings_mutex);
      threads = threads_now();
    }
    if (threads >= 2 && pool == nullptr) pool = new CopyPool();
  }
  if (threads < 2 || !l.owns_lock()) {
    std::memcpy(to, from, n);
    return;
  }
  pool->copy(to, from, n, threads);
}

}  // namespace mgx
