#include "ep.h"

#include <pybind11/stl.h>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compute.h"
#include "device_memory.h"
#include "factory.h"
#include "graph_marshal.h"

namespace py = pybind11;

namespace mgx {
namespace {

py::module_ bridge() { return py::module_::import("migraphx_ep.ep.bridge"); }

std::string lowered(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

int early_context_ordinal(const std::map<std::string, std::string>& options) noexcept try {
  const char* prewarm = std::getenv("MIGRAPHX_EP_PREWARM");
  if (prewarm != nullptr && std::strcmp(prewarm, "0") == 0) return -1;
  const char* env_target = std::getenv("ORT_MIGRAPHX_TARGET");
  auto opt = options.find("migraphx_target");
  const std::string target = env_target != nullptr ? env_target : (opt != options.end() ? opt->second : "");
  if (lowered(target).find("ref") != std::string::npos) return -1;
  auto dev = options.find("device_id");
  if (dev == options.end()) return 0;
  char* end = nullptr;
  const long v = std::strtol(dev->second.c_str(), &end, 10);
  if (end == dev->second.c_str() || *end != '\0' || v < 0 || v > INT_MAX) return -1;
  return static_cast<int>(v);
} catch (...) {
  return -1;
}

namespace {

// Python's groups of node indices -> EpGraphSupportInfo_AddNodesToFuse, one fused node per group.
void add_groups(const MarshalledGraph& g, py::handle groups, OrtEpGraphSupportInfo* support) {
  std::vector<bool> used(g.nodes.size(), false);
  for (py::handle group : groups) {
    std::vector<const OrtNode*> nodes;
    for (py::handle item : group) {
      const auto index = item.cast<long long>();
      if (index < 0 || static_cast<size_t>(index) >= g.nodes.size()) {
        throw OrtError(ORT_INVALID_ARGUMENT, "get_capability returned node index " + std::to_string(index) +
                                                 " but the graph has " + std::to_string(g.nodes.size()) + " nodes");
      }
      if (used[index]) {
        throw OrtError(ORT_INVALID_ARGUMENT,
                       "get_capability returned node index " + std::to_string(index) + " in two groups");
      }
      used[index] = true;
      nodes.push_back(g.nodes[index]);
    }
    if (nodes.empty()) continue;
    OrtNodeFusionOptions fusion{};
    fusion.ort_version_supported = ORT_API_VERSION;
    // Without device I/O, keep ORT passing constant initializers to the fused node: the session then
    // keeps them alive, which is what makes the zero-copy initializer views handed to compile() safe.
    // With device I/O ORT would copy every one of them to the GPU for us (twice the weights' memory):
    // drop them, and the marshal copies what compile() keeps (graph_marshal.cpp).
    fusion.drop_constant_initializers = device_io();
    check(api().ep->EpGraphSupportInfo_AddNodesToFuse(support, nodes.data(), nodes.size(), &fusion));
  }
}

// One attribute of an EPContext node: Python int -> INT, str -> STRING (UTF-8), bytes -> STRING (binary:
// ORT copies `len` bytes, so an embedded program may hold NULs).
OpAttrPtr make_attr(const std::string& name, py::handle value) {
  OrtOpAttr* raw = nullptr;
  if (py::isinstance<py::bool_>(value) || py::isinstance<py::int_>(value)) {
    const int64_t v = value.cast<int64_t>();
    check(api().ort->CreateOpAttr(name.c_str(), &v, 1, ORT_OP_ATTR_INT, &raw));
    return OpAttrPtr(raw);
  }
  std::string bytes;
  if (py::isinstance<py::bytes>(value)) {
    bytes = value.cast<std::string>();
  } else if (py::isinstance<py::str>(value)) {
    bytes = value.cast<std::string>();  // UTF-8
  } else {
    throw OrtError(ORT_INVALID_ARGUMENT, "EPContext attribute " + name + ": expected int, str or bytes, got " +
                                             py::str(py::type::of(value)).cast<std::string>());
  }
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {  // CreateOpAttr takes an int length
    throw OrtError(ORT_INVALID_ARGUMENT, "EPContext attribute " + name + " holds " + std::to_string(bytes.size()) +
                                             " bytes, more than ORT can store in one attribute (2 GiB): use "
                                             "ep.context_embed_mode=0 (the program in a .mxr file)");
  }
  check(api().ort->CreateOpAttr(name.c_str(), bytes.data(), static_cast<int>(bytes.size()), ORT_OP_ATTR_STRING,
                                &raw));
  return OpAttrPtr(raw);
}

std::vector<std::string> strings(py::handle list) { return list.cast<std::vector<std::string>>(); }

// bridge.ep_context's {"name", "inputs", "outputs", "attributes"} -> a com.microsoft EPContext OrtNode.
NodePtr make_context_node(py::handle spec) {
  if (api().editor == nullptr) {
    throw OrtError(ORT_NOT_IMPLEMENTED, "this ONNX Runtime build has no model editor API (minimal build): "
                                        "it cannot create EPContext nodes");
  }
  py::dict d = py::reinterpret_borrow<py::dict>(spec);
  const std::string name = d["name"].cast<std::string>();
  const std::vector<std::string> inputs = strings(d["inputs"]), outputs = strings(d["outputs"]);
  std::vector<OpAttrPtr> owned;
  std::vector<OrtOpAttr*> attrs;
  for (auto item : py::reinterpret_borrow<py::dict>(d["attributes"])) {
    owned.push_back(make_attr(item.first.cast<std::string>(), item.second));
    attrs.push_back(owned.back().get());
  }
  std::vector<const char*> in, out;
  for (const auto& n : inputs) in.push_back(n.c_str());
  for (const auto& n : outputs) out.push_back(n.c_str());
  OrtNode* node = nullptr;
  check(api().editor->CreateNode("EPContext", "com.microsoft", name.c_str(), in.data(), in.size(), out.data(),
                                 out.size(), attrs.data(), attrs.size(), &node));
  // The header says the attributes are copied, but ORT (1.23-1.32) releases each one it took and nulls
  // its slot: release only those it left, or they would be freed twice.
  for (size_t i = 0; i < attrs.size(); ++i) {
    if (attrs[i] == nullptr) owned[i].release();
  }
  return NodePtr(node);
}

}  // namespace

Ep::Ep(py::object py_ep_, const OrtLogger& logger_, bool write_context_, AllocatorSettings allocator_)
    : OrtEp{}, py_ep(std::move(py_ep_)), logger(logger_), write_context(write_context_), allocator(allocator_) {
  ort_version_supported = ORT_API_VERSION;
  GetName = GetNameImpl;
  GetCapability = GetCapabilityImpl;
  Compile = CompileImpl;
  ReleaseNodeComputeInfos = ReleaseNodeComputeInfosImpl;
  CreateAllocator = CreateAllocatorImpl;  // this session's options; the factory releases it
  // In the 1.23 ABI (kMinApiVersion), so every runtime we load in has it: no version check needed.
  GetCompiledModelCompatibilityInfo = GetCompiledModelCompatibilityInfoImpl;
  // Optional in the 1.23 ABI and left null on purpose: GetPreferredDataLayout (NCHW assumed),
  // ShouldConvertDataLayoutForOp, SetDynamicOptions, OnRunStart/OnRunEnd, CreateSyncStreamForDevice
  // (we are not stream aware).
  // Newer callbacks only where the running ORT has them (api().version), though ORT would ignore a field
  // beyond the ort_version_supported it reads.
#if ORT_API_VERSION >= 24
  if (api().version >= 24) IsConcurrentRunSupported = IsConcurrentRunSupportedImpl;
#endif
#if ORT_API_VERSION >= 25
  if (api().version >= 25) Sync = SyncImpl;
#endif
  // Left null: GetKernelRegistry (we compile), CreateProfiler, the 1.26 graph-capture hooks (our gpu
  // target captures its own CUDA graphs inside Compute), OnSessionInitializationEnd, and
  // GetDefaultMemoryDevice (1.27): ORT then takes the EpDevice's DEFAULT memory info (ours, with a GPU;
  // CPU memory without one), which is what we want.
}

Ep::~Ep() {
  if (!py_ep) return;
  try {
    bridge().attr("release_ep")(py_ep);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("migraphx_ep bridge.release_ep");
  } catch (...) {
  }
}

const char* ORT_API_CALL Ep::GetNameImpl(const OrtEp*) noexcept { return kEpName; }

OrtStatus* ORT_API_CALL Ep::GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                              OrtEpGraphSupportInfo* support) noexcept {
  auto* ep = static_cast<Ep*>(self);
  // Note: ORT only logs a GetCapability error and runs the graph without this EP.
  return guarded("GetCapability", [&] {
    MarshalledGraph g = marshal_graph(graph);
    py::object groups = bridge().attr("get_capability")(ep->py_ep, g.dict);
    add_groups(g, groups, support);
  });
}

OrtStatus* ORT_API_CALL Ep::CompileImpl(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes,
                                        size_t count, OrtNodeComputeInfo** infos,
                                        OrtNode** ep_context_nodes) noexcept {
  auto* ep = static_cast<Ep*>(self);
  for (size_t i = 0; i < count; ++i) infos[i] = nullptr;
  if (!ep->write_context) ep_context_nodes = nullptr;
  if (ep_context_nodes != nullptr) {
    for (size_t i = 0; i < count; ++i) ep_context_nodes[i] = nullptr;
  }
  return guarded("Compile", [&] {
    // All or nothing: if one graph fails, the ones already compiled are released right here (under the
    // GIL) instead of being handed to ORT half-done.
    std::vector<std::unique_ptr<ComputeInfo>> made;
    std::vector<NodePtr> contexts;
    for (size_t i = 0; i < count; ++i) {
      const char* name = nullptr;
      check(api().ort->Node_GetName(fused_nodes[i], &name));
      std::string fused_name = name != nullptr ? name : "";
      MarshalledGraph g = marshal_graph(graphs[i], fused_nodes[i]);
      py::object compiled = bridge().attr("compile")(ep->py_ep, g.dict, fused_name);
      made.push_back(std::make_unique<ComputeInfo>(compiled, fused_name,
                                                   value_names(fused_nodes[i], /*outputs=*/true)));
      if (ep_context_nodes != nullptr) {
        contexts.push_back(make_context_node(bridge().attr("ep_context")(ep->py_ep, compiled, fused_name)));
      }
    }
    for (size_t i = 0; i < count; ++i) infos[i] = made[i].release();
    for (size_t i = 0; i < contexts.size(); ++i) ep_context_nodes[i] = contexts[i].release();  // ORT owns them
  });
}

void ORT_API_CALL Ep::ReleaseNodeComputeInfosImpl(OrtEp*, OrtNodeComputeInfo** infos, size_t count) noexcept {
  release_compute_infos(infos, count);
}

OrtStatus* ORT_API_CALL Ep::CreateAllocatorImpl(OrtEp* self, const OrtMemoryInfo* memory_info,
                                                OrtAllocator** allocator) noexcept {
  return make_allocator(memory_info, static_cast<Ep*>(self)->allocator, allocator);
}

const char* ORT_API_CALL Ep::GetCompiledModelCompatibilityInfoImpl(OrtEp* self, const OrtGraph*) noexcept {
  // ORT calls this for every EP of a session that wrote an EPContext model, once the model's nodes are
  // final, and stores a non-empty answer in its metadata ("ep_compatibility_info.<EP name>"). The graph
  // is not needed: what matters is what this session compiled (bridge.compatibility_info).
  auto* ep = static_cast<Ep*>(self);
  OrtStatus* status = guarded("GetCompiledModelCompatibilityInfo", [&] {
    ep->compatibility = bridge().attr("compatibility_info")(ep->py_ep).cast<std::string>();
  });
  if (status != nullptr) {
    // No status can be returned here. With no string stored the model still loads: each EPContext
    // node's own record is checked at Compile. Say why the string is missing.
    ep->compatibility.clear();
    ignore(api().ort->Logger_LogMessage(&ep->logger, ORT_LOGGING_LEVEL_WARNING, api().ort->GetErrorMessage(status),
                                        ORT_FILE, __LINE__, __FUNCTION__));
    api().ort->ReleaseStatus(status);
  }
  return ep->compatibility.c_str();
}

#if ORT_API_VERSION >= 24
OrtStatus* ORT_API_CALL Ep::IsConcurrentRunSupportedImpl(OrtEp*, bool* is_supported) noexcept {
  // Yes: Compute takes the GIL, and a compiled program is safe to run from several threads at once
  // (ep/compiled.py compiles a new shape under its lock; the gpu executable serialises device work under
  // its own lock and stages outputs per thread, which the shell copies out before returning).
  *is_supported = true;
  return nullptr;
}
#endif

#if ORT_API_VERSION >= 25
OrtStatus* ORT_API_CALL Ep::SyncImpl(OrtEp*) noexcept {
  // Nothing is ever pending: Compute and our copies return only after their device work has finished
  // (we are not stream aware).
  return nullptr;
}
#endif

namespace {

AllocatorSettings allocator_settings(const py::object& obj) {
  AllocatorSettings s;
  if (obj.is_none()) return s;
  py::dict d = py::reinterpret_borrow<py::dict>(obj);
  s.mem_limit = d["mem_limit"].cast<size_t>();
  s.power_of_two = d["power_of_two"].cast<bool>();
  s.external_alloc = reinterpret_cast<void* (*)(size_t)>(d["external_alloc"].cast<uintptr_t>());
  s.external_free = reinterpret_cast<void (*)(void*)>(d["external_free"].cast<uintptr_t>());
  s.external_empty_cache = reinterpret_cast<void (*)()>(d["external_empty_cache"].cast<uintptr_t>());
  return s;
}

}  // namespace

OrtStatus* create_ep(const std::map<std::string, std::string>& options,
                     const std::map<std::string, std::string>& session, const OrtLogger& logger,
                     OrtEp** out) noexcept {
  const int ordinal = early_context_ordinal(options);
  if (ordinal >= 0) GpuDevices::get().retain_in_background(ordinal);
  return guarded("CreateEp", [&] {
    py::object py_ep = bridge().attr("create_ep")(options, session);  // std::map -> dict (pybind11/stl.h)
    auto enable = session.find("ep.context_enable");
    *out = new Ep(std::move(py_ep), logger, enable != session.end() && enable->second == "1",
                  allocator_settings(bridge().attr("allocator_settings")(py_ep)));
  });
}

OrtStatus* validate_compatibility(const char* info, OrtCompiledModelCompatibility* result) noexcept {
  if (result == nullptr) {
    return make_status(ORT_INVALID_ARGUMENT, std::string(kEpName) + " ValidateCompiledModelCompatibilityInfo: "
                                                                    "null model_compatibility");
  }
  *result = OrtCompiledModelCompatibility_EP_UNSUPPORTED;  // until a verdict is reached
  if (info == nullptr) return nullptr;                     // no string: nothing we could have written
  return guarded("ValidateCompiledModelCompatibilityInfo", [&] {
    // Bytes, not str: a string that is not UTF-8 is a verdict (unsupported), not a decoding error.
    const py::bytes raw(info, std::strlen(info));
    const int verdict = bridge().attr("validate_compatibility")(raw).cast<int>();
    if (verdict < OrtCompiledModelCompatibility_EP_NOT_APPLICABLE ||
        verdict > OrtCompiledModelCompatibility_EP_UNSUPPORTED) {
      throw OrtError(ORT_FAIL, "bridge.validate_compatibility returned " + std::to_string(verdict) +
                                   ", not an OrtCompiledModelCompatibility value");
    }
    *result = static_cast<OrtCompiledModelCompatibility>(verdict);
  });
}

void destroy_ep(OrtEp* ep) noexcept {
  auto* e = static_cast<Ep*>(ep);
  if (e == nullptr) return;
  if (!python_alive()) {  // interpreter shutdown: leak the Python object, free the C++ one
    e->py_ep.release();
    delete e;
    return;
  }
  guarded_void("ReleaseEp", [&] { delete e; });
}

}  // namespace mgx
