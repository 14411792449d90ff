"""Shape templates (ep/shape_template.py): a never-seen input shape instantiates the optimised program
fitted to the programs of earlier shapes -- no parse, no passes -- and gets exactly the program (and, on
the gpu target, the lowered steps and kernel sources) a full compile would give."""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from migraphx_ep.ep.provider import create_ep
from migraphx_ep.ep.shape_fit import (
    Fitter,
    NoTemplate,
    NotInstantiable,
    TooFewPrograms,
    affine,
    stride_products,
)
from migraphx_ep.ep.shape_template import Templates, flatten
from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import from_onnx
from migraphx_ep.ir.operation import Literal
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ir.weights import WeightCache
from migraphx_ep.mxr.codec import decode_program, encode_program
from migraphx_ep.passes import run_passes
from migraphx_ep.passes.pipelines import ref_pipeline
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.fuse import adopt_submodules
from migraphx_ep.targets.gpu.kernels.spec import canonical
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.simulate import run_steps
from migraphx_ep.targets.gpu.steps import KernelStep
from migraphx_ep.targets.ref import RefExecutable

MODELS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models")
EP = "MIGraphXExecutionProvider"
OPSET = onnx.helper.make_opsetid("", 17)
# (batch, sequence): five programs over-determine a fit in both (1, b, s, b*s); then never-seen ones.
SEEN = [(2, 8), (3, 5), (2, 13), (4, 9), (3, 16)]
NEW = [(5, 7), (2, 21), (6, 3)]


# -- the fits ------------------------------------------------------------------------------------------
def test_sizes_fit_exactly_over_the_varying_dims():
    dims = [{"b": b, "s": s} for b, s in SEEN]
    f = Fitter(dims, ["b", "s"])
    assert f.fit([7] * 5) == 7
    for rule in (lambda b, s: s, lambda b, s: b * s * 12, lambda b, s: 3 * b + s + 1):
        poly = f.fit([rule(d["b"], d["s"]) for d in dims])
        assert all(poly.at({"b": b, "s": s}) == rule(b, s) for b, s in NEW)
    half = Fitter([{"s": s} for s in (64, 96, 224)], ["s"]).fit([32, 48, 112])
    assert half.at({"s": 320}) == 160
    with pytest.raises(NotInstantiable, match="not whole"):
        half.at({"s": 33})
    with pytest.raises(NoTemplate, match="no polynomial"):
        f.fit([s * s for _, s in SEEN])  # a square is no product of distinct dims
    with pytest.raises(TooFewPrograms):
        Fitter(dims[:4], ["b", "s"]).fit([s for _, s in SEEN[:4]])  # exactly determined: unchecked


def test_constants_that_vary_are_affine_in_their_index():
    assert affine(np.arange(6).reshape(1, 6)) == (0, [None, 1])
    assert affine(np.arange(2 * 6).reshape(2, 1, 1, 6)) == (0, [6, None, None, 1])  # a flattened range
    assert affine(np.ones((1, 1, 5, 1), bool)) == (1, [None, None, 0, None])
    assert affine(np.full((3, 2), -0.5, np.float32)) == (-0.5, [0, 0])
    assert affine(np.array([0, 1, 3])) is None
    assert affine(np.array([0.0, 1.0])) is None  # floats: one value everywhere, or nothing


def test_strides_of_views_are_products_of_sizes():
    # attention scores (b, h, s, s) transposed to (b, s, h, s): strides need s*s, no linear size
    views = []
    for s in (5, 9, 16):
        lens = [2, s, 4, s]
        views.append({"lens": lens, "strides": [4 * s * s, s, s * s, 1]})
    products = stride_products(views)
    assert products is not None
    for s in (7, 30):  # sizes never seen
        lens = [2, s, 4, s]
        assert [c * int(np.prod([lens[j] for j in axes])) for axes, c in products] == [4 * s * s, s, s * s, 1]
    assert stride_products([{"lens": [3], "strides": [5]}, {"lens": [4], "strides": [7]}]) is None


