#include "io_graph.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "native_run.h"

namespace mgx {
namespace {

std::atomic<uint64_t> launches{0}, builds{0}, repoints{0};  // tests read them (io_graph_counts)

CuMemcpy3D device_copy(CuDevicePtr dst, CuDevicePtr src, size_t n) {
  CuMemcpy3D p{};
  p.srcMemoryType = p.dstMemoryType = 2;  // CU_MEMORYTYPE_DEVICE
  p.srcDevice = src;
  p.dstDevice = dst;
  p.srcPitch = p.dstPitch = p.WidthInBytes = n;
  p.srcHeight = p.dstHeight = p.Height = p.Depth = 1;
  return p;
}

// Whether `io` copies from and to exactly these addresses.
bool same_addresses(const IoGraph& io, const IoAddresses& a) {
  for (size_t i = 0; i < a.src.size(); ++i) {
    if (io.in_nodes[i] != nullptr && a.src[i] != io.in_src[i]) return false;
  }
  for (size_t i = 0; i < a.dst.size(); ++i) {
    if (io.out_nodes[i] != nullptr && a.dst[i] != io.out_dst[i]) return false;
  }
  return true;
}

// A new IO graph for these addresses (null when the driver refused to build it).
std::unique_ptr<IoGraph> build(const CudaDriver& cuda, const NativePlan& plan, const NativeContext& c,
                               const IoAddresses& a) {
  auto io = std::make_unique<IoGraph>();
  bool ok = cuda.graph_create(&io->graph, 0) == 0;
  io->in_nodes.assign(a.src.size(), nullptr);
  io->in_src.assign(a.src.size(), 0);
  std::vector<CuHandle> ins;
  for (size_t i = 0; ok && i < a.src.size(); ++i) {
    if (a.src[i] == 0) continue;
    const CuMemcpy3D p = device_copy(c.inputs[i], a.src[i], plan.input_bytes[i]);
    ok = cuda.graph_add_memcpy_node(&io->in_nodes[i], io->graph, nullptr, 0, &p, plan.context) == 0;
    io->in_src[i] = a.src[i];
    ins.push_back(io->in_nodes[i]);
  }
  CuHandle body = nullptr;
  ok = ok && cuda.graph_add_child_graph_node(&body, io->graph, ins.data(), ins.size(), c.graph_template) == 0;
  io->out_nodes.assign(a.dst.size(), nullptr);
  io->out_dst.assign(a.dst.size(), 0);
  for (size_t i = 0; ok && i < a.dst.size(); ++i) {
    if (a.dst[i] == 0) continue;
    const CuMemcpy3D p = device_copy(a.dst[i], c.outputs[i], plan.outputs[i].nbytes);
    ok = cuda.graph_add_memcpy_node(&io->out_nodes[i], io->graph, &body, 1, &p, plan.context) == 0;
    io->out_dst[i] = a.dst[i];
  }
  ok = ok && cuda.graph_instantiate(&io->exec, io->graph, 0) == 0;
  if (!ok) return nullptr;  // ~IoGraph frees what was made
  builds.fetch_add(1, std::memory_order_relaxed);
  return io;
}

// Points `io`'s copy nodes at these addresses; false when the driver refused.
bool repoint(const CudaDriver& cuda, const NativePlan& plan, const NativeContext& c, IoGraph& io,
             const IoAddresses& a) {
  for (size_t i = 0; i < a.src.size(); ++i) {
    if (io.in_nodes[i] == nullptr || a.src[i] == io.in_src[i]) continue;
    const CuMemcpy3D p = device_copy(c.inputs[i], a.src[i], plan.input_bytes[i]);
    if (cuda.graph_exec_memcpy_node_set_params(io.exec, io.in_nodes[i], &p, plan.context) != 0) return false;
    io.in_src[i] = a.src[i];
    repoints.fetch_add(1, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < a.dst.size(); ++i) {
    if (io.out_nodes[i] == nullptr || a.dst[i] == io.out_dst[i]) continue;
    const CuMemcpy3D p = device_copy(a.dst[i], c.outputs[i], plan.outputs[i].nbytes);
    if (cuda.graph_exec_memcpy_node_set_params(io.exec, io.out_nodes[i], &p, plan.context) != 0) return false;
    io.out_dst[i] = a.dst[i];
    repoints.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

// Whether every address no IO graph of `c` has is device memory: a graph node copies from an address it
// does not validate the way a memcpy call does.
bool new_addresses_are_device_memory(const CudaDriver& cuda, const NativeContext& c, const IoAddresses& a) {
  const auto seen = [&](CuDevicePtr p, size_t i, bool input) {
    return std::any_of(c.io.begin(), c.io.end(), [&](const auto& g) {
      return input ? g->in_nodes[i] != nullptr && g->in_src[i] == p : g->out_nodes[i] != nullptr && g->out_dst[i] == p;
    });
  };
  for (size_t i = 0; i < a.src.size(); ++i) {
    if (a.src[i] != 0 && !seen(a.src[i], i, true) && cuda.memory_type(a.src[i]) != 2) return false;
  }
  for (size_t i = 0; i < a.dst.size(); ++i) {
    if (a.dst[i] != 0 && !seen(a.dst[i], i, false) && cuda.memory_type(a.dst[i]) != 2) return false;
  }
  return true;
}

}  // namespace

IoGraph::~IoGraph() {
  const CudaDriver* cuda = cuda_driver();
  if (cuda == nullptr || !cuda->can_build_graphs()) return;
  if (exec != nullptr) cuda->graph_exec_destroy(exec);
  if (graph != nullptr) cuda->graph_destroy(graph);
}

bool io_graphs_enabled() noexcept {
  const char* v = std::getenv("MIGRAPHX_EP_IO_GRAPH");
  return v == nullptr || (std::strcmp(v, "0") != 0 && std::strcmp(v, "") != 0);
}

IoGraphCounts io_graph_counts() noexcept { return IoGraphCounts{launches.load(), builds.load(), repoints.load()}; }

bool launch_io_graph(const CudaDriver& cuda, const NativePlan& plan, const NativeContext& c, const IoAddresses& a) {
  if (c.io_off || c.graph == nullptr || c.graph_template == nullptr || !cuda.can_build_graphs()) return false;
  auto hit = std::find_if(c.io.begin(), c.io.end(), [&](const auto& g) { return same_addresses(*g, a); });
  if (hit == c.io.end()) {
    if (!new_addresses_are_device_memory(cuda, c, a)) return false;
    bool ok = true;
    if (c.io.size() < kIoGraphs) {
      std::unique_ptr<IoGraph> made = build(cuda, plan, c, a);
      ok = made != nullptr;
      if (ok) c.io.push_back(std::move(made));
    } else {
      ok = repoint(cuda, plan, c, *c.io.back(), a);
    }
    if (!ok) {
      c.io_off = true;
      c.io.clear();
      return false;
    }
    hit = c.io.end() - 1;
  }
  std::rotate(c.io.begin(), hit, hit + 1);  // most recently launched first; the last is re-pointed next
  cuda.check(cuda.graph_launch(c.io.front()->exec, c.stream), "cuGraphLaunch");
  launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace mgx
