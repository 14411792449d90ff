// The copies in, the program's graph and the copies out as one graph launch (the native Run path's IO
// graph, io_graph.cpp): one launch per Run where there were one call per input and output, when every
// input and output is device memory. A context keeps up to kIoGraphs, one per set of ORT addresses: ORT's
// buffers for numpy feeds and fetches come from our caching allocator, which hands equal-sized blocks
// back in the other order every other Run, so two sets alternate and each keeps its graph; only a set none
// of them has re-points the least recently launched one's copy nodes.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda_driver.h"

namespace mgx {

struct NativePlan;
struct NativeContext;

inline constexpr size_t kIoGraphs = 4;

struct IoGraph {
  CuHandle graph = nullptr;
  CuHandle exec = nullptr;
  std::vector<CuHandle> in_nodes, out_nodes;  // per input / output: its memcpy node (null: none)
  std::vector<CuDevicePtr> in_src, out_dst;   // the ORT addresses the nodes copy from / to
  ~IoGraph();
};

// One Run's device addresses: per input where it is copied from, per output where it is copied to (0: no
// copy -- a missing optional input, an output nobody consumes, a compile-time constant).
struct IoAddresses {
  std::vector<CuDevicePtr> src, dst;
};

// Launches an IO graph of `c` for these addresses on its stream: one already built for them, else a new
// one while the context has fewer than kIoGraphs, else the least recently launched one re-pointed. False
// when there is none to launch (the caller then issues the copies one by one): no captured graph, a driver
// without graph building, an address new to the context that is not device memory (the one-by-one copies
// then report it, by name), or a build or update the driver refused (then never tried again on this
// context: the fallback is always right). The caller holds the context's lock.
bool launch_io_graph(const CudaDriver& cuda, const NativePlan& plan, const NativeContext& c, const IoAddresses& a);

// Whether IO graphs may be used at all (MIGRAPHX_EP_IO_GRAPH=0: the copies always go one by one).
bool io_graphs_enabled() noexcept;

struct IoGraphCounts {
  uint64_t launches = 0, builds = 0, repoints = 0;  // Runs launched as one graph, graphs built, nodes re-pointed
};
IoGraphCounts io_graph_counts() noexcept;

}  // namespace mgx
