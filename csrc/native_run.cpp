#include "native_run.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "device_memory.h"
#include "host_staging.h"
#include "io_graph.h"
#include "run_trace.h"

namespace py = pybind11;

namespace mgx {
namespace {

template <class T>
T* handle_of(py::handle h) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(h.cast<uint64_t>()));
}

}  // namespace

size_t DimsKeyHash::operator()(const DimsKey& k) const noexcept {
  size_t h = k.size();
  for (int64_t v : k) h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

namespace {

bool fits(const NativePlan& plan, const DimsKey& key) {
  if (key.size() != plan.pattern.size()) return false;
  for (size_t j = 0; j < key.size(); ++j) {
    const bool ok = plan.free[j] ? key[j] >= 0 && key[j] <= plan.pattern[j] : key[j] == plan.pattern[j];
    if (!ok) return false;
  }
  return true;
}

// Where each input's entry (its rank, then its dims) starts in a dims key (read_dims_key's layout).
std::vector<size_t> input_offsets(const DimsKey& key, size_t n_inputs) {
  std::vector<size_t> at(n_inputs);
  size_t pos = 0;
  for (size_t i = 0; i < n_inputs; ++i) {
    at[i] = pos;
    pos += key[pos] < 0 ? 1 : 1 + static_cast<size_t>(key[pos]);
  }
  return at;
}

}  // namespace

std::shared_ptr<const NativePlan> NativePlans::find(const DimsKey& key) const {
  std::lock_guard<std::mutex> g(mutex_);
  auto it = plans_.find(key);
  if (it != plans_.end() && it->second->revoked()) return nullptr;  // replaced: add() retires it
  if (it != plans_.end()) {
    it->second->last_used.store(clock_.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return it->second;
  }
  for (const auto& p : padded_) {
    if (fits(*p, key) && !p->revoked()) return p;
  }
  return nullptr;
}

bool NativePlans::refused(const DimsKey& key) const {
  std::lock_guard<std::mutex> g(mutex_);
  return refused_.count(key) != 0;
}

namespace {

std::shared_ptr<NativeContext> parse_context(py::handle obj) {
  py::dict d = py::reinterpret_borrow<py::dict>(obj);
  auto c = std::make_shared<NativeContext>();
  c->stream = handle_of<void>(d["stream"]);
  c->graph = handle_of<void>(d["graph"]);
  if (d.contains("graph_template")) c->graph_template = handle_of<void>(d["graph_template"]);
  c->inputs = d["inputs"].cast<std::vector<CuDevicePtr>>();
  c->dims = d.contains("dims") ? d["dims"].cast<std::vector<CuDevicePtr>>() : std::vector<CuDevicePtr>();
  c->dims.resize(c->inputs.size(), 0);
  c->outputs = d["outputs"].cast<std::vector<CuDevicePtr>>();
  py::tuple errors = d["errors"];
  c->error_slots = handle_of<int32_t>(errors[0]);
  c->n_error_slots = errors[1].cast<size_t>();
  c->lock = d["lock"].cast<std::shared_ptr<RunLock>>();
  return c;
}

}  // namespace

void NativePlans::add(const DimsKey& key, py::handle obj) {
  // False: not yet -- these dims run on a larger batch's program while their own compiles in the
  // background (ep/batch_serve.py), or the program captures its graph at a later Run
  // (MIGRAPHX_EP_CAPTURE_RUN); ask again after the next Run.
  if (py::isinstance<py::bool_>(obj)) return;
  if (obj.is_none()) {
    constexpr size_t kMaxRefused = 4096;  // a node fed ever-new shapes must not grow without bound
    std::lock_guard<std::mutex> g(mutex_);
    if (refused_.size() >= kMaxRefused) refused_.clear();
    refused_.insert(key);
    return;
  }
  py::dict d = py::reinterpret_borrow<py::dict>(obj);
  const size_t capacity = std::max<size_t>(1, d["capacity"].cast<size_t>());
  std::vector<std::shared_ptr<NativePlan>> freed;  // destroyed at return, under the GIL, unlocked
  {
    std::lock_guard<std::mutex> g(mutex_);
    for (auto it = plans_.begin(); it != plans_.end();) {  // plans whose program was replaced
      if (!it->second->revoked()) {
        ++it;
        continue;
      }
      retired_.push_back(std::move(it->second));
      it = plans_.erase(it);
    }
    auto stale = std::partition(padded_.begin(), padded_.end(), [](const auto& p) { return !p->revoked(); });
    std::move(stale, padded_.end(), std::back_inserter(retired_));
    padded_.erase(stale, padded_.end());
    if (plans_.count(key) != 0) return;
    // Retired plans no Run holds any more (only retired_ does, and find() cannot hand them out).
    auto idle = std::partition(retired_.begin(), retired_.end(), [](const auto& p) { return p.use_count() > 1; });
    std::move(idle, retired_.end(), std::back_inserter(freed));
    retired_.erase(idle, retired_.end());
  }
  auto plan = std::make_shared<NativePlan>();
  plan->context = handle_of<void>(d["context"]);
  plan->device = d["device"].cast<int>();
  plan->input_bytes = d["input_bytes"].cast<std::vector<size_t>>();
  plan->pads.assign(plan->input_bytes.size(), NativePad{});
  if (d.contains("pads")) {
    py::list pads = d["pads"];
    for (size_t i = 0; i < pads.size() && i < plan->pads.size(); ++i) {
      if (pads[i].is_none()) continue;
      py::tuple t = py::reinterpret_borrow<py::tuple>(pads[i]);  // (capacity of the last axis, element bytes)
      plan->pads[i] = NativePad{t[0].cast<size_t>(), t[1].cast<size_t>()};
      plan->padded = true;
    }
  }
  if (plan->padded) {  // the pattern: this key, each padded input's last dim free up to its capacity
    plan->pattern = key;
    plan->free.assign(key.size(), 0);
    const std::vector<size_t> at = input_offsets(key, plan->pads.size());
    for (size_t i = 0; i < plan->pads.size(); ++i) {
      if (plan->pads[i].capacity == 0 || key[at[i]] <= 0) continue;
      const size_t last = at[i] + static_cast<size_t>(key[at[i]]);
      plan->pattern[last] = static_cast<int64_t>(plan->pads[i].capacity);
      plan->free[last] = 1;
    }
  }
  for (py::handle out : d["outputs"]) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(out);  // (constant bytes | None, nbytes, dims)
    NativeOutput o;
    o.is_constant = !t[0].is_none();
    if (o.is_constant) o.constant = t[0].cast<std::string>();
    o.nbytes = t[1].cast<size_t>();
    o.dims = t[2].cast<std::vector<int64_t>>();
    plan->outputs.push_back(std::move(o));
  }
  for (py::handle c : d["contexts"]) plan->contexts.push_back(parse_context(c));
  plan->max_contexts = std::max<size_t>(1, d["max_contexts"].cast<size_t>());
  plan->grow = d["grow"];
  plan->owner = d["owner"];
  if (d.contains("token")) plan->token = d["token"].cast<std::shared_ptr<PlanToken>>();
  std::lock_guard<std::mutex> g(mutex_);
  if (!plan->padded) {
    if (plans_.count(key) != 0) return;  // another Run made the same plan meanwhile
    if (plans_.size() >= capacity) {
      const auto older = [](const auto& a, const auto& b) {
        return a.second->last_used.load(std::memory_order_relaxed) <
               b.second->last_used.load(std::memory_order_relaxed);
      };
      auto lru = std::min_element(plans_.begin(), plans_.end(), older);
      retired_.push_back(std::move(lru->second));
      plans_.erase(lru);
    }
    plan->last_used.store(clock_.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    plans_.emplace(key, std::move(plan));
    return;
  }
  for (const auto& p : padded_) {
    if (fits(*p, key)) return;  // another Run made the same plan meanwhile
  }
  if (padded_.size() < d["capacity"].cast<size_t>()) padded_.push_back(std::move(plan));
}

void NativePlans::clear() noexcept {
  std::unordered_map<DimsKey, std::shared_ptr<NativePlan>, DimsKeyHash> gone;
  std::vector<std::shared_ptr<NativePlan>> gone_padded, gone_retired;
  {
    std::lock_guard<std::mutex> g(mutex_);
    gone.swap(plans_);
    gone_padded.swap(padded_);
    gone_retired.swap(retired_);
  }
  // Destroyed here, under the caller's GIL: each owner's last reference may free an executable.
}

void NativePlans::abandon() noexcept {
  std::lock_guard<std::mutex> g(mutex_);
  auto forget = [](NativePlan& p) {
    p.owner.release();  // leak references: Python is going away
    p.grow.release();
    for (auto& c : p.contexts) {
      c->lock.reset();
      for (auto& g : c->io) g.release();  // the driver may be shutting down too: never call it from here
    }
  };
  for (auto& kv : plans_) forget(*kv.second);
  for (auto& p : padded_) forget(*p);
  for (auto& p : retired_) forget(*p);
  plans_.clear();
  padded_.clear();
  retired_.clear();
}

bool read_dims_key(OrtKernelContext* ctx, size_t n_inputs, DimsKey& key) {
  const OrtApi& ort = *api().ort;
  key.clear();
  for (size_t i = 0; i < n_inputs; ++i) {
    const OrtValue* v = nullptr;
    check(ort.KernelContext_GetInput(ctx, i, &v));
    if (v == nullptr) {
      key.push_back(-1);
      continue;
    }
    int is_tensor = 0;
    check(ort.IsTensor(v, &is_tensor));
    if (!is_tensor) return false;
    OrtTensorTypeAndShapeInfo* raw = nullptr;
    check(ort.GetTensorTypeAndShape(v, &raw));
    TensorInfoPtr info(raw);
    size_t rank = 0;
    check(ort.GetDimensionsCount(info.get(), &rank));
    key.push_back(static_cast<int64_t>(rank));
    const size_t at = key.size();
    key.resize(at + rank);
    if (rank != 0) check(ort.GetDimensions(info.get(), key.data() + at, rank));
  }
  return true;
}

namespace {

// Where one of ORT's tensors lives for the native path: its address, and whether it is in GPU memory
// (device I/O: ORT's allocator, or a buffer the user bound). Device memory of another GPU than the
// program's is an error naming both.
struct Place {
  void* ptr = nullptr;
  bool device = false;
};

// Names a fused node's input or output in an error; the text is built only when one is raised (a Run that
// succeeds makes no strings).
struct Where {
  const std::string& label;
  size_t index;
  bool output;
  std::string str() const { return label + (output ? ": output " : ": input ") + std::to_string(index); }
};

Place place_of(const OrtValue* v, bool writable, int program_device, const Where& what) {
  Place p;
  int ordinal = -1;
  p.device = is_our_gpu(api().ep->Value_GetMemoryDevice(v), &ordinal);
  if (p.device && ordinal != program_device) {
    throw OrtError(ORT_INVALID_ARGUMENT, what.str() + " is in the memory of GPU " + std::to_string(ordinal) +
                                             " but this session runs on GPU " + std::to_string(program_device) +
                                             " (device_id)");
  }
  if (writable) {
    check(api().ort->GetTensorMutableData(const_cast<OrtValue*>(v), &p.ptr));
  } else {
    const void* data = nullptr;
    check(api().ort->GetTensorData(v, &data));
    p.ptr = const_cast<void*>(data);
  }
  return p;
}

// A failed copy from or to memory said to be on the device: name the tensor when its address is not device
// memory at all (a host buffer bound with device_type 'cuda'), rather than report a bare CUDA error.
void check_copy(const CudaDriver& cuda, CuResult r, const char* call, const Place& p, const Where& what) {
  if (r != 0 && p.device && cuda.memory_type(reinterpret_cast<CuDevicePtr>(p.ptr)) != 2) {
    throw OrtError(ORT_INVALID_ARGUMENT, what.str() + " is bound as GPU memory, but its address is not device memory "
                                                "(a host buffer bound with device_type 'cuda'?)");
  }
  cuda.check(r, call);
}

// What an IO graph copies from and to (io_graph.h), into `a`; false when host memory is on either side.
// `a` is the calling thread's, reused Run after Run: the native path allocates nothing for it.
bool io_addresses(const NativePlan& plan, const std::vector<Place>& src, const std::vector<Place>& dst,
                  IoAddresses& a) {
  a.src.clear();
  a.dst.clear();
  for (const Place& p : src) {
    if (p.ptr != nullptr && !p.device) return false;
    a.src.push_back(reinterpret_cast<CuDevicePtr>(p.ptr));
  }
  for (size_t i = 0; i < dst.size(); ++i) {
    const bool copied = dst[i].ptr != nullptr && !plan.outputs[i].is_constant;
    if (copied && !dst[i].device) return false;
    a.dst.push_back(copied ? reinterpret_cast<CuDevicePtr>(dst[i].ptr) : 0);
  }
  return true;
}

}  // namespace

namespace {

// A context of `plan` locked for this Run: a free one, else a new one while the pool may grow (asked of
// Python under the GIL; no lock of ours is held then), else the next in turn (waiting for it).
std::shared_ptr<NativeContext> acquire_context(const NativePlan& plan) {
  std::vector<std::shared_ptr<NativeContext>> seen;
  {
    std::lock_guard<std::mutex> g(plan.contexts_mutex);
    seen = plan.contexts;
  }
  for (auto& c : seen) {
    if (c->lock->mutex.try_lock()) return c;
  }
  if (seen.size() < plan.max_contexts && !plan.grow.is_none() && python_alive() && !plan.growing.exchange(true)) {
    std::shared_ptr<NativeContext> made;
    {
      py::gil_scoped_acquire gil;
      try {
        made = parse_context(plan.grow());
      } catch (py::error_already_set& e) {
        // No room for another arena (or another failure): this program stops growing, Runs wait instead.
        e.discard_as_unraisable("migraphx_ep: another execution context for concurrent Runs");
        plan.max_contexts = seen.size();
      }
    }
    plan.growing = false;
    if (made != nullptr) {
      made->lock->mutex.lock();
      std::lock_guard<std::mutex> g(plan.contexts_mutex);
      plan.contexts.push_back(made);
      return made;
    }
  }
  std::shared_ptr<NativeContext> c;
  {
    std::lock_guard<std::mutex> g(plan.contexts_mutex);
    c = plan.contexts[plan.next++ % plan.contexts.size()];
  }
  c->lock->mutex.lock();
  return c;
}

}  // namespace


namespace {

// One padded input's copy (NativePad): `rows` rows of `width` bytes, into a slot `pitch` bytes wide.
struct PaddedCopy {
  size_t rows = 0, width = 0, pitch = 0;
  const int64_t* dims = nullptr;  // the input's dims, in the Run's key
  size_t rank = 0;
};

PaddedCopy padded_copy(const NativePad& pad, const DimsKey& key, size_t at) {
  PaddedCopy p;
  p.rank = static_cast<size_t>(key[at]);
  p.dims = key.data() + at + 1;
  p.rows = 1;
  for (size_t j = 0; j + 1 < p.rank; ++j) p.rows *= static_cast<size_t>(p.dims[j]);
  p.width = static_cast<size_t>(p.dims[p.rank - 1]) * pad.elem;
  p.pitch = pad.capacity * pad.elem;
  return p;
}

void copy_padded(const CudaDriver& cuda, const NativeContext& c, size_t i, const Place& src, const PaddedCopy& p,
                 size_t slot_bytes, const Where& what) {
  const CuDevicePtr slot = c.inputs[i];
  if (p.width < p.pitch) cuda.check(cuda.memset_d8_async(slot, 0, slot_bytes, c.stream), "cuMemsetD8Async");
  if (p.width != 0 && p.rows != 0) {
    CuMemcpy3D m{};
    m.srcMemoryType = src.device ? 2 : 1;  // CU_MEMORYTYPE_DEVICE / _HOST
    m.srcHost = src.ptr;
    m.srcDevice = reinterpret_cast<CuDevicePtr>(src.ptr);
    m.srcPitch = p.width;
    m.srcHeight = p.rows;
    m.dstMemoryType = 2;
    m.dstDevice = slot;
    m.dstPitch = p.pitch;
    m.dstHeight = p.rows;
    m.WidthInBytes = p.width;
    m.Height = p.rows;
    m.Depth = 1;
    check_copy(cuda, cuda.memcpy_3d_async(&m, c.stream), "cuMemcpy3DAsync", src, what);
  }
  if (c.dims[i] != 0) {
    cuda.check(cuda.memcpy_htod_async(c.dims[i], p.dims, p.rank * sizeof(int64_t), c.stream), "cuMemcpyHtoDAsync");
  }
}

}  // namespace

bool run_native(const CudaDriver& cuda, const NativePlan& plan, OrtKernelContext* ctx, const DimsKey& key,
                const std::string& label) {
  const OrtApi& ort = *api().ort;
  // Outputs first: ORT allocates them before any device work, so a failure here leaves the device alone.
  std::vector<Place> dst(plan.outputs.size());
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    const NativeOutput& o = plan.outputs[i];
    int64_t scalar = 0;
    OrtValue* out = nullptr;
    check(ort.KernelContext_GetOutput(ctx, i, o.dims.empty() ? &scalar : o.dims.data(), o.dims.size(), &out));
    if (out == nullptr || o.nbytes == 0) continue;
    dst[i] = place_of(out, /*writable=*/true, plan.device, Where{label, i, true});
  }
  std::vector<Place> src(plan.input_bytes.size());
  std::vector<PaddedCopy> padded(plan.padded ? plan.input_bytes.size() : 0);
  const std::vector<size_t> at = plan.padded ? input_offsets(key, plan.input_bytes.size()) : std::vector<size_t>();
  for (size_t i = 0; i < plan.input_bytes.size(); ++i) {
    if (plan.input_bytes[i] == 0) continue;
    const OrtValue* v = nullptr;
    check(ort.KernelContext_GetInput(ctx, i, &v));
    size_t nbytes = 0;
    check(ort.GetTensorSizeInBytes(v, &nbytes));
    const bool pad = plan.padded && plan.pads[i].capacity != 0;
    if (pad) padded[i] = padded_copy(plan.pads[i], key, at[i]);
    const size_t want = pad ? padded[i].rows * padded[i].width : plan.input_bytes[i];
    if (nbytes != want) {
      throw OrtError(ORT_FAIL, Where{label, i, false}.str() + " has " + std::to_string(nbytes) +
                                   " bytes, the compiled program takes " + std::to_string(want));
    }
    src[i] = place_of(v, /*writable=*/false, plan.device, Where{label, i, false});
  }
  std::shared_ptr<NativeContext> held = acquire_context(plan);
  const NativeContext& c = *held;
  std::lock_guard<std::mutex> run(c.lock->mutex, std::adopt_lock);
  // ORT may call from any thread; the primary context must be current on this one.
  cuda.check(cuda.ctx_set_current(plan.context), "cuCtxSetCurrent");
  // Device memory on both sides: the copies and the program in one launch (the IO graph).
  // (Not with padded inputs: their copies change size with every Run.)
  thread_local IoAddresses io;
  const bool one_launch = !plan.padded && io_graphs_enabled() && io_addresses(plan, src, dst, io) &&
                          launch_io_graph(cuda, plan, c, io);
  for (size_t i = 0; i < src.size() && !one_launch; ++i) {
    const Place& p = src[i];
    if (plan.padded && plan.pads[i].capacity != 0 && plan.input_bytes[i] != 0) {
      copy_padded(cuda, c, i, p, padded[i], plan.input_bytes[i], Where{label, i, false});
      continue;
    }
    if (p.ptr == nullptr) continue;
    const size_t n = plan.input_bytes[i];
    if (p.device) {
      check_copy(cuda, cuda.memcpy_dtod_async(c.inputs[i], reinterpret_cast<CuDevicePtr>(p.ptr), n, c.stream),
                 "cuMemcpyDtoDAsync", p, Where{label, i, false});
    } else {
      cuda.check(cuda.memcpy_htod_async(c.inputs[i], p.ptr, n, c.stream), "cuMemcpyHtoDAsync");
    }
  }
  if (c.graph != nullptr && !one_launch) cuda.check(cuda.graph_launch(c.graph, c.stream), "cuGraphLaunch");
  for (size_t i = 0; i < dst.size(); ++i) {
    const NativeOutput& o = plan.outputs[i];
    const Place& p = dst[i];
    if (p.ptr == nullptr || (one_launch && !o.is_constant)) continue;
    const auto d = reinterpret_cast<CuDevicePtr>(p.ptr);
    if (o.is_constant && p.device) {
      check_copy(cuda, cuda.memcpy_htod_async(d, o.constant.data(), o.nbytes, c.stream), "cuMemcpyHtoDAsync",
                 p, Where{label, i, true});
    } else if (o.is_constant) {
      std::memcpy(p.ptr, o.constant.data(), o.nbytes);
    } else if (p.device) {
      check_copy(cuda, cuda.memcpy_dtod_async(d, c.outputs[i], o.nbytes, c.stream), "cuMemcpyDtoDAsync", p,
                 Where{label, i, true});
    } else {
      cuda.check(cuda.memcpy_dtoh_async(p.ptr, c.outputs[i], o.nbytes, c.stream), "cuMemcpyDtoHAsync");
    }
  }
  // Always: ORT treats a returned Compute as finished (we are not stream aware), and the slots are read next.
  trace_mark(TraceMark::kSyncBegin);
  const CuResult synced = cuda.stream_synchronize(c.stream);
  trace_mark(TraceMark::kSyncEnd);
  cuda.check(synced, "cuStreamSynchronize");
  bool failed = false;
  for (size_t i = 0; i < c.n_error_slots; ++i) failed = failed || c.error_slots[i] != 0;
  if (failed) {
    // The Python Run (on the first context) repeats the work and raises what the ref raises; clear this
    // context's slots so its next Run starts clean (no kernel runs on it now: it is synchronised).
    std::memset(c.error_slots, 0, c.n_error_slots * sizeof(int32_t));
  }
  return !failed;
}

bool native_run_enabled() noexcept {
  const char* v = std::getenv("MIGRAPHX_EP_NATIVE_RUN");
  return v == nullptr || (std::strcmp(v, "0") != 0 && std::strcmp(v, "") != 0);
}

void register_native(py::module_& m) {
  py::class_<RunLock, std::shared_ptr<RunLock>>(
      m, "RunLock", "The lock a gpu executable's Runs share with the shell's native Run path")
      .def(py::init<>())
      .def("__enter__",
           [](RunLock& l) {
             py::gil_scoped_release nogil;  // the holder may be a native Run that never takes the GIL
             l.mutex.lock();
           })
      .def("__exit__", [](RunLock& l, const py::args&) { l.mutex.unlock(); });
  py::class_<PlanToken, std::shared_ptr<PlanToken>>(
      m, "PlanToken", "Revoked when a program is replaced: the shell's plans of it are then dropped")
      .def(py::init<>())
      .def("revoke", [](PlanToken& t) { t.valid.store(false, std::memory_order_release); })
      .def_property_readonly("valid", [](const PlanToken& t) { return t.valid.load(std::memory_order_acquire); });
  m.def(
      "io_graph_launches", [] { return io_graph_counts().launches; },
      "Native Runs whose copies and program went out as one graph launch (MIGRAPHX_EP_IO_GRAPH=0: none)");
  m.def(
      "io_graph_counts",
      [] {
        const IoGraphCounts n = io_graph_counts();
        return py::make_tuple(n.builds, n.repoints);
      },
      "(IO graphs instantiated, copy nodes re-pointed) so far: a steady Run builds and re-points none");
  m.def(
      "cuda_driver_status",
      [] {
        std::string why;
        return cuda_driver(&why) != nullptr ? std::string() : why;
      },
      "'' when the native Run path can reach the CUDA driver; otherwise why not");
  m.def("native_run_enabled", &native_run_enabled, "False when MIGRAPHX_EP_NATIVE_RUN=0");
  m.def(
      "device_io_status",
      [] { return GpuDevices::get().count() > 0 ? std::string() : GpuDevices::get().why_not(); },
      "'' when our EpDevices advertise GPU memory (inputs and outputs live on the GPU); otherwise why not");
}

}  // namespace mgx
