"""LLM decode benchmark: time to first token and decode tokens/s of a GenAI decoder, per system.

    python3 bench/llm.py --build /tmp/llm --layers 16 --hidden 2048 [--precisions fp16,int4]
    python3 bench/llm.py --model /tmp/llm/fp16 --systems ours_genai,ours_ort,cpu_genai,torch_compile \
        --batch 1,8 --prompt 128 --new 128 [--target gpu] [--out llm.jsonl]

``--build`` makes a Llama-style decoder with random weights (transformers config + ``save_pretrained``
into ``<build>/hf``, kept for the torch systems; a small byte-level tokenizer from
tools/make_genai_models.py; token ids are fed directly, so its vocabulary does not matter) and runs
GenAI's own model builder on it (``-e cuda`` graphs: GroupQueryAttention, MatMulNBits for int4) into
``<build>/<precision>``. Systems, each on the same random prompt ids, greedy:

- ``ours_genai``: our EP through onnxruntime-genai (``migraphx_ep.genai``);
- ``ours_ort``: our EP through plain onnxruntime, the decode loop driven here with GenAI's inputs
  (shared past/present buffers, the mask growing by one); with ``--device-io`` the KV cache lives in
  GPU memory (IOBinding), else in host memory as GenAI keeps it for a plugin EP;
- ``cpu_genai``: ORT's CPU EP through GenAI (the reference for the tokens);
- ``cuda_genai``: ORT's CUDA EP through onnxruntime-genai-cuda, where installed;
- ``torch_eager``, ``torch_compile``: HF transformers ``generate`` with a static KV cache on the
  transformers checkpoint (``<build>/hf`` or ``--hf``), eager or with ``torch.compile(model.forward,
  mode="reduce-overhead", fullgraph=True)``, after ``--torch-warmup`` untimed generations
  (bench/llm_torch.py); float rows only, an int4 row gives a ``skipped`` line.

Per system and batch: time to first token (prompt + first token), decode tokens/s (each sequence's
new tokens after the first, per second) of a generation after a warm-up one (whose figures are the
``cold_*`` fields: compiles included), the tokens' agreement with the first system's, the first
16 new tokens of batch row 0, and (ours) the programs compiled during the decode steps, which should
be none. bench/README.md says what each time includes, system by system.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from jsonl import emit  # bench/ is the script's folder: on sys.path
from llm_torch import HEAD, run_torch
from llm_torch import SYSTEMS as TORCH_SYSTEMS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
SYSTEMS = ("ours_genai", "ours_ort", "cpu_genai", "cuda_genai", *TORCH_SYSTEMS)


def build(out: Path, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int,
          ctx: int, precisions: list[str]) -> None:  # fmt: skip
    import tempfile

    import torch
    import transformers
    from make_genai_models import build_tokenizer, run_builder_args

    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=ctx,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False, torch_dtype="float16",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = out / "hf"  # kept: the torch systems load it (bench/llm_torch.py)
    transformers.LlamaForCausalLM(config).half().save_pretrained(hf)
    build_tokenizer().save_pretrained(hf)
    print(f"saved {hf}", flush=True)
    with tempfile.TemporaryDirectory(prefix="llm_bench_") as tmp:
        for p in precisions:
            run_builder_args(hf, out / p, ["-p", p, "-e", "cuda", "-c", str(Path(tmp) / "cache")])
            print(f"built {out / p}", flush=True)


def _og_model(system: str, path: Path, target: str):
    import onnxruntime_genai as og

    from migraphx_ep import genai

    if system == "ours_genai":
        return og.Model(genai.config(path, og=og, migraphx_target=target))
    cfg = og.Config(str(path))
    cfg.clear_providers()
    if system == "cuda_genai":
        cfg.append_provider("cuda")
    return og.Model(cfg)


def warm(generate: Callable[[], dict]) -> dict:
    """Two generations of one model: the first (``cold_*``: compiles included, as a first request sees
    them) and the timed second (a server's steady state; the torch systems are timed after warm-up too)."""
    cold = generate()
    rec = generate()
    rec["cold_ttft_ms"], rec["cold_decode_tok_s"] = cold["ttft_ms"], cold["decode_tok_s"]
    return rec


def run_genai(system: str, path: Path, target: str, prompts: np.ndarray, new: int) -> dict:
    import onnxruntime_genai as og

    model = _og_model(system, path, target)
    b, p = prompts.shape

    def generate() -> dict:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=p + new, min_length=p + new, do_sample=False, batch_size=b)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompts.astype(np.int32))
        gen.generate_next_token()
        ttft = time.perf_counter() - t0
        t1 = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        decode = time.perf_counter() - t1
        tokens = np.array([gen.get_sequence(i)[p:] for i in range(b)])
        return {"ttft_ms": 1e3 * ttft, "decode_tok_s": b * (new - 1) / decode, "tokens": tokens}

    return warm(generate)


