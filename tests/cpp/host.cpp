// A C++ program with no Python in it that runs a model on MIGraphXExecutionProvider through ORT's plugin
// route (RegisterExecutionProviderLibrary, GetEpDevices, SessionOptionsAppendExecutionProvider_V2) and
// compares the result with ORT's CPU EP. The plugin has to start Python itself. Plain C API, so the
// build stays one small compile (tests/test_cpp_host.py builds and runs it).
//
// usage: host PLUGIN_LIBRARY MODEL.onnx [KEY=VALUE ...]   (provider options)
// The model has one float input and one float output. Prints key=value lines (max_abs_diff: ours vs the
// CPU EP's); exit code 0: ran on our EP, every node of it (no CPU fallback); 1: output sizes differ;
// 2: an ORT call failed; 3: RegisterExecutionProviderLibrary failed (message as register_error=...).
#include <onnxruntime_c_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

const OrtApi* g_ort = nullptr;
constexpr const char* kEp = "MIGraphXExecutionProvider";

struct Failure {
  std::string message;
  int code;
};

void check(OrtStatus* status, const char* what, int code = 2) {
  if (status == nullptr) return;
  Failure f{std::string(what) + ": " + g_ort->GetErrorMessage(status), code};
  g_ort->ReleaseStatus(status);
  throw f;
}

#define ORT_HANDLE(T)                                                      \
  struct T##Deleter {                                                      \
    void operator()(Ort##T* p) const noexcept { g_ort->Release##T(p); } \
  };                                                                       \
  using T##Ptr = std::unique_ptr<Ort##T, T##Deleter>;
ORT_HANDLE(Env)
ORT_HANDLE(SessionOptions)
ORT_HANDLE(Session)
ORT_HANDLE(Value)
ORT_HANDLE(MemoryInfo)
ORT_HANDLE(TypeInfo)
ORT_HANDLE(TensorTypeAndShapeInfo)
#undef ORT_HANDLE

std::string io_name(OrtSession* session, bool output) {
  OrtAllocator* allocator = nullptr;
  check(g_ort->GetAllocatorWithDefaultOptions(&allocator), "GetAllocatorWithDefaultOptions");
  char* raw = nullptr;
  check(output ? g_ort->SessionGetOutputName(session, 0, allocator, &raw)
               : g_ort->SessionGetInputName(session, 0, allocator, &raw),
        "SessionGet{Input,Output}Name");
  std::string name = raw;
  allocator->Free(allocator, raw);
  return name;
}

std::vector<int64_t> input_shape(OrtSession* session) {
  OrtTypeInfo* raw = nullptr;
  check(g_ort->SessionGetInputTypeInfo(session, 0, &raw), "SessionGetInputTypeInfo");
  TypeInfoPtr type(raw);
  const OrtTensorTypeAndShapeInfo* info = nullptr;
  check(g_ort->CastTypeInfoToTensorInfo(type.get(), &info), "CastTypeInfoToTensorInfo");
  size_t rank = 0;
  check(g_ort->GetDimensionsCount(info, &rank), "GetDimensionsCount");
  std::vector<int64_t> dims(rank);
  check(g_ort->GetDimensions(info, dims.data(), rank), "GetDimensions");
  for (int64_t& d : dims) d = d > 0 ? d : 2;  // a symbolic dim: any size will do
  return dims;
}

// One session (on our EP device when `device` is set, else ORT's CPU EP), one Run; the output values.
std::vector<float> run(OrtEnv* env, const char* model, const OrtEpDevice* device,
                       const std::vector<const char*>& keys, const std::vector<const char*>& values) {
  OrtSessionOptions* raw_options = nullptr;
  check(g_ort->CreateSessionOptions(&raw_options), "CreateSessionOptions");
  SessionOptionsPtr options(raw_options);
  if (device != nullptr) {
    check(g_ort->SessionOptionsAppendExecutionProvider_V2(options.get(), env, &device, 1, keys.data(),
                                                          values.data(), keys.size()),
          "SessionOptionsAppendExecutionProvider_V2");
    // Session creation fails if any node is left to the CPU EP: everything runs on ours.
    check(g_ort->AddSessionConfigEntry(options.get(), "session.disable_cpu_ep_fallback", "1"),
          "AddSessionConfigEntry");
  }
  OrtSession* raw_session = nullptr;
  check(g_ort->CreateSession(env, model, options.get(), &raw_session), "CreateSession");
  SessionPtr session(raw_session);

  const std::vector<int64_t> dims = input_shape(session.get());
  size_t count = 1;
  for (int64_t d : dims) count *= static_cast<size_t>(d);
  std::vector<float> input(count);
  for (size_t i = 0; i < count; ++i) input[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;

  OrtMemoryInfo* raw_memory = nullptr;
  check(g_ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &raw_memory), "CreateCpuMemoryInfo");
  MemoryInfoPtr memory(raw_memory);
  OrtValue* raw_in = nullptr;
  check(g_ort->CreateTensorWithDataAsOrtValue(memory.get(), input.data(), count * sizeof(float), dims.data(),
                                              dims.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &raw_in),
        "CreateTensorWithDataAsOrtValue");
  ValuePtr in(raw_in);

  const std::string in_name = io_name(session.get(), false), out_name = io_name(session.get(), true);
  const char* in_names[] = {in_name.c_str()};
  const char* out_names[] = {out_name.c_str()};
  const OrtValue* ins[] = {in.get()};
  OrtValue* raw_out = nullptr;
  check(g_ort->Run(session.get(), nullptr, in_names, ins, 1, out_names, 1, &raw_out), "Run");
  ValuePtr out(raw_out);

  OrtTensorTypeAndShapeInfo* raw_info = nullptr;
  check(g_ort->GetTensorTypeAndShape(out.get(), &raw_info), "GetTensorTypeAndShape");
  TensorTypeAndShapeInfoPtr info(raw_info);
  size_t n = 0;
  check(g_ort->GetTensorShapeElementCount(info.get(), &n), "GetTensorShapeElementCount");
  float* data = nullptr;
  check(g_ort->GetTensorMutableData(out.get(), reinterpret_cast<void**>(&data)), "GetTensorMutableData");
  return std::vector<float>(data, data + n);
}

