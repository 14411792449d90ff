"""The systems the benchmark compares, one function each, and the one timing loop they share.

Every system function takes a :class:`Row` and returns ``(record, outputs)``: JSON-ready fields (times in
ms or s) and the outputs of its last timed run as numpy arrays (for the accuracy comparison in
``run.py``). What each time includes (``timed`` in the record, explained in bench/README.md):

- ``numpy_io``: ``sess.run(None, numpy_feeds)``: host->device copies of the inputs, the run, the
  device->host copies of the outputs into new numpy arrays (ORT systems with numpy feeds).
- ``device_io``: ``sess.run_with_iobinding`` with inputs and outputs already in GPU memory, then
  ``synchronize_outputs()``: no copies (ORT CUDA EP and our EP with IOBinding; ours also records
  ``graph_ms``, the CUDA-graph replay alone, and ``overhead_us`` = the run minus the replay).
- ``device_sync``: ``module(*gpu_tensors)`` then ``torch.cuda.synchronize()``; outputs stay on the GPU.

Any exception propagates to ``run.py``, which records it as an error row and goes on.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import specs

EP = "MIGraphXExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"


class Unavailable(RuntimeError):
    """The system cannot run in this process (a missing package, provider or device)."""


@dataclass
class Settings:
    warmup: int = 10
    runs: int = 50
    cpu_runs: int = 10
    cpu_warmup: int = 2
    device_id: int = 0
    torch_device: str = "cuda"
    cap_s: float = 60.0  # per system: stop timing after this long (a slow system still gets 3 runs)
    ep_options: dict[str, str] = field(default_factory=dict)


@dataclass
class Row:
    model: str  # a name from specs.MODELS, or the stem of an ONNX file given by path
    dtype: str
    batch: int
    path: Path
    feeds: dict[str, np.ndarray]
    spec: specs.Model | None  # None for a file given by path: no torch module exists for it
    settings: Settings
    shared: dict[str, Any]  # lives across rows: the torch module of the current (model, dtype)
    tiny: bool = False  # the file holds export_models.py --tiny weights: build the tiny module too
    cache: dict[str, Any] = field(default_factory=dict)  # lives for this row: the ORT CUDA session


Result = tuple[dict[str, Any], list[np.ndarray]]


def measure(
    fn: Callable[[], Any], warmup: int, runs: int, sync: Callable[[], None] | None = None, cap_s: float = 0
):
    """Median/min/mean/p90 of ``runs`` timed calls after ``warmup`` untimed ones; also the last output.

    With ``cap_s``, warm-up stops after a quarter of it and timing after all of it (but not before 3
    timed runs), so one slow system cannot eat a device call's time limit; ``capped`` says so.
    """
    out = None
    t0 = time.perf_counter()
    done_warmup = 0
    for _ in range(warmup):
        out = fn()
        if sync:
            sync()
        done_warmup += 1
        if cap_s and time.perf_counter() - t0 > cap_s / 4:
            break
    warmup_s = time.perf_counter() - t0
    times: list[float] = []
    t0 = time.perf_counter()
    for _ in range(max(runs, 1)):
        t = time.perf_counter()
        out = fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t)
        if cap_s and len(times) >= 3 and time.perf_counter() - t0 > cap_s:
            break
    ms = sorted(x * 1e3 for x in times)
    stats = {
        "ms": statistics.median(ms),
        "ms_min": ms[0],
        "ms_mean": statistics.fmean(ms),
        "ms_p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
        "runs": len(ms),
        "warmup": done_warmup,
        "warmup_s": warmup_s,
        "capped": len(ms) < max(runs, 1) or done_warmup < warmup,
    }
    return stats, out


def _ort():
    import onnxruntime as ort

    return ort


def _inputs_for(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Only the inputs the graph kept (an exporter drops unused ones; ORT rejects unknown names)."""
    return {i.name: feeds[i.name] for i in sess.get_inputs()}


