"""What a ``sess.run`` costs on top of the program's own CUDA-graph replay, with the shell's native Run path
on and off (``MIGRAPHX_EP_NATIVE_RUN``), measured in one process on the same inputs. Usage:

    python tools/run_overhead.py [resnet50 | squeezenet | MODEL.onnx ...] [--fp16] [--runs 200]
        [--batch N] [--json OUT.jsonl] [--threads 4]

``--threads N`` measures one session's throughput from N threads against one thread instead (numpy I/O and
IOBinding), next to the ceiling the GPU itself offers: the same graphs replayed on N streams at once.
``--trace`` splits ``sess.run`` with numpy I/O and with IOBinding into ORT's own work before, between and
after the shell's calls, the copies ORT asks of our data transfer, and our Compute (its stream
synchronisation apart), from the shell's marks (``MIGRAPHX_EP_TRACE_RUN``, ``csrc/run_trace.h``).
``--iobinding`` measures one session with inputs and outputs bound in GPU memory, against its own graph
replay, with the native path's IO graph on and off (``MIGRAPHX_EP_IO_GRAPH`` is read per Run), with the
outputs bound once to preallocated buffers (ORT allocates nothing per Run), and the replay with the
inputs' device copies into the arena, in interleaved blocks so clock drift hits them all alike.

A name without ``.onnx`` is one of ``migraphx_ep.testing``'s light models (real-size, random weights).
Symbolic dims are set to ``--batch`` (first dim) and ``--seq`` (others).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import onnx
import onnxruntime as ort

import migraphx_ep
from migraphx_ep.ep.background import wait_for_compiles
from migraphx_ep.targets.gpu import cuda
from migraphx_ep.testing import capture_compiled, light_model, random_feeds

EP = migraphx_ep.get_ep_name()


def _model(name: str) -> onnx.ModelProto:
    return onnx.load(name) if name.endswith(".onnx") else light_model(name)


def _feeds(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    return random_feeds(model, lambda axis, _: batch if axis == 0 else seq, np.random.default_rng(0))


def _gpu_session(name: str, fp16: bool, batch: int, seq: int) -> tuple[dict, ort.InferenceSession, list]:
    """Feeds, a gpu session of the model (not run yet) and its compiled subgraphs as they come."""
    model = _model(name)
    feeds = _feeds(model, batch, seq)
    options = {"migraphx_target": "gpu", "migraphx_fp16_enable": "1" if fp16 else "0"}
    with capture_compiled() as compiled:
        sess = ort.InferenceSession(
            model.SerializeToString(), providers=[(EP, options), "CPUExecutionProvider"]
        )
    return feeds, sess, compiled


def _compiled_session(name: str, fp16: bool, batch: int, seq: int) -> tuple[dict, ort.InferenceSession, list]:
    """``_gpu_session`` run once with its feeds; background compiles are waited for, so the timed
    program has replaced the quick one (other library picks: other bits)."""
    feeds, sess, compiled = _gpu_session(name, fp16, batch, seq)
    sess.run(None, feeds)
    wait_for_compiles()
    return feeds, sess, compiled


def _median_ms(fn, runs: int) -> float:
    for _ in range(10):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e3)


def measure(name: str, fp16: bool, runs: int, batch: int, seq: int) -> dict:
    model = _model(name)
    blob = model.SerializeToString()
    feeds = _feeds(model, batch, seq)
    options = {"migraphx_target": "gpu", "migraphx_fp16_enable": "1" if fp16 else "0"}
    row: dict = {"model": os.path.basename(name), "fp16": fp16, "batch": batch}
    compiled: list = []
    outs = {}
    for native in ("1", "0"):
        os.environ["MIGRAPHX_EP_NATIVE_RUN"] = native  # read when the session compiles
        with capture_compiled() as got:  # to reach the session's own executable for the replay timing
            sess = ort.InferenceSession(blob, providers=[(EP, options), "CPUExecutionProvider"])
        compiled += got
        sess.run(None, feeds)
        wait_for_compiles()  # the quick program's timed replacement lands first (ep/background_compiles.py)
        outs[native] = sess.run(None, feeds)
        key = "native_ms" if native == "1" else "python_ms"
        row[key] = _median_ms(lambda s=sess: s.run(None, feeds), runs)
    os.environ.pop("MIGRAPHX_EP_NATIVE_RUN")
    # Two sessions may time different library algorithms, so bits can differ; values may not.
    for a, b in zip(outs["1"], outs["0"], strict=True):
        scale = float(np.abs(b.astype(np.float64)).max()) if b.size else 0.0
        np.testing.assert_allclose(
            a, b, rtol=2e-2, atol=2e-2 * scale, err_msg="native and Python Runs disagree"
        )
    exes = [p._exe for c in compiled[:1] for p in c.programs.values()]
    row["partitions"] = len(compiled) // 2
    if len(exes) == 1 and getattr(exes[0], "graph", None) is not None:
        exe = exes[0]

        def replay() -> None:
            exe.graph.launch(exe.stream.handle)
            exe.stream.sync()

        row["graph_ms"] = _median_ms(replay, runs)
        row["native_overhead_us"] = (row["native_ms"] - row["graph_ms"]) * 1e3
        row["python_overhead_us"] = (row["python_ms"] - row["graph_ms"]) * 1e3
    return row


def iobinding(name: str, fp16: bool, batch: int, seq: int, blocks: int = 20, per_block: int = 30) -> dict:
    feeds, sess, compiled = _gpu_session(name, fp16, batch, seq)
    io = sess.io_binding()
    device_feeds = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
    for k, v in device_feeds.items():
        io.bind_ortvalue_input(k, v)
    for o in sess.get_outputs():
        io.bind_output(o.name, "cuda")
    sess.run_with_iobinding(io)  # compiles; the native path takes every later Run
    wait_for_compiles()  # its timed program replaces the quick one: replay the program the Runs use
    ctx = next(p._exe for c in compiled for p in c.programs.values()).contexts[0]

    def replay() -> None:
        ctx.graph.launch(ctx.stream.handle)
        ctx.stream.sync()

    # The inputs' device-to-device copies into the arena with the replay: what a Run must add to it.
    copies = [(slot, v.data_ptr(), feeds[n].nbytes) for n, v in device_feeds.items() for name, slot, _ in
              ctx.inputs if name == n]  # fmt: skip

    def replay_with_copies() -> None:
        for dst, src, nbytes in copies:
            cuda.memcpy_dtod(dst, src, nbytes, ctx.stream.handle)
        ctx.graph.launch(ctx.stream.handle)
        ctx.stream.sync()

    # Outputs in buffers bound once, so ORT allocates nothing per Run: what output allocation costs.
    pre = sess.io_binding()
    for k, v in device_feeds.items():
        pre.bind_ortvalue_input(k, v)
    for o, got in zip(sess.get_outputs(), io.get_outputs(), strict=True):
        pre.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_shape_and_type(
            got.shape(), _numpy_type(got.data_type()), "cuda", 0))  # fmt: skip
    sess.run_with_iobinding(pre)

    blocks_ms: dict[str, list[float]] = {k: [] for k in ("io_graph", "one_by_one", "preallocated", "replay",
                                                          "replay_with_copies")}  # fmt: skip
    saved = os.environ.get("MIGRAPHX_EP_IO_GRAPH")
    try:
        for _ in range(blocks):
            for key, flag, binding in (
                ("io_graph", "1", io),
                ("one_by_one", "0", io),
                ("preallocated", "1", pre),
            ):
                os.environ["MIGRAPHX_EP_IO_GRAPH"] = flag
                blocks_ms[key].append(_median_ms(lambda b=binding: sess.run_with_iobinding(b), per_block))
            blocks_ms["replay"].append(_median_ms(replay, per_block))
            blocks_ms["replay_with_copies"].append(_median_ms(replay_with_copies, per_block))
    finally:
        if saved is None:
            os.environ.pop("MIGRAPHX_EP_IO_GRAPH", None)
        else:
            os.environ["MIGRAPHX_EP_IO_GRAPH"] = saved
    ms = {k: float(np.median(v)) for k, v in blocks_ms.items()}
    row = {
        "model": os.path.basename(name),
        "fp16": fp16,
        "batch": batch,
        **{f"{k}_ms": v for k, v in ms.items()},
    }
    for key in ("io_graph", "one_by_one", "preallocated"):
        row[f"overhead_us_{key}"] = (ms[key] - ms["replay"]) * 1e3
    row["copies_us"] = (ms["replay_with_copies"] - ms["replay"]) * 1e3
    return row


# csrc/run_trace.h's marks and copy directions
_COPY_BEGIN, _COPY_END, _COMPUTE_BEGIN, _COMPUTE_END, _SYNC_BEGIN, _SYNC_END = range(6)
_DIRECTIONS = {1: "h2d", 2: "d2h", 3: "d2d"}


def _split_run(t0: int, t1: int, marks: list[tuple[int, int, int]]) -> dict[str, float]:
    """One ``sess.run`` (``t0``..``t1``, ns) cut by the shell's marks into µs per part: ORT before,
    between and after our calls, each copy direction, Compute without its synchronisation, the wait."""
    part: dict[str, float] = {"calls_copy": 0.0}
    last, open_at, direction = t0, 0, ""
    for ns, mark, arg in marks:
        if mark == _COPY_BEGIN:
            part["ort"] = part.get("ort", 0.0) + (ns - last) / 1e3
            open_at, direction = ns, _DIRECTIONS.get(arg & 15, "copy")
            part["calls_copy"] += 1
        elif mark == _COPY_END:
            key = f"copy_{direction}"
            part[key] = part.get(key, 0.0) + (ns - open_at) / 1e3
            last = ns
        elif mark == _COMPUTE_BEGIN:
            part["ort"] = part.get("ort", 0.0) + (ns - last) / 1e3
            open_at = ns
        elif mark == _SYNC_BEGIN:
            part["compute"] = part.get("compute", 0.0) + (ns - open_at) / 1e3
            open_at = ns
        elif mark == _SYNC_END:
            part["sync_wait"] = part.get("sync_wait", 0.0) + (ns - open_at) / 1e3
            open_at = ns
        elif mark == _COMPUTE_END:
            part["compute"] = part.get("compute", 0.0) + (ns - open_at) / 1e3
            part["native"] = float(arg)
            last = ns
    part["ort"] = part.get("ort", 0.0) + (t1 - last) / 1e3
    part["total"] = (t1 - t0) / 1e3
    return part


def trace(name: str, fp16: bool, batch: int, seq: int, runs: int) -> dict:
    """Median µs of each part of a numpy-I/O ``sess.run`` (with large copies staged, and left to the
    driver), and of an IOBinding one (``_split_run``), with the program's graph replay for comparison."""
    from migraphx_ep import _C

    feeds, sess, compiled = _compiled_session(name, fp16, batch, seq)
    io = sess.io_binding()
    for k, v in feeds.items():
        io.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
    for o in sess.get_outputs():
        io.bind_output(o.name, "cuda")
    row: dict = {"model": os.path.basename(name), "fp16": fp16, "batch": batch}

    def unstaged() -> None:  # the driver's own pageable copies (csrc/host_staging.h), for comparison
        _C.configure_staging(False)
        try:
            sess.run(None, feeds)
        finally:
            _C.reset_staging()

    calls = {
        "numpy": lambda: sess.run(None, feeds),
        "numpy_unstaged": unstaged,
        "iobinding": lambda: sess.run_with_iobinding(io),
    }
    for kind, call in calls.items():
        for _ in range(20):
            call()
        spans = []
        _C.run_trace(True)
        _C.set_run_trace(True)
        for _ in range(runs):
            t0 = time.perf_counter_ns()
            call()
            spans.append((t0, time.perf_counter_ns()))
        _C.set_run_trace(False)
        marks, dropped = _C.run_trace(True)
        if dropped:
            raise RuntimeError(f"the trace dropped {dropped} marks: fewer --runs")
        parts = []
        for t0, t1 in spans:
            parts.append(_split_run(t0, t1, [m for m in marks if t0 <= m[0] <= t1]))
        for key in sorted({k for p in parts for k in p}):
            row[f"{kind}_{key}"] = float(np.median([p.get(key, 0.0) for p in parts]))
    exe = next(p._exe for c in compiled for p in c.programs.values())
    ctx = exe.contexts[0]

    def replay() -> None:
        ctx.graph.launch(ctx.stream.handle)
        ctx.stream.sync()

    row["graph_us"] = _median_ms(replay, runs) * 1e3
    return row


