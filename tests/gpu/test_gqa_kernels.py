"""GroupQueryAttention's generated kernels without a GPU: NVRTC compiles them for sm_90 in every
configuration they branch on, and the same sources run on the host (``hostwarp``: g++, a thread per
CUDA thread, real warp shuffles) inside their lowered programs, against the ref target. The numbers on
a GPU are checked by test_gpu_gqa.py."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ops.gqa import GqaRunError
from migraphx_ep.targets import get_target
from migraphx_ep.targets.gpu import nvrtc
from migraphx_ep.targets.gpu.errors import device_error
from migraphx_ep.targets.gpu.kernels import gqa as KG
from migraphx_ep.targets.gpu.kernels.headers import included
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import Memory, _step
from migraphx_ep.targets.gpu.steps import KernelStep

from . import gqacases, hostwarp

F, H = DType.float_type, DType.half_type

# (type, head size, heads, kv heads, rotary width, interleaved, past, query length, splits, attributes)
CONFIGS = {
    "fp32_rotary_decode": (F, 16, 4, 2, 16, False, 8, 1, 1, {}),
    "fp16_sink_split": (H, 16, 4, 2, 0, False, 8, 1, 3, {"has_sink": True}),
    "fp16_llama_decode_split": (H, 128, 32, 8, 128, False, 4096, 1, 64, {"smooth_softmax": True}),
    "fp32_interleaved_partial_128": (F, 128, 8, 8, 64, True, 16, 1, 1, {}),
    "fp32_head_256_prompt": (F, 256, 8, 1, 0, False, 0, 5, 1, {"softcap": 2.0, "local_window": 3}),
    "fp16_head_80_group_3": (H, 80, 6, 2, 0, False, 0, 4, 2, {"causal": False}),
    "fp16_head_48_group_8": (H, 48, 16, 2, 16, True, 6, 1, 1, {"has_sink": True}),
}


def _compile(spec) -> None:
    first, section = included(spec.source)  # the prelude, then the kernel's own part of the device code
    assert first == "mx_prelude.cuh" and f"  {section.removesuffix('.cuh')}({{" in spec.source
    assert spec.block[0] <= 1024 and 1 <= spec.grid[0] < 2**31 and spec.grid[1] <= 65535
    assert nvrtc.compile_source(spec.source, "sm_90", spec.name)


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gqa_kernels_compile(name: str) -> None:
    t, d, hq, hkv, rot, inter, past, s, splits, attrs = CONFIGS[name]
    b, present_len = 2 if s == 1 else 1, max(past, s)
    op = make_op(
        "group_query_attention", num_heads=hq, kv_num_heads=hkv, present_len=present_len, has_past=past > 0,
        rotary=rot > 0, rotary_interleaved=inter, **attrs,
    )  # fmt: skip
    q, kv = Shape(t, (b, s, hq * d)), Shape(t, (b, s, hkv * d))
    cos = Shape(t, (present_len + 4, rot // 2)) if rot else None
    present = Shape(t, (b, hkv, present_len, d))
    lay = KG.gqa_layout(op, q, cos)
    assert KG.gqa_supported(lay) is None
    past_shapes = (present, present) if past else None
    _compile(KG.gqa_update_kernel("k_update", lay, kv, kv, past_shapes, cos, present))
    _compile(KG.gqa_attend_kernel("k_attend", lay, q, present, past, cos, splits, KG.MIN_CHUNK))
    if splits > 1:
        part = Shape(F, (b * s * hq, splits, d + 2))
        _compile(KG.gqa_combine_kernel("k_combine", lay, part, q))


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
def test_gqa_kernels_compile_with_baked_sizes(monkeypatch) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "0")  # every size a literal: one compile per shape
    op = make_op("group_query_attention", num_heads=4, kv_num_heads=2, present_len=8, has_past=True)
    q, kv, present = Shape(H, (2, 1, 64)), Shape(H, (2, 1, 32)), Shape(H, (2, 2, 8, 16))
    lay = KG.gqa_layout(op, q, None)
    specs = [
        KG.gqa_update_kernel("k_update", lay, kv, kv, (present, present), None, present),
        KG.gqa_attend_kernel("k_attend", lay, q, present, 8, None, 2, 4),
        KG.gqa_combine_kernel("k_combine", lay, Shape(F, (8, 2, 18)), q),
    ]
    for spec in specs:
        assert spec.args == ()
        _compile(spec)


# -- the kernels on the host, inside their lowered programs -------------------------------------------------
@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """One folder of built kernels for the module: cases that share a source build it once."""
    return tmp_path_factory.mktemp("gqa_host")


def run_on_host(low, feeds: dict[str, np.ndarray], tmp) -> list[np.ndarray]:
    """The lowered steps over a simulated arena; the group_query_attention kernels run their real
    sources (hostwarp), anything else the simulator's numpy. A set error slot raises as on a GPU."""
    mem = Memory(low)
    mem.arena, mem.weights = hostwarp.aligned(mem.arena), hostwarp.aligned(mem.weights)

    def ptr(b) -> int:
        base = mem.weights if b.storage.kind == "weight" else mem.arena
        return base.ctypes.data + b.storage.offset + b.offset

    for name, b in low.inputs.items():
        mem.view(b)[...] = feeds[name]
    for s in low.steps:
        if isinstance(s, KernelStep) and s.op is not None and s.op.name.startswith("gqa_"):
            code = hostwarp.launch_pointers(s.spec, tmp, [ptr(b) for b in (*s.reads, *s.writes)])
            if code:
                raise device_error(s.spec, code)
        else:
            _step(s, mem)
    return [o.copy() if isinstance(o, np.ndarray) else np.array(mem.view(o)) for o in low.outputs]


