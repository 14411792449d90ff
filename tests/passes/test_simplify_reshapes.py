"""simplify_reshapes: view chains collapse; layouts stay valid; numbers unchanged."""

from __future__ import annotations

import numpy as np
from passcheck import Build, check_pass

from migraphx_ep.passes import DEAD_CODE_ELIMINATION as DCE
from migraphx_ep.passes import SIMPLIFY_RESHAPES, simplify_reshapes

SR = [SIMPLIFY_RESHAPES, DCE]


def _only(lens, dtype=np.float32):
    def build():
        b = Build()
        return b.ret(b.param("x", lens, dtype))

    return build


def test_transpose_pair_cancels():  # transpose(transpose(x)) with inverse perms -> x
    def build():
        b = Build()
        x = b.param("x", [2, 3, 4])
        return b.ret(b("transpose", b("transpose", x, permutation=[2, 0, 1]), permutation=[1, 2, 0]))

    check_pass(SR, build, _only([2, 3, 4]))


def test_transpose_pair_composes():
    def build():
        b = Build()
        x = b.param("x", [2, 3, 4])
        t = b("transpose", b("transpose", x, permutation=[2, 0, 1]), permutation=[0, 2, 1])
        return b.ret(b("contiguous", t))

    def expected():
        b = Build()
        x = b.param("x", [2, 3, 4])
        return b.ret(b("contiguous", b("transpose", x, permutation=[2, 1, 0])))

    check_pass(SR, build, expected)


def test_identity_transpose_and_same_lens_broadcast():
    def build():
        b = Build()
        x = b.param("x", [2, 3], np.int64)
        t = b("transpose", x, permutation=[0, 1])
        return b.ret(b("multibroadcast", t, out_lens=[2, 3]))

    check_pass(SR, build, _only([2, 3], np.int64))


def test_reshape_chain_becomes_one_reshape():
    def build():
        b = Build()
        x = b.param("x", [2, 3, 4])
        r = b("flatten", b("unsqueeze", b("reshape", x, dims=[6, -1]), axes=[0]), axis=2)
        return b.ret(b("squeeze", b("reshape", r, dims=[1, 24]), axes=[0]))

    def expected():
        b = Build()
        x = b.param("x", [2, 3, 4])
        return b.ret(b("reshape", x, dims=[24]))

    check_pass(SR, build, expected)


def test_squeeze_unsqueeze_cancel():
    def build():
        b = Build()
        x = b.param("x", [2, 1, 3])
        return b.ret(
            b("unsqueeze", b("squeeze", x, axes=[1]), axes=[1]),
            b("squeeze", b("unsqueeze", x, axes=[0, 3]), axes=[0, 3]),
        )

    def expected():
        b = Build()
        x = b.param("x", [2, 1, 3])
        return b.ret(x, x)

    check_pass(SR, build, expected)


def test_reshape_of_transposed_input_keeps_its_copy():
    # squeeze of a transposed view is a view; folding it into a reshape would make it a copy with a
    # different layout, so it stays; the copying reshape on top may absorb the chain though.
    def build():
        b = Build()
        x = b.param("x", [3, 1, 2])
        t = b("transpose", x, permutation=[2, 1, 0])
        sq = b("squeeze", t, axes=[1])
        return b.ret(b("unsqueeze", sq, axes=[0]), b("reshape", sq, dims=[6]))

    def expected():
        b = Build()
        x = b.param("x", [3, 1, 2])
        t = b("transpose", x, permutation=[2, 1, 0])
        return b.ret(b("unsqueeze", b("squeeze", t, axes=[1]), axes=[0]), b("reshape", t, dims=[6]))

    check_pass(SR, build, expected)


def test_contiguous_of_standard_removed_but_not_of_transposed():
    def build():
        b = Build()
        x = b.param("x", [2, 3])
        t = b("transpose", x, permutation=[1, 0])
        return b.ret(b("contiguous", b("contiguous", x)), b("contiguous", t))

    def expected():
        b = Build()
        x = b.param("x", [2, 3])
        return b.ret(x, b("contiguous", b("transpose", x, permutation=[1, 0])))

    check_pass(SR, build, expected)


def test_multibroadcast_pair():
    def build():
        b = Build()
        x = b.param("x", [3, 1])
        inner = b("multibroadcast", x, out_lens=[3, 4])
        return b.ret(b("contiguous", b("multibroadcast", inner, out_lens=[2, 3, 4])))

    def expected():
        b = Build()
        x = b.param("x", [3, 1])
        return b.ret(b("contiguous", b("multibroadcast", x, out_lens=[2, 3, 4])))

    check_pass(SR, build, expected)


def test_full_slice_removed_partial_kept():
    def build():
        b = Build()
        x = b.param("x", [4, 3])
        full = b("slice", x, axes=[0], starts=[0], ends=[100])
        part = b("slice", x, axes=[0], starts=[1], ends=[3])
        return b.ret(b("neg", full), b("neg", part))

    def expected():
        b = Build()
        x = b.param("x", [4, 3])
        part = b("slice", x, axes=[0], starts=[1], ends=[3])
        return b.ret(b("neg", x), b("neg", part))

    check_pass(SR, build, expected)


def test_nothing_to_do_reports_unchanged():
    b = Build()
    x = b.param("x", [2, 3])
    m = b.ret(b("transpose", x, permutation=[1, 0]))
    assert not simplify_reshapes(m)
