// Shared plumbing for the ORT plugin shell: the API tables ORT hands us, OrtStatus <-> C++ exception
// conversion, RAII for owned ORT handles, and the GIL-holding trampoline every entry point uses.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#ifndef MIGRAPHX_EP_VERSION  // set by CMake from migraphx_ep.__version__
#define MIGRAPHX_EP_VERSION "0.0.0"
#endif

namespace mgx {

inline constexpr const char* kEpName = "MIGraphXExecutionProvider";
inline constexpr const char* kVendor = "migraphx-ep";
// Session config prefix under which ORT stores the EP options: "ep." + lowercase(EP name) + ".".
inline constexpr const char* kOptionPrefix = "ep.migraphxexecutionprovider.";
// Session config keys of EPContext model generation (onnxruntime_session_options_config_keys.h).
inline constexpr const char* kContextPrefix = "ep.context_";

using HasShapeFn = bool(ORT_API_CALL*)(const OrtTensorTypeAndShapeInfo*);

// The oldest plugin-EP ABI we speak: everything called unconditionally exists in API 23; newer entries
// are used only when `Api::version` has them.
inline constexpr uint32_t kMinApiVersion = 23;

struct Api {
  const OrtApi* ort = nullptr;
  // The OrtApi version the running ORT gave us (<= ORT_API_VERSION of our headers, >= kMinApiVersion):
  // no field of an ORT struct, and no callback of ours, beyond this version is touched or installed.
  uint32_t version = 0;
  const char* runtime_version = nullptr;  // OrtApiBase::GetVersionString, e.g. "1.32.0"
  const OrtEpApi* ep = nullptr;
  // Builds EPContext nodes; null in ORT's minimal builds (then EPContext models cannot be written).
  const OrtModelEditorApi* editor = nullptr;
  // OrtApi::TensorTypeAndShape_HasShape (ORT API 24+); null when the runtime can't tell "rank unknown"
  // from "scalar" (then unknown ranks are reported as scalars).
  HasShapeFn has_shape = nullptr;
};

// Filled by CreateEpFactories from the OrtApiBase ORT passes in (we never link libonnxruntime).
const Api& api();
// Asks for ORT_API_VERSION, else the newest version down to kMinApiVersion the runtime serves; throws
// (naming the runtime's version) when it serves none.
void init_api(const OrtApiBase* base);

// An ORT error carried through C++ code as an exception until a trampoline turns it back into OrtStatus.
class OrtError : public std::runtime_error {
 public:
  OrtError(OrtErrorCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  OrtErrorCode code() const { return code_; }

 private:
  OrtErrorCode code_;
};

// Throws OrtError if `status` is an error (and releases it).
void check(OrtStatus* status);
// Release a status we deliberately ignore (e.g. the size-probe call of ReadOpAttr).
void ignore(OrtStatus* status) noexcept;

OrtStatus* make_status(OrtErrorCode code, const std::string& msg) noexcept;

// Turn the in-flight exception (Python, ORT or C++) into an OrtStatus whose message starts with
// "MIGraphXExecutionProvider <where>: " and carries the Python exception type and message.
OrtStatus* status_from_exception(const char* where) noexcept;

// True when calling into Python is safe: the interpreter exists and is not being torn down.
bool python_alive() noexcept;

// Runs `body` with the GIL held; every exception becomes an OrtStatus. This is the body of every
// `static ... Impl(...) noexcept` trampoline that reaches Python.
OrtStatus* run_with_gil(const char* where, void (*body)(void*), void* ctx) noexcept;

template <class F>
OrtStatus* guarded(const char* where, F&& f) noexcept {
  return run_with_gil(
      where, [](void* p) { (*static_cast<F*>(p))(); }, &f);
}

// Same as guarded() for entry points that must not fail (releases): errors are printed, not raised.
template <class F>
void guarded_void(const char* where, F&& f) noexcept {
  if (OrtStatus* st = guarded(where, std::forward<F>(f))) {
    ::fprintf(stderr, "%s\n", api().ort->GetErrorMessage(st));
    api().ort->ReleaseStatus(st);
  }
}

// --- RAII for ORT handles we own ---------------------------------------------------------------
struct ValueDeleter {
  void operator()(OrtValue* v) const noexcept { api().ort->ReleaseValue(v); }
};
struct TensorInfoDeleter {
  void operator()(OrtTensorTypeAndShapeInfo* v) const noexcept { api().ort->ReleaseTensorTypeAndShapeInfo(v); }
};
struct KeyValuePairsDeleter {
  void operator()(OrtKeyValuePairs* v) const noexcept { api().ort->ReleaseKeyValuePairs(v); }
};
struct OpAttrDeleter {
  void operator()(OrtOpAttr* v) const noexcept { api().ort->ReleaseOpAttr(v); }
};
struct ExternalInfoDeleter {
  void operator()(OrtExternalInitializerInfo* v) const noexcept { api().ort->ReleaseExternalInitializerInfo(v); }
};
using ValuePtr = std::unique_ptr<OrtValue, ValueDeleter>;
using TensorInfoPtr = std::unique_ptr<OrtTensorTypeAndShapeInfo, TensorInfoDeleter>;
using KeyValuePairsPtr = std::unique_ptr<OrtKeyValuePairs, KeyValuePairsDeleter>;
using ExternalInfoPtr = std::unique_ptr<OrtExternalInitializerInfo, ExternalInfoDeleter>;
using OpAttrPtr = std::unique_ptr<OrtOpAttr, OpAttrDeleter>;
struct NodeDeleter {
  void operator()(OrtNode* v) const noexcept { api().ort->ReleaseNode(v); }
};
using NodePtr = std::unique_ptr<OrtNode, NodeDeleter>;  // until handed to ORT (which then owns it)

}  // namespace mgx
