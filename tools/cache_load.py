"""A session loaded from ``migraphx_model_cache_dir``, split into ORT's share and ours. Usage:

    python tools/cache_load.py MODEL.onnx [--loads 3] [--target gpu] [--batch 1] [--seq 128]
        [--cache-dir DIR] [--no-ort]

One session fills a fresh cache directory, then ``--loads`` sessions in the same process load from it
(as ``bench/run.py`` measures a cache load). With ``--cache-dir`` that already holds programs, every
session loads: run it once to fill ``DIR``, then again per fresh process that loads (a restarted
server). Each line gives the session's creation and its first Run, and inside them our EP's creation,
GetCapability, Compile (before the first Run), the first Run's cache key (``graph_fingerprint``) and its
``.mxr`` load, whose stages follow on a line of their own (``mxr read``: the bytes and checksums, ``mxr
decode``: the IR, then the target's restore: lowering, weights upload, binding...). ORT's own load of
the same model with the CPU EP alone, graph optimizations on and off, comes first: what is left of a
session beyond our calls is ORT's. Symbolic dims: the first is ``--batch``, the others ``--seq`` (a 4-d
float input: 3 x 224 x 224 images).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort

import migraphx_ep  # noqa: F401 - registers the EP (as the autoload hook would)
from migraphx_ep import timing
from migraphx_ep.ep import cache, compiled, provider

_SPENT: dict[str, float] = {}
_LOAD_STAGES: list[str] = []  # each .mxr load's stages (timing.record's summary)


def _timed(owner: Any, name: str, label: str, stages: bool = False) -> None:
    real: Callable = getattr(owner, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            if not stages:
                return real(*args, **kw)
            with timing.record() as times:
                found = real(*args, **kw)
            if found is not None:
                _LOAD_STAGES.append(times.summary())
            return found
        finally:
            _SPENT[label] = _SPENT.get(label, 0.0) + time.perf_counter() - t

    setattr(owner, name, wrapper)


def _feeds(sess: ort.InferenceSession, batch: int, seq: int) -> dict[str, np.ndarray]:
    out = {}
    for i in sess.get_inputs():
        image = len(i.shape) == 4 and "float" in i.type
        dims = [batch, 3, 224, 224] if image else [batch] + [seq] * (len(i.shape) - 1)
        shape = [d if isinstance(d, int) else dims[k] for k, d in enumerate(i.shape)]
        if "int" in i.type:
            out[i.name] = np.ones(shape, np.int64 if "64" in i.type else np.int32)
        else:
            dtype = np.float16 if "float16" in i.type else np.float32
            out[i.name] = np.random.default_rng(0).random(shape).astype(dtype)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--target", default="gpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--cache-dir", help="a cache directory to fill or load from (default: a new one)")
    ap.add_argument("--no-ort", action="store_true", help="skip ORT's own load of the model")
    a = ap.parse_args(argv)
    for optimized in () if a.no_ort else (True, False):
        so = ort.SessionOptions()
        if not optimized:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        t = time.perf_counter()
        ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
        took = time.perf_counter() - t
        print(f"ORT, CPU EP alone, optimizations {'on' if optimized else 'off'}: {took:.3f} s")
    _timed(provider.MIGraphXEp, "__init__", "create")
    _timed(provider.MIGraphXEp, "get_capability", "capability")
    _timed(provider.MIGraphXEp, "_compile_graph", "compile")
    _timed(compiled, "graph_fingerprint", "fingerprint")
    _timed(cache.ProgramStore, "lookup", "mxr load", stages=True)
    cache_dir = a.cache_dir or tempfile.mkdtemp(prefix="mxr-cache-")
    filled = os.path.isdir(cache_dir) and any(f.endswith(".mxr") for f in os.listdir(cache_dir))
    opts = {"migraphx_target": a.target, "migraphx_model_cache_dir": cache_dir}
    for n in range(int(filled), a.loads + 1):
        _SPENT.clear()
        t0 = time.perf_counter()
        sess = ort.InferenceSession(
            a.model, providers=[("MIGraphXExecutionProvider", opts), "CPUExecutionProvider"]
        )
        t1 = time.perf_counter()
        sess.run(None, _feeds(sess, a.batch, a.seq))
        t2 = time.perf_counter()
        ours = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in _SPENT.items())
        what = "fill" if n == 0 else f"load #{n}"
        print(f"{what}: session {t1 - t0:.3f} s, + first Run {t2 - t0:.3f} s (ms: {ours})", flush=True)
        while _LOAD_STAGES:
            print(f"  .mxr load: {_LOAD_STAGES.pop(0)}", flush=True)
        del sess
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
