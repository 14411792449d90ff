"""Create, run and destroy sessions in a loop on the gpu target; print device and host memory as it goes,
so a leak shows as growth. Usage: ``python tools/session_cycles.py [resnet50 | MODEL.onnx] [--cycles 200]``
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
from pathlib import Path

import onnxruntime as ort

import migraphx_ep

sys.path.insert(0, str(Path(__file__).parent))
from run_overhead import _feeds, _model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="resnet50")
    ap.add_argument("--cycles", type=int, default=200)
    a = ap.parse_args()
    from cuda.bindings import driver as cu

    model = _model(a.model)
    blob = model.SerializeToString()
    feeds = _feeds(model, 1, 128)
    providers = [(migraphx_ep.get_ep_name(), {"migraphx_target": "gpu"}), "CPUExecutionProvider"]
    marks = {}
    for i in range(1, a.cycles + 1):
        sess = ort.InferenceSession(blob, providers=providers)
        sess.run(None, feeds)
        del sess
        gc.collect()
        if i in (10, a.cycles // 2, a.cycles):
            free = cu.cuMemGetInfo()[1]
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
            marks[i] = (free, rss)
            print(f"cycle {i}: device free {free / 2**20:.0f} MiB, host max RSS {rss} MiB", flush=True)
    (f10, r10), (fn, rn) = marks[10], marks[a.cycles]
    grew = (f10 - fn) / 2**20
    print(f"from cycle 10 to {a.cycles}: device {grew:+.1f} MiB used, host max RSS {rn - r10:+d} MiB")


if __name__ == "__main__":
    main()
