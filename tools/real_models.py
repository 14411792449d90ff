"""Real models through ORT with the EP: how much is claimed, in how many partitions, and is it right.

    python tools/real_models.py model.onnx [--dim NAME=SIZE ...] [--feed NAME=VALUE ...]
                                [--option key=value ...] [--runs N]

Symbolic dims take --dim sizes (else --default-dim), whole inputs --shape; --feed gives a
scalar input its value (e.g. silero VAD's sample rate: --feed sr=16000). Prints, per model: the nodes
of the top-level graph, how many ran on other providers (ORT's profiler), our fused partitions, and
the largest difference from ORT's CPU EP over --runs random inputs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import numpy as np
import onnx


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SystemExit(f"error: {what} {item!r} is not NAME=VALUE")
        out[k] = v
    return out


def _inputs(model: onnx.ModelProto, dims: dict, shapes: dict, feeds: dict, default: int, rng) -> dict:
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if vi.name in feeds:
            out[vi.name] = np.array(feeds[vi.name], dtype=dtype)
            continue
        if vi.name in shapes:
            shape = [int(d) for d in shapes[vi.name].split(",")]
        else:
            shape = [
                d.dim_value if d.HasField("dim_value") else int(dims.get(d.dim_param, default))
                for d in tt.shape.dim
            ]
        if dtype.kind == "f":
            out[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            out[vi.name] = rng.integers(0, 2, shape).astype(dtype)
    return out


def _placement(sess) -> collections.Counter:
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    return collections.Counter(
        (e["args"]["provider"], e["args"].get("op_name", "")) for e in events if e.get("cat") == "Node"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--dim", action="append", default=[], help="NAME=SIZE for a symbolic dim")
    ap.add_argument("--shape", action="append", default=[], help="NAME=D1,D2,... for an input")
    ap.add_argument("--feed", action="append", default=[], help="NAME=VALUE for a scalar input")
    ap.add_argument("--option", action="append", default=[], help="EP provider option key=value")
    ap.add_argument("--default-dim", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args(argv)
    import onnxruntime as ort

    import migraphx_ep  # noqa: F401 - registers the EP and routes its name

    dims, shapes = _pairs(a.dim, "--dim"), _pairs(a.shape, "--shape")
    feeds, opts = _pairs(a.feed, "--feed"), _pairs(a.option, "--option")
    rng = np.random.default_rng(0)
    worst = 0.0
    for path in a.models:
        model = onnx.load(path)
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
        ep = ("MIGraphXExecutionProvider", opts)
        sess = ort.InferenceSession(path, so, providers=[ep, "CPUExecutionProvider"])
        cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        err = 0.0
        for _ in range(a.runs):
            x = _inputs(model, dims, shapes, feeds, a.default_dim, rng)
            for g, w in zip(sess.run(None, x), cpu.run(None, x), strict=True):
                g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
                scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
                err = max(err, float(np.abs(g - w).max()) / scale if w.size else 0.0)
        placed = _placement(sess)
        ours = {op for (p, op) in placed if p == "MIGraphXExecutionProvider"}
        others = collections.Counter(op for (p, op) in placed if p != "MIGraphXExecutionProvider")
        per_run_other = sum(others.values()) // a.runs
        n = len(model.graph.node)
        print(
            f"{os.path.basename(path)}: {n} nodes, {n - per_run_other} on our EP "
            f"({100.0 * (n - per_run_other) / n:.1f}%) in {len(ours)} partition(s); "
            f"elsewhere: {dict(others) or 'none'}; max rel err vs ORT CPU {err:.2e}"
        )
        worst = max(worst, err)
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
