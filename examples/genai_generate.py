"""Generate text with ONNX Runtime GenAI on MIGraphXExecutionProvider, checked against ORT's CPU EP.

    python examples/genai_generate.py                       # a tiny random-weight Llama, fp32
    python examples/genai_generate.py --arch qwen2 --precision int4
    python examples/genai_generate.py --model path/to/genai/model --prompt "Hello" --new-tokens 32

With torch + transformers installed, the tiny model is built by tools/make_genai_models.py (GenAI's own
model builder) into a folder under the system's temp directory and reused from there; without them the
copy committed in tests/models/genai is used. Prints the token ids and text from both EPs, whether
they are identical, and where the nodes ran (ORT's profiler, through GenAI's session options). The
weights are random, so the text is gibberish: the point is that both EPs produce the same tokens.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime_genai as og

import migraphx_ep
from migraphx_ep import genai

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "models" / "genai"
EP = migraphx_ep.get_ep_name()


def tiny_model(arch: str, precision: str) -> Path:
    """A tiny GenAI model folder: built by the tool where it can run, else the committed fixture."""
    name = f"{arch}_{precision}"
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        out = Path(tempfile.gettempdir()) / "migraphx_ep_genai_models"
        if not (out / name / "genai_config.json").is_file():
            print(f"building {name} with tools/make_genai_models.py into {out}")
            tool = [sys.executable, str(REPO / "tools" / "make_genai_models.py"), "--out", str(out)]
            subprocess.run(
                [*tool, "--only", arch, "--precisions", precision], check=True, stdout=subprocess.DEVNULL
            )
        return out / name
    if not (FIXTURES / name / "genai_config.json").is_file():
        known = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []
        raise SystemExit(
            f"no committed model {name} in {FIXTURES} (have {known}); install torch + transformers"
        )
    return FIXTURES / name


def parse_options(pairs: list[str]) -> dict[str, str]:
    opts = {"migraphx_target": "ref"}  # what is verified with GenAI today (see README)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--option {pair!r}: expected KEY=VALUE")
        opts[key] = value
    return opts


def generate(
    model_dir: Path, prompt: str, new_tokens: int, options: dict[str, str] | None, profile: str = ""
):
    """(token ids, text, seconds) on our EP (``options`` given) or on ORT's CPU EP (``None``)."""
    if options is None:
        cfg = og.Config(str(model_dir))
        cfg.clear_providers()
    else:
        cfg = genai.config(model_dir, options, og=og)
    if profile:
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"enable_profiling": profile}}}}))
    model = og.Model(cfg)
    tokenizer = og.Tokenizer(model)
    start = time.perf_counter()
    prompt_ids = [int(t) for t in tokenizer.encode(prompt)]
    ids = genai.generate_greedy(model, prompt_ids, new_tokens, og)
    seconds = time.perf_counter() - start
    text = tokenizer.decode(prompt_ids + ids)  # random weights: the new part is mostly stray bytes
    del tokenizer, model
    gc.collect()  # the session ends with the model, and ORT writes its profile then
    return ids, text, seconds


def placement(profile_dir: str) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for path in Path(profile_dir).glob("*.json"):
        events = json.loads(path.read_text())
        counts.update(
            (e["args"]["provider"], e["args"].get("op_name", "?"))
            for e in events
            if e.get("cat") == "Node" and "provider" in e.get("args", {})
        )
        path.unlink()
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a GenAI model folder (genai_config.json, model.onnx...)")
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2", "phi3"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "int4"])
    ap.add_argument("--prompt", default="the quick brown fox")
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--option", action="append", default=[], help="provider option KEY=VALUE (repeatable)")
    args = ap.parse_args()
    if args.new_tokens < 1:
        raise SystemExit("--new-tokens must be >= 1")
    model_dir = args.model if args.model is not None else tiny_model(args.arch, args.precision)
    options = genai.provider_options(parse_options(args.option))
    print(f"model: {model_dir}\noptions: {options}")

    cpu_ids, cpu_text, cpu_s = generate(model_dir, args.prompt, args.new_tokens, None)
    with tempfile.TemporaryDirectory(prefix="genai_profile_") as prof:
        ids, text, s = generate(model_dir, args.prompt, args.new_tokens, options, os.path.join(prof, "p"))
        where = placement(prof)
    print(f"{EP:28s} {ids} {text!r} ({s:.2f} s, compiles included)")
    print(f"{'CPUExecutionProvider':28s} {cpu_ids} {cpu_text!r} ({cpu_s:.2f} s)")
    print("node events per provider (ORT profiler; a fused partition is one event per run):")
    for (provider, op), n in sorted(where.items()):
        print(f"  {provider:28s} {op[:60]:60s} {n}")
    print("ORT_MIGRAPHX_DUMP_MODEL_OPS=1 lists every node as claimed or refused, with the reason.")
    same = ids == cpu_ids
    print("tokens identical to ORT's CPU EP" if same else "tokens DIFFER from ORT's CPU EP")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
