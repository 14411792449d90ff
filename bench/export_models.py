"""Export the benchmark models (ResNet-50, BERT-base, GPT-2; random seeded weights) to ONNX, fp32 and fp16.

Run on the GPU machine (torch, torchvision and transformers are there; no network is needed: the
models are built from their configs)::

    python3 bench/export_models.py [--out /tmp/bench_models] [--models resnet50,bert_base,gpt2]

Each model is exported with ``torch.onnx.export(..., dynamo=False, opset_version=17,
do_constant_folding=True)`` (the TorchScript exporter) with a dynamic batch axis, so one file serves
every batch size; the fp16 file comes from ``model.half()`` on the GPU. If this torch no longer has
the TorchScript exporter, the dynamo exporter is used instead and the manifest says so (``exporter``,
``fallback_reason``). Files that exist and are in the manifest are skipped; a file is written under a
temporary name and renamed, so a killed export leaves nothing half-written. ``--tiny`` builds narrow
versions of the same architectures (same inputs) to debug the harness on a CPU.

The manifest (``manifest.json`` in ``--out``) lists, per file: model, dtype, inputs, outputs, opset,
exporter, versions, size, node count, export seconds and the largest difference between ORT's CPU EP
and the torch module at batch 1 (a check of the export itself; ``--no-check`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import specs  # noqa: E402
import torch_models  # noqa: E402

OPSET = 17
EXPORT_BATCH = 2  # not 1: a batch of 1 invites the tracer to bake the size into reshapes


def export_legacy(module: torch.nn.Module, args: tuple, path: Path, model: specs.Model) -> None:
    names = [i.name for i in model.inputs]
    axes = {n: {0: "batch"} for n in [*names, *model.outputs]}
    torch.onnx.export(
        module,
        args,
        str(path),
        input_names=names,
        output_names=list(model.outputs),
        dynamic_axes=axes,
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )


def export_dynamo(module: torch.nn.Module, args: tuple, path: Path, model: specs.Model) -> None:
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.onnx.export(
        module,
        args,
        input_names=[i.name for i in model.inputs],
        output_names=list(model.outputs),
        dynamic_shapes=tuple({0: batch} for _ in model.inputs),
        opset_version=max(OPSET, 18),  # the dynamo exporter starts at opset 18
        dynamo=True,
    )
    program.save(str(path))


def check_with_ort(path: Path, module: torch.nn.Module, name: str, dtype: str, device: str) -> dict:
    """Largest |ORT CPU - torch| per output at batch 1: catches a broken export before timing it."""
    import onnxruntime as ort

    feeds = specs.make_feeds(specs.MODELS[name], 1, dtype)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    with torch.no_grad():
        want = module(*torch_models.example_inputs(name, 1, dtype, device))
    return {
        out: float(np.max(np.abs(g.astype(np.float64) - w.float().cpu().numpy().astype(np.float64))))
        for out, g, w in zip(specs.MODELS[name].outputs, got, want, strict=True)
    }


def export_one(name: str, dtype: str, out: Path, device: str, tiny: bool, check: bool) -> dict:
    model = specs.MODELS[name]
    path = model.file(out, dtype)
    module = torch_models.build(name, dtype, device, tiny)
    args = torch_models.example_inputs(name, EXPORT_BATCH, dtype, device)
    tmp = path.with_name(path.name + ".tmp")
    entry: dict = {"exporter": "torchscript"}
    t0 = time.perf_counter()
    with torch.no_grad():
        try:
            export_legacy(module, args, tmp, model)
        except Exception as e:  # the TorchScript exporter may be gone (or break) in this torch
            print(f"  TorchScript export failed ({type(e).__name__}: {e}); trying dynamo", flush=True)
            entry = {"exporter": "dynamo", "fallback_reason": f"{type(e).__name__}: {e}"[:500]}
            export_dynamo(module, args, tmp, model)
    seconds = time.perf_counter() - t0
    os.replace(tmp, path)
    proto = onnx.load(str(path), load_external_data=False)
    graph_in = {v.name for v in proto.graph.input} - {t.name for t in proto.graph.initializer}
    entry.update(
        file=path.name,
        model=name,
        dtype=dtype,
        tiny=tiny,
        inputs=[
            {"name": i.name, "kind": i.kind, "shape": list(i.shape), "in_graph": i.name in graph_in}
            for i in model.inputs
        ],
        outputs=list(model.outputs),
        opset=max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=None),
        ir_version=proto.ir_version,
        nodes=len(proto.graph.node),
        bytes=path.stat().st_size,
        export_s=round(seconds, 2),
        device=device,
        torch=torch.__version__,
        versions=_versions(),
    )
    if check:
        try:
            entry["check_max_abs_ort_cpu_vs_torch_bs1"] = check_with_ort(path, module, name, dtype, device)
        except Exception as e:
            entry["check_error"] = f"{type(e).__name__}: {e}"[:500]
    return entry


def _versions() -> dict:
    out = {"onnx": onnx.__version__}
    for mod in ("torchvision", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:
            out[mod] = f"unavailable: {e}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=specs.DEFAULT_MODEL_DIR, help="output folder (default %(default)s)")
    ap.add_argument("--models", default=",".join(specs.MODELS), help="comma list (default: all)")
    ap.add_argument("--dtypes", default=",".join(specs.DTYPES), help="comma list of fp32,fp16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="narrow models of the same architectures")
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the ORT CPU check")
    ap.add_argument("--force", action="store_true", help="re-export files that exist")
    a = ap.parse_args()

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / specs.MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    failed = 0
    for name in a.models.split(","):
        if name not in specs.MODELS:
            ap.error(f"unknown model {name!r}; choose from {', '.join(specs.MODELS)}")
        for dtype in a.dtypes.split(","):
            path = specs.MODELS[name].file(out, dtype)
            known = manifest["files"].get(path.name)
            if not a.force and path.exists() and known and known.get("tiny") == a.tiny:
                print(f"{path}: exists, skipped", flush=True)
                continue
            print(f"{path}: exporting ({a.device}{', tiny' if a.tiny else ''})", flush=True)
            try:
                entry = export_one(name, dtype, out, a.device, a.tiny, a.check)
            except Exception as e:
                failed += 1
                print(f"  FAILED: {type(e).__name__}: {e}", flush=True)
                continue
            finally:
                if a.device == "cuda":
                    torch.cuda.empty_cache()
            manifest["files"][path.name] = entry
            manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")  # after each file: kill-safe
            size = f"{entry['nodes']} nodes, {entry['bytes'] / 1e6:.1f} MB"
            print(f"  {size}, exported in {entry['export_s']} s by {entry['exporter']}", flush=True)
            if "check_max_abs_ort_cpu_vs_torch_bs1" in entry:
                print(f"  ORT CPU vs torch (bs1): {entry['check_max_abs_ort_cpu_vs_torch_bs1']}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
