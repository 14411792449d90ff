"""The CPU part of compiling one fused subgraph for never-seen input shapes, on a machine without a GPU:

    python3 bench/compile_stages.py MODEL.onnx --shape batch=1,sequence=128 --shape batch=4,sequence=128
        [--fp16-enable] [--no-share] [--repeat 3]

Per ``--shape`` (a symbolic dim's size, for every input that has it), in order, what ``CompiledSubgraph``
runs for the gpu target up to the device: parse, quantize (``--fp16-enable``), the gpu passes, lowering,
and the host side of the weights upload (``DeviceWeights`` over a fake device: the bytes staged for the
device, where the real executable would copy them). All shapes share one ``WeightCache``, as the
compiles of one subgraph do; ``--no-share`` gives each its own (and its own device copies). Prints
milliseconds per stage and shape; ``--repeat`` runs the whole sequence again in fresh caches and keeps
each cell's minimum. Models: ``bench/synth_models.py`` writes BERT-base and ResNet-50 ones.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import onnx

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import from_onnx
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ir.weights import WeightCache
from migraphx_ep.passes import run_passes
from migraphx_ep.quantize import quantize_fp16
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.weights import DeviceWeights
from migraphx_ep.timing import record, stage

STAGES = ("parse", "quantize", "passes", "lowering", "weights upload")


class HostBlock:
    """A fake device block: an address and nothing behind it (the staging copy is what is timed)."""

    next_ptr = 1 << 40

    def __init__(self, nbytes: int) -> None:
        self.ptr, self.nbytes = HostBlock.next_ptr, nbytes
        HostBlock.next_ptr += nbytes + 256


def _shapes(graph: dict, dims: dict[str, int]) -> dict[str, Shape]:
    out = {}
    for name in graph["inputs"]:
        info = graph["values"][name]
        lens = [d if isinstance(d, int) and d >= 0 else dims[d] for d in info["shape"]]
        out[name] = Shape(from_onnx(info["dtype"]), lens)
    return out


def compile_shapes(graph: dict, shapes: list[dict[str, int]], fp16: bool, share: bool) -> list[dict]:
    """Stage seconds per shape (and the bytes staged for the device)."""
    cache, device = WeightCache(), DeviceWeights(HostBlock, lambda block, host: None)
    held = []  # the compiled programs stay alive, as in the subgraph's program cache
    rows = []
    for dims in shapes:
        if not share:
            cache, device = WeightCache(), DeviceWeights(HostBlock, lambda block, host: None)
        with record() as times:
            prog = parse_graph(graph, _shapes(graph, dims), specialize=True, weights=cache).program
            if fp16:
                with stage("quantize"):
                    quantize_fp16(prog)
            for m in prog.modules.values():
                run_passes(m, gpu_pipeline(cache))
            with stage("lowering"):
                lowered = lower(prog.get_main_module(), True, True, weights=cache)
            with stage("weights upload"):
                placed = device.place(lowered.weights)
        held.append((prog, lowered, placed))
        rows.append(
            {**{s: times.seconds(s) for s in STAGES}, "total": times.total, "staged": placed.uploaded}
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", required=True, help="NAME=SIZE[,NAME=SIZE...], in order")
    ap.add_argument("--fp16-enable", action="store_true", help="quantize_fp16 as migraphx_fp16_enable")
    ap.add_argument("--no-share", action="store_true", help="a fresh weight cache per shape")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)
    shapes = [{k: int(v) for k, v in (kv.split("=") for kv in s.split(","))} for s in args.shape]
    t0 = time.perf_counter()
    graph = model_to_dict(onnx.load(args.model))
    print(f"{args.model}: loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    runs = [compile_shapes(graph, shapes, args.fp16_enable, not args.no_share) for _ in range(args.repeat)]
    cols = [s for s in (*STAGES, "total") if any(r[s] for run in runs for r in run)]
    print(f"{'shape':<28}" + "".join(f"{c:>16}" for c in cols) + f"{'staged MB':>12}")
    for i, dims in enumerate(shapes):
        cells = [min(run[i][c] for run in runs) * 1e3 for c in cols]
        label = ",".join(f"{k}={v}" for k, v in dims.items())
        print(f"{label:<28}" + "".join(f"{v:16.1f}" for v in cells) + f"{runs[0][i]['staged'] / 2**20:12.1f}")
    if len(shapes) > 1:
        later = [min(run[i]["total"] for run in runs) * 1e3 for i in range(1, len(shapes))]
        print(f"never-seen shapes after the first: median total {np.median(later):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
