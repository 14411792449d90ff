"""The torch peer of bench/llm.py: HF transformers ``generate`` with a static KV cache, eager or compiled.

- ``torch_eager``: ``model.generation_config.cache_implementation = "static"``, nothing compiled;
- ``torch_compile``: the same plus ``model.forward = torch.compile(model.forward, mode="reduce-overhead",
  fullgraph=True)``, transformers' documented recipe for a static cache with torch.compile (CUDA graphs).

Both load the transformers checkpoint that ``llm.py --build`` keeps beside the ONNX models (``<build>/hf``,
or ``--hf``) in the row's precision (fp16/fp32/bf16: the dtype of the ONNX model's KV cache; int4 rows are
skipped: the ONNX int4 weights have no torch counterpart here) on cuda:0, and generate from the same
prompt ids, greedy, exactly ``new`` tokens. Transformers' own automatic compile of the decode step under a
static cache (``generation_config.disable_compile``, newer versions) is turned off in both: eager stays
eager, and the recipe's compiled ``forward`` is not wrapped in a second compile. The first generation
(eager) makes the static cache; the later ones get that cache back, ``reset()`` (see ``_measure``).

A stopping criterion stamps the time (after ``torch.cuda.synchronize()``) as each new token is appended:
time to first token is the start of ``generate`` (prompt ids still in host memory, as for the other
systems) to the first stamp; decode tokens/s is ``batch * (new - 1)`` over the first to the last stamp.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

SYSTEMS = ("torch_eager", "torch_compile")
DTYPES = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16"}  # row precision -> torch dtype name
HEAD = 16  # generated ids of batch row 0 kept in the JSON line
DEVICE = "cuda:0"  # only a harness check on a machine without a GPU would set "cpu"


def row_precision(path: Path) -> str:
    """The precision GenAI's builder gave the model in ``path``: ``int4`` where its decoder has
    MatMulNBits, else the element type of its KV cache (``fp16``, ``fp32``, ``bf16``)."""
    import json

    import onnx

    dec = json.loads((path / "genai_config.json").read_text())["model"]["decoder"]
    m = onnx.load(str(path / dec["filename"]), load_external_data=False)
    if any(n.op_type == "MatMulNBits" for n in m.graph.node):
        return "int4"
    kinds = {i.name: i.type.tensor_type.elem_type for i in m.graph.input}
    kv = kinds[dec["inputs"]["past_key_names"] % 0]
    names = {
        onnx.TensorProto.FLOAT16: "fp16",
        onnx.TensorProto.FLOAT: "fp32",
        onnx.TensorProto.BFLOAT16: "bf16",
    }
    return names.get(kv, onnx.TensorProto.DataType.Name(kv).lower())


def hf_folder(model: Path, hf: Path | None = None) -> Path:
    """The transformers checkpoint: ``hf`` if given, else ``<build>/hf`` beside ``<build>/<precision>``."""
    return hf if hf is not None else model.parent / "hf"


def _counter(group: str, key: str) -> int | None:
    """One of torch._dynamo's counters (graphs compiled, CUDA graph skips), None where this torch lacks it."""
    try:
        from torch._dynamo.utils import counters

        return int(counters[group][key])
    except Exception:  # noqa: BLE001 - a private API: its absence only drops a diagnostic field
        return None


