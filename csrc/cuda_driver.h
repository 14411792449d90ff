// The few CUDA driver calls the native Run path makes, reached through dlopen at run time: the library
// builds without a CUDA toolkit or GPU (CI has neither), and a process without a driver simply never takes
// the native path. Each call has a HIP twin (hipMemcpyHtoDAsync, hipGraphLaunch, ...) for the AMD path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mgx {

using CuResult = int;  // CUresult: 0 is CUDA_SUCCESS
using CuDevicePtr = unsigned long long;
using CuHandle = void*;  // CUcontext, CUstream, CUgraphExec: opaque pointers

struct CudaDriver {
  CuResult (*ctx_set_current)(CuHandle ctx) = nullptr;
  CuResult (*memcpy_htod_async)(CuDevicePtr dst, const void* src, size_t bytes, CuHandle stream) = nullptr;
  CuResult (*memcpy_dtoh_async)(void* dst, CuDevicePtr src, size_t bytes, CuHandle stream) = nullptr;
  CuResult (*memcpy_dtod_async)(CuDevicePtr dst, CuDevicePtr src, size_t bytes, CuHandle stream) = nullptr;
  CuResult (*graph_launch)(CuHandle exec, CuHandle stream) = nullptr;
  CuResult (*stream_synchronize)(CuHandle stream) = nullptr;
  CuResult (*get_error_string)(CuResult error, const char** str) = nullptr;

  // Throws OrtError naming `what` and the driver's message when `r` is an error.
  void check(CuResult r, const char* what) const;
};

// The process's libcuda (the one the Python bindings already loaded: dlopen returns the same handle), or
// nullptr when there is none; `why` then says what is missing.
const CudaDriver* cuda_driver(std::string* why = nullptr) noexcept;

}  // namespace mgx