# ---- ONNX Runtime: CUDA EP and CPU EP --------------------------------------------------------------


def _cuda_session(row: Row) -> tuple[Any, float | None]:
    """One CUDA EP session per row, shared by the numpy and IOBinding systems; session_s once."""
    if "ort_cuda" in row.cache:
        return row.cache["ort_cuda"], None
    ort = _ort()
    if CUDA_EP not in ort.get_available_providers():
        raise Unavailable(f"{CUDA_EP} not in this onnxruntime ({ort.__version__}, {ort.__file__})")
    t0 = time.perf_counter()
    sess = ort.InferenceSession(
        str(row.path), providers=[(CUDA_EP, {"device_id": str(row.settings.device_id)}), CPU_EP]
    )
    session_s = time.perf_counter() - t0
    if sess.get_providers()[0] != CUDA_EP:  # ORT falls back to CPU silently when the EP fails to load
        raise Unavailable(f"{CUDA_EP} failed to load; session providers {sess.get_providers()}")
    row.cache["ort_cuda"] = sess
    return sess, session_s


def ort_cuda_numpy(row: Row) -> Result:
    sess, session_s = _cuda_session(row)
    feeds = _inputs_for(sess, row.feeds)
    t0 = time.perf_counter()
    sess.run(None, feeds)  # the CUDA EP picks cuDNN algorithms on the first run: timed on its own
    first_run_s = time.perf_counter() - t0
    s = row.settings
    stats, outs = measure(lambda: sess.run(None, feeds), s.warmup, s.runs, cap_s=s.cap_s)
    rec = {"timed": "numpy_io", "session_s": session_s, "first_run_s": first_run_s}
    return {**rec, **stats, "providers": sess.get_providers()}, outs


def _iobinding(sess, row: Row) -> tuple[Callable[[], None], Any]:
    """Inputs in GPU memory and outputs bound to GPU buffers ORT allocated once: the timed step is one
    ``run_with_iobinding`` plus ``synchronize_outputs`` (no copies, no allocation per run)."""
    ort = _ort()
    dev = row.settings.device_id
    io = sess.io_binding()
    keep = []  # the OrtValues must outlive the binding
    for name, x in _inputs_for(sess, row.feeds).items():
        keep.append(ort.OrtValue.ortvalue_from_numpy(x, "cuda", dev))
        io.bind_ortvalue_input(name, keep[-1])
    for o in sess.get_outputs():
        io.bind_output(o.name, "cuda", dev)
    sess.run_with_iobinding(io)
    for o, value in zip(sess.get_outputs(), io.get_outputs(), strict=True):
        keep.append(value)
        io.bind_ortvalue_output(o.name, value)

    def step() -> None:
        sess.run_with_iobinding(io)
        io.synchronize_outputs()

    step.keep = keep  # type: ignore[attr-defined]
    return step, io


def ort_cuda_iobinding(row: Row) -> Result:
    sess, session_s = _cuda_session(row)
    step, io = _iobinding(sess, row)
    s = row.settings
    stats, _ = measure(step, s.warmup, s.runs, cap_s=s.cap_s)
    rec = {"timed": "device_io", "session_s": session_s, **stats, "providers": sess.get_providers()}
    return rec, io.copy_outputs_to_cpu()


def ort_cpu(row: Row) -> Result:
    ort = _ort()
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(row.path), providers=[CPU_EP])
    session_s = time.perf_counter() - t0
    feeds = _inputs_for(sess, row.feeds)
    s = row.settings
    warmup, runs = min(s.warmup, s.cpu_warmup), min(s.runs, s.cpu_runs)
    stats, outs = measure(lambda: sess.run(None, feeds), warmup, runs, cap_s=s.cap_s)
    return {"timed": "numpy_io", "session_s": session_s, **stats, "threads": os.cpu_count()}, outs


# ---- our EP ------------------------------------------------------------------------------------------