def _numpy_type(ort_type: str) -> type:
    """numpy's type for ORT's 'tensor(float16)'-style name."""
    name = ort_type[len("tensor(") : -1]
    return {"float": np.float32, "double": np.float64, "float16": np.float16}.get(name) or np.dtype(name).type


def threads(name: str, fp16: bool, n_threads: int, seconds: float, batch: int, seq: int) -> dict:
    """Runs per second of one session from 1 thread and from ``n_threads`` threads, with numpy I/O and
    with IOBinding (each thread its own binding, inputs shared on the device), whether every thread's
    outputs equal the single-threaded ones, and the GPU's own ceiling: the program's captured graphs
    replayed back to back on 1 and on ``n_threads`` execution contexts' streams from one host thread,
    with no ORT, no shell and no copies. ``scaling / ceiling`` is the share of the concurrency the device
    offers that the Run path delivers."""
    from concurrent.futures import ThreadPoolExecutor

    feeds, sess, compiled = _compiled_session(name, fp16, batch, seq)
    want = sess.run(None, feeds)
    device_feeds = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}

    def numpy_loop(deadline: float) -> tuple[int, bool]:
        n, same = 0, True
        while time.perf_counter() < deadline:
            got = sess.run(None, feeds)
            same = same and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
            n += 1
        return n, same

    def iobinding_loop(deadline: float) -> tuple[int, bool]:
        io = sess.io_binding()
        for k, v in device_feeds.items():
            io.bind_ortvalue_input(k, v)
        for o in sess.get_outputs():
            io.bind_output(o.name, "cuda")
        n, same = 0, True
        while time.perf_counter() < deadline:
            sess.run_with_iobinding(io)
            n += 1
            if n % 64 == 1:  # a device->host copy per Run would cost more than the Run being measured
                got = io.copy_outputs_to_cpu()
                same = same and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
        return n, same

    def rate(loop, k: int) -> tuple[float, bool]:  # noqa: ANN001
        with ThreadPoolExecutor(k) as ex:
            list(ex.map(lambda _: loop(time.perf_counter() + 0.3), range(k)))  # warm: contexts grow here
            t0 = time.perf_counter()
            done = list(ex.map(lambda _: loop(t0 + seconds), range(k)))
        return sum(n for n, _ in done) / (time.perf_counter() - t0), all(s for _, s in done)

    row: dict = {"model": os.path.basename(name), "fp16": fp16, "batch": batch, "threads": n_threads}
    identical = True
    for io_kind, loop in (("numpy", numpy_loop), ("iobinding", iobinding_loop)):
        one, same1 = rate(loop, 1)
        many, same_n = rate(loop, n_threads)
        row[f"{io_kind}_runs_per_s_1"] = one
        row[f"{io_kind}_runs_per_s_{n_threads}"] = many
        row[f"{io_kind}_scaling"] = many / one
        identical = identical and same1 and same_n
    row["identical"] = identical
    exes = [p._exe for c in compiled for p in c.programs.values()]
    if len(exes) == 1 and len(exes[0].contexts) >= n_threads:
        ceiling_1, ceiling_n = (_replay_rate(exes[0].contexts[:k], seconds) for k in (1, n_threads))
        row["replay_per_s_1"], row[f"replay_per_s_{n_threads}"] = ceiling_1, ceiling_n
        row["ceiling"] = ceiling_n / ceiling_1
        for io_kind in ("numpy", "iobinding"):
            row[f"{io_kind}_share_of_ceiling"] = row[f"{io_kind}_scaling"] / row["ceiling"]
    else:
        row["ceiling"] = None  # several partitions, or the threads never needed a context each
    return row


