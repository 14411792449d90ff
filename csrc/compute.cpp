#include "compute.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <vector>

#include "device_memory.h"
#include "graph_marshal.h"
#include "native_run.h"
#include "run_trace.h"

namespace py = pybind11;

namespace mgx {
namespace {

// Copies bigger than this run with the GIL released, so concurrent Compute calls overlap their copies.
constexpr size_t kReleaseGilBytes = size_t{1} << 16;

py::module_ bridge() { return py::module_::import("migraphx_ep.ep.bridge"); }

std::string output_label(const ComputeInfo& ci, size_t i) {
  std::string label = "output " + std::to_string(i);
  if (i < ci.output_names.size()) label += " ('" + ci.output_names[i] + "')";
  return label + " of " + ci.fused_name;
}

void copy_output(const ComputeInfo& ci, const py::module_& br, OrtKernelContext* ctx, size_t i,
                 py::handle spec_obj) {
  const OrtApi& ort = *api().ort;
  // (elem_type, shape, contiguous uint8 buffer) from bridge.output_buffers
  py::tuple spec = py::reinterpret_borrow<py::tuple>(spec_obj);
  const int elem = spec[0].cast<int>();
  std::vector<int64_t> dims = spec[1].cast<std::vector<int64_t>>();
  py::buffer_info buf = py::reinterpret_borrow<py::buffer>(spec[2]).request();
  const size_t src_bytes = static_cast<size_t>(buf.size) * static_cast<size_t>(buf.itemsize);

  int64_t scalar_dims = 0;  // KernelContext_GetOutput wants a valid pointer even for rank 0
  OrtValue* out = nullptr;
  check(ort.KernelContext_GetOutput(ctx, i, dims.empty() ? &scalar_dims : dims.data(), dims.size(), &out));
  if (out == nullptr) return;  // optional output nobody consumes

  OrtTensorTypeAndShapeInfo* raw = nullptr;
  check(ort.GetTensorTypeAndShape(out, &raw));
  TensorInfoPtr info(raw);
  ONNXTensorElementDataType expected = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(ort.GetTensorElementType(info.get(), &expected));
  if (static_cast<int>(expected) != elem) {
    throw OrtError(ORT_FAIL, output_label(ci, i) + ": backend returned " +
                                 br.attr("elem_type_name")(elem).cast<std::string>() + " but ORT expects " +
                                 br.attr("elem_type_name")(static_cast<int>(expected)).cast<std::string>());
  }
  size_t dst_bytes = 0;
  check(ort.GetTensorSizeInBytes(out, &dst_bytes));
  if (dst_bytes != src_bytes) {
    throw OrtError(ORT_FAIL, output_label(ci, i) + ": " + std::to_string(src_bytes) +
                                 " bytes returned for a tensor of " + std::to_string(dst_bytes) + " bytes");
  }
  if (dst_bytes == 0) return;
  void* dst = nullptr;
  check(ort.GetTensorMutableData(out, &dst));
  const bool device = is_our_gpu(api().ep->Value_GetMemoryDevice(out));  // device I/O: upload
  auto copy = [&] {
    if (device) {
      copy_host_to_device(buf.ptr, out, dst_bytes);
    } else {
      std::memcpy(dst, buf.ptr, dst_bytes);
    }
  };
  if (dst_bytes >= kReleaseGilBytes) {
    py::gil_scoped_release nogil;  // `spec` keeps the source buffer alive
    copy();
  } else {
    copy();
  }
}

// A host copy of a tensor in our GPU memory (device I/O), as the ndarray the Python path takes.
py::object host_copy(const py::module_& br, const OrtValue* v) {
  const OrtApi& ort = *api().ort;
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  check(ort.GetTensorTypeAndShape(v, &raw));
  TensorInfoPtr info(raw);
  ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(ort.GetTensorElementType(info.get(), &elem));
  size_t rank = 0;
  check(ort.GetDimensionsCount(info.get(), &rank));
  std::vector<int64_t> dims(rank);
  if (rank != 0) check(ort.GetDimensions(info.get(), dims.data(), rank));
  size_t nbytes = 0;
  check(ort.GetTensorSizeInBytes(v, &nbytes));
  py::array_t<uint8_t> buf(static_cast<py::ssize_t>(nbytes));
  {
    py::gil_scoped_release nogil;
    copy_device_to_host(v, buf.mutable_data(), nbytes);
  }
  return br.attr("make_array")(buf, static_cast<int>(elem), py::cast(dims));
}

// The Python path: a new shape compiles here, the ref target runs here, and a gpu program's first Run of
// a shape hands the native path its plan (`key`: the input dims; null when the native path is off).
void compute(ComputeInfo& ci, OrtKernelContext* ctx, const DimsKey* key) {
  const OrtApi& ort = *api().ort;
  py::module_ br = bridge();
  size_t n_in = 0, n_out = 0;
  check(ort.KernelContext_GetInputCount(ctx, &n_in));
  check(ort.KernelContext_GetOutputCount(ctx, &n_out));

  // Zero-copy read-only views of ORT's input tensors (ORT keeps them alive until we return); host copies
  // of those in GPU memory (device I/O: a shape's first Run, and the ref target).
  py::list inputs;
  for (size_t i = 0; i < n_in; ++i) {
    const OrtValue* v = nullptr;
    check(ort.KernelContext_GetInput(ctx, i, &v));
    if (v == nullptr) {
      inputs.append(py::none());
    } else if (is_our_gpu(api().ep->Value_GetMemoryDevice(v))) {
      inputs.append(host_copy(br, v));
    } else {
      inputs.append(tensor_to_array(br, v, /*copy=*/false));
    }
  }
  py::object outputs = br.attr("run")(ci.compiled, inputs);
  py::list specs = br.attr("output_buffers")(outputs, n_out);
  for (size_t i = 0; i < n_out; ++i) copy_output(ci, br, ctx, i, specs[i]);
  if (key != nullptr && !ci.plans.refused(*key)) ci.plans.add(*key, br.attr("native_plan")(ci.compiled, inputs));
}

// The native path (native_run.h): true when this Compute is done. Runs without the GIL. `keyed` says
// whether `key` holds this call's input dims (a plan may be made for them).
bool try_native(ComputeInfo& ci, OrtKernelContext* ctx, DimsKey& key, bool& keyed) {
  const CudaDriver* cuda = cuda_driver();
  size_t n_in = 0;
  check(api().ort->KernelContext_GetInputCount(ctx, &n_in));
  keyed = cuda != nullptr && read_dims_key(ctx, n_in, key);
  if (!keyed) return false;
  std::shared_ptr<const NativePlan> plan = ci.plans.find(key);
  return plan != nullptr && run_native(*cuda, *plan, ctx, key, ci.fused_name);
}

}  // namespace

ComputeInfo::ComputeInfo(py::object compiled_, std::string fused_name_, std::vector<std::string> output_names_)
    : OrtNodeComputeInfo{},
      compiled(std::move(compiled_)),
      fused_name(std::move(fused_name_)),
      output_names(std::move(output_names_)),
      native(native_run_enabled()) {
  ort_version_supported = ORT_API_VERSION;
  CreateState = CreateStateImpl;
  Compute = ComputeImpl;
  ReleaseState = ReleaseStateImpl;
}

ComputeInfo::~ComputeInfo() {
  if (!compiled) return;
  plans.clear();  // the GIL is held: plans hold references to executables
  try {
    bridge().attr("release")(compiled);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("migraphx_ep bridge.release");
  } catch (...) {
  }
}

OrtStatus* ORT_API_CALL ComputeInfo::CreateStateImpl(OrtNodeComputeInfo* self, OrtNodeComputeContext*,
                                                     void** state) noexcept {
  // The compiled object is the state: no per-kernel-instance state is needed, and ORT may call
  // Compute concurrently on it (Ep::IsConcurrentRunSupported says it may).
  *state = self;
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeInfo::ComputeImpl(OrtNodeComputeInfo* self, void*, OrtKernelContext* ctx) noexcept {
  auto* ci = static_cast<ComputeInfo*>(self);
  trace_mark(TraceMark::kComputeBegin);
  DimsKey key;
  bool keyed = false;
  if (ci->native) {
    try {
      if (try_native(*ci, ctx, key, keyed)) {
        trace_mark(TraceMark::kComputeEnd, 1);
        return nullptr;
      }
    } catch (...) {
      return status_from_exception("Compute");  // OrtError / C++ only: nothing here raises Python errors
    }
  }
  OrtStatus* status = guarded("Compute", [&] { compute(*ci, ctx, keyed ? &key : nullptr); });
  trace_mark(TraceMark::kComputeEnd, 0);
  return status;
}

void ORT_API_CALL ComputeInfo::ReleaseStateImpl(OrtNodeComputeInfo*, void*) noexcept {
  // Nothing per state; the compiled object is released once, with the ComputeInfo.
}

void release_compute_infos(OrtNodeComputeInfo** infos, size_t count) noexcept {
  if (!python_alive()) {  // interpreter shutdown: free C++ memory, leave Python objects alone
    for (size_t i = 0; i < count; ++i) {
      auto* ci = static_cast<ComputeInfo*>(infos[i]);
      if (ci == nullptr) continue;
      ci->abandon();
      delete ci;
    }
    return;
  }
  guarded_void("ReleaseNodeComputeInfos", [&] {
    for (size_t i = 0; i < count; ++i) {
      delete static_cast<ComputeInfo*>(infos[i]);
      infos[i] = nullptr;
    }
  });
}

}  // namespace mgx