def placement(sess) -> dict[str, Any]:
    """Node events per provider from ORT's profiler: the proof that nothing fell back to the CPU EP."""
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.unlink(path)
    nodes = [e["args"] for e in events if e.get("cat") == "Node" and "provider" in e.get("args", {})]
    per_provider = collections.Counter(a["provider"] for a in nodes)
    cpu_ops = collections.Counter(a.get("op_name", "?") for a in nodes if a["provider"] != EP)
    return {
        "node_events": dict(per_provider),
        "fallback_ops": dict(cpu_ops),
        # No event on our EP at all means the partitioning refused everything: a fallback too.
        "fallback": bool(cpu_ops) or per_provider.get(EP, 0) == 0,
    }


def _ep_options(row: Row) -> dict[str, str]:
    """fp16 rows run the fp16 model as it is: no ``migraphx_fp16_enable`` unless --ep-option says so."""
    return {"migraphx_target": "gpu", "device_id": str(row.settings.device_id), **row.settings.ep_options}


def _ep_session(row: Row, cache_dir: str, profile_dir: str | None):
    ort = _ort()
    import migraphx_ep  # registers the plugin library and routes the provider name (idempotent)

    options = {**_ep_options(row), "migraphx_model_cache_dir": cache_dir}
    so = ort.SessionOptions()
    if profile_dir:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "migraphx_ep_bench")
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(row.path), so, providers=[(migraphx_ep.get_ep_name(), options), CPU_EP])
    session_s = time.perf_counter() - t0
    if EP not in sess.get_providers():
        raise Unavailable(f"{EP} not in the session's providers {sess.get_providers()}")
    feeds = _inputs_for(sess, row.feeds)
    t0 = time.perf_counter()
    sess.run(None, feeds)  # a dynamic batch dim: the program for this shape is compiled (or loaded) here
    first_run_s = time.perf_counter() - t0
    times = {"session_s": session_s, "first_run_s": first_run_s, "total_s": session_s + first_run_s}
    return sess, feeds, times


def migraphx_ep(row: Row) -> Result:
    """Cold: empty cache dir (profiled for placement); warm: a second session on that cache; timed."""
    with tempfile.TemporaryDirectory(prefix="mgx_cache_") as cache, tempfile.TemporaryDirectory() as prof:
        cold_sess, _, cold = _ep_session(row, cache, prof)
        where = placement(cold_sess)
        cold_sess = None  # released before the warm session loads the cache it wrote
        cache_files = sorted(p.name for p in Path(cache).iterdir())
        sess, feeds, warm = _ep_session(row, cache, None)
        s = row.settings
        stats, outs = measure(lambda: sess.run(None, feeds), s.warmup, s.runs, cap_s=s.cap_s)
        copies = _copies_ms(list(feeds.values()), outs, row)
        rec = {
            "timed": "numpy_io",
            "cold": cold,
            "warm": warm,
            "cache_files": len(cache_files),
            "placement": where,
            "options": _ep_options(row),
            **stats,
            "providers": sess.get_providers(),
        }
        if copies is not None:
            rec["copies_ms"] = copies
        sess = None  # released before its cache directory is removed
    return rec, outs


def _copies_ms(inputs: list[np.ndarray], outputs: list[np.ndarray], row: Row) -> float | None:
    """What numpy I/O cannot avoid: the inputs copied host to device and the outputs back, from and into
    pageable numpy arrays as ORT hands them over, on one stream, synchronised (median of the row's
    runs). A numpy-I/O Run over the graph replay, minus this, is the Run's own overhead."""
    try:
        from migraphx_ep.targets.gpu import cuda

        cuda.Device.get(row.settings.device_id).make_current()
        nbytes = [a.nbytes for a in inputs] + [o.nbytes for o in outputs]
        bufs = [cuda.alloc(max(n, 1)) for n in nbytes]
        stream = cuda.Stream()
    except Exception:  # noqa: BLE001 - no GPU or no bindings: the row just has no copies_ms
        return None
    host_out = [np.empty_like(o) for o in outputs]

    def copy() -> None:
        for a, b in zip(inputs, bufs, strict=False):
            cuda.memcpy_htod(b.ptr, np.ascontiguousarray(a), stream)
        for o, b in zip(host_out, bufs[len(inputs) :], strict=True):
            cuda.memcpy_dtoh(o, b.ptr, stream)
        stream.sync()

    s = row.settings
    stats, _ = measure(copy, s.warmup, s.runs, cap_s=s.cap_s)
    return stats["ms"]