# -- programs ------------------------------------------------------------------------------------------
def optimised(graph: dict, b: int, s: int, cache: WeightCache, gpu: bool):
    shapes = {}
    for n in graph["inputs"]:
        info = graph["values"][n]
        lens = [{"batch": b, "sequence": s}.get(d, d) for d in info["shape"]]
        shapes[n] = Shape(from_onnx(info["dtype"]), lens)
    prog = parse_graph(graph, shapes, specialize=True, weights=cache).program
    for m in prog.modules.values():
        run_passes(m, gpu_pipeline(cache, True, True) if gpu else ref_pipeline(cache))
    if gpu:
        adopt_submodules(prog)
    return prog


def fitted(name: str, gpu: bool):
    graph = model_to_dict(onnx.load(os.path.join(MODELS, name)))
    cache = WeightCache()
    templates = Templates(list(graph["inputs"]), [graph["values"][n]["shape"] for n in graph["inputs"]])
    for b, s in SEEN:
        templates.add({"batch": b, "sequence": s}, optimised(graph, b, s, cache, gpu), "t")
    t = templates.find({"batch": 9, "sequence": 9})
    assert t is not None and t.vary == ("batch", "sequence") and not t.fixed
    return graph, cache, templates, t


def feeds(graph: dict, b: int, s: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(b * 100 + s)
    out = {}
    for n in graph["inputs"]:
        top = 2 if "type" in n else (2 if "mask" in n else 100)
        out[n] = rng.integers(0, top, (b, s)).astype(np.int64)
    return out


@pytest.mark.parametrize("model", ["bert.onnx", "gpt2.onnx"])
def test_an_instantiated_program_is_the_full_compile(model):
    graph, cache, _, t = fitted(model, gpu=False)
    for b, s in NEW:
        inst = t.instantiate({"batch": b, "sequence": s})
        full = optimised(graph, b, s, cache, gpu=False)
        assert t.disagrees(flatten({"batch": b, "sequence": s}, full)) is None
        assert _instructions(inst) == _instructions(full)  # shapes too: instantiate computes its own
        x = feeds(graph, b, s)
        got, want = RefExecutable(inst).run(dict(x)), RefExecutable(full).run(dict(x))
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def _instructions(prog) -> list:
    """The main module's instructions: op name, shape, inputs (by position) and the submodules it owns,
    each described the same way (so a body shared by several ops compares equal to its copies)."""

    def described(m) -> list:
        pos = {id(i): n for n, i in enumerate(m.instructions)}
        return [
            (i.name, i.shape, [pos[id(a)] for a in i.inputs], [described(x) for x in i.module_args])
            for i in m.instructions
        ]

    return described(prog.get_main_module())


def test_equal_bodies_are_built_once_and_shared():
    # BERT's 2 layers own equal bodies (each layer's GEMM epilogues, layernorms, attention): an
    # instantiation builds one of each and its fused ops share it; the full compile has a copy each.
    graph, cache, _, t = fitted("bert_fp16.onnx", gpu=True)
    inst, full = t.instantiate({"batch": 3, "sequence": 11}), optimised(graph, 3, 11, cache, gpu=True)
    owners = [x for i in inst.get_main_module().instructions for x in i.module_args]
    assert len(inst.modules) < len(full.modules) == len(owners) + 1
    assert len(inst.modules) == len({id(x) for x in owners}) + 1  # every module is in the program
    assert all(inst.modules[x.name] is x for x in owners)
    assert _instructions(inst) == _instructions(full)


def _steps(prog, cache) -> tuple[list[str], set[str]]:
    low = lower(prog.get_main_module(), True, True, weights=cache)
    text = [re.sub(r" at 0x[0-9a-f]+", "", str(s)) for s in low.steps]
    return text, {canonical(s.spec).source for s in low.steps if isinstance(s, KernelStep)}


def test_bodies_that_differ_in_a_constant_are_not_shared():
    # Two chains alike but for one constant (x * 2 + 1, x * 3 + 1): two bodies, and each output its own.
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "sequence"])
    outs = [onnx.helper.make_tensor_value_info(f"y{k}", onnx.TensorProto.FLOAT, None) for k in (2, 3)]
    nodes, inits = [], [onnx.numpy_helper.from_array(np.array(1, np.float32), "one")]
    for k in (2, 3):
        inits.append(onnx.numpy_helper.from_array(np.array(k, np.float32), f"c{k}"))
        nodes += [
            onnx.helper.make_node("Mul", ["x", f"c{k}"], [f"m{k}"]),
            onnx.helper.make_node("Add", [f"m{k}", "one"], [f"y{k}"]),
        ]
    graph = model_to_dict(
        onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", [x], outs, inits), opset_imports=[OPSET])
    )
    cache = WeightCache()
    templates = Templates(["x"], [["batch", "sequence"]])
    for b, s in SEEN:
        templates.add({"batch": b, "sequence": s}, optimised(graph, b, s, cache, gpu=True), "t")
    t = templates.find({"batch": 5, "sequence": 7})
    assert t is not None and not t.same
    inst = t.instantiate({"batch": 5, "sequence": 7})
    assert len(inst.modules) == 3
    feed = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    got = run_steps(lower(inst.get_main_module(), True, True, weights=cache), {"x": feed})
    np.testing.assert_allclose(got[0], feed * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(got[1], feed * 3 + 1, rtol=1e-6)


def test_on_the_gpu_target_it_lowers_to_the_full_compile_and_compiles_no_kernel():
    # Codegen level, no GPU: the same steps, and only kernel sources the earlier shapes compiled.
    graph, cache, _, t = fitted("bert_fp16.onnx", gpu=True)
    seen: set[str] = set()
    for b, s in SEEN[1:]:
        seen |= _steps(optimised(graph, b, s, cache, gpu=True), cache)[1]
    for b, s in NEW:
        inst, full = t.instantiate({"batch": b, "sequence": s}), optimised(graph, b, s, cache, gpu=True)
        assert _instructions(inst) == _instructions(full)
        steps, sources = _steps(inst, cache)
        assert steps == _steps(full, cache)[0]
        assert sources <= seen, f"{len(sources - seen)} new kernel sources at {(b, s)}"


def is_index_range(ins) -> bool:
    return ins.is_literal() and ins.op.value.dtype == np.int64 and ins.op.value.size > 7


def test_a_full_compile_that_disagrees_drops_the_template(caplog):
    graph, cache, templates, t = fitted("bert.onnx", gpu=False)
    full = optimised(graph, 5, 7, cache, gpu=False)
    m = full.get_main_module()
    lit = next(i for i in m.instructions if is_index_range(i))
    m.replace_instruction(lit, Literal(np.zeros_like(lit.op.value)), [])
    assert "a constant differs" in t.disagrees(flatten({"batch": 5, "sequence": 7}, full))
    with caplog.at_level(logging.WARNING, logger="migraphx_ep"):
        templates.add({"batch": 5, "sequence": 7}, full, "t")
    assert "shape template dropped" in caplog.text and templates.dropped == 1
    assert templates.find({"batch": 5, "sequence": 7}) is None


def test_dims_of_a_key_name_each_symbolic_axis_once():
    templates = Templates(["a", "b", "c"], [["n", 4], ["n", None], [3]])
    assert templates.dims([[2, 4], [2, 7], [3]]) == {"n": 2, "b:1": 7}
    assert templates.dims([[2, 4], [3, 7], [3]]) is None  # one dim, two sizes


# -- through ONNX Runtime --------------------------------------------------------------------------
def test_never_seen_shapes_are_instantiated_through_ort(monkeypatch, caplog):
    monkeypatch.setenv("MIGRAPHX_EP_SHAPE_TEMPLATES", "1")  # the ref target parses every shape by default
    graph = model_to_dict(onnx.load(os.path.join(MODELS, "bert.onnx")))
    c = create_ep({"migraphx_target": "ref"}).compile(graph, "fused_0")
    cpu = ort.InferenceSession(os.path.join(MODELS, "bert.onnx"), providers=["CPUExecutionProvider"])
    with caplog.at_level(logging.INFO, logger="migraphx_ep"):
        for b, s in SEEN + NEW:
            x = feeds(graph, b, s)
            got = c.run([x[n] for n in c.input_names])
            want = cpu.run(None, {i.name: x[i.name] for i in cpu.get_inputs()})
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert c.templates is not None and c.templates.served == len(NEW)
    assert caplog.text.count("instantiated from a shape template for ref") == len(NEW)


def test_background_compiles_check_a_template_then_instantiate(monkeypatch):
    # Quick picks on the ref target: each served shape compiles again in the background. The first
    # CHECKS of those are full compiles that must agree with the template; the rest instantiate too.
    from migraphx_ep.ep import background_compiles, shape_template
    from migraphx_ep.ep.background import wait_for_compiles

    monkeypatch.setenv("MIGRAPHX_EP_SHAPE_TEMPLATES", "1")
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "1")
    monkeypatch.setattr(background_compiles, "QUIET_S", 0.0)
    graph = model_to_dict(onnx.load(os.path.join(MODELS, "bert.onnx")))
    c = create_ep({"migraphx_target": "ref"}).compile(graph, "fused_0")
    before = dict(shape_template.STATS)
    for b, s in SEEN:
        c.run([feeds(graph, b, s)[n] for n in c.input_names])
        wait_for_compiles()  # their timed programs: full compiles, before any template
    extra = [(2, 4), (3, 12), (4, 6)]
    for b, s in NEW + extra:
        c.run([feeds(graph, b, s)[n] for n in c.input_names])
    wait_for_compiles()
    (t,) = c.templates.templates.values()  # type: ignore[union-attr]
    assert c.templates.served == len(NEW + extra) and c.templates.dropped == 0  # type: ignore[union-attr]
    assert t.agreed == shape_template.CHECKS
    background = shape_template.STATS["background"] - before["background"]
    # The fifth seen shape's timed compile, the first after the fit, was the first check.
    assert background == len(NEW + extra) + 1 - shape_template.CHECKS


