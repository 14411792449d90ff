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

// cuda.h's CUDA_MEMCPY3D, field for field (the IO graph's memcpy nodes, and rows copied into a padded slot).
struct CuMemcpy3D {
  size_t srcXInBytes, srcY, srcZ, srcLOD;
  int srcMemoryType;  // CUmemorytype: 2 is device
  const void* srcHost;
  CuDevicePtr srcDevice;
  void* srcArray;
  void* reserved0;
  size_t srcPitch, srcHeight;
  size_t dstXInBytes, dstY, dstZ, dstLOD;
  int dstMemoryType;
  void* dstHost;
  CuDevicePtr dstDevice;
  void* dstArray;
  void* reserved1;
  size_t dstPitch, dstHeight;
  size_t WidthInBytes, Height, Depth;
};

struct CudaDriver {
  CuResult (*ctx_set_current)(CuHandle ctx) = nullptr;
  CuResult (*memcpy_htod_async)(CuDevicePtr dst, const void* src, size_t bytes, CuHandle stream) = nullptr;
  CuResult (*memcpy_dtoh_async)(void* dst, CuDevicePtr src, size_t bytes, CuHandle stream) = nullptr;
  CuResult (*memcpy_dtod_async)(CuDevicePtr dst, CuDevicePtr src, size_t bytes, CuHandle stream) = nullptr;
  CuResult (*graph_launch)(CuHandle exec, CuHandle stream) = nullptr;
  CuResult (*stream_synchronize)(CuHandle stream) = nullptr;
  CuResult (*get_error_string)(CuResult error, const char** str) = nullptr;
  // Device memory (device_memory.h): the allocator, ORT's copies and the checks of bound pointers.
  CuResult (*init)(unsigned flags) = nullptr;
  CuResult (*device_get_count)(int* count) = nullptr;
  CuResult (*device_get)(int* device, int ordinal) = nullptr;
  CuResult (*primary_ctx_retain)(CuHandle* ctx, int device) = nullptr;
  CuResult (*mem_alloc)(CuDevicePtr* ptr, size_t bytes) = nullptr;
  CuResult (*mem_free)(CuDevicePtr ptr) = nullptr;
  CuResult (*mem_get_info)(size_t* free, size_t* total) = nullptr;
  CuResult (*stream_create)(CuHandle* stream, unsigned flags) = nullptr;  // ORT's copies' own stream
  CuResult (*pointer_get_attribute)(void* data, int attribute, CuDevicePtr ptr) = nullptr;
  // Inputs with a run-time axis (native_run.h NativePad): a zeroed slot, then the rows at its pitch.
  CuResult (*memset_d8_async)(CuDevicePtr dst, unsigned char value, size_t bytes, CuHandle stream) = nullptr;
  CuResult (*memcpy_3d_async)(const CuMemcpy3D* params, CuHandle stream) = nullptr;
  // Graph building (the native path's IO graph); optional: without them the copies are issued one by one.
  CuResult (*graph_create)(CuHandle* graph, unsigned flags) = nullptr;
  CuResult (*graph_add_memcpy_node)(CuHandle* node, CuHandle graph, const CuHandle* deps, size_t n_deps,
                                    const CuMemcpy3D* params, CuHandle ctx) = nullptr;
  CuResult (*graph_add_child_graph_node)(CuHandle* node, CuHandle graph, const CuHandle* deps, size_t n_deps,
                                         CuHandle child) = nullptr;
  CuResult (*graph_instantiate)(CuHandle* exec, CuHandle graph, unsigned long long flags) = nullptr;
  CuResult (*graph_exec_memcpy_node_set_params)(CuHandle exec, CuHandle node, const CuMemcpy3D* params,
                                                CuHandle ctx) = nullptr;
  CuResult (*graph_exec_destroy)(CuHandle exec) = nullptr;
  CuResult (*graph_destroy)(CuHandle graph) = nullptr;
  bool can_build_graphs() const noexcept { return graph_create != nullptr && graph_destroy != nullptr; }
  // Pinned staging for large pageable copies (host_staging.h); optional like graph building.
  CuResult (*mem_host_alloc)(void** ptr, size_t bytes, unsigned flags) = nullptr;
  CuResult (*mem_free_host)(void* ptr) = nullptr;
  CuResult (*event_create)(CuHandle* event, unsigned flags) = nullptr;
  CuResult (*event_record)(CuHandle event, CuHandle stream) = nullptr;
  CuResult (*event_synchronize)(CuHandle event) = nullptr;
  CuResult (*event_destroy)(CuHandle event) = nullptr;
  bool can_stage() const noexcept { return mem_host_alloc != nullptr && event_synchronize != nullptr; }

  // Throws OrtError naming `what` and the driver's message when `r` is an error.
  void check(CuResult r, const char* what) const;
  // What `ptr` is: 1 host (pinned), 2 device, 3 array, 4 unified (CUmemorytype); 0 when the driver does
  // not know it (pageable host memory, or not an address at all).
  int memory_type(CuDevicePtr ptr) const noexcept;
  // The CUDA ordinal owning device memory `ptr`, -1 when unknown.
  int device_of(CuDevicePtr ptr) const noexcept;
};

// The process's libcuda (the one the Python bindings already loaded: dlopen returns the same handle), or
// nullptr when there is none; `why` then says what is missing.
const CudaDriver* cuda_driver(std::string* why = nullptr) noexcept;

}  // namespace mgx
