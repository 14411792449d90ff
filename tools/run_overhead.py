"""What a ``sess.run`` costs on top of the program's own CUDA-graph replay, with the shell's native Run path
on and off (``MIGRAPHX_EP_NATIVE_RUN``), measured in one process on the same inputs. Usage:

    python tools/run_overhead.py [resnet50 | squeezenet | MODEL.onnx ...] [--fp16] [--runs 200]
        [--batch N] [--json OUT.jsonl] [--threads 4]

``--threads N`` measures one session's throughput from N threads against one thread instead.
``--iobinding`` measures one session with inputs and outputs bound in GPU memory, against its own graph
replay, with the native path's IO graph on and off (``MIGRAPHX_EP_IO_GRAPH`` is read per Run), in
interleaved blocks so clock drift hits both alike.

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
from migraphx_ep.testing import capture_compiled, light_model, random_feeds

EP = migraphx_ep.get_ep_name()


def _model(name: str) -> onnx.ModelProto:
    return onnx.load(name) if name.endswith(".onnx") else light_model(name)


def _feeds(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    return random_feeds(model, lambda axis, _: batch if axis == 0 else seq, np.random.default_rng(0))


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
    model = _model(name)
    feeds = _feeds(model, batch, seq)
    options = {"migraphx_target": "gpu", "migraphx_fp16_enable": "1" if fp16 else "0"}
    with capture_compiled() as compiled:
        sess = ort.InferenceSession(
            model.SerializeToString(), providers=[(EP, options), "CPUExecutionProvider"]
        )
    io = sess.io_binding()
    for k, v in feeds.items():
        io.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
    for o in sess.get_outputs():
        io.bind_output(o.name, "cuda")
    sess.run_with_iobinding(io)  # compiles; the native path takes every later Run
    ctx = next(p._exe for c in compiled for p in c.programs.values()).contexts[0]

    def replay() -> None:
        ctx.graph.launch(ctx.stream.handle)
        ctx.stream.sync()

    blocks_ms: dict[str, list[float]] = {"io_graph": [], "one_by_one": [], "replay": []}
    saved = os.environ.get("MIGRAPHX_EP_IO_GRAPH")
    try:
        for _ in range(blocks):
            for key, flag in (("io_graph", "1"), ("one_by_one", "0")):
                os.environ["MIGRAPHX_EP_IO_GRAPH"] = flag
                blocks_ms[key].append(_median_ms(lambda: sess.run_with_iobinding(io), per_block))
            blocks_ms["replay"].append(_median_ms(replay, per_block))
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
    row["overhead_us_io_graph"] = (ms["io_graph"] - ms["replay"]) * 1e3
    row["overhead_us_one_by_one"] = (ms["one_by_one"] - ms["replay"]) * 1e3
    return row


def threads(name: str, fp16: bool, n_threads: int, seconds: float, batch: int, seq: int) -> dict:
    """Runs per second of one session from 1 thread and from ``n_threads`` threads (numpy I/O), and
    whether every thread's outputs equal the single-threaded ones."""
    from concurrent.futures import ThreadPoolExecutor

    model = _model(name)
    feeds = _feeds(model, batch, seq)
    options = {"migraphx_target": "gpu", "migraphx_fp16_enable": "1" if fp16 else "0"}
    sess = ort.InferenceSession(model.SerializeToString(), providers=[(EP, options), "CPUExecutionProvider"])
    want = sess.run(None, feeds)

    def loop(deadline: float) -> tuple[int, bool]:
        n, same = 0, True
        while time.perf_counter() < deadline:
            got = sess.run(None, feeds)
            same = same and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
            n += 1
        return n, same

    def rate(k: int) -> tuple[float, bool]:
        with ThreadPoolExecutor(k) as ex:
            list(ex.map(lambda _: loop(time.perf_counter() + 0.3), range(k)))  # warm: contexts grow here
            t0 = time.perf_counter()
            done = list(ex.map(lambda _: loop(t0 + seconds), range(k)))
        return sum(n for n, _ in done) / (time.perf_counter() - t0), all(s for _, s in done)

    one, same1 = rate(1)
    many, same_n = rate(n_threads)
    row = {"model": os.path.basename(name), "fp16": fp16, "threads": n_threads, "runs_per_s_1": one}
    row[f"runs_per_s_{n_threads}"] = many
    return {**row, "scaling": many / one, "identical": same1 and same_n}


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
    a = ap.parse_args()
    for name in a.models:
        if a.iobinding:
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
