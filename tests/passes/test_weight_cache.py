"""The weight cache (ir/weights.py) shared by the compiles of one subgraph: constant folding, CSE and
fp16 conversion take what an earlier compile computed from the weights, and the numbers stay the same."""

from __future__ import annotations

import gc

import numpy as np
from passcheck import Build, random_inputs, same_bits

from migraphx_ep.ir.evaluate import run_module
from migraphx_ep.ir.operation import Literal
from migraphx_ep.ir.program import Program
from migraphx_ep.ir.weights import WeightCache
from migraphx_ep.passes import DEAD_CODE_ELIMINATION as DCE
from migraphx_ep.passes import ELIMINATE_COMMON_SUBEXPRESSION, run_passes
from migraphx_ep.passes.pipelines import ref_pipeline
from migraphx_ep.quantize import quantize_fp16

RNG = np.random.default_rng(0)
W = RNG.standard_normal((6, 4)).astype(np.float32)  # an initializer: the same array every compile
B = RNG.standard_normal(6).astype(np.float32)


def model(batch: int, cache: WeightCache | None):
    """x[batch, 4] @ transpose(W) + neg(B): two weight-only values, folded by every compile."""
    b = Build()
    w = b.m.add_literal(cache.literal(W) if cache else W)
    bias = b.m.add_literal(cache.literal(B) if cache else B)
    x = b.param("x", [batch, 4])
    y = b("dot", x, b("contiguous", b("transpose", w, permutation=[1, 0])))
    nb = b("multibroadcast", b("neg", bias), out_lens=[batch, 6])
    return b.ret(b("add", y, nb))


def literals(m) -> dict[int, Literal]:
    return {id(i.op): i.op for i in m.instructions if i.is_literal()}  # type: ignore[misc]


def test_initializer_literal_is_one_object():
    cache = WeightCache()
    assert cache.literal(W) is cache.literal(W)
    assert cache.literal(W) is not cache.literal(W.copy())  # another initializer, even with equal bytes
    assert cache.key_of(cache.literal(W)) is not None and cache.key_of(Literal(W)) is None


def test_second_shape_takes_the_folded_weights_and_numbers_are_the_same():
    cache = WeightCache()
    first = model(2, cache)
    run_passes(first, ref_pipeline(cache))
    misses = cache.misses
    assert misses >= 2  # the weight chain and neg(B) were computed
    second = model(5, cache)
    run_passes(second, ref_pipeline(cache))
    assert cache.misses == misses and cache.hits >= 2  # ... and not again for the new batch size
    assert literals(first).keys() == literals(second).keys()  # the very same literal objects
    plain = model(5, None)
    run_passes(plain, ref_pipeline())
    assert second == plain  # the same program as a compile that shares nothing
    feeds = random_inputs(second)
    for got, want in zip(run_module(second, feeds), run_module(model(5, None), feeds), strict=True):
        assert same_bits(got, want)


def test_derived_values_live_as_long_as_a_program_holds_them():
    cache = WeightCache()
    m = model(2, cache)
    run_passes(m, ref_pipeline(cache))
    computed = cache.misses
    del m
    gc.collect()
    m = model(3, cache)
    run_passes(m, ref_pipeline(cache))
    assert cache.misses == 2 * computed  # nothing held them: computed again, no stale key reused


def test_a_literal_not_from_the_cache_is_not_cached():
    cache = WeightCache()
    for _ in range(2):
        b = Build()
        x = b.param("x", [2, 3])
        m = b.ret(b("add", x, b("neg", b.lit(np.ones((2, 3))))))
        run_passes(m, ref_pipeline(cache))
    assert cache.hits == cache.misses == 0


def test_cse_tells_distinct_weights_apart_without_hashing_them():
    b = Build()
    x = b.param("x", [64, 64])
    ws = [b.lit(RNG.standard_normal((64, 64))) for _ in range(3)]
    same = [b.lit(np.full((64, 64), 0.5)) for _ in range(2)]  # equal bytes: merged
    m = b.ret(*[b("add", x, w) for w in ws + same])
    run_passes(m, [ELIMINATE_COMMON_SUBEXPRESSION, DCE])
    left = [i for i in m.instructions if i.is_literal()]
    assert len(left) == 4
    hashed = [i for i in ws if i.op._digest is not None]  # type: ignore[attr-defined]
    assert not hashed  # random weights differ in their sampled elements: no full hash needed


