// OrtEpFactory: names the EP, offers its OrtEpDevices (CPU memory, or one per CUDA device with its memory),
// creates Eps, allocators and the data transfer.
// Pure C++ except CreateEp/ReleaseEp and ValidateCompiledModelCompatibilityInfo (called while a session is
// being made, or from ORT's API): ORT may release the factory after Python has shut down.
#pragma once

#include "device_memory.h"
#include "ort_api.h"

namespace mgx {

struct Factory : OrtEpFactory {
  Factory();

  static const char* ORT_API_CALL GetNameImpl(const OrtEpFactory* self) noexcept;
  static const char* ORT_API_CALL GetVendorImpl(const OrtEpFactory* self) noexcept;
  static uint32_t ORT_API_CALL GetVendorIdImpl(const OrtEpFactory* self) noexcept;
  static const char* ORT_API_CALL GetVersionImpl(const OrtEpFactory* self) noexcept;
  static OrtStatus* ORT_API_CALL GetSupportedDevicesImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                                         size_t num_devices, OrtEpDevice** ep_devices,
                                                         size_t max_ep_devices, size_t* num_ep_devices) noexcept;
  static OrtStatus* ORT_API_CALL CreateEpImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                              const OrtKeyValuePairs* const* ep_metadata, size_t num_devices,
                                              const OrtSessionOptions* session_options, const OrtLogger* logger,
                                              OrtEp** ep) noexcept;
  static void ORT_API_CALL ReleaseEpImpl(OrtEpFactory* self, OrtEp* ep) noexcept;
  static OrtStatus* ORT_API_CALL ValidateCompiledModelCompatibilityInfoImpl(
      OrtEpFactory* self, const OrtHardwareDevice* const* devices, size_t num_devices, const char* info,
      OrtCompiledModelCompatibility* result) noexcept;
  static OrtStatus* ORT_API_CALL CreateAllocatorImpl(OrtEpFactory* self, const OrtMemoryInfo* memory_info,
                                                     const OrtKeyValuePairs* options,
                                                     OrtAllocator** allocator) noexcept;
  static void ORT_API_CALL ReleaseAllocatorImpl(OrtEpFactory* self, OrtAllocator* allocator) noexcept;
  static OrtStatus* ORT_API_CALL CreateDataTransferImpl(OrtEpFactory* self,
                                                        OrtDataTransferImpl** data_transfer) noexcept;
  static bool ORT_API_CALL IsStreamAwareImpl(const OrtEpFactory* self) noexcept;
  static OrtStatus* ORT_API_CALL CreateSyncStreamForDeviceImpl(OrtEpFactory* self,
                                                               const OrtMemoryDevice* memory_device,
                                                               const OrtKeyValuePairs* stream_options,
                                                               OrtSyncStreamImpl** stream) noexcept;
};

// A GpuAllocator for `memory_info` when it is one of our GPU memory infos; null (ORT's CPU allocator)
// otherwise. The factory's allocators use default settings, a session's (Ep::CreateAllocator) its options.
OrtStatus* make_allocator(const OrtMemoryInfo* memory_info, const AllocatorSettings& settings,
                          OrtAllocator** allocator) noexcept;

}  // namespace mgx