def _one_executable(compiled: list) -> Any | None:
    """The gpu executable of the session's one program; None with several (partitions, shapes)."""
    exes = [p._exe for c in compiled for p in c.programs.values()]
    return exes[0] if len(exes) == 1 else None


def _graph_replay(compiled: list) -> Callable[[], None] | None:
    """One CUDA-graph replay (synchronised) of the session's one program (None with several partitions):
    what a Run costs beyond it is ORT's and the shell's overhead."""
    exe = _one_executable(compiled)
    if getattr(exe, "graph", None) is None:
        return None

    def replay() -> None:
        exe.graph.launch(exe.stream.handle)
        exe.stream.sync()

    return replay


def _launches(compiled: list) -> dict[str, int] | None:
    """What the session's one program launches per Run: its steps by kind (generated kernels, cuBLASLt
    GEMMs, cuDNN convolutions) and its CUDA graph's nodes by type (every kernel, the libraries' own
    included). None with several programs (partitions)."""
    from migraphx_ep.targets.gpu.steps import ConvStep, GemmStep, KernelStep

    exe = _one_executable(compiled)
    if not hasattr(exe, "lowered"):
        return None
    steps = exe.lowered.steps
    out = {
        "steps": len(steps),
        "generated": sum(isinstance(s, KernelStep) for s in steps),
        "gemm": sum(isinstance(s, GemmStep) for s in steps),
        "conv": sum(isinstance(s, ConvStep) for s in steps),
    }
    graph = getattr(exe, "graph", None)
    if graph is not None:
        try:
            out.update({f"graph_{k}": n for k, n in graph.node_counts().items()})
        except Exception as e:  # noqa: BLE001 - the row keeps its step counts
            out["graph_error"] = str(e)[:200]  # type: ignore[assignment]
    return out


def _interleaved_overhead_us(step: Callable[[], Any], replay: Callable[[], None], blocks: int = 12) -> float:
    """The median over blocks of (a block's median Run - the next block's median replay), in µs: Runs and
    replays alternate in short blocks so the GPU's clock changes hit both alike. Measured one after the
    other instead, the difference moved by tens of µs between bench runs (12-72 µs on the H100, where
    interleaved blocks of the same programs gave 9-21 µs: tools/run_overhead.py --iobinding)."""
    diffs = []
    for _ in range(blocks):
        run_ms, _ = measure(step, 3, 15)
        replay_ms, _ = measure(replay, 3, 15)
        diffs.append(run_ms["ms"] - replay_ms["ms"])
    return statistics.median(diffs) * 1e3


def migraphx_ep_iobinding(row: Row) -> Result:
    """Our EP with IOBinding (inputs and outputs in GPU memory, as ORT CUDA EP's IOBinding row), next to
    the graph replay of the same program: their difference is the per-Run overhead."""
    from migraphx_ep.testing import capture_compiled

    with tempfile.TemporaryDirectory(prefix="mgx_cache_") as cache:
        with capture_compiled() as compiled:
            sess, _, times = _ep_session(row, cache, None)
        step, io = _iobinding(sess, row)
        s = row.settings
        stats, _ = measure(step, s.warmup, s.runs, cap_s=s.cap_s)
        replay = _graph_replay(compiled)
        graph_ms = measure(replay, s.warmup, s.runs, cap_s=s.cap_s)[0]["ms"] if replay is not None else None
        rec = {"timed": "device_io", **times, **stats, "graph_ms": graph_ms}
        rec["providers"] = sess.get_providers()
        launches = _launches(compiled)
        if launches is not None:
            rec["launches"] = launches
        if replay is not None:
            rec["overhead_us"] = _interleaved_overhead_us(step, replay)
            rec["overhead_us_separate"] = (stats["ms"] - graph_ms) * 1e3  # type: ignore[operator]
        outs = io.copy_outputs_to_cpu()
        sess = None
    return rec, outs


