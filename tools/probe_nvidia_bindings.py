"""Do NVIDIA's official Python bindings serve the gpu target? Runs, on a GPU machine with CuPy:

* nvmath-python's cuBLASLt bindings (``nvmath.bindings.cublasLt``): an fp16 GEMM from raw device
  pointers, eagerly and captured in a CUDA graph, against a float32 product; the host cost of a call;
* cudnn-frontend's graph API (``cudnn.pygraph``): fp16 scaled-dot-product attention from raw device
  pointers, eagerly and captured in a CUDA graph, against a float32 reference; its device time.

    python3 tools/probe_nvidia_bindings.py      # pip install nvmath-python nvidia-cudnn-frontend cupy

Each probe prints OK with its figures or FAIL with the error; nothing here is used by the EP.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable

import numpy as np


def step(name: str, fn: Callable[[], dict]) -> None:
    try:
        print(f"OK   {name}: {fn()}")
    except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
        print(f"FAIL {name}: {type(e).__name__}: {e}")
        traceback.print_exc(limit=2, file=sys.stdout)


def nvmath_gemm() -> dict:
    import cupy as cp
    import nvmath
    from nvmath.bindings import cublasLt as lt

    h = lt.create()
    m, n, k = 256, 768, 768
    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((k, n)).astype(np.float16))
    d = cp.zeros((m, n), np.float16)
    r_16f, r_32f, compute_32f = 2, 0, 68  # CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F
    desc = lt.matmul_desc_create(compute_32f, r_32f)
    # Row-major D = A @ B is column-major D^T = B^T @ A^T.
    la = lt.matrix_layout_create(r_16f, n, k, n)
    lb = lt.matrix_layout_create(r_16f, k, m, k)
    ld = lt.matrix_layout_create(r_16f, n, m, n)
    pref = lt.matmul_preference_create()
    ws = cp.empty(32 << 20, np.uint8)
    wsz = np.array([ws.nbytes], np.uint64)
    lt.matmul_preference_set_attribute(
        pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, wsz.ctypes.data, 8
    )
    res = lt.MatmulHeuristicResult(8)
    count = np.zeros(1, np.int32)
    lt.matmul_algo_get_heuristic(h, desc, la, lb, ld, ld, pref, 8, res.ptr, count.ctypes.data)
    alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
    s = cp.cuda.Stream(non_blocking=True)

    def call() -> None:  # the first heuristic result's algo is its first field: res.ptr points at it
        lt.matmul(h, desc, alpha.ctypes.data, b.data.ptr, la, a.data.ptr, lb, beta.ctypes.data,
                  d.data.ptr, ld, d.data.ptr, ld, res.ptr, ws.data.ptr, ws.nbytes, s.ptr)  # fmt: skip

    want = a.astype(cp.float32) @ b.astype(cp.float32)
    call()
    s.synchronize()
    eager = float(cp.abs(d.astype(cp.float32) - want).max())
    d.fill(0)
    s.begin_capture()
    call()
    graph = s.end_capture()
    graph.launch(s)
    s.synchronize()
    captured = float(cp.abs(d.astype(cp.float32) - want).max())
    t = time.perf_counter()
    for _ in range(1000):
        call()
    s.synchronize()
    return {
        "nvmath": nvmath.__version__, "cublasLt": lt.get_version(), "algos": int(count[0]),
        "max_err_eager": eager, "max_err_graph": captured,
        "host_us_per_call": round((time.perf_counter() - t) * 1e3, 2),
    }  # fmt: skip


def cudnn_sdpa() -> dict:
    import cudnn
    import cupy as cp

    bsz, heads, seq, dim = 8, 12, 128, 64
    rng = np.random.default_rng(0)
    q, k, v = (cp.asarray(rng.standard_normal((bsz, heads, seq, dim)).astype(np.float16)) for _ in range(3))
    o = cp.empty_like(q)
    handle = cudnn.create_handle()
    s = cp.cuda.Stream(non_blocking=True)
    cudnn.set_stream(handle=handle, stream=s.ptr)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)  # fmt: skip
    stride = [heads * seq * dim, seq * dim, dim, 1]
    tq, tk, tv = (
        g.tensor(name=n, dim=[bsz, heads, seq, dim], stride=stride, data_type=cudnn.data_type.HALF)
        for n in "qkv"
    )
    try:
        to, _ = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, generate_stats=False, attn_scale=1 / 8.0)
    except TypeError:  # frontends before generate_stats
        to, _ = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, is_inference=True, attn_scale=1 / 8.0)
    to.set_output(True).set_dim([bsz, heads, seq, dim]).set_stride(stride)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = cp.empty(max(1, g.get_workspace_size()), np.uint8)
    pack = {tq: q.data.ptr, tk: k.data.ptr, tv: v.data.ptr, to: o.data.ptr}
    qf, kf, vf = (x.astype(cp.float32) for x in (q, k, v))
    p = qf @ kf.transpose(0, 1, 3, 2) / 8.0
    p = cp.exp(p - p.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vf
    g.execute(pack, ws.data.ptr, handle=handle)
    s.synchronize()
    eager = float(cp.abs(o.astype(cp.float32) - want).max())
    o.fill(0)
    s.begin_capture()
    g.execute(pack, ws.data.ptr, handle=handle)
    graph = s.end_capture()
    graph.launch(s)
    s.synchronize()
    captured = float(cp.abs(o.astype(cp.float32) - want).max())
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(s)
    for _ in range(100):
        graph.launch(s)
    e1.record(s)
    e1.synchronize()
    return {
        "cudnn_frontend": cudnn.__version__, "cudnn": cudnn.backend_version(),
        "max_err_eager": eager, "max_err_graph": captured,
        "device_ms_b8_h12_s128_d64": round(cp.cuda.get_elapsed_time(e0, e1) / 100, 4),
    }  # fmt: skip


if __name__ == "__main__":
    step("nvmath-python cuBLASLt: fp16 GEMM from raw pointers, in a CUDA graph", nvmath_gemm)
    step("cudnn-frontend: fp16 SDPA from raw pointers, in a CUDA graph", cudnn_sdpa)
