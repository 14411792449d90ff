// Where a Run's time goes between ORT and the shell: with MIGRAPHX_EP_TRACE_RUN=1 the data transfer and
// Compute record when they start and end (steady clock, the clock of Python's time.perf_counter_ns), so
// tools/run_overhead.py --trace can split a sess.run into ORT's own work, the copies ORT asks for and the
// program's Run. Off (the default) it costs one predictable branch per mark.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace mgx {

enum class TraceMark : uint32_t {
  kCopyBegin = 0,  // arg: the copy's direction (kH2D, kD2H, kD2D of its first tensor) | count << 4
  kCopyEnd = 1,
  kComputeBegin = 2,
  kComputeEnd = 3,  // arg: 1 when the native path ran it, 0 for the Python path
  kSyncBegin = 4,   // the native Run's stream synchronisation
  kSyncEnd = 5,
};

enum TraceDirection : uint32_t { kH2D = 1, kD2H = 2, kD2D = 3 };

bool trace_enabled() noexcept;
void trace_mark_slow(TraceMark mark, uint32_t arg) noexcept;

inline void trace_mark(TraceMark mark, uint32_t arg = 0) noexcept {
  if (trace_enabled()) trace_mark_slow(mark, arg);
}

void register_trace(pybind11::module_& m);

}  // namespace mgx
