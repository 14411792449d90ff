#include "run_trace.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace mgx {
namespace {

struct Event {
  std::atomic<uint64_t> ns{0};  // 0: not written yet (a reader skips it)
  uint32_t mark = 0;
  uint32_t arg = 0;
};

// A fixed buffer: a trace is a measurement of a few thousand Runs, and recording past its end just stops
// (the reader is told how many were dropped) rather than allocating inside a Run.
constexpr size_t kEvents = size_t{1} << 18;
std::array<Event, kEvents> events;
std::atomic<size_t> next_event{0};

bool read_switch() noexcept {
  const char* v = std::getenv("MIGRAPHX_EP_TRACE_RUN");
  return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
}

std::atomic<bool> enabled{read_switch()};

}  // namespace

bool trace_enabled() noexcept { return enabled.load(std::memory_order_relaxed); }

void trace_mark_slow(TraceMark mark, uint32_t arg) noexcept {
  const size_t i = next_event.fetch_add(1, std::memory_order_relaxed);
  if (i >= kEvents) return;
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  Event& e = events[i];
  e.mark = static_cast<uint32_t>(mark);
  e.arg = arg;
  e.ns.store(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()),
             std::memory_order_release);
}

void register_trace(py::module_& m) {
  m.def(
      "run_trace",
      [](bool clear) {
        const size_t n = std::min(next_event.load(), kEvents);
        std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> out;
        out.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          const uint64_t ns = events[i].ns.load(std::memory_order_acquire);
          if (ns != 0) out.emplace_back(ns, events[i].mark, events[i].arg);
        }
        const size_t dropped = next_event.load() > kEvents ? next_event.load() - kEvents : 0;
        if (clear) {
          for (size_t i = 0; i < n; ++i) events[i].ns.store(0, std::memory_order_relaxed);
          next_event.store(0);
        }
        return py::make_tuple(out, dropped);
      },
      py::arg("clear") = true,
      "([(steady-clock ns, mark, arg), ...], events dropped) recorded under MIGRAPHX_EP_TRACE_RUN=1 "
      "(marks: run_trace.h)");
  m.def(
      "set_run_trace", [](bool on) { enabled.store(on); }, py::arg("on"),
      "Start or stop recording marks (MIGRAPHX_EP_TRACE_RUN sets the default)");
}

}  // namespace mgx
