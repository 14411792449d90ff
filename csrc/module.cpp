// The one shared library: the pybind11 extension module `migraphx_ep._C` *and* the ORT plugin-EP
// library (ORT dlopens the same file, so both share this process-wide state).
#include <pybind11/pybind11.h>

#include <new>

#include "factory.h"

#define MGX_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// A status for when init_api failed: the table for the version we asked for is missing, so build it
// with API 1, which every runtime serves (CreateStatus is one of its first entries).
OrtStatus* early_error(const OrtApiBase* base, const char* msg) noexcept {
  const OrtApi* v1 = base != nullptr ? base->GetApi(1) : nullptr;
  return v1 != nullptr ? v1->CreateStatus(ORT_FAIL, msg) : nullptr;
}

}  // namespace

// Plugin entry point. Pure C++ (no GIL): the factory itself never calls Python, and the Python-facing
// entry points (CreateEp, GetCapability, Compile, Compute, releases) take the GIL themselves.
MGX_EXPORT OrtStatus* CreateEpFactories(const char* /*registered_name*/, const OrtApiBase* ort_api_base,
                                        const OrtLogger* /*default_logger*/, OrtEpFactory** factories,
                                        size_t max_factories, size_t* num_factories) {
  *num_factories = 0;
  try {
    mgx::init_api(ort_api_base);
  } catch (const std::exception& e) {
    return early_error(ort_api_base, e.what());
  }
  if (max_factories < 1) {
    return mgx::make_status(ORT_INVALID_ARGUMENT, "MIGraphXExecutionProvider: no room for a factory");
  }
  auto* factory = new (std::nothrow) mgx::Factory();
  if (factory == nullptr) return mgx::make_status(ORT_FAIL, "MIGraphXExecutionProvider: out of memory");
  factories[0] = factory;
  *num_factories = 1;
  return nullptr;
}

// May run after the Python interpreter is gone (ORT unloads plugin libraries at its own exit), so it
// must not touch Python; the factory holds no Python objects.
MGX_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete static_cast<mgx::Factory*>(factory);
  return nullptr;
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "migraphx-ep native shell: ORT plugin-EP library (CreateEpFactories/ReleaseEpFactory)";
  m.attr("EP_NAME") = mgx::kEpName;
  m.attr("VERSION") = MIGRAPHX_EP_VERSION;
  m.attr("ORT_API_VERSION") = ORT_API_VERSION;  // the headers we were built against
}
