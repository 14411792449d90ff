// OrtNodeComputeInfo: runs one compiled fused node by calling bridge.run(compiled, inputs).
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "native_run.h"
#include "ort_api.h"

namespace mgx {

struct ComputeInfo : OrtNodeComputeInfo {
  ComputeInfo(pybind11::object compiled, std::string fused_name, std::vector<std::string> output_names);
  // Calls bridge.release(compiled). The GIL must be held unless compiled was already dropped.
  ~ComputeInfo();
  ComputeInfo(const ComputeInfo&) = delete;
  ComputeInfo& operator=(const ComputeInfo&) = delete;

  // Interpreter shutdown: forget the Python object without touching Python (leaks one reference).
  void abandon() noexcept {
    plans.abandon();
    compiled.release();
  }

  pybind11::object compiled;
  std::string fused_name;
  std::vector<std::string> output_names;  // for error messages
  bool native;                             // MIGRAPHX_EP_NATIVE_RUN (read once, at Compile)
  NativePlans plans;                       // per input dims: runs that need no Python

  static OrtStatus* ORT_API_CALL CreateStateImpl(OrtNodeComputeInfo* self, OrtNodeComputeContext* context,
                                                 void** state) noexcept;
  static OrtStatus* ORT_API_CALL ComputeImpl(OrtNodeComputeInfo* self, void* state,
                                             OrtKernelContext* context) noexcept;
  static void ORT_API_CALL ReleaseStateImpl(OrtNodeComputeInfo* self, void* state) noexcept;
};

// OrtEp::ReleaseNodeComputeInfos: deletes our ComputeInfos (releasing their compiled objects).
void release_compute_infos(OrtNodeComputeInfo** infos, size_t count) noexcept;

}  // namespace mgx