def _check(prog, low, feeds, dtype, tmp) -> None:
    tol = 1e-5 if dtype == np.float32 else 2e-3
    for k, (g, w) in enumerate(zip(run_on_host(low, feeds, tmp), prog.run_numpy(feeds), strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape
        if k:  # presents: copies, and rotated keys rounded exactly as the ref rounds them
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


HOST_CASES = [
    ("decode_share_buffer", np.float16, True),
    ("prompt_padded_empty_past", np.float16, False),
    ("subsequent_prompt", np.float32, True),
    ("rotary_decode_share", np.float16, False),
    ("rotary_interleaved_partial", np.float32, False),
    ("local_window_prompt", np.float32, True),
    ("scale_softcap", np.float32, True),
    ("smooth_softmax", np.float32, False),
    ("head_sink", np.float16, True),
    ("non_causal_prompt", np.float32, False),
    ("group_of_4_head_48", np.float16, False),
    ("mha_head_80", np.float32, True),
]
HOST_IDS = [f"{n}-{np.dtype(d)}-{'split' if s else 'rows'}" for n, d, s in HOST_CASES]


@pytest.mark.skipif(hostwarp.GXX is None, reason="no g++ to build kernels for the host")
@pytest.mark.parametrize(
    "name,dtype,split", HOST_CASES, ids=[f"{n}-{np.dtype(d)}-{s}" for n, d, s in HOST_CASES]
)
def test_gqa_kernels_on_the_host_match_ref(name: str, dtype, split: bool, builds, monkeypatch) -> None:
    if split:
        monkeypatch.setattr(KG, "MIN_CHUNK", 2)
    model, feeds = gqacases.case(name, dtype)
    prog = gqacases.parse(model, feeds)
    prog.compile(get_target("ref"))
    low = lower(prog.get_main_module(), use_blas=True, use_dnn=True)
    assert ("gqa combine" in [s.label for s in low.steps]) == split
    _check(prog, low, feeds, dtype, builds)
    _check(prog, low, gqacases.other_lengths(name, feeds), dtype, builds)


@pytest.mark.skipif(hostwarp.GXX is None, reason="no g++ to build kernels for the host")
def test_gqa_update_kernel_reports_each_check_in_the_refs_order(builds) -> None:
    from .test_lowering_sim import GQA_BAD_RUNS

    for name, sk, tl, message in GQA_BAD_RUNS.values():
        model, feeds = gqacases.case(name, max_pos=6, packed=False)
        prog = gqacases.runtime_program(model, feeds)
        prog.compile(get_target("ref"))
        low = lower(prog.get_main_module(), use_blas=True, use_dnn=True)
        _check(prog, low, feeds, np.float32, builds)
        bad = {**feeds, "sk": np.array(sk, np.int32), "tl": np.array(tl, np.int32)}
        with pytest.raises(GqaRunError, match=message):
            run_on_host(low, bad, builds)
        _check(prog, low, feeds, np.float32, builds)  # nothing stays behind
