// OrtGraph -> the Python graph dict documented in migraphx_ep/ep/bridge.py.
// Weights are not re-serialised: initializers become numpy arrays over ORT's memory (see bridge.py for
// the lifetime rules), dtype mapping happens in Python (bridge.make_array).
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "ort_api.h"

namespace mgx {

struct MarshalledGraph {
  pybind11::dict dict;
  // nodes[i] is the OrtNode of dict["nodes"][i]; GetCapability maps Python's indices back through it.
  std::vector<const OrtNode*> nodes;
};

// `fused_node` (Compile only): take graph inputs/outputs from it, so their order is the order ORT uses
// for the fused node's inputs/outputs at Compute time. Call with the GIL held.
MarshalledGraph marshal_graph(const OrtGraph* graph, const OrtNode* fused_node = nullptr);

// numpy array over a tensor OrtValue via bridge.make_array: a read-only zero-copy view, or an owned
// copy when `copy` (the OrtValue dies before Python is done with it). Non-tensors -> bridge.Unsupported.
pybind11::object tensor_to_array(const pybind11::module_& bridge, const OrtValue* value, bool copy);

// Names of a node's inputs ("" for a missing optional one) or outputs.
std::vector<std::string> value_names(const OrtNode* node, bool outputs);

}  // namespace mgx
