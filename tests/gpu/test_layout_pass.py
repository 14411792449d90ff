"""layout_convolution without a GPU: the gpu target's pass that lays out 2-D convolutions' activations
and filters channels-last in the IR (``layout`` instructions), the ops that keep that layout down a
chain, the lowering that writes each value in the layout its shape says (kernel counts and numbers in
the simulator against the ref), when the pass stays away, and shape templates of a CNN that reproduce
it at a never-seen batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from migraphx_ep.ep.shape_template import Templates
from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import DType, from_onnx
from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import CHANNELS_LAST, Shape, ShapeError, follow_channels_last
from migraphx_ep.ir.weights import WeightCache
from migraphx_ep.passes import DEAD_CODE_ELIMINATION, run_passes
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.fuse import FUSE_CONV_EPILOGUE, FUSE_POINTWISE, adopt_submodules
from migraphx_ep.targets.gpu.layout import layout_convolution, layout_pass
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import ConvStep, GemmStep, KernelStep
from migraphx_ep.targets.gpu.support import kernel_supported
from passes.passcheck import Build, check_pass, random_inputs

MODELS = Path(__file__).resolve().parents[1] / "models"
FUSIONS = [FUSE_CONV_EPILOGUE, DEAD_CODE_ELIMINATION, FUSE_POINTWISE, DEAD_CODE_ELIMINATION]
F32 = DType.float_type


# -- the shapes and the op ---------------------------------------------------------------------------
def test_from_permutation_and_channels_last() -> None:
    s = Shape(F32, (2, 3, 4, 5))
    assert s.as_channels_last().strides == (60, 1, 15, 3)
    assert Shape.from_permutation(F32, (2, 3, 4, 5), (0, 1, 2, 3)) == s
    assert Shape.from_permutation(F32, (2, 3), (1, 0)).strides == (1, 2)
    assert s.as_channels_last().channels_last() and not s.channels_last()
    # One channel: the same bytes either way, yet only what a layout made so counts as channels-last.
    one = Shape(F32, (2, 1, 4, 5))
    assert not one.channels_last() and one.as_channels_last().channels_last()
    with pytest.raises(ValueError, match="not a permutation"):
        Shape.from_permutation(F32, (2, 3), (0, 0))


def test_follow_channels_last_only_from_a_channels_last_source() -> None:
    out = Shape(F32, (2, 8, 4, 4))
    nhwc = Shape(F32, (2, 3, 9, 9)).as_channels_last()
    assert follow_channels_last(out, [nhwc]) == out.as_channels_last()
    assert follow_channels_last(out, [Shape(F32, (2, 3, 9, 9))]) == out
    assert follow_channels_last(Shape(F32, (2, 8, 4)), [nhwc]) == Shape(F32, (2, 8, 4))  # not 4-D


def test_the_layout_op_copies_into_its_permutation_and_names_a_bad_one() -> None:
    b = Build()
    x = b.param("x", [2, 3, 4, 5])
    y = b("layout", x, permutation=CHANNELS_LAST)
    assert y.shape == x.shape.as_channels_last()
    assert kernel_supported(y) is None
    v = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    (got,) = run_module(b.ret(y), {"x": v})
    np.testing.assert_array_equal(got, v)
    with pytest.raises(ShapeError, match=r"layout: \[0, 2, 1\] is not a permutation of 4 dims"):
        b("layout", x, permutation=(0, 2, 1))


# -- the pass on a chain ------------------------------------------------------------------------------
def cnn(dtype: type = np.float32) -> Module:
    """conv 3x3 + bias + relu -> max pool -> 1x1 conv + relu, and a transposed view of the pool."""
    rng = np.random.default_rng(0)
    b = Build()
    x = b.param("x", [2, 4, 8, 8], dtype)
    w1 = b.lit(rng.standard_normal((8, 4, 3, 3)), dtype)
    bias = b("broadcast", b.lit(rng.standard_normal(8), dtype), axis=1, out_lens=[2, 8, 8, 8])
    c1 = b(
        "relu", b("add", b("convolution", x, w1, padding=(1, 1, 1, 1), stride=(1, 1), dilation=(1, 1)), bias)
    )
    p = b("pooling", c1, mode="max", padding=(0, 0, 0, 0), stride=(2, 2), lengths=(2, 2), dilations=(1, 1))
    w2 = b.lit(rng.standard_normal((6, 8, 1, 1)), dtype)
    c2 = b("relu", b("convolution", p, w2, padding=(0, 0, 0, 0), stride=(1, 1), dilation=(1, 1)))
    return b.ret(c2, b("transpose", p, permutation=[0, 2, 3, 1]))


def laid_out_for(m: Module) -> list[str]:
    return sorted(i.inputs[0].name for i in m.instructions if i.name == "layout")


def test_convolutions_read_and_write_channels_last_and_the_layout_flows_down_the_chain() -> None:
    def build() -> Module:
        m = cnn()
        run_passes(m, FUSIONS)
        return m

    # Numbers bit for bit on the ref, twice (a second run changes nothing), shapes valid after each.
    m = check_pass(layout_pass(True, True), build)
    # The input and both filters are laid out; the pooled activations already are, so the 1x1 reads them.
    assert laid_out_for(m) == ["@literal", "@literal", "@param"]
    kept = [
        i for i in m.instructions if i.name in ("fused_conv", "convolution", "pooling", "fused_pointwise")
    ]
    assert [i.name for i in kept] == ["fused_conv", "pooling", "fused_conv"]
    assert all(i.shape.channels_last() for i in kept)
    # The view reads the strides its input really has: NHWC transposed to (N, H, W, C) is standard.
    view = m.get_return().inputs[1]
    assert view.name == "transpose" and view.shape.standard()


def test_lowered_it_copies_only_the_input_and_writes_no_other_layout_kernel() -> None:
    m = cnn()
    run_passes(m, [*FUSIONS, layout_pass(True, True)])
    low = lower(m, True, True)
    kinds = [type(s).__name__ + ":" + s.label for s in low.steps]
    relayouts = [k for k in kinds if "NHWC" in k or "copy" in k]
    # The input's NHWC copy and the returned NHWC value's copy to standard; filters went KRSC on the host.
    assert relayouts == ["KernelStep:to NHWC (layout)", "KernelStep:copy (output)"], kinds
    assert sum(isinstance(s, ConvStep) for s in low.steps) == 1
    assert sum(isinstance(s, GemmStep) for s in low.steps) == 1  # the 1x1 convolution, relu in its epilogue
    assert len(low.steps) == 5, kinds  # + the pool; the transposed view is free
    feeds = random_inputs(m, specials=False)
    for got, want in zip(run_steps(low, feeds), run_module(cnn(), feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "why, dtype, kw",
    [
        ("switched off", np.float32, {"mode": "0"}),
        ("no cuDNN", np.float32, {"use_dnn": False}),
        ("no cuDNN type", np.int32, {}),
    ],
)
def test_where_nhwc_does_not_pay_the_pass_changes_nothing(why: str, dtype: type, kw: dict) -> None:
    m = cnn(dtype)
    run_passes(m, FUSIONS)
    before = m.structure()
    assert not layout_convolution(m, **kw), why
    assert m.structure() == before


@pytest.mark.parametrize("value, laid", [("0", False), ("1", True), ("auto", True)])
def test_the_switch_is_read_by_the_pass(monkeypatch, value: str, laid: bool) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_NHWC", value)
    m = cnn()
    run_passes(m, FUSIONS)
    assert layout_convolution(m) == laid


def conv_1x1_residual() -> Module:
    b = Build()
    x, r = b.param("x", [2, 4, 5, 5]), b.param("r", [2, 6, 5, 5])
    w = b.lit(np.random.default_rng(1).standard_normal((6, 4, 1, 1)))
    conv = b("convolution", x, w, padding=(0, 0, 0, 0), stride=(1, 1), dilation=(1, 1))
    return b.ret(b("relu", b("add", conv, r)))


def test_a_residual_a_1x1_gemm_adds_is_laid_out_too() -> None:
    m = conv_1x1_residual()
    run_passes(m, [*FUSIONS, layout_pass(True, True)])
    assert laid_out_for(m) == ["@literal", "@param", "@param"]  # the filter, x and the residual
    (step,) = [s for s in lower(m, True, True).steps if not isinstance(s, KernelStep)]
    assert isinstance(step, GemmStep) and step.has_residual
    # Without cuBLASLt cuDNN runs it, and reads the residual as it is.
    m = conv_1x1_residual()
    run_passes(m, [*FUSIONS, layout_pass(False, True)])
    assert laid_out_for(m) == ["@literal", "@param"]


# -- shape templates reproduce the layout --------------------------------------------------------------
def _optimised(graph: dict, batch: int, cache: WeightCache):
    (name,) = graph["inputs"]
    info = graph["values"][name]
    lens = [batch if d == "batch" else d for d in info["shape"]]
    prog = parse_graph(graph, {name: Shape(from_onnx(info["dtype"]), lens)}, weights=cache).program
    for m in prog.modules.values():
        run_passes(m, gpu_pipeline(cache, True, True))
    adopt_submodules(prog)
    return prog


def _instructions(prog) -> list:
    m = prog.get_main_module()
    pos = {id(i): n for n, i in enumerate(m.instructions)}
    return [(i.name, i.shape, [pos[id(a)] for a in i.inputs]) for i in m.instructions]


@pytest.mark.parametrize("model", ["resnet_fp16.onnx", "mobilenet_v2_fp16.onnx"])
def test_a_template_instantiates_the_layouts_of_the_full_compile(model: str) -> None:
    graph = model_to_dict(onnx.load(MODELS / model))
    cache = WeightCache()
    (name,) = graph["inputs"]
    templates = Templates([name], [graph["values"][name]["shape"]])
    for batch in (1, 2, 3, 5):
        templates.add({"batch": batch}, _optimised(graph, batch, cache), "t")
    t = templates.find({"batch": 7})
    assert t is not None
    inst, full = t.instantiate({"batch": 7}), _optimised(graph, 7, cache)
    assert _instructions(inst) == _instructions(full)
    assert any(i.name == "layout" for i in inst.get_main_module().instructions)
    steps = [str(s.label) for s in lower(inst.get_main_module(), True, True, weights=cache).steps]
    assert steps == [str(s.label) for s in lower(full.get_main_module(), True, True, weights=cache).steps]
    # One NHWC copy, the input's: MobileNet's lone clips (ReLU6) and pads keep the layout as well.
    assert sum("NHWC" in s for s in steps) == 1
    assert not [s for s in steps if s.startswith("copy") and s != "copy (output)"]


def test_make_op_knows_layout() -> None:
    assert make_op("layout", permutation=[0, 2, 3, 1]).permutation == (0, 2, 3, 1)


def test_an_mxr_file_keeps_the_layouts(tmp_path: Path) -> None:
    from migraphx_ep import mxr

    graph = model_to_dict(onnx.load(MODELS / "mobilenet_v2_fp16.onnx"))
    prog = _optimised(graph, 2, WeightCache())
    mxr.save(prog, tmp_path / "m.mxr")
    back = mxr.load(tmp_path / "m.mxr")
    assert _instructions(back) == _instructions(prog)
    assert any(i.name == "layout" and i.shape.channels_last() for i in back.get_main_module().instructions)


@pytest.mark.parametrize("op, extra", [("relu", 0), ("clip", 2), ("where", 2), ("add", 1)])
def test_lone_elementwise_ops_keep_a_channels_last_input(op: str, extra: int) -> None:
    b = Build()
    x = b("layout", b.param("x", [2, 3, 4, 5]), permutation=CHANNELS_LAST)
    others = [b.param(f"y{i}", [2, 3, 4, 5]) for i in range(extra)]
    if op == "where":
        args = [b("greater", x, others[0]), x, others[1]]
    else:
        args = [x, *others]
    y = b(op, *args)
    assert y.shape == x.shape.as_channels_last()
    # Contiguous is the one elementwise copy that means "standard".
    assert b("contiguous", y).shape.standard()
