"""Benchmark: our EP vs ORT's CUDA EP, torch eager / torch.compile and ORT's CPU EP, in ONE process.

    python3 bench/run.py --out results.jsonl                       # every model, dtype and system
    python3 bench/run.py --models resnet50 --dtypes fp16 --systems migraphx_ep,ort_cuda_numpy
    python3 bench/run.py --models tests/models/resnet.onnx --systems ort_cpu --runs 5   # any file
    python3 bench/run.py --models resnet50,bert_base --dtypes fp16,int8,fp8 \
        --systems migraphx_ep_iobinding,ort_cuda_iobinding                     # int8/fp8 rows

Rows are (model, batch, dtype). Every system of a row gets the same seeded numpy inputs. Each result
is one JSON line, appended and flushed as soon as it exists, so a killed run keeps what it measured;
a failing system becomes a line with ``error`` and the run goes on. The first line of each invocation
is an ``env`` line (date, GPU, driver, versions). ``bench/report.py`` turns the lines into tables;
bench/README.md says what every time includes. int8/fp8 rows (the fp32 file quantised by our EP with
a calibration table, and ORT's QDQ model for the peers) are set up by ``quant_rows.py``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_rows  # noqa: E402
import specs  # noqa: E402
import systems  # noqa: E402
from report import short_error  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# For each comparison, the first of these systems that ran in the row is the reference.
REFERENCES = {
    "vs_ort_cuda": ("ort_cuda_numpy", "ort_cuda_iobinding"),
    "vs_torch": ("torch_eager", "torch_compile_default", "torch_compile_reduce-overhead"),
    "vs_ort_cpu": ("ort_cpu",),
}


def compare(ours: list[np.ndarray], ref: list[np.ndarray]) -> dict[str, Any]:
    """Worst over outputs of max|a-b| and of max|a-b| / max|b| (relative to the output's scale)."""
    if len(ours) != len(ref):
        return {"error": f"{len(ours)} outputs vs {len(ref)}"}
    worst = {"max_abs": 0.0, "max_rel": 0.0, "nonfinite": 0}
    for k, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a.shape != b.shape:
            return {"error": f"output {k}: shape {list(a.shape)} vs {list(b.shape)}"}
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        finite = np.isfinite(a64) & np.isfinite(b64)
        worst["nonfinite"] += int(np.count_nonzero(np.isfinite(b64) & ~np.isfinite(a64)))
        if not finite.any():
            continue
        diff = float(np.max(np.abs(a64 - b64)[finite]))
        scale = float(np.max(np.abs(b64[finite])))
        worst["max_abs"] = max(worst["max_abs"], diff)
        worst["max_rel"] = max(worst["max_rel"], diff / scale if scale > 0 else diff)
    return worst


def flag(result: dict[str, Any], dtype: str) -> dict[str, Any]:
    """``ok``: max_rel within the row dtype's tolerance (specs.MAX_REL) and no new non-finite value."""
    tol = specs.MAX_REL.get(dtype)
    if tol is None or "error" in result:
        return result
    return {**result, "tol": tol, "ok": result["max_rel"] <= tol and result["nonfinite"] == 0}


def accuracy(system: str, outputs: dict[str, list[np.ndarray]], dtype: str = "") -> dict[str, Any]:
    acc = {}
    for key, candidates in REFERENCES.items():
        ref = next((c for c in candidates if c in outputs and c != system), None)
        if ref is not None:
            acc[key] = flag({"ref": ref, **compare(outputs[system], outputs[ref])}, dtype)
    return acc


def quant_accuracy(outs: list[np.ndarray], row: systems.Row, quant: quant_rows.Quant) -> dict[str, Any]:
    """int8/fp8 rows: against the fp32 file's output (ORT CPU EP), never against a float16 peer."""
    ref, error = quant.reference(row)
    got = {"error": error} if ref is None else compare(outs, ref)
    return {"vs_fp32": flag({"ref": "fp32 model on ORT CPU EP", **got}, row.dtype)}


def _cmd(args: list[str]) -> str | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except Exception:
        return None


def worktree_tree() -> str | None:
    """The git tree id of the files as they are (every file git would not ignore), through a scratch
    index. The GPU machine's copy carries a stale .git, so its HEAD names an older commit; this id
    equals the tree of the commit that was measured, which ``report.py`` looks up where .git is current."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        try:
            for args in (["add", "-A", "."], ["write-tree"]):
                git = ["git", "-C", str(REPO), *args]
                out = subprocess.run(git, env=env, capture_output=True, text=True, timeout=60, check=True)
        except Exception:
            return None
    return out.stdout.strip() or None


def load_manifest(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / specs.MANIFEST
    return json.loads(path.read_text())["files"] if path.exists() else {}


def environment(args: argparse.Namespace, cuda_libs: str, manifest: dict[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {
        "kind": "env",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "argv": sys.argv[1:],
        "warmup": args.warmup,
        "runs": args.runs,
        "cuda_libs": cuda_libs,
        "git_commit": _cmd(["git", "-C", str(REPO), "rev-parse", "HEAD"]),
        "git_dirty": bool(_cmd(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])),
        "git_tree": worktree_tree(),
        "models": {
            f: {k: e.get(k) for k in ("exporter", "opset", "tiny", "torch", "versions", "bytes", "nodes")}
            for f, e in manifest.items()
        },
    }
    smi = _cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if smi:
        name, driver, memory = (s.strip() for s in smi.splitlines()[args.device_id].split(","))
        env.update(gpu=name, driver=driver, gpu_memory=memory)
    try:
        import onnxruntime as ort

        env.update(ort=ort.__version__, ort_file=ort.__file__, ort_providers=ort.get_available_providers())
    except Exception as e:
        env["ort"] = f"unavailable: {e}"
    for mod in ("onnx", "torch", "torchvision", "transformers", "migraphx_ep"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:
            env[mod] = f"unavailable: {type(e).__name__}"
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env.setdefault("gpu", torch.cuda.get_device_name(args.device_id))
    return env


def load_cuda_libs(wanted: list[str]) -> str:
    """Make cuDNN/cuBLAS/cudart visible to ORT's CUDA EP before any session exists.

    Importing torch first loads the nvidia-* libraries it ships with; without torch, onnxruntime's own
    ``preload_dlls`` loads them from the installed nvidia-* packages.
    """
    if not any(s.startswith(("ort_cuda", "torch", "migraphx")) for s in wanted):
        return "not needed"
    try:
        import torch  # noqa: F401

        return "torch"
    except ImportError:
        pass
    try:
        import onnxruntime as ort

        ort.preload_dlls()
        return "onnxruntime.preload_dlls"
    except Exception as e:
        return f"none ({type(e).__name__}: {e})"


class Writer:
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a")  # noqa: SIM115 - kept open for the whole run, closed in main

    def write(self, rec: dict[str, Any]) -> None:
        self.f.write(json.dumps(rec, default=_jsonable) + "\n")
        self.f.flush()


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def plan_rows(args: argparse.Namespace) -> list[tuple[str, str, int, Path, specs.Model | None]]:
    """(name, dtype, batch, file, spec) per row. A file given by path is a row of its own dtype (unless
    --dtypes names only int8/fp8), and an int8/fp8 row for each of those in --dtypes if it is fp32."""
    batches = [int(b) for b in args.batches.split(",")] if args.batches else None
    wanted = specs.parse_dtypes(args.dtypes)
    rows = []
    for name in args.models.split(","):
        if name in specs.MODELS:
            spec = specs.MODELS[name]
            for dtype in wanted:
                path = spec.file(args.model_dir, dtype)
                rows += [(name, dtype, b, path, spec) for b in batches or spec.batches]
        elif name.endswith(".onnx"):
            path = Path(name)
            dtype = specs.file_dtype(path) if path.exists() else "unknown"  # the row records the error
            float_rows = dtype == "unknown" or any(d in specs.DTYPES for d in wanted)  # not only int8/fp8
            own = [dtype] if float_rows else []
            quant = [d for d in wanted if d in specs.QUANT_DTYPES] if dtype == "fp32" else []
            rows += [(path.stem, d, b, path, None) for d in own + quant for b in batches or [1]]
        else:
            raise SystemExit(f"unknown model {name!r}: a name in {list(specs.MODELS)} or a path to .onnx")
    return rows


def run_row(
    row: systems.Row, wanted: list[str], writer: Writer, args: argparse.Namespace, quant: quant_rows.Quant
) -> None:
    outputs: dict[str, list[np.ndarray]] = {}
    quantised = row.dtype in specs.QUANT_DTYPES
    order = [s for s in systems.SYSTEMS if s in wanted]
    for k, system in enumerate(order):
        if system == "ort_cpu" and row.batch > 1 and not args.cpu_all_batches:
            continue  # the CPU EP is the slow baseline: batch 1 tells enough and saves minutes
        skip = quant_rows.skip_reason(system, row.dtype)
        if skip == "":
            continue  # not applicable to this dtype (our EP on the QDQ model outside int8 rows)
        base = {"kind": "result", "model": row.model, "batch": row.batch, "dtype": row.dtype}
        base["system"] = system
        print(f"[{time.strftime('%H:%M:%S')}] {row.model} bs{row.batch} {row.dtype} {system} ...", flush=True)
        if skip:
            writer.write({**base, "skipped": skip})
            print(f"    skipped: {skip}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            rec, outs = systems.SYSTEMS[system](quant.system_row(row, system))
            outputs[system] = [np.asarray(o) for o in outs]
            if quantised:  # against the fp32 model's output, not against a peer of the row
                rec = {**base, **rec, "accuracy": quant_accuracy(outputs[system], row, quant)}
                rec["quant"] = quant.record(row, system)
            else:
                rec = {**base, **rec, "accuracy": accuracy(system, outputs, row.dtype)}
        except Exception as e:
            lines = traceback.format_exc().strip().splitlines()
            rec = {**base, "error": f"{type(e).__name__}: {e}"[:2000], "traceback_tail": lines[-8:]}
            rec["unavailable"] = quant_rows.unavailable(e)
        rec["wall_s"] = time.perf_counter() - t0
        writer.write(rec)
        line = f"ERROR {short_error(rec['error'])}" if "error" in rec else _summary(rec)
        print(f"    {line}", flush=True)
        if not any(s.startswith("ort_cuda") for s in order[k + 1 :]):
            row.cache.pop("ort_cuda", None)  # its GPU memory is not left to the systems after it
        gc.collect()


def _summary(rec: dict[str, Any]) -> str:
    parts = [f"median {rec['ms']:.3f} ms (min {rec['ms_min']:.3f})"]
    if "cold" in rec:
        parts.append(f"cold {rec['cold']['total_s']:.2f} s, warm {rec['warm']['total_s']:.2f} s")
        parts.append(f"fallback {rec['placement']['fallback']} {rec['placement']['node_events']}")
    if "compile_s" in rec:
        parts.append(f"compile {rec['compile_s']:.2f} s")
    for key, acc in rec.get("accuracy", {}).items():
        if "error" in acc:
            parts.append(f"{key} {acc['error']}")
        else:
            over = "" if acc.get("ok", True) else f" OVER TOLERANCE {acc['tol']}"
            parts.append(f"{key} abs {acc['max_abs']:.2e} rel {acc['max_rel']:.2e}{over}")
    return "; ".join(parts)


def free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(specs.MODELS), help="names and/or .onnx paths, comma list")
    ap.add_argument(
        "--dtypes", default=",".join(specs.DTYPES), help=f"comma list of {','.join(specs.ALL_DTYPES)}"
    )
    ap.add_argument("--batches", default="", help="override every model's batch list, e.g. 1,32")
    ap.add_argument("--systems", default=",".join(systems.SYSTEMS), help="comma list; run order is fixed")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per system (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed runs first (default %(default)s)")
    ap.add_argument("--cpu-runs", type=int, default=10, help="at most this many timed runs for ort_cpu")
    ap.add_argument("--cpu-all-batches", action="store_true", help="ort_cpu on every batch, not only 1")
    ap.add_argument("--out", default="bench-results.jsonl", help="JSONL file, appended (default %(default)s)")
    ap.add_argument("--budget-s", type=float, default=0, help="start no new row after this many seconds")
    ap.add_argument("--model-dir", default=specs.DEFAULT_MODEL_DIR, help="where export_models.py wrote")
    ap.add_argument("--seq", type=int, default=specs.SEQ, help="symbolic non-batch dims of files by path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device-id", type=int, default=0)
    ap.add_argument("--torch-device", default="cuda", help="'cpu' only to debug the harness")
    ap.add_argument("--cap-s", type=float, default=60, help="per system: stop timing after this (>=3 runs)")
    ap.add_argument("--ep-option", action="append", default=[], help="extra migraphx_ep option key=value")
    ap.add_argument(
        "--calib", type=int, default=64, help="int8/fp8: calibration inputs (default %(default)s)"
    )
    ap.add_argument("--quant-ep-option", action="append", default=[], help="more options, int8/fp8 rows only")
    args = ap.parse_args()
    try:
        specs.parse_dtypes(args.dtypes)
    except ValueError as e:
        ap.error(str(e))

    wanted = args.systems.split(",")
    unknown = [s for s in wanted if s not in systems.SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; choose from {list(systems.SYSTEMS)}")
    settings = systems.Settings(
        warmup=args.warmup,
        runs=args.runs,
        cpu_runs=args.cpu_runs,
        device_id=args.device_id,
        torch_device=f"cuda:{args.device_id}" if args.torch_device == "cuda" else args.torch_device,
        cap_s=args.cap_s,
        ep_options=dict(kv.split("=", 1) for kv in args.ep_option),
    )
    rows = plan_rows(args)
    quant_options = dict(kv.split("=", 1) for kv in args.quant_ep_option)
    quant = quant_rows.Quant(args.model_dir, args.calib, args.seq, quant_options)
    writer = Writer(args.out)
    start = time.perf_counter()
    cuda_libs = load_cuda_libs(wanted)
    manifest = load_manifest(args.model_dir)
    writer.write(environment(args, cuda_libs, manifest))
    shared: dict[str, Any] = {}
    for k, (name, dtype, batch, path, spec) in enumerate(rows):
        elapsed = time.perf_counter() - start
        if args.budget_s and elapsed > args.budget_s:
            left = [{"model": n, "dtype": d, "batch": b} for n, d, b, _, _ in rows[k:]]
            writer.write({"kind": "skipped", "reason": f"budget {args.budget_s} s spent", "rows": left})
            print(f"budget spent after {elapsed:.0f} s: {len(left)} rows not started", flush=True)
            break
        if shared.get("torch_key", (name, dtype))[:2] != (name, dtype):
            shared.clear()  # the previous model's torch module: free it before building the next
            free_memory()
        try:
            if not path.exists():
                raise FileNotFoundError(f"{path} (run bench/export_models.py --out {args.model_dir})")
            if spec is None:
                feeds = specs.feeds_for_file(path, batch, args.seq, args.seed)
            else:
                feeds = specs.make_feeds(spec, batch, dtype, args.seed)
        except Exception as e:
            base = {"kind": "result", "model": name, "batch": batch, "dtype": dtype, "system": "*"}
            writer.write({**base, "error": f"{type(e).__name__}: {e}"})
            print(f"{name} bs{batch} {dtype}: ERROR {e}", flush=True)
            continue
        tiny = spec is not None and manifest.get(path.name, {}).get("tiny", False)
        row = systems.Row(name, dtype, batch, path, feeds, spec, settings, shared, tiny=tiny)
        run_row(row, wanted, writer, args, quant)
        del row
        free_memory()
    writer.f.close()
    print(f"done in {time.perf_counter() - start:.0f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