def run_ort(path: Path, target: str, prompts: np.ndarray, new: int, device_io: bool) -> dict:
    """The decode loop GenAI runs, by hand: shared past/present buffers of the full context length, the
    attention mask one longer each step, greedy argmax on the host."""
    import onnx
    import onnxruntime as ort

    import migraphx_ep
    from migraphx_ep.testing import capture_compiled

    cfg = json.loads((path / "genai_config.json").read_text())["model"]
    dec = cfg["decoder"]
    m = onnx.load(str(path / dec["filename"]), load_external_data=False)
    kinds = {i.name: i.type.tensor_type.elem_type for i in m.graph.input}
    b, p = prompts.shape
    total = p + new
    heads, dim, layers = dec["num_key_value_heads"], dec["head_size"], dec["num_hidden_layers"]
    names = dec["inputs"]
    kv_type = onnx.helper.tensor_dtype_to_np_dtype(kinds[names["past_key_names"] % 0])
    opts = {"migraphx_target": target}
    with capture_compiled() as compiled:
        sess = ort.InferenceSession(
            str(path / dec["filename"]), providers=[(migraphx_ep.get_ep_name(), opts), "CPUExecutionProvider"]
        )
    kv_names = [names[k] % i for i in range(layers) for k in ("past_key_names", "past_value_names")]
    out_kv = [
        dec["outputs"][k] % i for i in range(layers) for k in ("present_key_names", "present_value_names")
    ]
    where = ("cuda", 0) if device_io else ("cpu", 0)
    kv = [
        ort.OrtValue.ortvalue_from_numpy(np.zeros((b, heads, total, dim), kv_type), *where) for _ in kv_names
    ]
    io = sess.io_binding()
    io.bind_output(dec["outputs"]["logits"], "cpu")  # first: get_outputs() lists them in binding order
    for n, v, o in zip(kv_names, kv, out_kv, strict=True):
        io.bind_ortvalue_input(n, v)
        io.bind_ortvalue_output(o, v)  # the shared buffer: present is past
    after_first_decode = 0

    def generate() -> dict:
        nonlocal after_first_decode
        ids, tokens, steps = prompts.astype(np.int64), [], []
        for step in range(new):
            length = p + step
            io.bind_cpu_input(names["input_ids"], np.ascontiguousarray(ids))
            io.bind_cpu_input(names["attention_mask"], np.ones((b, length), np.int64))
            io.bind_output(dec["outputs"]["logits"], "cpu")  # its dims change after the prompt: a new one
            t = time.perf_counter()
            sess.run_with_iobinding(io)
            logits = io.get_outputs()[0].numpy()
            steps.append(time.perf_counter() - t)
            ids = logits[:, -1, :].argmax(-1).reshape(b, 1).astype(np.int64)
            tokens.append(ids[:, 0])
            if step == 1 and not after_first_decode:
                after_first_decode = sum(c.compiles for c in compiled)
        return {
            "ttft_ms": 1e3 * steps[0],
            "decode_tok_s": b * (new - 1) / sum(steps[1:]),
            "tokens": np.stack(tokens, 1),
        }

    rec = warm(generate)
    rec["partitions"] = len(compiled)
    rec["compiles_after_first_decode"] = sum(c.compiles for c in compiled) - after_first_decode
    return rec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--precisions", default="fp16,int4")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--systems", default="ours_genai,ours_ort,cpu_genai", help=f"of {','.join(SYSTEMS)}")
    ap.add_argument("--target", default="gpu")
    ap.add_argument("--device-io", action="store_true", help="ours_ort: KV cache bound in GPU memory")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--hf", type=Path, help="torch systems: the transformers checkpoint (default <model>/../hf)"
    )
    ap.add_argument("--torch-warmup", type=int, default=3, help="torch systems: untimed generations first")
    a = ap.parse_args(argv)
    unknown = [s for s in a.systems.split(",") if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {','.join(unknown)}: choose from {','.join(SYSTEMS)}")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.build:
        build(a.build, a.layers, a.hidden, a.heads, a.kv_heads, a.inter, a.vocab, a.ctx,
              a.precisions.split(","))  # fmt: skip
    if not a.model:
        return
    vocab = json.loads((a.model / "genai_config.json").read_text())["model"]["vocab_size"]
    for batch in (int(x) for x in a.batch.split(",")):
        prompts = np.random.default_rng(batch).integers(1, vocab, (batch, a.prompt))
        first = None
        for system in a.systems.split(","):
            try:
                if system == "ours_ort":
                    rec = run_ort(a.model, a.target, prompts, a.new, a.device_io)
                elif system in TORCH_SYSTEMS:
                    rec = run_torch(system, a.model, prompts, a.new, a.hf, a.torch_warmup)
                else:
                    rec = run_genai(system, a.model, a.target, prompts, a.new)
            except Exception as e:  # noqa: BLE001 - one system failing must not hide the others' rows
                rec = {"error": f"{type(e).__name__}: {e}"[:500]}
            tokens = rec.pop("tokens", None)
            if tokens is not None:
                first = tokens if first is None else first
                rec["tokens_match_first"] = float(np.mean(tokens == first))
                rec["tokens_head"] = [int(t) for t in tokens[0, :HEAD]]
            rec.update(system=system, model=a.model.name, batch=batch, prompt=a.prompt, new=a.new)
            emit(rec, a.out)


if __name__ == "__main__":
    main()
