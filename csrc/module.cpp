// The one shared library: the pybind11 extension module `migraphx_ep._C` *and* the ORT plugin-EP
// library (ORT dlopens the same file, so both share this process-wide state).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <new>
#include <string>

#include "ep.h"
#include "factory.h"
#include "host_staging.h"
#include "native_run.h"
#include "python_host.h"
#include "run_trace.h"

#ifndef MIGRAPHX_EP_ORT_INCLUDE_DIR  // set by CMake: the ORT headers this library was built against
#define MIGRAPHX_EP_ORT_INCLUDE_DIR ""
#endif

namespace py = pybind11;

#define MGX_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// A status for when init_api failed: the table for the version we asked for is missing, so build it
// with API 1, which every runtime serves (CreateStatus is one of its first entries).
OrtStatus* early_error(const OrtApiBase* base, const char* msg) noexcept {
  const OrtApi* v1 = base != nullptr ? base->GetApi(1) : nullptr;
  return v1 != nullptr ? v1->CreateStatus(ORT_FAIL, msg) : nullptr;
}

OrtStatus* python_error(const char* what) noexcept {
  try {
    return mgx::make_status(ORT_FAIL, std::string(mgx::kEpName) + ": cannot run Python in this process: " + what);
  } catch (...) {
    return mgx::make_status(ORT_FAIL, what);
  }
}

}  // namespace

// Plugin entry point. In a Python process the factory never calls Python, and the Python-facing entry
// points (CreateEp, GetCapability, Compile, Compute, releases) take the GIL themselves. In a C/C++ host
// without Python, this is where the interpreter starts (python_host.h).
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
  try {
    mgx::ensure_python();
  } catch (const std::exception& e) {
    return python_error(e.what());
  } catch (...) {
    return python_error("unknown C++ exception");
  }
  auto* factory = new (std::nothrow) mgx::Factory();
  if (factory == nullptr) return mgx::make_status(ORT_FAIL, "MIGraphXExecutionProvider: out of memory");
  factories[0] = factory;
  *num_factories = 1;
  return nullptr;
}

// May run after the Python interpreter is gone (ORT unloads plugin libraries at its own exit), so it
// must not touch Python; the factory holds no Python objects. An interpreter we started stays running.
MGX_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete static_cast<mgx::Factory*>(factory);
  return nullptr;
}

namespace {

// (header API version, runtime API version obtained, runtime version string); the last two are None
// until ORT has loaded the library (CreateEpFactories).
py::dict ort_api_versions() {
  py::dict d;
  d["header"] = ORT_API_VERSION;
  d["runtime"] = mgx::api().ort != nullptr ? py::object(py::int_(mgx::api().version)) : py::none();
  d["runtime_version"] =
      mgx::api().runtime_version != nullptr ? py::object(py::str(mgx::api().runtime_version)) : py::none();
  return d;
}

py::dict build_info() {
  const mgx::PythonBuildInfo python = mgx::python_build_info();
  py::dict d;
  d["ort_include_dir"] = MIGRAPHX_EP_ORT_INCLUDE_DIR;
  d["python_home"] = python.home;
  d["python_executable"] = python.executable;
  d["python_library"] = python.library;  // "" when not linked: C/C++ hosts without Python unsupported
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "migraphx-ep native shell: ORT plugin-EP library (CreateEpFactories/ReleaseEpFactory)";
  m.attr("EP_NAME") = mgx::kEpName;
  m.attr("VERSION") = MIGRAPHX_EP_VERSION;
  m.attr("ORT_API_VERSION") = ORT_API_VERSION;  // the headers we were built against
  m.def("ort_api_versions", &ort_api_versions,
        "{'header': ORT_API_VERSION built against, 'runtime': the OrtApi version the running ORT gave "
        "(None before ORT loaded the library), 'runtime_version': its version string}");
  m.def("embedded", &mgx::embedded_python,
        "True when the library started Python itself (loaded by a C/C++ host that had none)");
  m.def("build_info", &build_info, "ORT headers and Python the library was built against");
  m.def("early_context_ordinal", &mgx::early_context_ordinal, py::arg("options"),
        "The GPU whose primary context CreateEp retains before its first Python call, for these provider "
        "options and the environment (-1: none)");
  mgx::register_native(m);
  mgx::register_trace(m);
  mgx::register_staging(m);
}
