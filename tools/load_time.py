"""A process's first session of one model, three ways, each load a new Python process. Usage:

    python tools/load_time.py MODEL.onnx [--loads 3] [--target gpu] [--dim NAME=SIZE ...] [--work DIR]

* ``cold``: nothing stored (the NVRTC kernel cache, ``MIGRAPHX_EP_KERNEL_CACHE``, still holds what earlier
  runs compiled);
* ``model cache``: ``migraphx_model_cache_dir`` holding this model's program (filled by a first session);
* ``EPContext``: the model compiled ahead of time (``onnxruntime.ModelCompiler``, the ``.mxr`` beside it).

Symbolic dims are fixed first (``--dim``; any other is 1) into a static copy of the model in ``--work``
(an EPContext model needs static dims). Each line gives the process's ``import onnxruntime, migraphx_ep``,
then ``InferenceSession`` and its first Run (seconds), and ORT's own ``session_initialization`` from its
profiler (milliseconds: our GetCapability and Compile are inside it; our EP's creation, with the
compiler's import, is not). The kinds alternate load by load; medians follow.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import onnx

# One load: a fresh interpreter (the compiler's import is part of a process's first session).
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, onnxruntime as ort, migraphx_ep
t1 = time.perf_counter()
path, target, cache, prefix = sys.argv[1:5]
opts = {"migraphx_target": target, **({"migraphx_model_cache_dir": cache} if cache else {})}
so = ort.SessionOptions()
so.enable_profiling = True
so.profile_file_prefix = prefix
t2 = time.perf_counter()
sess = ort.InferenceSession(path, so, providers=[(migraphx_ep.get_ep_name(), opts), "CPUExecutionProvider"])
t3 = time.perf_counter()
kinds = {"tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(int64)": np.int64,
         "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
feeds = {i.name: np.ones(i.shape, kinds.get(i.type, np.float32)) for i in sess.get_inputs()}
sess.run(None, feeds)
t4 = time.perf_counter()
events = json.load(open(sess.end_profiling()))
init = sum(e.get("dur", 0) for e in events if e.get("name") == "session_initialization") / 1e3
print(f"LOAD {t1 - t0:.3f} {t3 - t2:.3f} {t4 - t3:.3f} {init:.1f}")
"""

COMPILE = r"""
import sys, onnxruntime as ort, migraphx_ep
so = ort.SessionOptions()
devices = [d for d in ort.get_ep_devices() if d.ep_name == migraphx_ep.get_ep_name()]
so.add_provider_for_devices(devices, {"migraphx_target": sys.argv[3]})
ort.ModelCompiler(so, sys.argv[1]).compile_to_file(sys.argv[2])
"""


def static_copy(model: str, dims: dict[str, int], out: str) -> None:
    """``model`` with every symbolic dim of its inputs and outputs fixed (``dims``, else 1)."""
    m = onnx.load(model)
    for vi in [*m.graph.input, *m.graph.output]:
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                size = dims.get(d.dim_param, 1)
                d.Clear()
                d.dim_value = size
    onnx.save(m, out)


def _child(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"load_time: a child process failed:\n{out.stderr[-3000:]}")
    return out.stdout


def load(path: str, target: str, cache: str, prefix: str) -> tuple[float, ...]:
    """import, session, first Run (s) and ORT's session_initialization (ms) of one fresh process."""
    line = next(x for x in _child(CHILD, path, target, cache, prefix).splitlines() if x.startswith("LOAD "))
    return tuple(float(x) for x in line.split()[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--target", default="gpu")
    ap.add_argument("--dim", action="append", default=[], help="NAME=SIZE for a symbolic dim (default 1)")
    ap.add_argument("--work", help="a directory for the static model, the cache and the EPContext model")
    a = ap.parse_args(argv)
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in a.dim)}
    work = a.work or tempfile.mkdtemp(prefix="load-time-")
    static, ctx, cache = (os.path.join(work, x) for x in ("static.onnx", "static_ctx.onnx", "cache"))
    prefix = os.path.join(work, "ort-profile")
    static_copy(a.model, dims, static)
    load(static, a.target, cache, prefix)  # fills the model cache
    _child(COMPILE, static, ctx, a.target)
    kinds = {"cold": (static, ""), "model cache": (static, cache), "EPContext": (ctx, "")}
    rows: dict[str, list[tuple[float, ...]]] = {k: [] for k in kinds}
    print("kind: import s, session s, first Run s, ORT session_initialization ms")
    for n in range(a.loads):
        for kind, (path, store) in kinds.items():
            rows[kind].append(load(path, a.target, store, prefix))
            print(f"{kind} #{n + 1}: " + ", ".join(str(x) for x in rows[kind][-1]), flush=True)
    for kind, got in rows.items():
        if got:
            med = [round(statistics.median(r[i] for r in got), 3) for i in range(4)]
            total = statistics.median(r[1] + r[2] for r in got)
            print(f"median {kind}: {', '.join(map(str, med))} (session + first Run {total:.3f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
