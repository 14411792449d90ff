"""propagate_constant: folds the constant frontier once per instruction, keeps broadcasts small."""

from __future__ import annotations

import time

import numpy as np
from passcheck import Build, check_pass

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ops.base import unary
from migraphx_ep.passes import DEAD_CODE_ELIMINATION as DCE
from migraphx_ep.passes import PROPAGATE_CONSTANT, propagate_constant

PC = [PROPAGATE_CONSTANT, DCE]
LENS = [2, 3]
CALLS = {"n": 0}


def _counted_neg(v: np.ndarray) -> np.ndarray:
    CALLS["n"] += 1
    return np.negative(v)


def _no_reference(v: np.ndarray) -> np.ndarray:
    raise NotImplementedError("device-only op")


unary("test_pc_counted_neg", _counted_neg)
unary("test_pc_no_reference", _no_reference)
A = np.arange(6, dtype=np.float32).reshape(LENS) - 2.5
B = np.linspace(-1, 1, 6, dtype=np.float32).reshape(LENS)


def test_constant_chain_folds_to_one_literal():
    def build():
        b = Build()
        x = b.param("x", LENS)
        c = b("exp", b("neg", b("add", b.lit(A), b.lit(B))))
        return b.ret(b("mul", x, c))

    def expected():
        b = Build()
        x = b.param("x", LENS)
        return b.ret(b("mul", x, b.lit(np.exp(-(A + B)))))

    check_pass(PC, build, expected)


def test_broadcast_of_scalar_is_not_materialised_but_its_input_folds():
    def build():
        b = Build()
        x = b.param("x", LENS)
        s = b("neg", b.lit([1.5]))
        return b.ret(b("mul", x, b("multibroadcast", s, out_lens=LENS)))

    def expected():
        b = Build()
        x = b.param("x", LENS)
        return b.ret(b("mul", x, b("multibroadcast", b.lit([-1.5]), out_lens=LENS)))

    check_pass(PC, build, expected)


def _big(n: int):
    def build():
        b = Build()
        x = b.param("x", [n])
        big = b("contiguous", b("multibroadcast", b.lit([2.0]), out_lens=[n]))
        return b.ret(b("add", x, b("exp", big)))

    return build


def test_large_result_of_small_literal_stays():
    m = check_pass(PC, _big(100_000), _big(100_000))  # 400 KB from 4 bytes: computed at run time
    assert sum(ins.is_literal() for ins in m) == 1


def test_small_result_folds():
    def expected():
        b = Build()
        x = b.param("x", [1000])
        return b.ret(b("add", x, b.lit(np.exp(np.full(1000, 2.0, np.float32)))))

    check_pass(PC, _big(1000), expected)


def test_each_constant_evaluated_once_and_shared_values_reused():
    def build():
        b = Build()
        x = b.param("x", LENS)
        shared = b("test_pc_counted_neg", b.lit(A))
        c1 = b("test_pc_counted_neg", shared)
        c2 = b("add", shared, b.lit(B))
        return b.ret(b("mul", x, c1), b("add", x, c2), b("sub", shared, x))

    CALLS["n"] = 0
    m = build()
    assert propagate_constant(m)
    assert CALLS["n"] == 2  # shared once, c1 once
    DCE.apply(m)
    assert [ins.name for ins in m].count("@literal") == 3
    check_pass(PC, build)


def test_return_of_constant_keeps_output_layout():
    def build():
        b = Build()
        b.param("x", LENS)
        t = b("transpose", b.lit(A), permutation=[1, 0])  # a packed literal would change the output strides
        return b.ret(t, b("add", b.lit(A), b.lit(B)))

    def expected():
        b = Build()
        b.param("x", LENS)
        a = b.lit(A)
        s = b.lit(A + B)
        return b.ret(b("transpose", a, permutation=[1, 0]), s)

    check_pass(PC, build, expected)


def test_last_instruction_without_return_folds_in_place():
    b = Build()
    x = b.param("x", LENS)
    b("neg", x)
    b("add", b.lit(A), b.lit(B))
    m = b.m
    assert propagate_constant(m)
    assert m.instructions[-1].is_literal()
    np.testing.assert_array_equal(m.instructions[-1].op.value, A + B)
    assert not propagate_constant(m)
    m.validate()


