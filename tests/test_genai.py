"""LLMs through ONNX Runtime GenAI on the EP (ref target).

The tiny decoders in tests/models/genai (Llama-, Qwen2- and Phi-3-style, fp32 and int4, built by GenAI's
own model builder: tools/make_genai_models.py) must generate the same greedy tokens through our EP as
through ORT's CPU EP, with at least 95% of their nodes on our EP. A decode step compiles nothing: the
attention mask grows by one each step, but its length is a run-time dim (ep/runtime_dims.py).
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
from pathlib import Path

import pytest

import migraphx_ep
from conftest import node_providers
from migraphx_ep import genai
from migraphx_ep.ep.options import OptionError

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")

EP = migraphx_ep.EP_NAME
MODELS_DIR = Path(__file__).parent / "models" / "genai"
MODELS = sorted(p.name for p in MODELS_DIR.iterdir() if (p / "genai_config.json").is_file())
PROMPT = "the quick brown fox"
NEW_TOKENS = 12
MIN_ON_EP = 0.95


def cpu_config(path: Path):
    cfg = og.Config(str(path))
    cfg.clear_providers()  # no provider: GenAI's sessions use ORT's CPU EP alone
    return cfg


def tokens(model, n: int = NEW_TOKENS) -> list[int]:
    return genai.generate_greedy(model, og.Tokenizer(model).encode(PROMPT), n, og)


def test_fixtures_are_there():
    assert {m.rsplit("_", 1)[0] for m in MODELS} == {"llama", "qwen2", "phi3"}, MODELS
    assert {m.rsplit("_", 1)[1] for m in MODELS} == {"fp32", "int4"}, MODELS


@pytest.mark.parametrize("name", MODELS)
def test_greedy_tokens_match_cpu_ep(name, recording, tmp_path, record_property, capsys):
    path = MODELS_DIR / name
    expected = tokens(og.Model(cpu_config(path)))
    assert len(expected) == NEW_TOKENS

    cfg = genai.config(path, og=og, migraphx_target="ref")
    # ORT's profiler through GenAI's session options: the file is written when the session ends.
    prefix = str(tmp_path / "profile")
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"enable_profiling": prefix}}}}))
    model = og.Model(cfg)
    assert len(recording.eps) == 1, "GenAI should build one decoder session on our EP"
    ep = recording.eps[0]
    assert ep.target_name == "ref"

    first = tokens(model)
    compiles_first = sum(c.compiles for c in ep.compiled)
    again = tokens(model)  # same lengths: every program comes from the EP's per-shape cache
    compiles_again = sum(c.compiles for c in ep.compiled) - compiles_first
    assert first == expected, f"{name}: ours {first} != CPU EP {expected}"
    assert again == expected
    assert compiles_again == 0

    claimed = sum(len(g) for g in ep.last_partition["groups"])
    refused = ep.last_partition["refused"]
    share = claimed / (claimed + len(refused))
    assert share >= MIN_ON_EP, f"{name}: {claimed} of {claimed + len(refused)} nodes on {EP}: {refused}"

    del model
    gc.collect()  # GenAI's session ends with the model: ORT writes the profile then
    (profile,) = tmp_path.glob("profile*.json")
    ran = node_providers(_Profiled(profile))
    on_cpu = {n for n, p in ran.items() if p != EP}
    assert any(p == EP for p in ran.values())
    assert len(on_cpu) <= len(refused), f"{name}: ran elsewhere {sorted(on_cpu)}, refused {refused}"

    record_property("nodes_on_ep", f"{claimed}/{claimed + len(refused)}")
    record_property("compiles_first_generation", compiles_first)
    record_property("compiles_second_generation", compiles_again)
    with capsys.disabled():
        print(
            f"\n{name}: tokens identical ({NEW_TOKENS}), {claimed}/{claimed + len(refused)} nodes on {EP}, "
            f"compiles: {compiles_first} in the first generation, {compiles_again} in the second"
        )


def _steps(model, prompt: list[int], n: int, after_first_decode=None) -> list[int]:
    """Greedy tokens one step at a time; ``after_first_decode()`` runs once the first decode step has."""
    params = og.GeneratorParams(model)
    total = len(prompt) + n
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)  # the prompt runs here
    step = 0
    while not gen.is_done():
        gen.generate_next_token()
        step += 1
        if step == 2 and after_first_decode is not None:  # step 1 takes the prompt's logits
            after_first_decode()
    return [int(t) for t in gen.get_sequence(0)][len(prompt) :]


@pytest.mark.parametrize("name", MODELS)
def test_a_64_token_generation_compiles_nothing_after_the_first_decode_step(name, recording):
    path = MODELS_DIR / name
    cpu = og.Model(cpu_config(path))
    prompt = [int(t) for t in og.Tokenizer(cpu).encode(PROMPT)]
    expected = _steps(cpu, prompt, 64)
    model = og.Model(genai.config(path, og=og, migraphx_target="ref"))
    ep = recording.eps[0]
    seen: list[int] = []
    got = _steps(model, prompt, 64, lambda: seen.append(sum(c.compiles for c in ep.compiled)))
    assert got == expected, f"{name}: ours {got} != CPU EP {expected}"
    assert seen and sum(c.compiles for c in ep.compiled) == seen[0], "a later decode step compiled"
    assert [c.runtime for c in ep.compiled] == [{"attention_mask": (1,)}]


def test_a_growing_kv_cache_recompiles_per_length_and_stays_right(recording, caplog):
    # Without GenAI's shared past/present buffer, the past grows every step: its dims are in the key
    # anyway, and the run-time-dims program's shared-buffer assumption fails at the first decode step
    # -- which must recompile and answer, not error.
    path = MODELS_DIR / "llama_fp32"
    no_share = json.dumps({"search": {"past_present_share_buffer": False}})
    cpu_cfg = cpu_config(path)
    cpu_cfg.overlay(no_share)
    cpu = og.Model(cpu_cfg)
    prompt = [int(t) for t in og.Tokenizer(cpu).encode(PROMPT)]
    expected = _steps(cpu, prompt, 6)
    cfg = genai.config(path, og=og, migraphx_target="ref")
    cfg.overlay(no_share)
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        got = _steps(og.Model(cfg), prompt, 6)
    assert got == expected
    assert [c.runtime for c in recording.eps[0].compiled] == [{}]
    assert "compiling per size of ['attention_mask'] from now on" in caplog.text


class _Profiled:
    """node_providers() reads a session's profile through end_profiling(); GenAI wrote it already."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def end_profiling(self) -> str:
        return str(self.path)


