"""The rewrite engine: bound names, commutative matching, splats, safe replacement, undo, capped fixpoint."""

from __future__ import annotations

import numpy as np
from passcheck import Build

from migraphx_ep.passes.rewrite import (
    Builder,
    Rule,
    any_of,
    apply_rules,
    const,
    is_splat,
    op,
    replace_value,
    rule,
    splat,
    var,
)

x, y = var("x"), var("y")
LENS = [2, 3]


def test_repeated_name_binds_same_instruction():
    b = Build()
    p, q = b.param("p", LENS), b.param("q", LENS)
    same, other = b("sub", p, p), b("sub", p, q)
    pat = op("sub", x, x)
    assert pat.match(same, {}) == {"x": p}
    assert pat.match(other, {}) is None


def test_commutative_only_for_add_mul():
    b = Build()
    p = b.param("p", LENS)
    n = b("neg", p)
    assert op("add", x, op("neg", y)).match(b("add", n, p), {}) == {"x": p, "y": p}
    assert op("sub", x, op("neg", y)).match(b("sub", n, p), {}) is None


def test_splat_sees_through_views_and_minds_signed_zero():
    b = Build()
    pz = b("multibroadcast", b.lit(0.0), out_lens=LENS)
    nz = b("transpose", b("multibroadcast", b.lit([-0.0, -0.0, -0.0]), out_lens=[3, 3]), permutation=[1, 0])
    iz = b("multibroadcast", b.lit(0, np.int32), out_lens=LENS)
    mixed = b.lit([[1.0, 1.0, 1.0], [1.0, 1.0, 2.0]])
    assert is_splat(pz, 0.0) and not is_splat(pz, -0.0)
    assert is_splat(nz, -0.0) and not is_splat(nz, 0.0)
    assert is_splat(iz, 0) and is_splat(iz, -0.0)
    assert not is_splat(mixed, 1.0)
    assert not is_splat(b.param("p", LENS), 0.0)
    assert splat(0.0, bind="z").match(pz, {}) == {"z": pz}
    assert const("c").match(nz, {}) == {"c": nz}


def test_when_condition_and_bindings_in_rewrite():
    b = Build()
    p = b.param("p", LENS)
    m = b.ret(b("neg", b("neg", p)), b("neg", b("exp", p)))
    rules = [rule(op("neg", op("neg", x)), lambda r: r.x, when=lambda r: r.x.is_param())]  # --x -> x
    assert apply_rules(m, rules)
    assert m.get_return().inputs[0] is p
    assert m.get_return().inputs[1].name == "neg"
    m.validate()


def test_builder_get_is_the_binding_or_none():
    b = Build()
    p = b.param("p", LENS)
    n = b("neg", p)
    r = Builder(b.m, n, op("neg", x, bind="n").match(n, {}))
    assert r.get("x") is p and r.get("n") is n and r.x is p
    assert r.get("bias") is None and r.get("root") is None  # a name the pattern left unbound


def test_rules_whose_ops_are_absent_are_not_swept():
    """A rule needs every op its pattern names outside alternatives (any of an alternative's)."""
    nested = rule(op("neg", op("exp", x)), lambda r: r.x)  # never a valid rewrite: x != -exp(x)
    either = rule(op("neg", any_of(op("exp", x), op("log", x))), lambda r: r.x)
    assert nested.needs == {frozenset({"neg"}), frozenset({"exp"})}
    assert either.needs == {frozenset({"neg"})}
    assert nested.can_match({"neg", "exp"}) and not nested.can_match({"neg", "log"})
    for rules, ops, fires in [
        ([nested], ("log", "neg"), False),  # no exp anywhere: skipped, unchanged
        ([nested, either], ("log", "neg"), True),  # one rule set member still applies
        ([nested], ("exp", "neg"), True),
    ]:
        b = Build()
        v = b.param("p", LENS)
        for name in ops:
            v = b(name, v)
        m = b.ret(v)
        before = m.to_text()
        assert apply_rules(m, rules) is fires
        assert (m.to_text() != before) is fires
        m.validate()


