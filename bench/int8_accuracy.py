"""int8 / fp8 accuracy of ``migraphx_int8_enable`` / ``migraphx_fp8_enable`` with a calibration table made
by ONNX Runtime's own calibrator, against the same model in float on the same EP:

    python3 bench/int8_accuracy.py /tmp/bench_models/resnet50_fp32.onnx --images 256 [--target gpu]
    python3 bench/int8_accuracy.py /tmp/bench_models/bert_base_fp32.onnx --batch 8 --seq 128

Calibration: ``onnxruntime.quantization.create_calibrator`` (MinMax) over ``--calib`` random-but-fixed
inputs (seeds 1000, 1001, ...), written by ``write_calibration_table`` (``calibration.json``, the format
the ``migraphx_int8_calibration_table_name`` option reads with ``..._use_native_calibration_table=0``);
the code is ``quant_rows.calibrate``, which the benchmark's int8/fp8 rows use too.
Evaluation on other random-but-fixed inputs (seed 2): for a classifier (one 2-D output) the share of
inputs whose top-1 class agrees with float; for any model the largest |quantised - float| relative to
the largest |float|. Prints one JSON line per mode.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from jsonl import emit  # bench/ is the script's folder: on sys.path
from quant_rows import calibrate

import migraphx_ep
from migraphx_ep.testing import random_feeds

EP = migraphx_ep.get_ep_name()


def feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    return random_feeds(model, lambda axis, _: batch if axis == 0 else seq, np.random.default_rng(seed))


def run(path: str, options: dict, batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    sess = ort.InferenceSession(path, providers=[(EP, options), "CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in batches]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--images", type=int, default=256, help="evaluation inputs")
    ap.add_argument("--calib", type=int, default=64, help="calibration inputs")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--target", default="gpu")
    ap.add_argument("--modes", default="int8,fp8")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    model = onnx.load(a.model, load_external_data=False)
    evals = [feeds(model, a.batch, a.seq, 2000 + i) for i in range(max(1, a.images // a.batch))]
    base = {"migraphx_target": a.target}
    want = run(a.model, base, evals)
    with tempfile.TemporaryDirectory(prefix="calib_") as tmp:
        samples = [feeds(model, a.batch, a.seq, 1000 + i) for i in range(max(1, a.calib // a.batch))]
        table = calibrate(a.model, samples, Path(tmp))
        for mode in a.modes.split(","):
            opts = {
                **base,
                f"migraphx_{mode}_enable": "1",
                "migraphx_int8_calibration_table_name": str(table),
                "migraphx_int8_use_native_calibration_table": "0",
            }
            try:
                got = run(a.model, opts, evals)
            except Exception as e:  # noqa: BLE001 - a mode this GPU cannot run is a row, not a crash
                print(json.dumps({"mode": mode, "error": f"{type(e).__name__}: {e}"[:400]}), flush=True)
                continue
            rec: dict = {"model": Path(a.model).name, "mode": mode, "target": a.target, "inputs": a.images}
            scale = max(float(np.abs(w).max()) for w in want)
            rec["max_abs_err_rel_to_max"] = (
                max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True)) / scale
            )
            if want[0].ndim == 2:  # a classifier's logits: top-1 agreement
                agree = np.concatenate([g.argmax(1) == w.argmax(1) for g, w in zip(got, want, strict=True)])
                rec["top1_agreement"] = float(agree.mean())
            emit(rec, a.out)


if __name__ == "__main__":
    main()
