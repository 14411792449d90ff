"""Run an ONNX model through ONNX Runtime with MIGraphXExecutionProvider and check it against the CPU EP.

    python examples/run_model.py                    # ResNet-50 (ONNX's bundled graph, random weights)
    python examples/run_model.py --model m.onnx     # any model; inputs are random, symbolic dims = 1
    python examples/run_model.py --light squeezenet --option migraphx_fp16_enable=1

Prints where every node ran (from ORT's profiler, not from get_providers()), the largest difference
from the CPU EP, and timings.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

import migraphx_ep
from migraphx_ep.testing import LIGHT_MODELS, light_input, light_model

EP = migraphx_ep.get_ep_name()


def random_inputs(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dt.kind in "iu":
            feeds[vi.name] = rng.integers(0, 2, size=dims).astype(dt)
        elif dt.kind == "b":
            feeds[vi.name] = rng.random(dims) < 0.5
        else:
            feeds[vi.name] = rng.standard_normal(dims).astype(dt)
    return feeds


def placement(sess: ort.InferenceSession) -> collections.Counter:
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    return collections.Counter(
        (e["args"]["provider"], e["args"].get("op_name", "?"))
        for e in events
        if e.get("cat") == "Node" and "provider" in e.get("args", {})
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="path of an ONNX model")
    ap.add_argument("--light", default="resnet50", choices=LIGHT_MODELS, help="bundled model to use")
    ap.add_argument("--option", action="append", default=[], help="provider option key=value (repeatable)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.model:
        model, name = onnx.load(a.model), a.model
        feeds = random_inputs(model)
    else:
        model, name = light_model(a.light), f"light_{a.light} (random weights)"
        feeds = light_input(model)
    options = dict(kv.split("=", 1) for kv in a.option)
    blob = model.SerializeToString()
    print(
        f"model: {name}: {len(model.graph.node)} nodes; inputs "
        + ", ".join(f"{k}{list(v.shape)}:{v.dtype}" for k, v in feeds.items())
    )

    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    want = cpu.run(None, feeds)

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "migraphx_ep_example")
    t0 = time.perf_counter()
    sess = ort.InferenceSession(blob, so, providers=[(EP, options), "CPUExecutionProvider"])
    t_create = time.perf_counter() - t0
    times = []
    for _ in range(max(a.runs, 1)):
        t0 = time.perf_counter()
        got = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    where = placement(sess)

    print(f"providers: {sess.get_providers()}")
    print("node events per provider (ORT profiler):")
    for prov, n in collections.Counter(p for p, _ in where.elements()).most_common():
        print(f"  {prov:28} {n}")
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        worst = max(
            worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if g.size else 0.0
        )
    tol = 1e-2 if options.get("migraphx_fp16_enable") == "1" else 1e-3
    ok = worst <= tol
    print(f"max |ours - CPU EP| = {worst:.3g} (tolerance {tol:g}) -> {'MATCH' if ok else 'MISMATCH'}")
    print(
        f"session creation {t_create:.2f} s (compile included); "
        f"run median {sorted(times)[len(times) // 2] * 1e3:.1f} ms"
        f" over {len(times)} runs (ref target on CPU: a correctness oracle, not a speed target)"
    )
    on_ep = sum(n for (p, _), n in where.items() if p == EP)
    if on_ep == 0:
        print("ERROR: no node ran on MIGraphXExecutionProvider", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