def test_replace_value_refuses_when_a_users_layout_would_change():
    def build(view_user: bool):
        b = Build()
        p = b.param("p", LENS)
        t = b("transpose", p, permutation=[1, 0])  # strided view
        c = b("contiguous", t)  # standard copy, same lens/type as t
        user = b("transpose", c, permutation=[1, 0]) if view_user else b("exp", c)
        return b.ret(user), c, t, user

    m, c, t, user = build(view_user=True)  # a transpose's strides follow its input's layout
    assert not replace_value(m, c, t)
    assert user.inputs == [c]
    m.validate()
    m, c, t, user = build(view_user=False)  # a pointwise output is standard whatever its input layout
    assert replace_value(m, c, t)
    assert user.inputs == [t]
    m.validate()


def test_replace_value_keeps_the_modules_output_layout():
    b = Build()
    p = b.param("p", LENS)
    t = b("transpose", p, permutation=[1, 0])
    c = b("contiguous", t)
    m = b.ret(c, b("exp", c))
    assert not replace_value(m, c, t)  # the output shapes are the module's interface
    assert replace_value(m, c, t, partial=True)  # exp may move, @return keeps reading the copy
    assert m.get_return().inputs[0] is c and m.get_return().inputs[1].inputs == [t]
    m.validate()


def test_failed_rewrite_leaves_no_garbage():
    b = Build()
    p = b.param("p", LENS)
    t = b("transpose", p, permutation=[1, 0])
    c = b("contiguous", t)
    m = b.ret(b("transpose", c, permutation=[1, 0]))
    n = len(m)
    # Rebuilds a transposed view for the contiguous copy: the user's strides would change, so refused.
    rebuild = lambda r: r.op("transpose", r.op("neg", p), permutation=[1, 0])  # noqa: E731
    rules = [rule(op("contiguous", var("v")), rebuild)]
    assert not apply_rules(m, rules)
    assert len(m) == n
    m.validate()


def test_capped_fixpoint_stops_a_cycling_rule_set():
    b = Build()
    p, q = b.param("p", LENS), b.param("q", LENS)
    m = b.ret(b("sub", p, q))
    # sub(a, b) -> sub(a, b) rebuilt: always "changes", never converges.
    rules = [Rule(op("sub", x, y), lambda r: r.op("sub", r.x, r.y), name="cycle")]
    assert apply_rules(m, rules, max_sweeps=3)
    m.validate()
    assert sum(ins.name == "sub" for ins in m) == 4  # the original plus one per sweep


def test_rewrite_rejected_by_op_shape_is_not_applied():
    b = Build()
    p = b.param("p", LENS)
    m = b.ret(b("neg", p))
    rules = [rule(op("neg", x), lambda r: r.op("transpose", r.x, permutation=[0, 1, 2]))]  # bad permutation
    assert not apply_rules(m, rules)
    assert len(m) == 3


def test_a_pruning_rule_removes_what_only_the_replaced_root_read():
    # relu(neg(exp(b))) is the chain a fusion replaces; exp(a) is read twice and must stay.
    bld = Build()
    a, c = bld.param("a", [4]), bld.param("b", [4])
    shared = bld("exp", a)
    bld.ret(bld("add", bld("neg", shared), shared), bld("relu", bld("neg", bld("exp", c))))
    chain = op("relu", op("neg", op("exp", var("v"))))

    def fused(r) -> object:  # noqa: ANN001 - any one instruction standing for the chain
        return r.op("sigmoid", r.v)

    assert apply_rules(bld.m, [Rule(chain, fused, None, "fuse", prune=True)])
    names = [i.name for i in bld.m.instructions]
    assert names.count("exp") == 1 and names.count("neg") == 1 and "relu" not in names  # no DCE ran
    assert shared in bld.m.instructions and len(shared.outputs) == 2
