#include "ep.h"

#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "compute.h"
#include "graph_marshal.h"

namespace py = pybind11;

namespace mgx {
namespace {

py::module_ bridge() { return py::module_::import("migraphx_ep.ep.bridge"); }

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
    // Keep ORT passing constant initializers to the fused node: the session then keeps them alive, which
    // is what makes the zero-copy initializer views handed to compile() safe.
    fusion.drop_constant_initializers = false;
    check(api().ep->EpGraphSupportInfo_AddNodesToFuse(support, nodes.data(), nodes.size(), &fusion));
  }
}

}  // namespace

Ep::Ep(py::object py_ep_, const OrtLogger& logger_) : OrtEp{}, py_ep(std::move(py_ep_)), logger(logger_) {
  ort_version_supported = ORT_API_VERSION;
  GetName = GetNameImpl;
  GetCapability = GetCapabilityImpl;
  Compile = CompileImpl;
  ReleaseNodeComputeInfos = ReleaseNodeComputeInfosImpl;
  // Optional in the 1.23 ABI and left null on purpose: GetPreferredDataLayout (NCHW assumed),
  // ShouldConvertDataLayoutForOp, SetDynamicOptions, OnRunStart/OnRunEnd, CreateAllocator and
  // CreateSyncStreamForDevice (ORT falls back to the factory's), GetCompiledModelCompatibilityInfo.
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
                                        size_t count, OrtNodeComputeInfo** infos, OrtNode**) noexcept {
  auto* ep = static_cast<Ep*>(self);
  for (size_t i = 0; i < count; ++i) infos[i] = nullptr;
  // ep_context_nodes stay untouched: EPContext model generation is not supported (yet).
  return guarded("Compile", [&] {
    // All or nothing: if one graph fails, the ones already compiled are released right here (under the
    // GIL) instead of being handed to ORT half-done.
    std::vector<std::unique_ptr<ComputeInfo>> made;
    for (size_t i = 0; i < count; ++i) {
      const char* name = nullptr;
      check(api().ort->Node_GetName(fused_nodes[i], &name));
      std::string fused_name = name != nullptr ? name : "";
      MarshalledGraph g = marshal_graph(graphs[i], fused_nodes[i]);
      py::object compiled = bridge().attr("compile")(ep->py_ep, g.dict, fused_name);
      made.push_back(std::make_unique<ComputeInfo>(std::move(compiled), fused_name,
                                                   value_names(fused_nodes[i], /*outputs=*/true)));
    }
    for (size_t i = 0; i < count; ++i) infos[i] = made[i].release();
  });
}

void ORT_API_CALL Ep::ReleaseNodeComputeInfosImpl(OrtEp*, OrtNodeComputeInfo** infos, size_t count) noexcept {
  release_compute_infos(infos, count);
}

OrtStatus* create_ep(const std::map<std::string, std::string>& options, const OrtLogger& logger,
                     OrtEp** out) noexcept {
  return guarded("CreateEp", [&] {
    py::object py_ep = bridge().attr("create_ep")(options);  // std::map -> dict (pybind11/stl.h)
    *out = new Ep(std::move(py_ep), logger);
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
