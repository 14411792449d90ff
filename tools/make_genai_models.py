"""Build tiny random-weight decoders for ONNX Runtime GenAI into tests/models/genai/.

Run with a throwaway environment that has torch + transformers (the tests need neither)::

    python3 -m venv /tmp/vgenai
    /tmp/vgenai/bin/pip install torch==2.13.0 transformers tokenizers onnx onnxruntime-genai
    /tmp/vgenai/bin/python tools/make_genai_models.py [--out tests/models/genai] [--only llama,qwen2]

Each architecture comes from its transformers config class (no hub access): random weights from a
fixed seed are saved with ``save_pretrained`` beside a byte-level BPE tokenizer trained here on a
fixed text, and GenAI's own model builder (``python -m onnxruntime_genai.models.builder``) turns
that folder into ``genai_config.json`` + ``model.onnx`` (+ ``model.onnx.data``) + tokenizer files,
once per precision (``-p fp32`` and ``-p int4``, ``-e cpu``): the graphs users get from GenAI, with
GroupQueryAttention, MatMulNBits, SkipSimplifiedLayerNormalization and rotary caches. Nothing in
the outputs is edited by hand. A JSON report (files, bytes, op histogram) goes to stdout.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "models" / "genai"
# precision -> extra builder arguments. For -e cpu the builder gives MatMulNBits accuracy_level 4, where
# ORT's CPU kernel quantises the activations to int8 per block (and only on CPUs with int8 dot
# instructions): the EP computes the op's float meaning, so greedy tokens part ways after ~10 steps
# (measured on llama and qwen2). Level 1 is ORT's float path: the CPU EP is then an exact oracle.
PRECISIONS: dict[str, list[str]] = {"fp32": [], "int4": ["--extra_options", "accuracy_level=1"]}
VOCAB = 320  # 256 byte tokens + 1 special + 63 merges: a real byte-level BPE at a tiny size
SEED = 0

# Common sizes: head size 16 (GroupQueryAttention's rotary needs a multiple of 16), GQA with 4 query
# heads over 2 KV heads, 2 layers, a 128-position context. initializer_range 0.2 (transformers'
# default is 0.02) spreads the logits, so greedy decoding has clear winners instead of near-ties.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.2,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
    tie_word_embeddings=False,
)
# name -> (transformers config class, model class, extra config fields)
ARCHS: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": False}),  # q/k/v biases
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"original_max_position_embeddings": 128}),
}

# The tokenizer's training text: fixed, so the merges (and every token id) are reproducible.
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "once upon a time there was a tiny model that learned to count",
    "one two three four five six seven eight nine ten",
    "large language models run on the migraphx execution provider",
    "hello world, hello onnx runtime, hello genai",
    "a stitch in time saves nine; the early bird catches the worm",
]
SPECIAL = "<|endoftext|>"


def build_tokenizer():
    """A byte-level BPE (GPT-2/Qwen2 style) of exactly VOCAB tokens; id 0 is the special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    if tok.get_vocab_size() != VOCAB or tok.token_to_id(SPECIAL) != 0:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens (want {VOCAB}): grow CORPUS")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL)


def perturb_params(model) -> None:
    """RMSNorm scales start at 1 and biases at 0 (so GenAI's builder would drop Qwen2's q/k/v biases):
    random ones make SkipSimplifiedLayerNormalization's scale and the bias adds matter."""
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def save_hf(arch: str, folder: Path, tokenizer) -> None:
    import torch
    import transformers

    cfg_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, cfg_cls)(**COMMON, **extra)
    torch.manual_seed(SEED)
    model = getattr(transformers, model_cls)(config).eval()
    perturb_params(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run_builder(hf: Path, out: Path, precision: str, cache: Path) -> None:
    run_builder_args(hf, out, ["-p", precision, "-e", "cpu", "-c", str(cache), *PRECISIONS[precision]])


def run_builder_args(hf: Path, out: Path, args: list[str]) -> None:
    """GenAI's model builder from ``hf`` into ``out`` (bench/llm.py builds its -e cuda graphs with it)."""
    # Offline: the builder reads config, weights and tokenizer from the folder; a hub lookup would
    # mean something is missing from it, which should fail here rather than download.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"GenAI's builder failed for {out.name} ({' '.join(cmd)}):\n{tail}")


def check_tokenizer(out: Path, tokenizer) -> None:
    """GenAI's own tokenizer (onnxruntime-extensions) must agree with the one we trained."""
    import onnxruntime_genai as og

    text = CORPUS[0]
    ours = tokenizer(text)["input_ids"]
    model = og.Model(str(out))
    theirs = [int(t) for t in og.Tokenizer(model).encode(text)]
    if ours != theirs:
        raise RuntimeError(f"{out.name}: GenAI tokenizes {text!r} as {theirs}, transformers as {ours}")


def report(out: Path) -> dict:
    import onnx

    m = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = collections.Counter(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in m.graph.node)
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    digest = hashlib.sha256(b"".join((out / f).read_bytes() for f in files)).hexdigest()[:16]
    return {
        "files": files,
        "bytes": sum(files.values()),
        "nodes": len(m.graph.node),
        "ops": dict(ops),
        "sha": digest,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", default="", help="comma-separated architectures: " + ",".join(ARCHS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    args = ap.parse_args()
    archs = [a for a in args.only.split(",") if a] or list(ARCHS)
    precisions = [p for p in args.precisions.split(",") if p]
    unknown = [a for a in archs if a not in ARCHS] + [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise SystemExit(
            f"unknown architecture/precision {unknown}; known: {list(ARCHS)} x {list(PRECISIONS)}"
        )
    missing = [m for m in ("torch", "transformers", "tokenizers", "onnxruntime_genai") if not find_spec(m)]
    if missing:
        raise SystemExit(
            f"{', '.join(missing)} missing: see this script's docstring for the environment it needs"
        )
    tokenizer = build_tokenizer()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="genai_models_") as tmp:
        for arch in archs:
            hf = Path(tmp) / f"hf_{arch}"
            save_hf(arch, hf, tokenizer)
            for precision in precisions:
                out = args.out / f"{arch}_{precision}"
                shutil.rmtree(out, ignore_errors=True)
                run_builder(hf, out, precision, Path(tmp) / "cache")
                check_tokenizer(out, tokenizer)
                results[out.name] = report(out)
    json.dump(results, sys.stdout, indent=1)
    print(f"\ntotal bytes: {sum(r['bytes'] for r in results.values())}")


if __name__ == "__main__":
    main()
