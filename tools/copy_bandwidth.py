"""Host<->GPU copies through the EP's data transfer: pageable numpy arrays copied with the driver's own
pageable path against the shell's pinned staging (``csrc/host_staging.h``), in interleaved blocks in one
process. Usage (GPU machine):

    python tools/copy_bandwidth.py [--sizes-mb 1,2,4,8] [--blocks 6] [--sweep] [--json OUT.jsonl]

Host to device is ``OrtValue.ortvalue_from_numpy(x, 'cuda', 0)``; device to host is ``OrtValue.numpy()``:
both go through our ``CopyTensors`` as ORT's own copies for a Run do (ORT's allocations included alike).
Every size is staged here, also below the default smallest staged copy, so the rows show where staging
starts to pay. ``--sweep`` also times the default chunk size with 4 threads and fixed chunks of 1, 2 and
4 MiB with 8. Each setting's bytes are checked after a round trip.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnxruntime as ort
from run_overhead import _median_ms  # tools/ is the script's directory, on sys.path

from migraphx_ep import _C  # registers the EP library with ORT: its data transfer does the copies

MiB = 1 << 20


def measure(nbytes: int, settings: dict[str, tuple[int, int] | None], blocks: int, per_block: int) -> dict:
    """Median ms per direction and setting (None: the driver's copy; else staged in (chunk, threads))."""
    host = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dev = ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)
    times: dict[str, list[float]] = {f"{d}_{k}": [] for k in settings for d in ("h2d", "d2h")}
    try:
        for _ in range(blocks):
            for name, staged in settings.items():
                _C.reset_staging()
                if staged is None:
                    _C.configure_staging(False)
                else:  # (0, 0): the default chunk and threads
                    _C.configure_staging(True, chunk_bytes=staged[0], threads=staged[1], min_bytes=1)
                h2d = lambda: ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)  # noqa: E731
                times[f"h2d_{name}"].append(_median_ms(h2d, per_block))
                times[f"d2h_{name}"].append(_median_ms(dev.numpy, per_block))
                if not np.array_equal(h2d().numpy(), host):
                    raise SystemExit(f"{nbytes} bytes: the round trip changed the data ({name})")
    finally:
        _C.reset_staging()
    row: dict = {"bytes": nbytes, "mb": round(nbytes / MiB, 3), "default_threads": _C.copy_threads()}
    for k, v in times.items():
        row[f"{k}_ms"] = float(np.median(v))
    for name in settings:
        if name != "driver":
            row[f"h2d_{name}_speedup"] = row["h2d_driver_ms"] / row[f"h2d_{name}_ms"]
            row[f"d2h_{name}_speedup"] = row["d2h_driver_ms"] / row[f"d2h_{name}_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="1,1.5,2,3,4,6,8,16,64")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=10)
    ap.add_argument("--sweep", action="store_true", help="also chunk sizes x threads")
    ap.add_argument("--json", help="append one JSON row per size here")
    a = ap.parse_args()
    if _C.device_io_status():
        raise SystemExit(f"no GPU memory to copy to: {_C.device_io_status()}")
    settings: dict[str, tuple[int, int] | None] = {"driver": None, "staged": (0, 0)}  # 0: the default
    if a.sweep:
        settings["auto_t4"] = (0, 4)  # the default chunk size (by the copy's size) with 4 threads
        for chunk in (1, 2, 4):
            settings[f"c{chunk}t8"] = (chunk * MiB, 8)
    for mb in a.sizes_mb.split(","):
        row = measure(int(float(mb) * MiB), settings, a.blocks, a.per_block)
        line = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
        print(line, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
