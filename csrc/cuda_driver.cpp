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
         bind(lib, "cuGetErrorString", d.get_error_string, l.why);
  return l;
}

}  // namespace

void CudaDriver::check(CuResult r, const char* what) const {
  if (r == 0) return;
  const char* msg = nullptr;
  if (get_error_string == nullptr || get_error_string(r, &msg) != 0 || msg == nullptr) msg = "unknown error";
  throw OrtError(ORT_FAIL, std::string(what) + " failed: CUDA error " + std::to_string(r) + " (" + msg + ")");
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
