// OrtEp: one per session. Holds the backend's EP object and forwards GetCapability / Compile to Python.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "device_memory.h"
#include "ort_api.h"

namespace mgx {

// Before its first Python call, a process's create_ep imports the compiler (0.1-0.3 s), and only then
// does the Python prewarm thread retain the GPU's primary context (~0.1 s) that the first compile or
// .mxr load waits for: an EPContext model's session spent that wait in its `device setup` stage. So
// create_ep first retains the context natively, on a thread of its own, overlapping the two. This is
// the device it retains: -1 (none) where the gpu target cannot be chosen (migraphx_target or
// ORT_MIGRAPHX_TARGET says ref), with MIGRAPHX_EP_PREWARM=0, or for a device_id that is no ordinal
// (Python validates the options and reports; a bad value only starts nothing here).
int early_context_ordinal(const std::map<std::string, std::string>& options) noexcept;

struct Ep : OrtEp {
  Ep(pybind11::object py_ep, const OrtLogger& logger, bool write_context, AllocatorSettings allocator);
  // Calls bridge.release_ep(py_ep). The GIL must be held unless py_ep was already dropped.
  ~Ep();
  Ep(const Ep&) = delete;
  Ep& operator=(const Ep&) = delete;

  pybind11::object py_ep;
  const OrtLogger& logger;
  // The session writes an EPContext model (ep.context_enable=1, as ModelCompiler sets). ORT hands
  // Compile an ep_context_nodes array either way, to be ignored otherwise.
  const bool write_context;
  // This session's device allocator options (migraphx_mem_limit, ...), from bridge.allocator_settings.
  const AllocatorSettings allocator;
  // The last GetCompiledModelCompatibilityInfo answer: ORT copies the string we return from here.
  std::string compatibility;

  static const char* ORT_API_CALL GetNameImpl(const OrtEp* self) noexcept;
  static OrtStatus* ORT_API_CALL GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                                   OrtEpGraphSupportInfo* support) noexcept;
  static OrtStatus* ORT_API_CALL CompileImpl(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes,
                                             size_t count, OrtNodeComputeInfo** infos,
                                             OrtNode** ep_context_nodes) noexcept;
  static void ORT_API_CALL ReleaseNodeComputeInfosImpl(OrtEp* self, OrtNodeComputeInfo** infos,
                                                       size_t count) noexcept;
  static OrtStatus* ORT_API_CALL CreateAllocatorImpl(OrtEp* self, const OrtMemoryInfo* memory_info,
                                                     OrtAllocator** allocator) noexcept;
  static const char* ORT_API_CALL GetCompiledModelCompatibilityInfoImpl(OrtEp* self, const OrtGraph* graph) noexcept;
#if ORT_API_VERSION >= 24
  static OrtStatus* ORT_API_CALL IsConcurrentRunSupportedImpl(OrtEp* self, bool* is_supported) noexcept;
#endif
#if ORT_API_VERSION >= 25
  static OrtStatus* ORT_API_CALL SyncImpl(OrtEp* self) noexcept;
#endif
};

// Factory side: build an Ep from the session's EP options and its "ep.context_*" entries
// (bridge.create_ep) / destroy it.
OrtStatus* create_ep(const std::map<std::string, std::string>& options,
                     const std::map<std::string, std::string>& session, const OrtLogger& logger,
                     OrtEp** out) noexcept;
void destroy_ep(OrtEp* ep) noexcept;
// Factory side: OrtEpFactory::ValidateCompiledModelCompatibilityInfo's verdict on `info` (the string ORT
// stored in a compiled model's metadata), computed by bridge.validate_compatibility. A string we cannot
// read is EP_UNSUPPORTED, not an error; an error status means the verdict itself could not be reached.
OrtStatus* validate_compatibility(const char* info, OrtCompiledModelCompatibility* result) noexcept;

}  // namespace mgx