def _replay_rate(contexts: list, seconds: float, depth: int = 8) -> float:
    """Graph replays per second with ``contexts`` replaying at once, each on its own stream, issued
    round-robin from this thread ``depth`` at a time per stream (enough queued work that the host's
    launch cost never starves the device)."""
    for c in contexts:
        c.graph.launch(c.stream.handle)
    for c in contexts:
        c.stream.sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(depth):
            for c in contexts:
                c.graph.launch(c.stream.handle)
        for c in contexts:
            c.stream.sync()
        n += depth * len(contexts)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["resnet50"])
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", help="append one JSON row per model here")
    ap.add_argument("--threads", type=int, default=0, help="measure throughput from N threads instead")
    ap.add_argument("--iobinding", action="store_true", help="GPU-bound I/O, IO graph on/off, vs replay")
    ap.add_argument("--trace", action="store_true", help="split sess.run into ORT, copies and Compute")
    a = ap.parse_args()
    for name in a.models:
        if a.trace:
            row = trace(name, a.fp16, a.batch, a.seq, a.runs)
        elif a.iobinding:
            row = iobinding(name, a.fp16, a.batch, a.seq)
        elif a.threads:
            row = threads(name, a.fp16, a.threads, 3.0, a.batch, a.seq)
        else:
            row = measure(name, a.fp16, a.runs, a.batch, a.seq)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
