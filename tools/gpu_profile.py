"""Where a gpu-target program spends its time: per-step device times (events around each step, run
eagerly; with ``--alone`` each step captured alone in a CUDA graph, as the program replays it), the graph
replay alone, and a whole Run with copies. Usage:
``python tools/gpu_profile.py MODEL.onnx [--batch N] [--top 15] [--alone] [--ort]``"""

from __future__ import annotations

import argparse
import collections
import os
import time

import numpy as np
import onnx

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.frontend.probe import fixed_dims
from migraphx_ep.ir.dtypes import DType
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu import cuda


def step_times(exe, launches: int = 50, replays: int = 15) -> dict[str, float]:  # noqa: ANN001
    """µs per launch of each step, captured ``launches`` times in a graph, best of ``replays``."""
    steps = [st for st in exe.lowered.steps if not all(b.shape.elements() == 0 for b in st.writes)]
    s, start, stop = exe.stream, cuda.Event(), cuda.Event()
    out: dict[str, float] = {}
    for k, (st, launch) in enumerate(zip(steps, exe._launches, strict=False)):
        graph = cuda.Graph(s, lambda h, launch=launch: [launch(h) for _ in range(launches)])
        best = float("inf")
        for _ in range(replays):
            start.record(s.handle)
            graph.launch(s.handle)
            stop.record(s.handle)
            stop.sync()
            best = min(best, stop.elapsed_ms(start) * 1e3 / launches)
        out[f"{k}:{st.label.split()[0]}"] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--ort", action="store_true", help="also time sess.run through ORT with the EP")
    ap.add_argument("--alone", action="store_true", help="each step alone in a CUDA graph (no launch gaps)")
    a = ap.parse_args()
    g = model_to_dict(onnx.load(a.model))
    t0 = time.perf_counter()
    prog = parse_graph(g, resolve_dim=fixed_dims(a.batch)).program
    prog.compile(get_target("gpu"))
    exe = prog._exe
    print(f"{os.path.basename(a.model)} bs{a.batch}: compile {time.perf_counter() - t0:.2f}s", exe.summary())
    rng = np.random.default_rng(0)
    feeds = {}
    for name, sh in prog.get_parameter_shapes().items():
        if sh.type in (DType.int64_type, DType.int32_type):
            feeds[name] = rng.integers(0, 2, sh.lens).astype(sh.dtype)  # valid ids, masks, segments
        else:
            feeds[name] = rng.standard_normal(sh.lens).astype(sh.dtype)
    for _ in range(10):
        exe.run(feeds)
    ts = []
    for _ in range(a.runs):
        t = time.perf_counter()
        exe.run(feeds)
        ts.append(time.perf_counter() - t)
    s = exe.stream
    gts = []
    for _ in range(a.runs):
        t = time.perf_counter()
        exe.graph.launch(s.handle)
        s.sync()
        gts.append(time.perf_counter() - t)
    # Per step: events around each launch, eager.
    steps = [st for st in exe.lowered.steps if not all(b.shape.elements() == 0 for b in st.writes)]
    evs = [cuda.Event() for _ in range(len(exe._launches) + 1)]
    per = np.zeros(len(exe._launches))
    for _ in range(20):
        evs[0].record(s.handle)
        for i, launch in enumerate(exe._launches):
            launch(s.handle)
            evs[i + 1].record(s.handle)
        evs[-1].sync()
        per += [evs[i + 1].elapsed_ms(evs[i]) for i in range(len(exe._launches))]
    per /= 20
    if a.alone:  # eager events include the launch gaps a graph does not have
        per = np.array(list(step_times(exe).values())) / 1e3
    by_kind: dict[str, float] = collections.defaultdict(float)
    for st, ms in zip(steps, per, strict=False):
        by_kind[st.label.split()[0]] += ms
    print(
        f"run (copies+graph) median {np.median(ts) * 1e3:.3f} ms; graph only {np.median(gts) * 1e3:.3f} ms; "
        f"sum of steps ({'each alone in a graph' if a.alone else 'eager'}) {per.sum():.3f} ms"
        f" over {len(per)} steps"
    )
    print("by kind:", {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])})
    if a.ort:
        import onnxruntime as ort

        import migraphx_ep
        from migraphx_ep.ep import bridge

        spent: list[float] = []
        inner = bridge.run

        def timed(compiled, inputs):  # the Python side of one Compute, as the C++ shell calls it
            t = time.perf_counter()
            try:
                return inner(compiled, inputs)
            finally:
                spent.append(time.perf_counter() - t)

        bridge.run = timed
        sess = ort.InferenceSession(
            a.model, providers=[(migraphx_ep.get_ep_name(), {"migraphx_target": "gpu"})]
        )
        for _ in range(10):
            sess.run(None, feeds)
        ots = []
        for _ in range(a.runs):
            t = time.perf_counter()
            sess.run(None, feeds)
            ots.append(time.perf_counter() - t)
        py_ms = np.median(spent[-a.runs :]) * 1e3
        print(f"ORT sess.run median {np.median(ots) * 1e3:.3f} ms, of which bridge.run {py_ms:.3f} ms")
    order = np.argsort(-per)[: a.top]
    for i in order:
        print(f"  {per[i] * 1e3:8.1f} us  {steps[i].label}  -> {steps[i].writes[0].shape}")


if __name__ == "__main__":
    main()
