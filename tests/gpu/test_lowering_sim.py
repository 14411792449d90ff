"""The gpu lowering checked without a GPU: every shipped model is lowered (fusion groups, views, NHWC
layouts, GEMM batch folding, epilogues, memory plan) and its steps run by the numpy simulator over a
simulated arena, then compared with the ref target. Kernel sources are not executed here (test_gpu_*
do that on a GPU); everything around them is."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.frontend.probe import fixed_dims
from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.shape import Shape
from migraphx_ep.passes import run_passes
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu.fuse import fusion_passes
from migraphx_ep.targets.gpu.layout import layout_convolution
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.memory import Storage, check_plan, plan
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import GemmStep, KernelStep, Lowered

from . import gqacases

MODELS = Path(__file__).resolve().parents[1] / "models"
CASES = sorted(p.name for p in MODELS.glob("*.onnx"))


def _program(name: str):
    p = parse_graph(model_to_dict(onnx.load(MODELS / name)), resolve_dim=fixed_dims(2)).program
    p.compile(get_target("ref"))
    return p


def _lower(prog, channels_last: bool | None = None) -> Lowered:
    """What the gpu target lowers: the ref-compiled main module after the gpu fusion passes (on a copy,
    so ``prog`` stays the ref oracle)."""
    m = prog.clone().get_main_module()
    run_passes(m, fusion_passes())
    layout_convolution(m, mode=None if channels_last is None else str(int(channels_last)))
    m.validate()
    return lower(m, use_blas=True, use_dnn=True)


def _feeds(prog) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for name, sh in prog.get_parameter_shapes().items():
        if sh.type in (DType.int64_type, DType.int32_type):
            feeds[name] = rng.integers(0, 2, sh.lens).astype(sh.dtype)
        else:
            feeds[name] = rng.standard_normal(sh.lens).astype(sh.dtype)
    return feeds


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("name", CASES)
def test_lowered_steps_match_ref(name: str, channels_last: bool) -> None:
    prog = _program(name)
    feeds = _feeds(prog)
    want = prog.run_numpy(feeds)
    low = _lower(prog, channels_last)
    got = run_steps(low, feeds)
    tol = 2e-2 if "fp16" in name else 1e-5
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


def test_bert_fuses_layernorm_and_gemm_epilogues() -> None:
    low = _lower(_program("bert.onnx"))
    labels = collections.Counter(s.label.split()[0] for s in low.steps)
    assert labels["layernorm"] == 5  # embeddings + 2 per layer, each one kernel
    gemms = [s for s in low.steps if isinstance(s, GemmStep)]
    assert sum(s.has_bias for s in gemms) >= 12 and sum(s.has_residual for s in gemms) >= 4
    # Shared weights fold the batch into M: the projections are single GEMMs, not batched ones.
    assert all(s.batch == 1 for s in gemms if s.has_bias)


def test_memory_plan_reuses_bytes_and_never_overlaps_live_buffers() -> None:
    low = _lower(_program("resnet.onnx"))
    run_steps(low, _feeds(_program("resnet.onnx")))  # plans as a side effect
    arena = [s for s in low.storages]
    check_plan(arena)
    used = max(s.offset + s.nbytes for s in arena)
    assert used < sum(s.nbytes for s in arena)


def test_plan_places_disjoint_lifetimes_at_the_same_offset() -> None:
    a, b, c = Storage(1000, first=0, last=1), Storage(1000, first=2, last=3), Storage(10, first=0, last=3)
    size = plan([a, b, c])
    assert a.offset == b.offset and c.offset not in (a.offset,)
    assert size == 1024 + 256
    check_plan([a, b, c])


@pytest.mark.parametrize("var", ["MIGRAPHX_EP_NHWC", "MIGRAPHX_EP_CONV_EPILOGUE"])
def test_bad_switch_value_is_an_error_naming_it(monkeypatch, var: str) -> None:
    monkeypatch.setenv(var, "sideways")
    with pytest.raises(ValueError, match=rf"{var}='sideways': expected one of"):
        _lower(_program("resnet.onnx"))


def test_unsupported_names_the_first_op_without_a_gpu_kernel() -> None:
    from onnx import TensorProto, helper

    from migraphx_ep.targets.gpu.support import unsupported

    assert unsupported(_program("bert.onnx").get_main_module()) is None
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    g = helper.make_graph(
        [node], "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 2]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2])],
        [helper.make_tensor("k", TensorProto.INT64, [1], [2])],
    )  # fmt: skip
    prog = parse_graph(
        model_to_dict(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    ).program
    assert "topk" in (unsupported(prog.get_main_module()) or "")


# -- run-time checks: the simulator raises what the executable raises from a kernel's error slot -----------
def _lowered_node(nodes, feeds: dict[str, np.ndarray]):
    from onnx import helper

    vis = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    g = helper.make_graph(nodes, "g", vis, [helper.make_value_info("y", onnx.TypeProto())])
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]))
    prog = parse_graph(model_to_dict(m), resolve_dim=fixed_dims(2)).program
    prog.compile(get_target("ref"))
    return prog, _lower(prog)


def test_out_of_range_gather_raises_the_device_error() -> None:
    from onnx import helper

    x, i = np.arange(12, dtype=np.float32).reshape(3, 4), np.array([[0, -3], [2, 1]], np.int64)
    prog, low = _lowered_node([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], {"x": x, "i": i})
    np.testing.assert_array_equal(run_steps(low, {"x": x, "i": i})[0], prog.run_numpy({"x": x, "i": i})[0])
    with pytest.raises(
        IndexError, match=r"gather: index out of range \[-3, 3\) on axis 0 \(found by gpu kernel"
    ):
        run_steps(low, {"x": x, "i": np.array([[0, 3], [2, 1]], np.int64)})


def test_fused_integer_division_by_zero_raises_the_device_error() -> None:
    from onnx import helper

    a = np.arange(1, 13, dtype=np.int32).reshape(3, 4)
    nodes = [helper.make_node("Mod", ["a", "b"], ["m"]), helper.make_node("Div", ["m", "b"], ["d"]),
             helper.make_node("Add", ["d", "a"], ["y"])]  # fmt: skip
    prog, low = _lowered_node(nodes, {"a": a, "b": a})
    fused = [s for s in low.steps if isinstance(s, KernelStep) and s.spec.checks]
    assert len(fused) == 1 and len(fused[0].spec.checks) == 2  # one kernel, a check per division op
    np.testing.assert_array_equal(run_steps(low, {"a": a, "b": a})[0], prog.run_numpy({"a": a, "b": a})[0])
    b = a.copy()
    b[1, 2] = 0
    with pytest.raises(ZeroDivisionError, match=r"^mod: integer modulo by zero \(found by gpu kernel"):
        run_steps(low, {"a": a, "b": b})


# -- group_query_attention: update, attend (and combine) steps against the ref --------------------------
def _gqa_lowered(model, feeds):
    prog = gqacases.parse(model, feeds)
    prog.compile(get_target("ref"))
    return prog, _lower(prog)


def _gqa_compare(prog, low, feeds, dtype) -> None:
    tol = 1e-5 if dtype == np.float32 else 2e-3
    for k, (g, w) in enumerate(zip(run_steps(low, feeds), prog.run_numpy(feeds), strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype
        if k:  # present_key/value: copies, and keys rotated exactly as the ref rounds them
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("split", [False, True], ids=["rows", "split"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(gqacases.CASES))
def test_gqa_steps_match_ref(name: str, dtype, split: bool, monkeypatch) -> None:
    from migraphx_ep.targets.gpu.kernels import gqa as KG

    if split:  # several flash-decoding splits even over these short caches
        monkeypatch.setattr(KG, "MIN_CHUNK", 2)
    model, feeds = gqacases.case(name, dtype)
    prog, low = _gqa_lowered(model, feeds)
    labels = [s.label.split(" (")[0] for s in low.steps]
    # packed QKV slices and strided views are read in place: no copies around the kernels
    assert labels == ["gqa update", "gqa attention"] + (["gqa combine"] if split else [])
    _gqa_compare(prog, low, feeds, dtype)
    _gqa_compare(prog, low, gqacases.other_lengths(name, feeds), dtype)  # seqlens_k is read at run time


GQA_BAD_RUNS = {
    # name: (case, seqlens_k, total_sequence_length, message)
    "present_length": ("decode_share_buffer", [5, 3], 9, "present length this program was compiled for"),
    "batch_with_past": ("prompt_share_buffer", [4, 4], 5, "batch_size must be 1"),
    "seqlens_negative": ("decode_share_buffer", [-1, 3], 6, "seqlens_k out of range"),
    "seqlens_past_present": ("decode_share_buffer", [8, 3], 6, "seqlens_k out of range"),
    "beyond_new_tokens": ("prompt_no_past", [4, 3], 4, "seqlens_k beyond the new tokens"),
    "rotary_positions": ("rotary_decode_share", [6, 3], 6, "position beyond the rotary caches"),
}


def _gqa_runtime(name: str, **attrs):
    model, feeds = gqacases.case(name, max_pos=6, packed=False)
    prog = gqacases.runtime_program(model, feeds, **attrs)
    prog.compile(get_target("ref"))
    return prog, _lower(prog), feeds


@pytest.mark.parametrize("bad", list(GQA_BAD_RUNS))
def test_gqa_bad_lengths_raise_the_ref_error_from_the_update_kernel(bad: str) -> None:
    from migraphx_ep.ops.gqa import GqaRunError

    name, sk, tl, message = GQA_BAD_RUNS[bad]
    prog, low, feeds = _gqa_runtime(name)
    _gqa_compare(prog, low, feeds, np.float32)
    feeds = {**feeds, "sk": np.array(sk, np.int32), "tl": np.array(tl, np.int32)}
    with pytest.raises(GqaRunError, match=message):
        prog.run_numpy(feeds)
    found = rf"^group_query_attention: .*{message}.*\(found by gpu kernel k\d+_"
    with pytest.raises(GqaRunError, match=found):
        run_steps(low, feeds)


def test_gqa_assumed_present_length_asks_for_a_recompile() -> None:
    # A program compiled without total_sequence_length's value (run-time dims) assumed GenAI's shared
    # buffer; a longer present raises GqaPresentAssumed (an AssumptionFailed: the EP recompiles).
    from migraphx_ep.ir.evaluate import AssumptionFailed
    from migraphx_ep.ops.gqa import GqaPresentAssumed

    prog, low, feeds = _gqa_runtime("decode_share_buffer", assumed_present=True)
    _gqa_compare(prog, low, feeds, np.float32)
    (update,) = [s for s in low.steps if s.label == "gqa update"]
    assert update.spec.checks[0].error == "GqaPresentAssumed"
    with pytest.raises(GqaPresentAssumed, match="found by gpu kernel") as e:
        run_steps(low, {**feeds, "tl": np.array(9, np.int32)})
    assert isinstance(e.value, AssumptionFailed)


def test_gqa_kernel_sources_do_not_depend_on_lengths() -> None:
    # Batch, query length, past and present lengths and strides are run-time arguments; seqlens_k and
    # total_sequence_length are read from device memory: another length compiles nothing.
    from migraphx_ep.targets.gpu.kernels.spec import canonical

    def sources(b: int, s: int, past: int, seqlens: list[int], total: int) -> list[str]:
        model, feeds = gqacases.gqa_model(b, s, past, seqlens, total, rotary=16, packed=True)
        return [canonical(st.spec).source for st in _gqa_lowered(model, feeds)[1].steps]

    first = sources(2, 1, 8, [5, 3], 6)
    assert first == sources(3, 1, 20, [12, 3, 9], 13) == sources(1, 1, 5, [5], 6)
    assert all("mx_gqa" in src for src in first)


def test_gqa_support_reasons() -> None:
    from migraphx_ep.targets.gpu.support import instruction_supported

    model, feeds = gqacases.gqa_model(1, 1, 4, [4], 5, d=264, hq=2, hkv=1)
    prog = gqacases.parse(model, feeds)
    (gqa,) = [i for i in prog.get_main_module().instructions if i.name == "group_query_attention"]
    assert "head size 264: the gpu kernels take multiples of 8 up to 256" in instruction_supported(gqa)
    model, feeds = gqacases.case("rotary_decode_share")
    prog = gqacases.parse(model, feeds)
    assert all(instruction_supported(i) is None for i in prog.get_main_module().instructions)


@pytest.mark.parametrize("name", ["llama_fp32", "llama_int4", "phi3_int4", "qwen2_fp32"])
def test_genai_decoder_is_one_gpu_partition_and_its_steps_match_ref(name: str) -> None:
    from migraphx_ep.ep.partition import partition
    from migraphx_ep.targets.gpu.support import instruction_supported

    model = gqacases.genai_graph(name)
    graph = model_to_dict(model)
    part = partition(graph, instruction_supported)
    assert len(part.groups) == 1 and not part.refused, (part.groups, part.refused)
    # a decode step of batch 2 with different lengths over GenAI's shared past/present buffer
    b, past, total = 2, 16, 9
    i64 = DType.int64_type
    shapes = {"input_ids": Shape(i64, (b, 1)), "attention_mask": Shape(i64, (b, total))}
    kv = [n for n in graph["inputs"] if n.startswith("past_key_values")]
    shapes.update({n: Shape(DType.float_type, (b, 2, past, 16)) for n in kv})
    prog = parse_graph(graph, shapes).program
    prog.compile(get_target("ref"))
    rng = np.random.default_rng(0)
    mask = np.ones((b, total), np.int64)
    mask[1, 6:] = 0
    feeds = {"input_ids": rng.integers(0, 64, (b, 1)), "attention_mask": mask}
    feeds.update({n: rng.standard_normal((b, 2, past, 16)).astype(np.float32) for n in kv})
    low = _lower(prog)
    assert sum(s.label == "gqa attention" for s in low.steps) == 2
    for g, w in zip(run_steps(low, feeds), prog.run_numpy(feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