def test_switched_off_and_on_by_target(monkeypatch):
    graph = model_to_dict(onnx.load(os.path.join(MODELS, "bert.onnx")))
    assert create_ep({"migraphx_target": "ref"}).compile(graph, "f").templates is None
    monkeypatch.setenv("MIGRAPHX_EP_SHAPE_TEMPLATES", "1")
    assert create_ep({"migraphx_target": "ref"}).compile(graph, "f").templates is not None


def test_a_bad_switch_value_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_SHAPE_TEMPLATES", "yes")
    graph = model_to_dict(onnx.load(os.path.join(MODELS, "bert.onnx")))
    with pytest.raises(ValueError, match="MIGRAPHX_EP_SHAPE_TEMPLATES='yes'"):
        create_ep({"migraphx_target": "ref"}).compile(graph, "f")


def test_other_key_splits_and_batch_1_compile_with_the_first_shape():
    # Attention splits its keys among 1, 2 or 4 warps by block count (batch x heads x row tiles), each
    # split its own source; at batch 1 a pointwise kernel's batch dim drops out of its source. The
    # first shape's kernels carry those (``others``), which compile beside them: later shapes of any
    # split, batch 1 included, find every kernel compiled.
    graph = model_to_dict(onnx.load(os.path.join(MODELS, "bert_fp16.onnx")))
    cache = WeightCache()
    low = lower(optimised(graph, 2, 8, cache, gpu=True).get_main_module(), True, True, weights=cache)
    specs = [canonical(s.spec) for s in low.steps if isinstance(s, KernelStep)]
    seen = {sp.source for sp in specs} | {o.source for sp in specs if sp.others for o in sp.others()}
    splits = set()
    for b, s in [(2, 8), (1, 5), (40, 16), (200, 16), (1, 64)]:  # 2 heads: 4, 2, 80, 400, 2 blocks
        steps = _steps(optimised(graph, b, s, cache, gpu=True), cache)[1]
        splits |= {x for x in steps if "mma" in x}
        assert steps <= seen, f"{len(steps - seen)} new kernel sources at {(b, s)}"
    assert len(splits) == 3  # one attention source per split: the shapes do reach all three


def test_a_program_with_shared_bodies_saves_and_loads():
    # The model cache and EPContext store instantiated programs: a shared body is stored once.
    graph, cache, _, t = fitted("bert_fp16.onnx", gpu=True)
    inst = t.instantiate({"batch": 3, "sequence": 11})
    spec, arrays = encode_program(inst, "t.mxr", binary=True)
    back = decode_program(spec, arrays, None, None, "t.mxr")
    assert len(back.modules) == len(inst.modules)
    assert _instructions(back) == _instructions(inst)
