#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

#include "ort_api.h"

namespace mgx {
namespace {

struct Loaded {
  CudaDriver driver;
  bool ok = false;
  std::string why;
};

template <class F>
bool bind(void* lib, const char* symbol, F& fn, std::string& why) {
  fn = reinterpret_cast<F>(dlsym(lib, symbol));
  if (fn == nullptr) why = std::string("libcuda.so.1 has no ") + symbol;
  return fn != nullptr;
}

Loaded load() {
  Loaded l;
  // Never dlclose: the handle is process-wide and the Python bindings share it.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    l.why = std::string("cannot load libcuda.so.1: ") + (err != nullptr ? err : "unknown error");
    return l;
  }
  CudaDriver& d = l.driver;
  // The _v2 names are what cuda.h's macros resolve to since CUDA 3.2 (64-bit sizes and pointers).
  l.ok = bind(lib, "cuCtxSetCurrent", d.ctx_set_current, l.why) &&
         bind(lib, "cuMemcpyHtoDAsync_v2", d.memcpy_htod_async, l.why) &&
         bind(lib, "cuMemcpyDtoHAsync_v2", d.memcpy_dtoh_async, l.why) &&
         bind(lib, "cuMemcpyDtoDAsync_v2", d.memcpy_dtod_async, l.why) &&
         bind(lib, "cuGraphLaunch", d.graph_launch, l.why) &&
         bind(lib, "cuStreamSynchronize", d.stream_synchronize, l.why) &&
         bind(lib, "cuGetErrorString", d.get_error_string, l.why) && bind(lib, "cuInit", d.init, l.why) &&
         bind(lib, "cuDeviceGetCount", d.device_get_count, l.why) &&
         bind(lib, "cuDeviceGet", d.device_get, l.why) &&
         bind(lib, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain, l.why) &&
         bind(lib, "cuMemAlloc_v2", d.mem_alloc, l.why) && bind(lib, "cuMemFree_v2", d.mem_free, l.why) &&
         bind(lib, "cuMemGetInfo_v2", d.mem_get_info, l.why) &&
         bind(lib, "cuStreamCreate", d.stream_create, l.why) &&
         bind(lib, "cuPointerGetAttribute", d.pointer_get_attribute, l.why) &&
         bind(lib, "cuMemsetD8Async", d.memset_d8_async, l.why) &&
         bind(lib, "cuMemcpy3DAsync_v2", d.memcpy_3d_async, l.why);
  // Optional (CUDA 11.4+): all or none, so can_build_graphs() means every one is there.
  std::string no_graphs;
  if (!(bind(lib, "cuGraphCreate", d.graph_create, no_graphs) &&
        bind(lib, "cuGraphAddMemcpyNode", d.graph_add_memcpy_node, no_graphs) &&
        bind(lib, "cuGraphAddChildGraphNode", d.graph_add_child_graph_node, no_graphs) &&
        bind(lib, "cuGraphInstantiateWithFlags", d.graph_instantiate, no_graphs) &&
        bind(lib, "cuGraphExecMemcpyNodeSetParams", d.graph_exec_memcpy_node_set_params, no_graphs) &&
        bind(lib, "cuGraphExecDestroy", d.graph_exec_destroy, no_graphs) &&
        bind(lib, "cuGraphDestroy", d.graph_destroy, no_graphs))) {
    d.graph_create = nullptr;
    d.graph_destroy = nullptr;
  }
  std::string no_staging;
  if (!(bind(lib, "cuMemHostAlloc", d.mem_host_alloc, no_staging) &&
        bind(lib, "cuMemFreeHost", d.mem_free_host, no_staging) &&
        bind(lib, "cuEventCreate", d.event_create, no_staging) &&
        bind(lib, "cuEventRecord", d.event_record, no_staging) &&
        bind(lib, "cuEventSynchronize", d.event_synchronize, no_staging) &&
        bind(lib, "cuEventDestroy_v2", d.event_destroy, no_staging))) {
    d.mem_host_alloc = nullptr;
    d.event_synchronize = nullptr;
  }
  return l;
}

}  // namespace

void CudaDriver::check(CuResult r, const char* what) const {
  if (r == 0) return;
  const char* msg = nullptr;
  if (get_error_string == nullptr || get_error_string(r, &msg) != 0 || msg == nullptr) msg = "unknown error";
  throw OrtError(ORT_FAIL, std::string(what) + " failed: CUDA error " + std::to_string(r) + " (" + msg + ")");
}

int CudaDriver::memory_type(CuDevicePtr ptr) const noexcept {
  unsigned type = 0;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
  return pointer_get_attribute(&type, 2, ptr) == 0 ? static_cast<int>(type) : 0;
}

int CudaDriver::device_of(CuDevicePtr ptr) const noexcept {
  int ordinal = -1;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
  return pointer_get_attribute(&ordinal, 9, ptr) == 0 ? ordinal : -1;
}

const CudaDriver* cuda_driver(std::string* why) noexcept {
  static Loaded* loaded = nullptr;
  static std::once_flag once;
  try {
    std::call_once(once, [] { loaded = new Loaded(load()); });
  } catch (...) {
    if (why != nullptr) *why = "out of memory loading libcuda";
    return nullptr;
  }
  if (!loaded->ok) {
    if (why != nullptr) *why = loaded->why;
    return nullptr;
  }
  return &loaded->driver;
}

}  // namespace mgx