# ---- torch -----------------------------------------------------------------------------------------


def _torch(row: Row):
    """torch, the row's module (one per model and dtype, reused across batches) and its GPU inputs."""
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"torch is not installed: {e}") from None
    if row.spec is None:
        raise Unavailable("no torch module for an ONNX file given by path")
    dev = row.settings.torch_device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise Unavailable("torch.cuda.is_available() is False")
    key = (row.model, row.dtype, dev, row.tiny)
    if row.shared.get("torch_key") != key:
        import torch_models

        row.shared.pop("torch_module", None)
        row.shared["torch_module"] = torch_models.build(row.model, row.dtype, dev, row.tiny)
        row.shared["torch_key"] = key
    inputs = tuple(torch.from_numpy(row.feeds[i.name]).to(dev) for i in row.spec.inputs)
    sync = torch.cuda.synchronize if dev.startswith("cuda") else None
    return torch, row.shared["torch_module"], inputs, sync


def _numpy(outs) -> list[np.ndarray]:
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [o.detach().cpu().numpy() for o in outs]


def torch_eager(row: Row) -> Result:
    torch, module, inputs, sync = _torch(row)
    with torch.no_grad():
        s = row.settings
        stats, outs = measure(lambda: module(*inputs), s.warmup, s.runs, sync, s.cap_s)
        return {"timed": "device_sync", **stats, "torch": torch.__version__}, _numpy(outs)


def _torch_compile(row: Row, mode: str) -> Result:
    torch, module, inputs, sync = _torch(row)
    torch._dynamo.reset()  # each mode compiles from scratch: its compile_s does not reuse the other's
    compiled = torch.compile(module, mode=None if mode == "default" else mode, dynamic=False)
    graphs = mode == "reduce-overhead"

    def step():
        if graphs:  # CUDA graphs: tell the graph tree each call is a new step (outputs are reused)
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(*inputs)

    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            step()
            if sync:
                sync()
            compile_s = time.perf_counter() - t0
            s = row.settings
            stats, outs = measure(step, s.warmup, s.runs, sync, s.cap_s)
            outs = _numpy(outs)  # before any further call overwrites the graph's output buffers
    finally:
        compiled = None  # drops the compiled graphs (and CUDA graph memory) with the reset below
        torch._dynamo.reset()
    return {"timed": "device_sync", "compile_s": compile_s, **stats, "torch": torch.__version__}, outs


def torch_compile_default(row: Row) -> Result:
    return _torch_compile(row, "default")


def torch_compile_reduce_overhead(row: Row) -> Result:
    return _torch_compile(row, "reduce-overhead")


# In run order: peers first, so a crash inside our EP (a bad kernel can poison the CUDA context of the
# whole process) still leaves the peers' rows for this model in the JSONL.
SYSTEMS: dict[str, Callable[[Row], Result]] = {
    "ort_cuda_numpy": ort_cuda_numpy,
    "ort_cuda_iobinding": ort_cuda_iobinding,
    "torch_eager": torch_eager,
    "torch_compile_default": torch_compile_default,
    "torch_compile_reduce-overhead": torch_compile_reduce_overhead,
    "ort_cpu": ort_cpu,
    "migraphx_ep": migraphx_ep,
    "migraphx_ep_iobinding": migraphx_ep_iobinding,
    # Our EP on ORT's QDQ model (int8 rows only; bench/quant_rows.py hands them a row on that file).
    "migraphx_ep_qdq": migraphx_ep,
    "migraphx_ep_qdq_iobinding": migraphx_ep_iobinding,
}