def test_genai_config_json_route(recording, tmp_path):
    # The documented file route: an entry named MIGraphXExecutionProvider in genai_config.json, the
    # library registered with GenAI, and a plain og.Model(folder).
    folder = tmp_path / "model"
    shutil.copytree(MODELS_DIR / "llama_fp32", folder)
    doc = json.loads((folder / "genai_config.json").read_text())
    entry = genai.config_entry(migraphx_target="ref", fp16_enable=False)
    doc["model"]["decoder"]["session_options"]["provider_options"] = [entry]
    (folder / "genai_config.json").write_text(json.dumps(doc))
    genai.register(og)
    genai.register(og)  # once per process: a second call is a no-op, not GenAI's "already registered"
    expected = tokens(og.Model(cpu_config(folder)))
    assert tokens(og.Model(str(folder))) == expected
    assert [ep.options.target for ep in recording.eps] == ["ref"]


def test_seed_002_migraphx_entry_is_applied(recording, tmp_path):
    # Seed 002's genai_config.json names the provider "MIGraphX", which stock GenAI sends to ORT's
    # built-in ROCm EP; genai.config() reads that entry's options and gives them to our EP.
    folder = tmp_path / "model"
    shutil.copytree(MODELS_DIR / "qwen2_int4", folder)
    doc = json.loads((folder / "genai_config.json").read_text())
    opts = {"migraphx_target": "ref", "fp16_enable": "0", "migraphx_max_compiled_models": "32"}
    doc["model"]["decoder"]["session_options"]["provider_options"] = [{"MIGraphX": opts}]
    (folder / "genai_config.json").write_text(json.dumps(doc))
    assert genai.file_options(folder) == opts
    model = og.Model(genai.config(folder, og=og))
    assert tokens(model, 4) == tokens(og.Model(cpu_config(folder)), 4)
    assert recording.eps[0].options.max_compiled_models == 32

    doc["model"]["decoder"]["session_options"]["provider_options"] = [{"MIGraphX": {"fp17_enable": "1"}}]
    (folder / "genai_config.json").write_text(json.dumps(doc))
    with pytest.raises(OptionError, match=r"genai_config.json: unknown .*'fp17_enable'"):
        genai.config(folder, og=og)


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(OptionError, match="unknown MIGraphXExecutionProvider option 'no_such'"):
        genai.provider_options(no_such=1)
    with pytest.raises(OptionError, match="fp16_enable='maybe'"):
        genai.config(MODELS_DIR / "llama_fp32", og=og, fp16_enable="maybe")
    with pytest.raises(FileNotFoundError, match="no genai_config.json"):
        genai.config(tmp_path, og=og)
    (tmp_path / "genai_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a GenAI config"):
        genai.file_options(tmp_path)
    with pytest.raises(ValueError, match="non-empty prompt"):
        genai.generate_greedy(None, [], 3, og)
    assert genai.provider_options(fp16_enable=True, device_id=0) == {"fp16_enable": "1", "device_id": "0"}
