"""GroupQueryAttention on the GPU: the update/attend/combine kernels against the ref target (every case
of gqacases, fp16 and fp32, with and without flash-decoding splits, other lengths at run time, long
decode and prompt shapes), the run-time checks through the error slot, no new kernel for new lengths,
and GenAI decoders through ORT on ``migraphx_target=gpu`` against ORT's CPU EP.

The decoder check without ``gpu`` runs the same loop on the ref target, so the harness itself is
checked where there is no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from migraphx_ep.ir.evaluate import AssumptionFailed
from migraphx_ep.ops.gqa import GqaPresentAssumed, GqaRunError
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu.kernels import gqa as KG

from . import gqacases
from .gpucheck import FP16_OP, FP32_SUM, assert_matches, times

EP = "MIGraphXExecutionProvider"
PROMPT = [1, 5, 9, 14, 3, 27, 8]  # token ids: no tokenizer needed
NEW_TOKENS = 8


def _programs(model, feeds, target, runtime: bool = False, **attrs):
    def one(t):
        prog = gqacases.runtime_program(model, feeds, **attrs) if runtime else gqacases.parse(model, feeds)
        prog.compile(t)
        return prog

    return one(get_target("ref")), one(target)


def _compare(ref, dev, feeds, dtype, what: str = "") -> None:
    tol = times(FP16_OP, 2) if np.dtype(dtype) == np.float16 else FP32_SUM
    want = ref.run_numpy(feeds)
    got = [np.asarray(o) for o in dev.run_numpy(feeds)]
    assert_matches(got[0], want[0], tol, f"{what} output")
    for k in (1, 2):  # copies, and rotated keys rounded exactly as the ref rounds them
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what} present {k}")


def _labels(prog) -> list[str]:
    return [s.label.split(" (")[0] for s in prog._exe.lowered.steps]  # type: ignore[union-attr]


@pytest.mark.gpu
@pytest.mark.parametrize("split", [False, True], ids=["rows", "split"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(gqacases.CASES))
def test_gqa_matches_ref(gpu, name: str, dtype, split: bool, monkeypatch) -> None:
    if split:  # several flash-decoding splits even over these short caches
        monkeypatch.setattr(KG, "MIN_CHUNK", 2)
    model, feeds = gqacases.case(name, dtype)
    ref, dev = _programs(model, feeds, gpu)
    assert _labels(dev) == ["gqa update", "gqa attention"] + (["gqa combine"] if split else [])
    _compare(ref, dev, feeds, dtype, "run 1")
    for seed in (7, 8):  # new values and lengths, same program: nothing baked in from the first run
        _compare(ref, dev, gqacases.other_lengths(name, feeds, seed), dtype, f"seed {seed}")


LLAMA, H64 = {"d": 128, "hq": 32, "hkv": 8}, {"d": 64}
LONG = {
    # name: (b, s, past, seqlens_k, total, keyword arguments of gqa_model): real model head layouts
    "llama_decode_4k": (1, 1, 4096, [3000], 3001, {**LLAMA, "rotary": 128}),
    "decode_ragged_batch": (4, 1, 1024, [1000, 17, 512, 0], 1001, {**H64, "hq": 16, "hkv": 4, "rotary": 64}),
    "decode_window_sink": (2, 1, 2048, [1500, 700], 1501, {**LLAMA, "local_window_size": 256, "sink": True}),
    "prompt_384": (1, 384, 0, [383], 384, {**H64, "hq": 8, "hkv": 2, "rotary": 32, "rotary_interleaved": 1}),
    "prompt_padded_softcap": (2, 128, None, [127, 60], 128, {"d": 96, "hq": 6, "hkv": 3, "softcap": 30.0}),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(LONG))
def test_gqa_long_shapes_match_ref(gpu, name: str, dtype) -> None:
    b, s, past, seqlens, total, kw = LONG[name]
    model, feeds = gqacases.gqa_model(b, s, past, seqlens, total, dtype=dtype, max_pos=4096 + 8, **kw)
    ref, dev = _programs(model, feeds, gpu)
    if s == 1:
        assert "gqa combine" in _labels(dev)  # few rows over a long cache: the keys are split
    _compare(ref, dev, feeds, dtype, name)


@pytest.mark.gpu
def test_gqa_bad_lengths_raise_the_refs_error_and_the_next_run_works(gpu) -> None:
    from .test_lowering_sim import GQA_BAD_RUNS

    for name, sk, tl, message in GQA_BAD_RUNS.values():
        model, feeds = gqacases.case(name, max_pos=6, packed=False)
        ref, dev = _programs(model, feeds, gpu, runtime=True)
        bad = {**feeds, "sk": np.array(sk, np.int32), "tl": np.array(tl, np.int32)}
        with pytest.raises(GqaRunError, match=rf"{message}.*\(found by gpu kernel"):
            dev.run_numpy(bad)
        _compare(ref, dev, feeds, np.float32, name)  # the slot was cleared


@pytest.mark.gpu
def test_gqa_assumed_present_length_raises_for_a_recompile(gpu) -> None:
    model, feeds = gqacases.case("decode_share_buffer", packed=False)
    ref, dev = _programs(model, feeds, gpu, runtime=True, assumed_present=True)
    _compare(ref, dev, feeds, np.float32)
    with pytest.raises(GqaPresentAssumed) as e:
        dev.run_numpy({**feeds, "tl": np.array(9, np.int32)})
    assert isinstance(e.value, AssumptionFailed)


@pytest.mark.gpu
def test_gqa_new_lengths_compile_no_kernel(gpu) -> None:
    from migraphx_ep.targets.gpu import nvrtc

    def compiled(b: int, past: int, seqlens: list[int], total: int):
        model, feeds = gqacases.gqa_model(b, 1, past, seqlens, total, rotary=16, packed=True)
        before = nvrtc.compile_count()
        ref, dev = _programs(model, feeds, gpu)
        _compare(ref, dev, feeds, np.float32)
        return nvrtc.compile_count() - before

    compiled(2, 8, [5, 3], 6)
    assert compiled(3, 20, [12, 3, 9], 13) == 0


# -- GenAI decoders through ORT ---------------------------------------------------------------------------
def _greedy(
    path: Path, providers: list, recording=None, compiles: list | None = None
) -> tuple[list[int], list]:
    """NEW_TOKENS greedy tokens with plain ORT, GenAI's way: one shared past/present buffer of
    ``max_len`` per layer (the present fed back as the next past), the attention mask growing by one.
    ``compiles``: gets our EP's compile count after each step."""
    import onnxruntime as ort

    dec = json.loads((path / "genai_config.json").read_text())["model"]["decoder"]
    sess = ort.InferenceSession(str(path / "model.onnx"), providers=providers)
    kv = [i.name for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    max_len = len(PROMPT) + NEW_TOKENS + 4
    past = {n: np.zeros((1, dec["num_key_value_heads"], max_len, dec["head_size"]), np.float32) for n in kv}
    ids, tokens, partitions = np.array([PROMPT], np.int64), [], []
    for _ in range(NEW_TOKENS):
        total = len(PROMPT) + len(tokens)
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past}
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
        tokens.append(int(outs["logits"][0, -1].argmax()))
        past = {n: outs[n.replace("past_key_values", "present")] for n in kv}
        ids = np.array([[tokens[-1]]], np.int64)
        if recording is not None and recording.eps:
            partitions.append(recording.eps[-1].last_partition)
            if compiles is not None:
                compiles.append(sum(c.compiles for c in recording.eps[-1].compiled))
    return tokens, partitions