def program(batch: int, cache: WeightCache | None) -> Program:
    p = Program()
    p.modules["main"] = model(batch, cache)
    p.weights = cache
    return p


def test_fp16_conversion_of_a_weight_is_shared_and_stays_one_weight():
    cache = WeightCache()
    progs = [program(n, cache) for n in (1, 3)]
    for p in progs:
        quantize_fp16(p)
        run_passes(p.get_main_module(), ref_pipeline(cache))
    half = [
        {k: v for k, v in literals(p.get_main_module()).items() if v.value.dtype == np.float16} for p in progs
    ]
    weight = [{k for k, v in h.items() if v.value.shape == (4, 6)} for h in half]
    assert len(weight[0]) == 1 and weight[0] == weight[1]  # W converted once, for both batch sizes
    shapes = sorted(v.value.shape for v in half[1].values())
    assert shapes == [(4, 6), (6,)]  # no copy per batch index
    plain = program(3, None)
    quantize_fp16(plain)
    run_passes(plain.get_main_module(), ref_pipeline())
    feeds = random_inputs(plain.get_main_module())
    got, want = run_module(progs[1].get_main_module(), feeds), run_module(plain.get_main_module(), feeds)
    assert all(same_bits(g, w) for g, w in zip(got, want, strict=True))


def test_a_full_expression_table_starts_afresh_without_mixing_keys(monkeypatch):
    from migraphx_ep.ir import weights as weights_module

    monkeypatch.setattr(weights_module, "MAX_EXPRESSIONS", 3)
    cache, held = WeightCache(), []
    for batch in (2, 3, 2, 4):
        m = model(batch, cache)
        run_passes(m, ref_pipeline(cache))
        held.append(m)
        assert len(cache._exprs) <= 3
        plain = model(batch, None)
        run_passes(plain, ref_pipeline())
        assert m == plain
        feeds = random_inputs(m)
        for got, want in zip(run_module(m, feeds), run_module(plain, feeds), strict=True):
            assert same_bits(got, want)


def test_fp16_conversion_of_a_broadcast_bias_stays_one_value_per_channel():
    # A convolution's bias is broadcast along axis 1 (``broadcast``, not ``multibroadcast``): converted
    # after broadcasting, it folded to a full (batch, C, H, W) half tensor that its kernel then read.
    b = Build()
    x = b.param("x", [2, 4, 5, 5])
    bias = b.m.add_literal(RNG.standard_normal(4).astype(np.float32))
    b.ret(b("add", x, b("broadcast", bias, axis=1, out_lens=[2, 4, 5, 5])))
    prog = Program()
    prog.modules["main"] = b.m
    quantize_fp16(prog)
    run_passes(b.m, ref_pipeline())
    assert sorted(i.op.value.shape for i in b.m.instructions if i.is_literal()) == [(4,)]  # type: ignore[attr-defined]


def test_int8_quantisation_of_a_batch_broadcast_weight_keeps_one_copy():
    # ONNX MatMul broadcasts a 2-D weight over the batch: quantised after broadcasting, the folded int8
    # weight was one copy per batch index, each read by its own GEMM (BERT-base int8 bs8: 8x the bytes).
    from migraphx_ep.ir.dtypes import DType
    from migraphx_ep.passes.simplify_qdq import simplify_qdq
    from migraphx_ep.quantize import quantize_static

    b = Build()
    x = b.param("x", [3, 2, 4])
    w = b.m.add_literal(W.T.copy())  # (4, 6)
    b.ret(b("dot", x, b("multibroadcast", w, out_lens=[3, 4, 6])))
    prog = Program()
    prog.modules["main"] = b.m
    feeds = {"x": np.random.default_rng(1).uniform(-4, 4, (3, 2, 4)).astype(np.float32)}
    want = run_module(b.m, feeds)[0]
    assert quantize_static(prog, DType.int8_type, lambda sites: [4.0, float(np.abs(W).max())]) == 2
    simplify_qdq(b.m)
    run_passes(b.m, ref_pipeline())
    names = [i.name for i in b.m.instructions]
    assert "quant_dot" in names and "dot" not in names
    int8 = [i.op.value.shape for i in b.m.instructions if i.is_literal() and i.shape.type == DType.int8_type]  # type: ignore[attr-defined]
    assert [s for s in int8 if s] == [(4, 6)]  # besides the zero point's one value
    got = run_module(b.m, feeds)[0]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()  # int8 of both operands
