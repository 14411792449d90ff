#include "factory.h"

#include <cstring>
#include <map>
#include <string>

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
  // The header does not say these may be null, and some ORT versions call CreateDataTransfer
  // unconditionally: implement them all as "nothing to offer" (CPU memory, no streams, no allocator).
  ValidateCompiledModelCompatibilityInfo = ValidateCompiledModelCompatibilityInfoImpl;
  CreateAllocator = CreateAllocatorImpl;
  ReleaseAllocator = ReleaseAllocatorImpl;
  CreateDataTransfer = CreateDataTransferImpl;
  IsStreamAware = IsStreamAwareImpl;
  CreateSyncStreamForDevice = CreateSyncStreamForDeviceImpl;
}

const char* ORT_API_CALL Factory::GetNameImpl(const OrtEpFactory*) noexcept { return kEpName; }
const char* ORT_API_CALL Factory::GetVendorImpl(const OrtEpFactory*) noexcept { return kVendor; }
// Not tied to a PCI vendor: the EP device is ORT's CPU device (see DESIGN.md, "first version").
uint32_t ORT_API_CALL Factory::GetVendorIdImpl(const OrtEpFactory*) noexcept { return 0; }
const char* ORT_API_CALL Factory::GetVersionImpl(const OrtEpFactory*) noexcept { return MIGRAPHX_EP_VERSION; }

OrtStatus* ORT_API_CALL Factory::GetSupportedDevicesImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                                         size_t num_devices, OrtEpDevice** ep_devices,
                                                         size_t max_ep_devices, size_t* num_ep_devices) noexcept {
  try {
    *num_ep_devices = 0;
    // One EpDevice on the first CPU hardware device: inputs/outputs live in CPU memory; the compiled
    // program moves data to the GPU itself (GPUs are often not listed by ORT anyway).
    for (size_t i = 0; i < num_devices && *num_ep_devices < max_ep_devices; ++i) {
      if (api().ort->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
      OrtEpDevice* device = nullptr;
      check(api().ep->CreateEpDevice(self, devices[i], nullptr, nullptr, &device));
      ep_devices[(*num_ep_devices)++] = device;
      break;
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
                                                                            const char*,
                                                                            OrtCompiledModelCompatibility* result) noexcept {
  // Our EPContext nodes carry their own target/version/options record, checked when they are compiled
  // (ep/epcontext.py: a mismatch is an error naming it); no separate compatibility string is written.
  *result = OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;
  return nullptr;
}

OrtStatus* ORT_API_CALL Factory::CreateAllocatorImpl(OrtEpFactory*, const OrtMemoryInfo*, const OrtKeyValuePairs*,
                                                     OrtAllocator** allocator) noexcept {
  *allocator = nullptr;  // ORT's default CPU allocator
  return nullptr;
}

void ORT_API_CALL Factory::ReleaseAllocatorImpl(OrtEpFactory*, OrtAllocator*) noexcept {}

OrtStatus* ORT_API_CALL Factory::CreateDataTransferImpl(OrtEpFactory*, OrtDataTransferImpl** data_transfer) noexcept {
  *data_transfer = nullptr;  // CPU memory only: nothing to copy between devices
  return nullptr;
}

bool ORT_API_CALL Factory::IsStreamAwareImpl(const OrtEpFactory*) noexcept { return false; }

OrtStatus* ORT_API_CALL Factory::CreateSyncStreamForDeviceImpl(OrtEpFactory*, const OrtMemoryDevice*,
                                                               const OrtKeyValuePairs*,
                                                               OrtSyncStreamImpl** stream) noexcept {
  *stream = nullptr;
  return nullptr;
}

}  // namespace mgx