def _decoder_on(target: str, name: str, recording) -> None:
    path = gqacases.GENAI / name
    want, _ = _greedy(path, ["CPUExecutionProvider"])
    options = {"migraphx_target": target, "migraphx_tf32_enable": "0"}
    compiles: list[int] = []
    got, parts = _greedy(path, [(EP, options), "CPUExecutionProvider"], recording, compiles)
    assert got == want, f"{name}: ours {got} != CPU EP {want}"
    assert recording.eps and recording.eps[-1].target_name == target
    last = parts[-1]
    assert len(last["groups"]) == 1 and not last["refused"], f"{name}: {last['refused']}"
    # The prompt compiles, the first decode step compiles; the mask's growth compiles nothing after.
    assert compiles[-1] == compiles[1], f"{name}: compiles after each step {compiles}"
    assert [c.runtime for c in recording.eps[-1].compiled] == [{"attention_mask": (1,)}]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama_fp32", "llama_int4"])
def test_genai_decoder_on_gpu_matches_cpu_ep(name: str, recording) -> None:
    _decoder_on("gpu", name, recording)


@pytest.mark.gpu
def test_genai_decode_steps_run_without_python_on_gpu(recording, python_runs) -> None:
    # The prompt and the first decode step compile and run in Python; every later step (a mask one
    # longer each time) runs in the shell, padded into the first decode step's program.
    want, _ = _greedy(gqacases.GENAI / "llama_fp32", ["CPUExecutionProvider"])
    got, _ = _greedy(gqacases.GENAI / "llama_fp32", [(EP, {"migraphx_target": "gpu"})], recording)
    assert got == want
    assert python_runs["n"] == 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama_fp32", "llama_int4"])
def test_genai_generate_on_gpu_matches_cpu_ep(name: str, recording) -> None:
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    from migraphx_ep import genai

    path = gqacases.GENAI / name
    cpu = og.Config(str(path))
    cpu.clear_providers()
    want = genai.generate_greedy(og.Model(cpu), PROMPT, NEW_TOKENS, og)
    model = og.Model(genai.config(path, og=og, migraphx_target="gpu", migraphx_tf32_enable="0"))
    assert genai.generate_greedy(model, PROMPT, NEW_TOKENS, og) == want
    ep = recording.eps[0]
    assert ep.target_name == "gpu"
    assert len(ep.last_partition["groups"]) == 1 and not ep.last_partition["refused"]


def test_genai_decoder_loop_on_ref_matches_cpu_ep(recording) -> None:
    _decoder_on("ref", "llama_fp32", recording)  # the gpu test's harness, checked without a GPU