def test_params_and_unevaluable_ops_are_not_folded():
    def build():
        b = Build()
        x = b.param("x", LENS)
        dev = b("test_pc_no_reference", b.lit(A))
        return b.ret(b("add", x, b("neg", b.lit(B))), dev)

    def expected():
        b = Build()
        x = b.param("x", LENS)
        a = b.lit(A)
        dev = b("test_pc_no_reference", a)
        return b.ret(b("add", x, b.lit(-B)), dev)

    m = build()
    run = [PROPAGATE_CONSTANT, DCE]
    for p in run:
        p.apply(m)
    for p in run:
        p.apply(m)
    assert m == expected()


def test_integer_and_convert_chain():
    def build():
        b = Build()
        x = b.param("x", LENS, np.int64)
        c = b("convert", b("mul", b.lit(A), b.lit(B)), target_type=DType.int64_type)
        return b.ret(b("add", x, c))

    def expected():
        b = Build()
        x = b.param("x", LENS, np.int64)
        return b.ret(b("add", x, b.lit((A * B).astype(np.int64), np.int64)))

    check_pass(PC, build, expected)


def test_fast_on_a_large_module():
    """~3000 instructions, 16 MB of weights: one linear walk, each constant evaluated once."""
    b = Build()
    x = b.param("x", [64, 64])
    rng = np.random.default_rng(0)
    h = x
    CALLS["n"] = 0
    for _ in range(500):
        w = b.lit(rng.standard_normal((64, 64), dtype=np.float32))
        wt = b("test_pc_counted_neg", b("transpose", w, permutation=[1, 0]))
        scale = b("multibroadcast", b("neg", b.lit([0.5])), out_lens=[64, 64])
        h = b("add", b("mul", h, wt), b("mul", wt, scale))
    m = b.ret(h)
    t0 = time.perf_counter()
    assert propagate_constant(m)
    DCE.apply(m)
    elapsed = time.perf_counter() - t0
    assert CALLS["n"] == 500
    assert not propagate_constant(m)
    assert elapsed < 10, f"propagate_constant took {elapsed:.1f}s"


def test_tuple_results_fold_through_get_tuple_elem():
    def build():
        b = Build()
        x = b.param("x", [2, 2])
        tk = b("topk", b.lit(A), k=2, axis=1, largest=True)
        return b.ret(b("add", x, b("get_tuple_elem", tk, index=0)), tk)

    def expected():
        b = Build()
        x = b.param("x", [2, 2])
        tk = b("topk", b.lit(A), k=2, axis=1, largest=True)
        return b.ret(b("add", x, b.lit(-np.sort(-A, axis=1)[:, :2])), tk)

    check_pass(PC, build, expected)


TABLE = np.arange(40, dtype=np.float32).reshape(10, 4) / 7  # an embedding table: 10 rows of 4


def _table_gather(index: np.ndarray):
    def build():
        b = Build()
        x = b.param("x", [1, *index.shape, 4])
        rows = b("gather", b.lit(TABLE), b("unsqueeze", b.lit(index, np.int64), axes=[0]), axis=0)
        return b.ret(b("add", x, rows))

    return build


def test_gather_of_a_table_by_an_index_run_is_a_view():
    # Position embeddings at range(sequence): a slice of the table, not a folded copy of its rows, so
    # programs for two sequence lengths differ in the slice's end only (ep/shape_template.py).
    def expected():
        b = Build()
        x = b.param("x", [1, 5, 4])
        rows = b("reshape", b("slice", b.lit(TABLE), axes=[0], starts=[2], ends=[7]), dims=[1, 5, 4])
        return b.ret(b("add", x, rows))

    check_pass(PC, _table_gather(np.arange(2, 7)), expected)


def test_gather_by_other_indices_still_folds():
    for index in (np.array([0, 2, 3]), np.array([3, 2]), np.array([[0, 1], [1, 2]])):

        def expected(index=index):
            b = Build()
            x = b.param("x", [1, *index.shape, 4])
            return b.ret(b("add", x, b.lit(TABLE[index][None])))

        check_pass(PC, _table_gather(index), expected)
