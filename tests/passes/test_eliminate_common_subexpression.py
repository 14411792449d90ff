"""eliminate_common_subexpression: equal op + same inputs merge (transitively); literals by bytes."""

from __future__ import annotations

import numpy as np
from passcheck import Build, check_pass

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ops.base import unary
from migraphx_ep.passes import DEAD_CODE_ELIMINATION as DCE
from migraphx_ep.passes import ELIMINATE_COMMON_SUBEXPRESSION, eliminate_common_subexpression

CSE = [ELIMINATE_COMMON_SUBEXPRESSION, DCE]
LENS = [2, 3]


def _noise(v: np.ndarray) -> np.ndarray:
    return v + np.random.default_rng().standard_normal(v.shape).astype(v.dtype)


_RANDOM = unary("test_cse_random", _noise, types=[DType.float_type])
_RANDOM.nondeterministic = True  # type: ignore[attr-defined]


def test_duplicates_merge_transitively():
    def build():
        b = Build()
        x, y = b.param("x", LENS), b.param("y", LENS)
        a1, a2 = b("add", x, y), b("add", x, y)
        n1, n2 = b("neg", a1), b("neg", a2)
        return b.ret(b("mul", n1, n2), b("exp", a2))

    def expected():
        b = Build()
        x, y = b.param("x", LENS), b.param("y", LENS)
        a = b("add", x, y)
        n = b("neg", a)
        return b.ret(b("mul", n, n), b("exp", a))

    check_pass(CSE, build, expected)


def test_operand_order_and_attributes_matter():
    def build():
        b = Build()
        x, y = b.param("x", LENS), b.param("y", LENS)
        return b.ret(
            b("sub", x, y),
            b("sub", y, x),
            b("transpose", x, permutation=[1, 0]),
            b("reshape", x, dims=[3, 2]),
        )

    check_pass(CSE, build, build)


def test_attributes_equal_as_fields_but_not_in_meaning_stay_apart():
    """pad values 0.0 and -0.0 (and 1 vs 1.0) compare equal as dataclass fields; only equal ones merge,
    each with the first of its own kind."""

    def pads(values: list[float | int]):
        b = Build()
        x = b.param("x", LENS)
        return b.ret(*(b("pad", x, pads=[0, 1, 0, 1], value=v) for v in values))

    m = pads([0.0, -0.0, 0.0, -0.0, 1, 1.0, 1])
    assert eliminate_common_subexpression(m)
    outs = m.get_return().inputs
    assert [repr(o.op.value) for o in outs] == ["0.0", "-0.0", "0.0", "-0.0", "1", "1.0", "1"]
    assert outs[0] is outs[2] and outs[1] is outs[3] and outs[4] is outs[6]
    assert len({id(o) for o in outs}) == 4
    m.validate()


def test_equal_literals_merge_by_bytes_not_value():
    def build():
        b = Build()
        x = b.param("x", LENS)
        c = [b.lit(v) for v in ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, -0.0], [1.0, 2.0, 0.0])]
        c.append(b.lit([1, 2, 3], np.int32))
        outs = [b("add", x, b("multibroadcast", ci, out_lens=LENS)) for ci in c[:4]]
        return b.ret(*outs, c[4])

    def expected():
        b = Build()
        x = b.param("x", LENS)
        c = [b.lit(v) for v in ([1.0, 2.0, 3.0], [1.0, 2.0, -0.0], [1.0, 2.0, 0.0])]
        ci = b.lit([1, 2, 3], np.int32)
        a = b("add", x, b("multibroadcast", c[0], out_lens=LENS))
        return b.ret(
            a,
            a,
            b("add", x, b("multibroadcast", c[1], out_lens=LENS)),
            b("add", x, b("multibroadcast", c[2], out_lens=LENS)),
            ci,
        )

    m = check_pass(CSE, build)
    outs = m.get_return().inputs
    assert outs[0] is outs[1]  # equal bytes
    assert len({id(o) for o in outs[1:4]}) == 3  # 3.0, -0.0 and 0.0 stay apart
    assert sorted(map(str, m)) == sorted(map(str, expected()))


def test_nondeterministic_and_params_not_merged():
    def build():
        b = Build()
        x = b.param("x", LENS)
        b.param("x2", LENS)
        return b.ret(b("test_cse_random", x), b("test_cse_random", x))

    m = build()
    assert not eliminate_common_subexpression(m)
    assert sum(ins.name == "test_cse_random" for ins in m) == 2
    assert len(m.get_parameters()) == 2


def test_mixed_int_float_literals_same_bytes_differ():
    def build():
        b = Build()
        return b.ret(b.lit([0, 0], np.int32), b.lit([0, 0], np.float32), b.lit([0, 0], np.int32))

    m = build()
    assert eliminate_common_subexpression(m)
    DCE.apply(m)
    assert [ins.name for ins in m].count("@literal") == 2
