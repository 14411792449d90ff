"""eliminate_identity: users read the identity's input; layouts users depend on are respected."""

from __future__ import annotations

import numpy as np
from passcheck import Build, check_pass

from migraphx_ep.passes import DEAD_CODE_ELIMINATION as DCE
from migraphx_ep.passes import ELIMINATE_IDENTITY, eliminate_identity

EI = [ELIMINATE_IDENTITY, DCE]
LENS = [2, 3]


def test_identities_removed():
    def build():
        b = Build()
        x = b.param("x", LENS, np.int32)
        i1 = b("identity", b("identity", x))
        return b.ret(b("neg", i1), b("identity", i1))

    def expected():
        b = Build()
        x = b.param("x", LENS, np.int32)
        return b.ret(b("neg", x), x)

    check_pass(EI, build, expected)


def test_identity_of_a_view_feeding_a_view_stays():
    # identity gives a standard shape; the transpose after it would get other strides without it.
    def build():
        b = Build()
        x = b.param("x", LENS)
        i = b("identity", b("transpose", x, permutation=[1, 0]))
        return b.ret(b("transpose", i, permutation=[1, 0]), b("exp", i))

    m = build()
    assert eliminate_identity(m)  # exp can read the view directly
    m.validate()
    assert [ins.name for ins in m].count("identity") == 1
    check_pass(EI, build)
