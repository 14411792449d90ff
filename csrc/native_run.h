// The native Run path: a compiled gpu program runs without entering Python.
//
// Python compiles (ep/compiled.py, targets/gpu/executable.py); after the Run of a shape that captured
// its CUDA graph (the second, MIGRAPHX_EP_CAPTURE_RUN) it hands the shell a *plan* for that shape
// (bridge.native_plan): the device context and stream, the captured CUDA graph, where each input goes
// in the arena, where each output is read from, the kernels' error slots and the executable's run lock.
// Every later Compute with the same input dims is then: input tensors -> arena (one async copy each),
// one graph launch, arena -> ORT's output tensors, one stream synchronisation, a look at the error
// slots. No GIL, no Python objects, no staging copies.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_driver.h"
#include "io_graph.h"
#include "ort_api.h"

namespace mgx {

// The lock a gpu executable's Runs share (they share its arena and stream): taken by the Python path
// (`with lock:`, the GIL released while waiting) and by the native path (no GIL) alike, so both kinds of
// Run can be in flight on one session. Exposed to Python as migraphx_ep._C.RunLock.
struct RunLock {
  std::mutex mutex;
};

// Whether plans of a program may still be used: Python revokes it when the program is replaced for the
// same dims (the timed program after a quick one, ep/compiled.py); the next Compute with those dims then
// misses and asks Python again. Exposed to Python as migraphx_ep._C.PlanToken.
struct PlanToken {
  std::atomic<bool> valid{true};
};

// An input with a run-time last axis (targets/gpu/runtime_dims.py): the program was compiled for a slot
// `capacity` elements wide there; each Run zeroes the slot, copies the input's rows into it at that pitch
// and writes the input's dims into the program's `<input>@dims` slot.
struct NativePad {
  size_t capacity = 0;  // 0: the input is copied as it is
  size_t elem = 0;      // bytes per element
};

struct NativeOutput {
  std::string constant;  // the bytes of an output computed at compile time (when `is_constant`)
  bool is_constant = false;
  size_t nbytes = 0;
  std::vector<int64_t> dims;
};


// One execution context of the program (targets/gpu/context.py): its own arena addresses, stream, graph,
// error slots and lock, so Runs on different contexts overlap on the device.
struct NativeContext {
  CuHandle stream = nullptr;
  CuHandle graph = nullptr;           // null: nothing to launch (every output is a constant)
  CuHandle graph_template = nullptr;  // the captured CUgraph the IO graph embeds (null: no IO graph)
  // Built at the context's first Runs whose inputs and outputs are all device memory, most recently
  // launched first; `io_off` once building or re-pointing failed (the copies then go one by one). Both
  // guarded by `lock`.
  mutable std::vector<std::unique_ptr<IoGraph>> io;
  mutable bool io_off = false;
  std::vector<CuDevicePtr> inputs;   // per fused-node input: its arena address (0: the program ignores it)
  std::vector<CuDevicePtr> dims;     // per fused-node input: where its padded dims go (0: none)
  std::vector<CuDevicePtr> outputs;  // per output: its arena address (0: a constant)
  int32_t* error_slots = nullptr;    // mapped host memory the kernels write (errors.py)
  size_t n_error_slots = 0;
  std::shared_ptr<RunLock> lock;
};

struct NativePlan {
  CuHandle context = nullptr;
  int device = 0;  // CUDA ordinal: device-resident inputs and outputs must be on it
  std::vector<size_t> input_bytes;  // per input: its slot's bytes
  std::vector<NativePad> pads;      // per input
  std::vector<NativeOutput> outputs;
  // A padded plan serves every dims key like `pattern` but at positions `free`, which may be up to it.
  bool padded = false;
  std::vector<int64_t> pattern;
  std::vector<char> free;
  mutable std::atomic<uint64_t> last_used{0};   // NativePlans' clock at its latest find (LRU)
  mutable std::atomic<size_t> max_contexts{1};  // lowered to the current count when growing fails
  mutable std::atomic<bool> growing{false};       // one new context at a time
  // The contexts made so far; a Run that finds them all busy asks `grow` (under the GIL) for another.
  mutable std::mutex contexts_mutex;
  mutable std::vector<std::shared_ptr<NativeContext>> contexts;
  mutable size_t next = 0;  // round robin once the pool is full
  pybind11::object grow;    // GpuExecutable.add_context bound to the input names
  pybind11::object owner;   // the executable: keeps arenas, graphs and slots alive; released under the GIL
  std::shared_ptr<PlanToken> token;  // null: valid for good

  bool revoked() const noexcept { return token && !token->valid.load(std::memory_order_acquire); }
};

// Input dims of one Compute call (rank, dims... per input; -1 for a missing optional input).
using DimsKey = std::vector<int64_t>;

struct DimsKeyHash {
  size_t operator()(const DimsKey& k) const noexcept;
};

// The plans of one fused node, by input dims (a padded plan: by a pattern of them). At most `capacity`
// are kept (the EP's max_compiled_models); a new one then replaces the least recently used, which is
// retired -- its executable freed under the GIL once no Run holds it -- so a server that sees more
// shapes than that keeps its hot ones native.
class NativePlans {
 public:
  std::shared_ptr<const NativePlan> find(const DimsKey& key) const;
  // Whether Python already said these dims cannot run natively (so Compute does not ask again).
  bool refused(const DimsKey& key) const;
  // Under the GIL: parse bridge.native_plan's answer (None: this program cannot run natively; False:
  // not yet, ask after the next Run) and keep it.
  void add(const DimsKey& key, pybind11::handle plan);
  // Under the GIL, at release: drop the Python references.
  void clear() noexcept;
  // Interpreter shutdown: forget the Python references without touching Python.
  void abandon() noexcept;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<DimsKey, std::shared_ptr<NativePlan>, DimsKeyHash> plans_;
  // Evicted plans a Run may still hold (find() handed it a reference): freed by a later add().
  std::vector<std::shared_ptr<NativePlan>> retired_;
  mutable std::atomic<uint64_t> clock_{0};
  // Dims Python refused a plan for (the ref target, value-specialised inputs, no CUDA graph): asking
  // again after every Run would cost a Python call each. Bounded: past the cap it is started afresh.
  std::unordered_set<DimsKey, DimsKeyHash> refused_;
  // Plans of programs with run-time axes, each serving many dims (NativePlan::pattern); looked at on a miss.
  std::vector<std::shared_ptr<NativePlan>> padded_;
};

// Reads the input dims of `ctx` into `key`; false when an input is not a tensor in CPU memory the native
// path can copy from (then Python runs it).
bool read_dims_key(OrtKernelContext* ctx, size_t n_inputs, DimsKey& key);

// Runs `plan`. Returns false, having written nothing ORT can see as a result, when a kernel reported an
// error through its slot: the caller then runs the inputs through Python, which raises the ref's error.
bool run_native(const CudaDriver& cuda, const NativePlan& plan, OrtKernelContext* ctx, const DimsKey& key,
                const std::string& label);

// Whether Compute may take the native path at all (MIGRAPHX_EP_NATIVE_RUN=0 turns it off, for A/B
// measurements and debugging).
bool native_run_enabled() noexcept;

void register_native(pybind11::module_& m);

}  // namespace mgx