int host(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PLUGIN_LIBRARY MODEL.onnx [KEY=VALUE ...]\n", argv[0]);
    return 2;
  }
  // Everything called here is in ORT 1.23's API, so ask for that: any runtime >= 1.23 serves it,
  // whichever headers this was compiled with.
  constexpr uint32_t kApi = 23;
  const OrtApiBase* base = OrtGetApiBase();
  g_ort = base->GetApi(kApi);
  if (g_ort == nullptr) {
    std::fprintf(stderr, "ONNX Runtime %s cannot serve API %u\n", base->GetVersionString(), kApi);
    return 2;
  }
  std::printf("ort_version=%s\n", base->GetVersionString());

  OrtEnv* raw_env = nullptr;
  check(g_ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "host", &raw_env), "CreateEnv");
  EnvPtr env(raw_env);
  check(g_ort->RegisterExecutionProviderLibrary(env.get(), kEp, argv[1]), "RegisterExecutionProviderLibrary", 3);

  const OrtEpDevice* const* devices = nullptr;
  size_t num_devices = 0;
  check(g_ort->GetEpDevices(env.get(), &devices, &num_devices), "GetEpDevices");
  const OrtEpDevice* ours = nullptr;
  for (size_t i = 0; i < num_devices && ours == nullptr; ++i) {
    if (std::strcmp(g_ort->EpDevice_EpName(devices[i]), kEp) == 0) ours = devices[i];
  }
  if (ours == nullptr) throw Failure{"GetEpDevices lists no MIGraphXExecutionProvider device", 2};
  std::printf("ep_device=%s vendor=%s\n", g_ort->EpDevice_EpName(ours), g_ort->EpDevice_EpVendor(ours));

  std::vector<std::string> pairs(argv + 3, argv + argc);
  std::vector<std::string> key_strings, value_strings;
  for (const std::string& kv : pairs) {
    const size_t eq = kv.find('=');
    key_strings.push_back(kv.substr(0, eq));
    value_strings.push_back(eq == std::string::npos ? "" : kv.substr(eq + 1));
  }
  std::vector<const char*> keys, values;
  for (size_t i = 0; i < key_strings.size(); ++i) {
    keys.push_back(key_strings[i].c_str());
    values.push_back(value_strings[i].c_str());
  }

  const std::vector<float> ep = run(env.get(), argv[2], ours, keys, values);
  std::printf("claimed_by=%s\n", kEp);  // CreateSession succeeded without CPU fallback
  const std::vector<float> cpu = run(env.get(), argv[2], nullptr, {}, {});
  if (ep.size() != cpu.size()) {
    std::printf("size_mismatch=%zu,%zu\n", ep.size(), cpu.size());
    return 1;
  }
  double diff = 0;
  for (size_t i = 0; i < ep.size(); ++i) diff = std::fmax(diff, std::fabs(double(ep[i]) - double(cpu[i])));
  std::printf("elements=%zu\nmax_abs_diff=%g\n", ep.size(), diff);
  check(g_ort->UnregisterExecutionProviderLibrary(env.get(), kEp), "UnregisterExecutionProviderLibrary");
  std::printf("unregistered=1\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return host(argc, argv);
  } catch (const Failure& f) {
    std::printf("%s=%s\n", f.code == 3 ? "register_error" : "error", f.message.c_str());
    return f.code;
  }
}
