// Python's view of host staging (host_staging.h): its counters and settings, for tests and measurements,
// and copy_to_device, through which the gpu target uploads a program's weights (targets/gpu/weights.py):
// a model's large weights are pageable numpy arrays, the copies staging is for.
#include <pybind11/pybind11.h>

#include <string>

#include "cuda_driver.h"
#include "host_staging.h"

namespace py = pybind11;

namespace mgx {

void register_staging(py::module_& m) {
  m.def("staged_copy_count", &staged_copy_count,
        "Pageable host<->GPU copies made through pinned staging so far (host_staging.h)");
  m.def("copy_threads", &copy_threads, "Host threads a staged copy uses (MIGRAPHX_EP_COPY_THREADS)");
  m.def("configure_staging", &set_staging, py::arg("on") = true, py::arg("chunk_bytes") = 0,
        py::arg("threads") = 0, py::arg("min_bytes") = 0,
        "Stage large pageable copies (the default) or leave them to the driver, from now on; chunk size, "
        "threads and the smallest staged copy for measurements (0: unchanged)");
  m.def("reset_staging", &reset_staging, "Staging's default settings again (after configure_staging)");
  m.def(
      "copy_to_device",
      [](uint64_t dst, const py::buffer& src, int ordinal, uint64_t stream) {
        const py::buffer_info info = src.request();
        py::ssize_t expect = info.itemsize;  // C order: each stride the bytes of the axes after it
        for (py::ssize_t axis = info.ndim - 1; axis >= 0; --axis) {
          if (info.shape[axis] > 1 && info.strides[axis] != expect)
            throw py::value_error("copy_to_device: src is not a contiguous buffer");
          expect *= info.shape[axis];
        }
        const size_t n = static_cast<size_t>(info.size * info.itemsize);
        std::string why;
        const CudaDriver* cuda = cuda_driver(&why);
        if (cuda == nullptr) throw std::runtime_error("copy_to_device: no CUDA driver (" + why + ")");
        if (n == 0) return false;
        const auto s = reinterpret_cast<CuHandle>(stream);
        py::gil_scoped_release nogil;  // the copy runs for milliseconds; compiles on other threads go on
        if (staged_htod(*cuda, ordinal, static_cast<CuDevicePtr>(dst), info.ptr, n, s)) return true;
        cuda->check(cuda->memcpy_htod_async(static_cast<CuDevicePtr>(dst), info.ptr, n, s), "cuMemcpyHtoDAsync");
        cuda->check(cuda->stream_synchronize(s), "cuStreamSynchronize");
        return false;
      },
      py::arg("dst"), py::arg("src"), py::arg("ordinal"), py::arg("stream"),
      "Copies the contiguous host buffer `src` to device address `dst` on `stream` of device `ordinal` "
      "(whose context is current) and waits for it; True when it went through pinned staging");
  m.def(
      "host_copy",
      [](const py::buffer& dst, const py::buffer& src) {
        const py::buffer_info to = dst.request(/*writable=*/true), from = src.request();
        const size_t n = static_cast<size_t>(from.size * from.itemsize);
        if (static_cast<size_t>(to.size * to.itemsize) != n)
          throw py::value_error("host_copy: dst and src differ in size");
        py::gil_scoped_release nogil;
        host_copy(to.ptr, from.ptr, n);
      },
      py::arg("dst"), py::arg("src"),
      "host_copy (host_staging.h) of contiguous buffer `src` into `dst` of the same size (tests)");
}

}  // namespace mgx
