#include "ort_api.h"

#include <pybind11/pybind11.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace py = pybind11;

namespace mgx {
namespace {
Api g_api;

// The OrtApi version a runtime serves at most: ORT 1.x serves API x ("1.32.0" -> 32); 0 when unknown.
uint32_t runtime_api_version(const char* version) {
  int major = 0, minor = 0;
  if (version == nullptr || std::sscanf(version, "%d.%d", &major, &minor) != 2) return 0;
  return major == 1 && minor > 0 ? static_cast<uint32_t>(minor) : 0;
}
}  // namespace

const Api& api() { return g_api; }

void init_api(const OrtApiBase* base) {
  if (base == nullptr) throw std::runtime_error("ORT passed a null OrtApiBase");
  const char* runtime = base->GetVersionString();
  const std::string runtime_name = std::string("ONNX Runtime ") + (runtime != nullptr ? runtime : "(unknown)");
  const uint32_t runtime_api = runtime_api_version(runtime);
  if (runtime_api != 0 && runtime_api < kMinApiVersion) {
    throw std::runtime_error(std::string(kEpName) + ": " + runtime_name + " is too old: the plugin-EP API " +
                             std::to_string(kMinApiVersion) + " (ONNX Runtime 1." +
                             std::to_string(kMinApiVersion) + ") is the oldest it speaks");
  }
  // Headers' version first, newest to oldest; never above the runtime's own, because GetApi prints an
  // error to stderr for a version it does not know (and returns null).
  uint32_t version = runtime_api != 0 && runtime_api < ORT_API_VERSION ? runtime_api : ORT_API_VERSION;
  const OrtApi* ort = nullptr;
  for (; version >= kMinApiVersion; --version) {
    if ((ort = base->GetApi(version)) != nullptr) break;
  }
  if (ort == nullptr) {
    throw std::runtime_error(std::string(kEpName) + ": " + runtime_name + " serves none of ORT API versions " +
                             std::to_string(kMinApiVersion) + " to " + std::to_string(ORT_API_VERSION));
  }
  g_api.ort = ort;
  g_api.version = version;
  g_api.runtime_version = runtime;
  g_api.ep = ort->GetEpApi();
  g_api.editor = ort->GetModelEditorApi();
  g_api.has_shape = nullptr;
#if ORT_API_VERSION >= 24
  if (version >= 24) g_api.has_shape = ort->TensorTypeAndShape_HasShape;
#else
  // Built against 1.23 headers (the sid fallback of cmake/fetch_ort_headers.sh).
  // TensorTypeAndShape_HasShape is the first function ORT API 24 appended to OrtApi (the table is
  // append-only and versioned), so with 1.23 headers it sits right after the last 1.23 entry. Only
  // probe runtimes >= 1.24: asking an older one for API 24 prints an error to stderr.
  if (runtime_api >= 24) {
    if (const OrtApi* v24 = base->GetApi(24)) {
      HasShapeFn fn = nullptr;
      std::memcpy(&fn, reinterpret_cast<const char*>(v24) + sizeof(OrtApi), sizeof(fn));
      g_api.has_shape = fn;
    }
  }
#endif
}

void check(OrtStatus* status) {
  if (status == nullptr) return;
  const OrtErrorCode code = g_api.ort->GetErrorCode(status);
  std::string msg = g_api.ort->GetErrorMessage(status);
  g_api.ort->ReleaseStatus(status);
  throw OrtError(code, msg);
}

void ignore(OrtStatus* status) noexcept {
  if (status != nullptr) g_api.ort->ReleaseStatus(status);
}

OrtStatus* make_status(OrtErrorCode code, const std::string& msg) noexcept {
  try {
    return g_api.ort->CreateStatus(code, msg.c_str());
  } catch (...) {
    return g_api.ort->CreateStatus(code, "MIGraphXExecutionProvider: out of memory formatting an error");
  }
}

OrtStatus* status_from_exception(const char* where) noexcept {
  std::string prefix = std::string(kEpName) + " " + where + ": ";
  try {
    throw;
  } catch (py::error_already_set& e) {
    // what() is "ExcType: message" (+ traceback); the GIL is held by our caller (run_with_gil).
    return make_status(ORT_FAIL, prefix + e.what());
  } catch (const OrtError& e) {
    return make_status(e.code(), prefix + e.what());
  } catch (const std::exception& e) {
    return make_status(ORT_FAIL, prefix + "C++ exception: " + e.what());
  } catch (...) {
    return make_status(ORT_FAIL, prefix + "unknown C++ exception");
  }
}

bool python_alive() noexcept {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsFinalizing();
#else
  return !_Py_IsFinalizing();
#endif
}

OrtStatus* run_with_gil(const char* where, void (*body)(void*), void* ctx) noexcept {
  try {
    if (!python_alive()) {
      return make_status(ORT_FAIL, std::string(kEpName) + " " + where +
                                       ": the Python interpreter is not running (this EP lives in Python)");
    }
    // ORT may call us from its own threads (session.run releases the GIL, Compute may run concurrently):
    // PyGILState_Ensure semantics work from any thread.
    py::gil_scoped_acquire gil;
    try {
      body(ctx);
      return nullptr;
    } catch (...) {
      return status_from_exception(where);  // still under the GIL: Python errors format safely
    }
  } catch (...) {
    return status_from_exception(where);
  }
}

}  // namespace mgx
