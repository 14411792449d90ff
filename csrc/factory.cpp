#include "factory.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "device_memory.h"
#include "ep.h"

namespace mgx {
namespace {

// Every session config entry "ep.migraphxexecutionprovider.<key>" -> options {<key>: value}. ORT puts the
// options given to add_provider_for_devices (and the EpDevice's ep_options) there, keys verbatim.
// The session-wide EPContext entries ("ep.context_enable", "ep.context_file_path", ...) go to `session`,
// keys whole: ModelCompiler sets them, and Compile needs them to write EPContext nodes.
std::map<std::string, std::string> read_ep_options(const OrtSessionOptions* session_options,
                                                   std::map<std::string, std::string>& session) {
  std::map<std::string, std::string> options;
  if (session_options == nullptr) return options;
  OrtKeyValuePairs* raw = nullptr;
  check(api().ort->GetSessionOptionsConfigEntries(session_options, &raw));
  KeyValuePairsPtr entries(raw);
  if (!entries) return options;
  const char* const* keys = nullptr;
  const char* const* values = nullptr;
  size_t n = 0;
  api().ort->GetKeyValuePairs(entries.get(), &keys, &values, &n);
  const size_t prefix_len = std::strlen(kOptionPrefix);
  const size_t context_len = std::strlen(kContextPrefix);
  for (size_t i = 0; i < n; ++i) {
    if (keys[i] == nullptr) continue;
    const char* value = values[i] != nullptr ? values[i] : "";
    if (std::strncmp(keys[i], kOptionPrefix, prefix_len) == 0) {
      options[keys[i] + prefix_len] = value;
    } else if (std::strncmp(keys[i], kContextPrefix, context_len) == 0) {
      session[keys[i]] = value;
    }
  }
  return options;
}

}  // namespace

Factory::Factory() : OrtEpFactory{} {
  ort_version_supported = ORT_API_VERSION;
  GetName = GetNameImpl;
  GetVendor = GetVendorImpl;
  GetSupportedDevices = GetSupportedDevicesImpl;
  CreateEp = CreateEpImpl;
  ReleaseEp = ReleaseEpImpl;
  GetVendorId = GetVendorIdImpl;
  GetVersion = GetVersionImpl;
  // In the 1.23 ABI (kMinApiVersion), so every runtime we load in has it: no version check needed.
  ValidateCompiledModelCompatibilityInfo = ValidateCompiledModelCompatibilityInfoImpl;
  // The header does not say these may be null, and some ORT versions call CreateDataTransfer
  // unconditionally: implement them all as "nothing to offer" (CPU memory, no streams, no allocator).
  CreateAllocator = CreateAllocatorImpl;
  ReleaseAllocator = ReleaseAllocatorImpl;
  CreateDataTransfer = CreateDataTransferImpl;
  IsStreamAware = IsStreamAwareImpl;
  CreateSyncStreamForDevice = CreateSyncStreamForDeviceImpl;
}

const char* ORT_API_CALL Factory::GetNameImpl(const OrtEpFactory*) noexcept { return kEpName; }
const char* ORT_API_CALL Factory::GetVendorImpl(const OrtEpFactory*) noexcept { return kVendor; }
// Not tied to one PCI vendor: the same plugin runs the ref target anywhere (and HIP twins are in view).
uint32_t ORT_API_CALL Factory::GetVendorIdImpl(const OrtEpFactory*) noexcept { return 0; }
const char* ORT_API_CALL Factory::GetVersionImpl(const OrtEpFactory*) noexcept { return MIGRAPHX_EP_VERSION; }

namespace {

// One metadata entry on our EpDevices: "device_id" = the CUDA ordinal whose memory it advertises (the
// Python routing picks the EpDevice matching the session's device_id).
OrtKeyValuePairs* device_metadata(int ordinal) {
  OrtKeyValuePairs* kv = nullptr;
  api().ort->CreateKeyValuePairs(&kv);
  api().ort->AddKeyValuePair(kv, "device_id", std::to_string(ordinal).c_str());
  return kv;
}

}  // namespace

OrtStatus* ORT_API_CALL Factory::GetSupportedDevicesImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                                         size_t num_devices, OrtEpDevice** ep_devices,
                                                         size_t max_ep_devices, size_t* num_ep_devices) noexcept {
  try {
    *num_ep_devices = 0;
    const OrtHardwareDevice* cpu = nullptr;
    std::vector<const OrtHardwareDevice*> nvidia;  // ORT lists GPUs only where sysfs shows them
    for (size_t i = 0; i < num_devices; ++i) {
      const OrtHardwareDeviceType type = api().ort->HardwareDevice_Type(devices[i]);
      if (type == OrtHardwareDeviceType_CPU && cpu == nullptr) cpu = devices[i];
      if (type == OrtHardwareDeviceType_GPU && api().ort->HardwareDevice_VendorId(devices[i]) == kNvidiaVendorId) {
        nvidia.push_back(devices[i]);
      }
    }
    if (cpu == nullptr) return nullptr;
    GpuDevices& gpus = GpuDevices::get();
    if (gpus.count() == 0) {
      // No GPU: one EpDevice whose inputs and outputs live in CPU memory (ORT's default).
      OrtEpDevice* device = nullptr;
      check(api().ep->CreateEpDevice(self, cpu, nullptr, nullptr, &device));
      ep_devices[(*num_ep_devices)++] = device;
      return nullptr;
    }
    // One EpDevice per CUDA device, advertising its memory: ORT then keeps our nodes' inputs and outputs
    // there and copies through our data transfer. On ORT's GPU entry when it lists as many NVIDIA GPUs,
    // else on the CPU entry (the hardware entry does not decide memory placement; the memory info does).
    const bool paired = static_cast<int>(nvidia.size()) == gpus.count();
    for (int k = 0; k < gpus.count() && *num_ep_devices < max_ep_devices; ++k) {
      KeyValuePairsPtr meta(device_metadata(k));
      OrtEpDevice* device = nullptr;
      check(api().ep->CreateEpDevice(self, paired ? nvidia[static_cast<size_t>(k)] : cpu, meta.get(), nullptr,
                                     &device));
      check(api().ep->EpDevice_AddAllocatorInfo(device, gpus.memory_info(k)));
      ep_devices[(*num_ep_devices)++] = device;
    }
    return nullptr;
  } catch (...) {
    return status_from_exception("GetSupportedDevices");
  }
}