def _diff(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _sync(torch: Any) -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _generate(torch: Any, transformers: Any, model: Any, prompts: np.ndarray, new: int, cache: Any) -> dict:
    """One timed ``generate``: stamps per new token, after a CUDA synchronisation. ``cache``: None (generate
    makes its static cache, per ``cache_implementation``) or the one made so, ``reset()`` and passed in."""
    b, p = prompts.shape
    stamps: list[float] = []
    not_done = torch.zeros(b, dtype=torch.bool, device=DEVICE)

    class Stamp(transformers.StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            _sync(torch)
            stamps.append(time.perf_counter())
            return not_done

    host_ids = torch.from_numpy(np.ascontiguousarray(prompts, dtype=np.int64))
    _sync(torch)
    t0 = time.perf_counter()
    ids = host_ids.to(DEVICE)
    if cache is not None:
        cache.reset()  # zeroed in place: the same tensors, so the compiled graphs and CUDA graphs hold
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
        num_beams=1, pad_token_id=0, stopping_criteria=transformers.StoppingCriteriaList([Stamp()]),
        return_dict_in_generate=True, **({} if cache is None else {"past_key_values": cache}),
    )  # fmt: skip
    _sync(torch)
    end = time.perf_counter()
    tokens = out.sequences[:, p:].cpu().numpy()
    if tokens.shape != (b, new) or len(stamps) != new:
        raise RuntimeError(f"generate gave {tokens.shape[1]} new tokens ({len(stamps)} stamps), not {new}")
    steps = np.diff(stamps)
    return {
        "ttft_ms": 1e3 * (stamps[0] - t0),
        "decode_tok_s": b * (new - 1) / (stamps[-1] - stamps[0]) if new > 1 else None,
        "decode_step_ms_median": 1e3 * float(np.median(steps)) if new > 1 else None,
        "generate_s": end - t0,
        "tokens": tokens,
        "cache": out.past_key_values,
    }


def _measure(torch: Any, transformers: Any, system: str, folder: Path, dtype: Any, prompts: np.ndarray,
             new: int, warmup: int) -> dict:  # fmt: skip
    from packaging.version import Version

    new_api = Version(transformers.__version__) >= Version("4.56")  # `torch_dtype` became `dtype`
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, **({"dtype": dtype} if new_api else {"torch_dtype": dtype})
    )
    model = model.to(DEVICE, dtype=dtype).eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.disable_compile = True  # no automatic compile of the decode step by generate
    rec: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch."),
        "attn": getattr(model.config, "_attn_implementation", None),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    # The first generation, eager, makes the static cache: its tensors are made (and marked as static
    # addresses for torch.compile) outside any compiled region, where newer transformers make them lazily
    # at the first forward. Newer transformers also make a new cache per generate; older ones kept one.
    # So from here on that one cache is passed in, reset() first (transformers' documented reuse), and the
    # compiled graphs see the same tensors at every call. Its tokens check the compiled model against eager.
    first = _generate(torch, transformers, model, prompts, new, None)
    cache = first.pop("cache")
    model.generation_config.cache_implementation = None  # transformers refuses it beside past_key_values
    rec["cache_init_s"] = first["generate_s"]
    if system == "torch_compile":
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    graphs0, skips0 = _counter("stats", "unique_graphs"), _counter("inductor", "cudagraph_skips")
    runs = [_generate(torch, transformers, model, prompts, new, cache) for _ in range(max(warmup, 1))]
    rec["warmup_s"] = [round(r["generate_s"], 4) for r in runs]
    cold = runs[0] if system == "torch_compile" else first  # the system's first generation
    rec["cold_ttft_ms"], rec["cold_decode_tok_s"] = cold["ttft_ms"], cold["decode_tok_s"]
    if system == "torch_compile":
        rec["compile_s"] = runs[0]["generate_s"]  # Dynamo + Inductor for prefill and decode, in one generate
        rec["dynamo_graphs"] = _diff(_counter("stats", "unique_graphs"), graphs0)
        rec["cudagraph_skips"] = _diff(_counter("inductor", "cudagraph_skips"), skips0)
    graphs1 = _counter("stats", "unique_graphs")
    timed = _generate(torch, transformers, model, prompts, new, cache)
    del timed["cache"]
    rec.update(timed)
    if system == "torch_compile":
        rec["compiles_in_timed_run"] = _diff(_counter("stats", "unique_graphs"), graphs1)
        rec["tokens_match_own_eager"] = float(np.mean(timed["tokens"] == first["tokens"]))
    rec["tokens_stable"] = all(np.array_equal(r["tokens"], timed["tokens"]) for r in runs)
    return rec


def run_torch(system: str, path: Path, prompts: np.ndarray, new: int, hf: Path | None = None,
              warmup: int = 3) -> dict:  # fmt: skip
    """One torch system on one batch of prompts: a result dict for llm.py's JSON line (``tokens`` included),
    or ``skipped`` / ``error`` (+ ``unavailable``) where it cannot run. Raises on failures while running."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown torch system {system!r}: one of {', '.join(SYSTEMS)}")
    precision = row_precision(path)
    if precision not in DTYPES:
        why = f"{precision} model: torch runs the float checkpoint only (the ONNX {precision} weights have no"
        return {"skipped": f"{why} torch counterpart here)", "precision": precision}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: never ask the hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        import transformers
    except ImportError as e:
        return {"error": f"{type(e).__name__}: {e}", "unavailable": True}
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        return {
            "error": "torch sees no CUDA device (torch.cuda.is_available() is False)",
            "unavailable": True,
        }
    folder = hf_folder(path, hf)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"no transformers checkpoint in {folder}: rebuild with llm.py --build (it keeps <build>/hf)"
            " or pass --hf"
        )
    dtype = getattr(torch, DTYPES[precision])
    torch._dynamo.reset()  # each row compiles from nothing: no automatic-dynamic state from the row before
    try:
        rec = _measure(torch, transformers, system, folder, dtype, prompts, new, warmup)
    finally:
        torch._dynamo.reset()  # drops the compiled code and its CUDA graphs (and the model they hold)
        gc.collect()
        if DEVICE.startswith("cuda"):
            torch.cuda.empty_cache()
    return {**rec, "precision": precision, "hf": str(folder)}
