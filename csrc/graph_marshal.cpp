#include "graph_marshal.h"

#include <cstring>
#include <string>
#include <unordered_set>

#include "device_memory.h"
#include "host_staging.h"

namespace py = pybind11;

namespace mgx {
namespace {

// Initializers up to this size are copied: tiny ones (ORT keeps those <= 127 bytes in protobuf form)
// live in an OrtValue owned by the OrtGraph wrapper, which dies when the ORT call returns.
constexpr size_t kCopyBelowBytes = 4096;

const OrtApi& ort() { return *api().ort; }

py::module_ bridge_module() { return py::module_::import("migraphx_ep.ep.bridge"); }

// Whether ReadOpAttr(STRING) writes a '\0' after the string and counts it: some ORT releases do, others
// do not. Asked once of the runtime itself (a one-byte attribute), since a binary value such as an
// EPContext node's program may end in a NUL of its own that must not be cut.
bool string_attr_has_terminator() {
  static const bool has = [] {
    OrtOpAttr* raw = nullptr;
    check(ort().CreateOpAttr("probe", "x", 1, ORT_OP_ATTR_STRING, &raw));
    OpAttrPtr attr(raw);
    size_t size = 0;
    ignore(ort().ReadOpAttr(attr.get(), ORT_OP_ATTR_STRING, nullptr, 0, &size));
    return size == 2;
  }();
  return has;
}

// The length of a STRING attribute read into `b` (without ORT's terminator, where it adds one).
size_t string_length(const std::vector<char>& b) {
  return b.size() - (string_attr_has_terminator() && !b.empty() && b.back() == '\0' ? 1 : 0);
}

// Lossless for any bytes: ONNX string attributes are bytes, Python wants str.
py::str to_str(const char* data, size_t size) {
  PyObject* s = PyUnicode_DecodeUTF8(data, static_cast<Py_ssize_t>(size), "surrogateescape");
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

py::object shape_of(const OrtTensorTypeAndShapeInfo* info) {
  if (api().has_shape != nullptr && !api().has_shape(info)) return py::none();  // rank unknown
  size_t rank = 0;
  check(ort().GetDimensionsCount(info, &rank));
  std::vector<int64_t> dims(rank);
  std::vector<const char*> syms(rank, nullptr);
  check(ort().GetDimensions(info, dims.data(), rank));
  check(ort().GetSymbolicDimensions(info, syms.data(), rank));
  py::list shape;
  for (size_t i = 0; i < rank; ++i) {
    if (dims[i] >= 0) {
      shape.append(dims[i]);
    } else if (syms[i] != nullptr && syms[i][0] != '\0') {
      shape.append(py::str(syms[i]));
    } else {
      shape.append(py::none());
    }
  }
  return std::move(shape);
}

// {"dtype": TensorProto elem type (0 when not a tensor), "shape": [...] | None}
py::dict describe(const OrtValueInfo* vi) {
  py::dict d;
  d["dtype"] = 0;
  d["shape"] = py::none();
  const OrtTypeInfo* type_info = nullptr;
  if (OrtStatus* st = ort().GetValueInfoTypeInfo(vi, &type_info); st != nullptr || type_info == nullptr) {
    ignore(st);  // untyped value: leave it unknown rather than failing the whole graph
    return d;
  }
  ONNXType kind = ONNX_TYPE_UNKNOWN;
  check(ort().GetOnnxTypeFromTypeInfo(type_info, &kind));
  if (kind != ONNX_TYPE_TENSOR) return d;
  const OrtTensorTypeAndShapeInfo* info = nullptr;
  check(ort().CastTypeInfoToTensorInfo(type_info, &info));
  if (info == nullptr) return d;
  ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(ort().GetTensorElementType(info, &elem));
  d["dtype"] = static_cast<int>(elem);  // ONNXTensorElementDataType numbering == TensorProto.DataType
  d["shape"] = shape_of(info);
  return d;
}

std::string name_of(const OrtValueInfo* vi) {
  if (vi == nullptr) return std::string();  // missing optional input
  const char* name = nullptr;
  check(ort().GetValueInfoName(vi, &name));
  return name != nullptr ? std::string(name) : std::string();
}

// Walks one OrtGraph, filling the dict; `seen` avoids describing/capturing a value twice.
class Marshaller {
 public:
  explicit Marshaller(py::module_ bridge) : bridge_(std::move(bridge)) {}

  MarshalledGraph run(const OrtGraph* graph, const OrtNode* fused_node) {
    graph_ = graph;
    // Compile with device I/O: ORT no longer passes constant initializers to the fused node (ep.cpp drops
    // them), so nothing keeps their buffers alive for us: own a copy of what compile() keeps.
    own_initializers_ = fused_node != nullptr && device_io();
    MarshalledGraph out;
    py::dict& g = out.dict;
    const char* gname = nullptr;
    check(ort().Graph_GetName(graph, &gname));
    g["name"] = py::str(gname != nullptr ? gname : "");
    g["values"] = values_;
    g["initializers"] = inits_;
    g["overridable_initializers"] = overridable_;
    g["opsets"] = opsets();
    // A control-flow body (If/Loop/Scan) offered on its own: Python then treats the outer-scope values
    // it reads as inputs, and holds back its refusal summary until the enclosing graph is offered.
    const OrtNode* parent = nullptr;
    check(ort().Graph_GetParentNode(graph, &parent));
    g["is_subgraph"] = parent != nullptr;
    // EPContext nodes name their .mxr relative to the model's directory ("" when loaded from bytes).
    const ORTCHAR_T* model_path = nullptr;
    ignore(ort().Graph_GetModelPath(graph, &model_path));
    g["model_path"] = py::str(model_path != nullptr ? model_path : "");

    size_t n = 0;
    check(ort().Graph_GetNumInitializers(graph, &n));
    std::vector<const OrtValueInfo*> inits(n);
    if (n) check(ort().Graph_GetInitializers(graph, inits.data(), n));
    for (const OrtValueInfo* vi : inits) capture_initializer(vi);

    check(ort().Graph_GetNumNodes(graph, &n));
    out.nodes.resize(n);
    if (n) check(ort().Graph_GetNodes(graph, out.nodes.data(), n));
    py::list nodes;
    for (size_t i = 0; i < n; ++i) nodes.append(node_dict(out.nodes[i], i));
    g["nodes"] = nodes;

    if (fused_node != nullptr) {
      g["inputs"] = names_and_values(node_values(fused_node, false));
      g["outputs"] = names_and_values(node_values(fused_node, true));
    } else {
      g["inputs"] = names_and_values(graph_values(false));
      g["outputs"] = names_and_values(graph_values(true));
    }
    return out;
  }

 private:
  bool own_initializers_ = false;
  py::dict opsets() {
    size_t n = 0;
    check(ort().Graph_GetNumOperatorSets(graph_, &n));
    std::vector<const char*> domains(n);
    std::vector<int64_t> versions(n);
    if (n) check(ort().Graph_GetOperatorSets(graph_, domains.data(), versions.data(), n));
    py::dict d;
    for (size_t i = 0; i < n; ++i) d[py::str(domains[i] ? domains[i] : "")] = versions[i];
    return d;
  }

  std::vector<const OrtValueInfo*> graph_values(bool outputs) {
    size_t n = 0;
    check(outputs ? ort().Graph_GetNumOutputs(graph_, &n) : ort().Graph_GetNumInputs(graph_, &n));
    std::vector<const OrtValueInfo*> v(n);
    if (n) check(outputs ? ort().Graph_GetOutputs(graph_, v.data(), n) : ort().Graph_GetInputs(graph_, v.data(), n));
    return v;
  }

  // Records every value (for "values") and returns the list of names, "" for missing optionals.
  py::list names_and_values(const std::vector<const OrtValueInfo*>& vis) {
    py::list names;
    for (const OrtValueInfo* vi : vis) names.append(py::str(see(vi)));
    return names;
  }

  std::string see(const OrtValueInfo* vi) {
    std::string name = name_of(vi);
    if (vi != nullptr && !name.empty() && seen_.insert(name).second) {
      values_[py::str(name)] = describe(vi);
      capture_initializer(vi);  // also catches initializers of an outer scope (If/Loop bodies)
    }
    return name;
  }

  void capture_initializer(const OrtValueInfo* vi) {
    std::string name = name_of(vi);
    if (!captured_.insert(name).second) return;
    if (seen_.insert(name).second) values_[py::str(name)] = describe(vi);
    bool external = false;
    py::object array = external_array(vi, external);
    if (array.is_none()) {
      const OrtValue* value = nullptr;
      check(ort().ValueInfo_GetInitializerValue(vi, &value));
      if (value == nullptr) return;  // not an initializer
      size_t nbytes = 0;
      check(ort().GetTensorSizeInBytes(value, &nbytes));
      // Larger in-memory initializers share their buffer with the session (which keeps them as fused
      // node inputs for its whole life unless drop_constant_initializers is set): view, don't copy.
      const bool copy = external || nbytes <= kCopyBelowBytes || own_initializers_;
      array = copy && nbytes >= kHostCopyMin ? copied_array(value, nbytes) : tensor_to_array(bridge_, value, copy);
    }
    bool constant = false;
    check(ort().ValueInfo_IsConstantInitializer(vi, &constant));
    (constant ? inits_ : overridable_)[py::str(name)] = array;
  }

  // A large initializer's own copy (a Compile with device I/O owns every one: BERT-base's 209 MB): an empty
  // array of its type and shape filled by host_copy on the staging pool's threads, the GIL released. On
  // one thread the copy into fresh pages took ~0.1 s of such a session. What numpy cannot hold (a string
  // tensor, a type it lacks) goes tensor_to_array's way.
  py::object copied_array(const OrtValue* value, size_t nbytes) {
    OrtTensorTypeAndShapeInfo* raw = nullptr;
    check(ort().GetTensorTypeAndShape(value, &raw));
    TensorInfoPtr info(raw);
    ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    check(ort().GetTensorElementType(info.get(), &elem));
    py::object arr = bridge_.attr("empty_array")(static_cast<int>(elem), shape_of(info.get()));
    if (!py::isinstance<py::buffer>(arr)) return tensor_to_array(bridge_, value, true);
    const py::buffer_info dst = py::reinterpret_borrow<py::buffer>(arr).request(/*writable=*/true);
    if (static_cast<size_t>(dst.size * dst.itemsize) != nbytes) return tensor_to_array(bridge_, value, true);
    const void* src = nullptr;
    check(ort().GetTensorData(value, &src));
    py::gil_scoped_release nogil;
    host_copy(dst.ptr, src, nbytes);
    return arr;
  }

  // Weights in an external file: ORT's mmap dies with the OrtGraph, so Python maps the file itself
  // (np.memmap: zero-copy and alive as long as the array). None -> caller falls back to ORT's value.
  py::object external_array(const OrtValueInfo* vi, bool& external) {
    OrtExternalInitializerInfo* raw = nullptr;
    check(ort().ValueInfo_GetExternalInitializerInfo(vi, &raw));
    external = raw != nullptr;
    if (raw == nullptr) return py::none();
    ExternalInfoPtr info(raw);
    const ORTCHAR_T* model_path = nullptr;
    ignore(ort().Graph_GetModelPath(graph_, &model_path));
    py::dict meta = describe(vi);
    return bridge_.attr("map_external")(
        py::str(model_path != nullptr ? model_path : ""), py::str(ort().ExternalInitializerInfo_GetFilePath(raw)),
        ort().ExternalInitializerInfo_GetFileOffset(raw), ort().ExternalInitializerInfo_GetByteSize(raw),
        meta["dtype"], meta["shape"]);
  }

  std::vector<const OrtValueInfo*> node_values(const OrtNode* node, bool outputs) {
    size_t n = 0;
    check(outputs ? ort().Node_GetNumOutputs(node, &n) : ort().Node_GetNumInputs(node, &n));
    std::vector<const OrtValueInfo*> v(n);
    if (n) check(outputs ? ort().Node_GetOutputs(node, v.data(), n) : ort().Node_GetInputs(node, v.data(), n));
    return v;
  }

  std::vector<const OrtValueInfo*> implicit_values(const OrtNode* node) {
    size_t n = 0;
    check(ort().Node_GetNumImplicitInputs(node, &n));
    std::vector<const OrtValueInfo*> v(n);
    if (n) check(ort().Node_GetImplicitInputs(node, v.data(), n));
    return v;
  }

  py::dict node_dict(const OrtNode* node, size_t index) {
    const char *name = nullptr, *op = nullptr, *domain = nullptr;
    int since = 0;
    check(ort().Node_GetName(node, &name));
    check(ort().Node_GetOperatorType(node, &op));
    check(ort().Node_GetDomain(node, &domain));
    check(ort().Node_GetSinceVersion(node, &since));
    py::dict d;
    d["index"] = index;
    d["name"] = py::str(name ? name : "");
    d["op_type"] = py::str(op ? op : "");
    d["domain"] = py::str(domain ? domain : "");
    d["since_version"] = since;
    d["inputs"] = names_and_values(node_values(node, false));
    d["outputs"] = names_and_values(node_values(node, true));
    d["implicit_inputs"] = names_and_values(implicit_values(node));
    py::dict attrs = attributes(node);
    py::dict subgraphs;
    size_t n = 0;
    check(ort().Node_GetNumSubgraphs(node, &n));
    if (n) {
      std::vector<const OrtGraph*> graphs(n);
      std::vector<const char*> names(n, nullptr);
      check(ort().Node_GetSubgraphs(node, graphs.data(), n, names.data()));
      for (size_t i = 0; i < n; ++i) {
        py::str attr(names[i] ? names[i] : ("subgraph" + std::to_string(i)).c_str());
        subgraphs[attr] = Marshaller(bridge_).run(graphs[i], nullptr).dict;
        attrs[attr] = "<graph>";
      }
    }
    d["attributes"] = attrs;
    d["subgraphs"] = subgraphs;
    return d;
  }

  py::dict attributes(const OrtNode* node) {
    size_t n = 0;
    check(ort().Node_GetNumAttributes(node, &n));
    std::vector<const OrtOpAttr*> attrs(n);
    if (n) check(ort().Node_GetAttributes(node, attrs.data(), n));
    py::dict d;
    for (const OrtOpAttr* a : attrs) {
      const char* name = nullptr;
      check(ort().OpAttr_GetName(a, &name));
      try {
        // An EPContext node's embedded program is binary: bytes, not a (surrogate-escaped) str.
        const bool binary = name != nullptr && std::strcmp(name, "ep_cache_context") == 0;
        d[py::str(name ? name : "")] = binary ? string_bytes(a) : attribute(a);
      } catch (const OrtError& e) {  // unreadable: let Python refuse the node with a reason
        d[py::str(name ? name : "")] = bridge_.attr("unsupported_attr")(std::string("unreadable: ") + e.what());
      }
    }
    return d;
  }

  // Two-call pattern: the first ReadOpAttr reports the byte size (and an error we drop).
  std::vector<char> read_bytes(const OrtOpAttr* a, OrtOpAttrType type) {
    size_t size = 0;
    ignore(ort().ReadOpAttr(a, type, nullptr, 0, &size));
    std::vector<char> buf(size);
    if (size) check(ort().ReadOpAttr(a, type, buf.data(), size, &size));
    buf.resize(size);
    return buf;
  }

  py::object string_bytes(const OrtOpAttr* a) {
    OrtOpAttrType type = ORT_OP_ATTR_UNDEFINED;
    check(ort().OpAttr_GetType(a, &type));
    if (type != ORT_OP_ATTR_STRING) return attribute(a);
    std::vector<char> b = read_bytes(a, type);
    return py::bytes(b.data(), string_length(b));
  }

  template <class T>
  py::list read_array(const OrtOpAttr* a, OrtOpAttrType type) {
    std::vector<char> bytes = read_bytes(a, type);
    py::list out;
    for (size_t off = 0; off + sizeof(T) <= bytes.size(); off += sizeof(T)) {
      T v;
      std::memcpy(&v, bytes.data() + off, sizeof(T));
      out.append(v);
    }
    return out;
  }

  py::object attribute(const OrtOpAttr* a) {
    OrtOpAttrType type = ORT_OP_ATTR_UNDEFINED;
    check(ort().OpAttr_GetType(a, &type));
    size_t size = 0;
    switch (type) {
      case ORT_OP_ATTR_INT: {
        int64_t v = 0;
        check(ort().ReadOpAttr(a, type, &v, sizeof(v), &size));
        return py::int_(v);
      }
      case ORT_OP_ATTR_FLOAT: {
        float v = 0;
        check(ort().ReadOpAttr(a, type, &v, sizeof(v), &size));
        return py::float_(v);
      }
      case ORT_OP_ATTR_INTS:
        return read_array<int64_t>(a, type);
      case ORT_OP_ATTR_FLOATS:
        return read_array<float>(a, type);
      case ORT_OP_ATTR_STRING: {
        std::vector<char> b = read_bytes(a, type);
        return to_str(b.data(), string_length(b));
      }
      case ORT_OP_ATTR_STRINGS: {  // each string followed by '\0'
        std::vector<char> b = read_bytes(a, type);
        py::list out;
        size_t start = 0;
        for (size_t i = 0; i < b.size(); ++i) {
          if (b[i] == '\0') {
            out.append(to_str(b.data() + start, i - start));
            start = i + 1;
          }
        }
        return std::move(out);
      }
      case ORT_OP_ATTR_TENSOR: {
        OrtValue* raw = nullptr;
        check(ort().OpAttr_GetTensorAttributeAsOrtValue(a, &raw));
        ValuePtr value(raw);
        if (!value) return bridge_.attr("unsupported_attr")("empty tensor attribute");
        return tensor_to_array(bridge_, value.get(), /*copy=*/true);  // the OrtValue is ours, and freed here
      }
      case ORT_OP_ATTR_GRAPH:
        return py::str("<graph>");  // the body itself goes under node["subgraphs"]
      default:
        return bridge_.attr("unsupported_attr")("attribute type " + std::to_string(static_cast<int>(type)));
    }
  }

  py::module_ bridge_;
  const OrtGraph* graph_ = nullptr;
  py::dict values_, inits_, overridable_;
  std::unordered_set<std::string> seen_, captured_;
};

}  // namespace

py::object tensor_to_array(const py::module_& bridge, const OrtValue* value, bool copy) {
  ONNXType kind = ONNX_TYPE_UNKNOWN;
  check(ort().GetValueType(value, &kind));
  if (kind != ONNX_TYPE_TENSOR) return bridge.attr("unsupported_attr")("non-tensor value");
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  check(ort().GetTensorTypeAndShape(value, &raw));
  TensorInfoPtr info(raw);
  ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(ort().GetTensorElementType(info.get(), &elem));
  py::object shape = shape_of(info.get());
  if (elem == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
    // std::string storage cannot be viewed as numpy memory; never crash, let Python refuse it.
    return bridge.attr("make_array")(py::none(), static_cast<int>(elem), shape);
  }
  size_t nbytes = 0;
  check(ort().GetTensorSizeInBytes(value, &nbytes));
  const void* data = nullptr;
  if (nbytes) check(ort().GetTensorData(value, &data));
  static const char kEmpty = 0;  // memoryview wants a non-null pointer even for 0 bytes
  const char* ptr = data != nullptr ? static_cast<const char*>(data) : &kEmpty;
  py::object buffer = copy ? py::object(py::bytes(ptr, nbytes))
                           : py::object(py::memoryview::from_memory(ptr, static_cast<py::ssize_t>(nbytes)));
  return bridge.attr("make_array")(buffer, static_cast<int>(elem), shape);
}

MarshalledGraph marshal_graph(const OrtGraph* graph, const OrtNode* fused_node) {
  return Marshaller(bridge_module()).run(graph, fused_node);
}

std::vector<std::string> value_names(const OrtNode* node, bool outputs) {
  size_t n = 0;
  check(outputs ? ort().Node_GetNumOutputs(node, &n) : ort().Node_GetNumInputs(node, &n));
  std::vector<const OrtValueInfo*> v(n);
  if (n) check(outputs ? ort().Node_GetOutputs(node, v.data(), n) : ort().Node_GetInputs(node, v.data(), n));
  std::vector<std::string> names;
  for (const OrtValueInfo* vi : v) names.push_back(name_of(vi));
  return names;
}

}  // namespace mgx