OrtStatus* ORT_API_CALL Factory::CreateEpImpl(OrtEpFactory*, const OrtHardwareDevice* const*,
                                              const OrtKeyValuePairs* const*, size_t,
                                              const OrtSessionOptions* session_options, const OrtLogger* logger,
                                              OrtEp** ep) noexcept {
  *ep = nullptr;
  std::map<std::string, std::string> options, session;
  try {
    options = read_ep_options(session_options, session);  // session_options is only valid during this call
  } catch (...) {
    return status_from_exception("CreateEp");
  }
  return create_ep(options, session, *logger, ep);
}

void ORT_API_CALL Factory::ReleaseEpImpl(OrtEpFactory*, OrtEp* ep) noexcept { destroy_ep(ep); }

OrtStatus* ORT_API_CALL Factory::ValidateCompiledModelCompatibilityInfoImpl(OrtEpFactory*,
                                                                            const OrtHardwareDevice* const*, size_t,
                                                                            const char* info,
                                                                            OrtCompiledModelCompatibility* result) noexcept {
  // ORT 1.32 calls this when its C API creates a session for a model whose metadata holds our string
  // (before Initialize: UNSUPPORTED fails the session, PREFER_RECOMPILATION logs a warning; its Python
  // InferenceSession does not ask), and for GetModelCompatibilityForEpDevices. The verdict is about this
  // machine and package (ep/compat.py; the session's options are checked per EPContext node at Compile),
  // and it weighs every GPU here, so the devices ORT names are not needed.
  return validate_compatibility(info, result);
}

OrtStatus* ORT_API_CALL Factory::CreateAllocatorImpl(OrtEpFactory*, const OrtMemoryInfo* memory_info,
                                                     const OrtKeyValuePairs*, OrtAllocator** allocator) noexcept {
  *allocator = nullptr;  // CPU memory: ORT's default allocator
  return make_allocator(memory_info, AllocatorSettings{}, allocator);
}

void ORT_API_CALL Factory::ReleaseAllocatorImpl(OrtEpFactory*, OrtAllocator* allocator) noexcept {
  delete static_cast<GpuAllocator*>(allocator);  // every allocator we hand out is one
}

OrtStatus* ORT_API_CALL Factory::CreateDataTransferImpl(OrtEpFactory*, OrtDataTransferImpl** data_transfer) noexcept {
  // CPU memory only without a GPU: nothing to copy between devices.
  *data_transfer = GpuDevices::get().count() > 0 ? gpu_data_transfer() : nullptr;
  return nullptr;
}

OrtStatus* make_allocator(const OrtMemoryInfo* memory_info, const AllocatorSettings& settings,
                          OrtAllocator** allocator) noexcept {
  *allocator = nullptr;
  try {
    int ordinal = 0;
    if (memory_info != nullptr && is_our_gpu(api().ep->MemoryInfo_GetMemoryDevice(memory_info), &ordinal)) {
      *allocator = new GpuAllocator(ordinal, settings);
    }
    return nullptr;
  } catch (...) {
    return status_from_exception("CreateAllocator");
  }
}

bool ORT_API_CALL Factory::IsStreamAwareImpl(const OrtEpFactory*) noexcept { return false; }

OrtStatus* ORT_API_CALL Factory::CreateSyncStreamForDeviceImpl(OrtEpFactory*, const OrtMemoryDevice*,
                                                               const OrtKeyValuePairs*,
                                                               OrtSyncStreamImpl** stream) noexcept {
  *stream = nullptr;
  return nullptr;
}

}  // namespace mgx
