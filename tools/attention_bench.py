"""One fused-attention launch on the GPU, timed as the program replays it: the chain (the tests' own
builder, ``tests/gpu/attentioncheck.py``) compiled for the gpu target, each of its steps captured 50 times
in a CUDA graph, the best of 15 replays per launch; with the error against the ref. Usage:

    python tools/attention_bench.py [CASE ...]       # cases: see CASES; all by default

``MIGRAPHX_EP_ATTENTION_KEY_WARPS=1|2|4`` forces the key split, ``MIGRAPHX_EP_DISABLE_PASSES=fuse_attention``
times the unfused chain, ``--attrs`` prints each kernel's registers and local memory. The numbers in
``kernels/attention_mma.py`` (``SPLIT4_BELOW``) and the README come from this tool on an H100.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the chain builder of the tests

from gpu_profile import step_times  # noqa: E402 - tools/, the script's folder

from gpu.attentioncheck import Chain, chain, feeds, fused  # noqa: E402
from migraphx_ep.ir.evaluate import run_module  # noqa: E402
from migraphx_ep.ir.program import Program  # noqa: E402
from migraphx_ep.targets import get_target  # noqa: E402
from migraphx_ep.targets.gpu import cuda  # noqa: E402

F16 = np.float16
CASES = {  # fp16, 12 heads, head dim 64: BERT-base / GPT-2 / ViT-B shapes
    "bert_bs1": Chain(b=1, h=12, s=128, d=64, dtype=F16),
    "bert_bs8": Chain(b=8, h=12, s=128, d=64, dtype=F16),
    "bert_bs32": Chain(b=32, h=12, s=128, d=64, dtype=F16),
    "gpt2_bs1": Chain(b=1, h=12, s=128, d=64, dtype=F16, qkv=True, mask="causal"),
    "seq384_bs1": Chain(b=1, h=12, s=384, d=64, dtype=F16),
    "seq1024_bs1": Chain(b=1, h=12, s=1024, d=64, dtype=F16),
    "vit_bs1": Chain(b=1, h=12, s=197, d=64, dtype=F16, mask="none"),
}


def attrs(exe) -> list[str]:  # noqa: ANN001
    drv = cuda.cu
    a = drv.CUfunction_attribute
    lines = []
    for launch in exe._launches:
        k = getattr(launch, "kernel", None)
        if k is not None:
            regs = drv.cuFuncGetAttribute(a.CU_FUNC_ATTRIBUTE_NUM_REGS, k.func)[1]
            local = drv.cuFuncGetAttribute(a.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, k.func)[1]
            lines.append(f"  {launch.label}: {regs} registers, {local} B local, {launch.shared} B shared, "
                         f"grid {launch.grid}")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", help=f"of {', '.join(CASES)} (default: all)")
    ap.add_argument("--attrs", action="store_true")
    a = ap.parse_args()
    unknown = [c for c in a.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}: choose from {', '.join(CASES)}")
    for name in a.cases or CASES:
        c = CASES[name]
        prog = Program()
        prog.modules["main"] = chain(c)
        prog.compile(get_target("gpu"))
        params = feeds(chain(c), seed=0, masked_rows=False)
        got = prog.run_numpy(params)[0].astype(np.float32)
        err = float(np.nanmax(np.abs(got - run_module(chain(c), params)[0].astype(np.float32))))
        times = step_times(prog._exe)
        detail = ", ".join(f"{k.split(':')[1]} {v:.1f}" for k, v in times.items())
        nf = len(fused(prog.get_main_module()))
        total = sum(times.values())
        print(f"{name:12s} fused={nf} max err {err:.2e}  {total:6.1f} us  [{detail}]", flush=True)
        if a.attrs:
            print("\n".join(attrs(prog._exe)))


if __name__ == "__main__":
    main()
