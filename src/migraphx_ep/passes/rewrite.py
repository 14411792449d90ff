"""rewrite: a small declarative rewrite engine (patterns with bound names, rules, capped fixpoint).

A rule is ``rule(pattern, rewrite)`` on one line with a ``# x*1 -> x`` comment. Patterns bind names
(``var("x")``, ``op("neg", x, bind="n")``); the rewrite gets a builder ``r`` whose attributes are the
bindings and which inserts new instructions before the matched root (``r.op``, ``r.literal``, ``r.fold``).
It returns the instruction that replaces the root, or None. Rules never walk ``inputs[...]`` by hand.

Replacement goes through ``replace_value``, which refuses when a user's stored shape would go stale
(e.g. a view of a transposed value replaced by a standard one), so every rule keeps ``validate()`` clean.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.dtypes import from_numpy
from ..ir.instruction import Instruction
from ..ir.module import Module, ModuleError
from ..ir.operation import make_op
from ..ir.shape import Shape, ShapeError
from ..ops.core import broadcast_lens
from .values import compact_value, is_splat, literal_source, op_shape, recompute_shape, replace_value

log = logging.getLogger("migraphx_ep.passes.rewrite")

Bindings = dict[str, Instruction]
Predicate = Callable[[Instruction], bool]

# Binary ops whose operands may be swapped when matching: exact in IEEE (NaN payloads aside). Not max/min:
# numpy's maximum(-0.0, 0.0) and maximum(0.0, -0.0) differ in the sign of the zero they return.
COMMUTATIVE = frozenset({"add", "mul"})


# -- patterns -------------------------------------------------------------------------------------------
class Pattern:
    def match(self, ins: Instruction, b: Bindings) -> Bindings | None:
        """Bindings extended by this match, or None; ``b`` itself is never modified."""
        raise NotImplementedError

    def roots(self) -> frozenset[str] | None:
        """Op names this pattern can match at its root (None: any)."""
        return None

    def needs(self) -> frozenset[frozenset[str]]:
        """Sets of op names of which a module must hold one for any match (a necessary condition)."""
        return frozenset()


def _bind(name: str | None, ins: Instruction, b: Bindings) -> Bindings | None:
    if name is None:
        return b
    if name in b:
        return b if b[name] is ins else None  # a repeated name must be the same instruction
    return {**b, name: ins}


@dataclass(frozen=True)
class Var(Pattern):
    name: str
    when: Predicate | None = None

    def match(self, ins: Instruction, b: Bindings) -> Bindings | None:
        if self.when is not None and not self.when(ins):
            return None
        return _bind(self.name, ins, b)


@dataclass(frozen=True)
class OpPattern(Pattern):
    names: frozenset[str]
    args: tuple[Pattern, ...] | None
    bind: str | None = None
    when: Predicate | None = None

    def roots(self) -> frozenset[str] | None:
        return self.names

    def needs(self) -> frozenset[frozenset[str]]:
        return frozenset({self.names}).union(*(p.needs() for p in self.args or ()))

    def match(self, ins: Instruction, b: Bindings) -> Bindings | None:
        # The innermost loop of every rewrite pass (~10k calls per compile): locals, no list of orders.
        name = ins.op.name
        if name not in self.names or (self.when is not None and not self.when(ins)):
            return None
        b2 = _bind(self.bind, ins, b)
        if b2 is None or self.args is None:
            return b2
        inputs = ins.inputs
        if len(inputs) != len(self.args):
            return None
        got = _match_args(self.args, inputs, b2)
        if got is None and name in COMMUTATIVE and len(inputs) == 2:
            got = _match_args(self.args, inputs[::-1], b2)
        return got


def _match_args(args: tuple[Pattern, ...], inputs: Sequence[Instruction], b: Bindings) -> Bindings | None:
    """``b`` extended by each pattern of ``args`` matching its input (equally many), or None."""
    for p, i in zip(args, inputs, strict=True):
        got = p.match(i, b)
        if got is None:
            return None
        b = got
    return b


@dataclass(frozen=True)
class Splat(Pattern):
    value: float
    bind: str | None = None

    def match(self, ins: Instruction, b: Bindings) -> Bindings | None:
        return _bind(self.bind, ins, b) if is_splat(ins, self.value) else None


@dataclass(frozen=True)
class Const(Pattern):
    name: str

    def match(self, ins: Instruction, b: Bindings) -> Bindings | None:
        return _bind(self.name, ins, b) if literal_source(ins) is not None else None


@dataclass(frozen=True)
class AnyOf(Pattern):
    """The first alternative that matches (MIGraphX's ``any_of``)."""

    alternatives: tuple[Pattern, ...]

    def match(self, ins: Instruction, b: Bindings) -> Bindings | None:
        for p in self.alternatives:
            got = p.match(ins, b)
            if got is not None:
                return got
        return None

    def roots(self) -> frozenset[str] | None:
        names = [p.roots() for p in self.alternatives]
        return None if any(n is None for n in names) else frozenset().union(*names)  # type: ignore[arg-type]

    def needs(self) -> frozenset[frozenset[str]]:
        needs = [p.needs() for p in self.alternatives]
        return frozenset.intersection(*needs) if needs else frozenset()


def any_of(*alternatives: Pattern) -> AnyOf:
    return AnyOf(tuple(alternatives))


def once(ins: Instruction) -> bool:
    """Read by one instruction only (which may read it twice): fusing it drops no value still needed."""
    return len({id(u) for u in ins.outputs}) == 1


def var(name: str, when: Predicate | None = None) -> Var:
    """Any instruction, bound to ``name`` (a name used twice must bind the same instruction)."""
    return Var(name, when)


def op(
    names: str | Iterable[str],
    *args: Pattern,
    bind: str | None = None,
    when: Predicate | None = None,
    any_args: bool = False,
) -> OpPattern:
    """An instruction of op ``names`` whose inputs match ``args`` (both orders for commutative ops)."""
    ns = frozenset([names] if isinstance(names, str) else names)
    return OpPattern(ns, None if any_args else tuple(args), bind, when)


def splat(value: float, bind: str | None = None) -> Splat:
    """A constant whose every element is ``value`` (through broadcasts and other views)."""
    return Splat(value, bind)


def const(name: str) -> Const:
    """A literal, or a view of one (e.g. a broadcast scalar)."""
    return Const(name)


# -- rules and the builder ------------------------------------------------------------------------------
class Builder:
    """What a rewrite sees: bindings as attributes, and constructors inserting before the root."""

    def __init__(self, m: Module, root: Instruction, bindings: Bindings) -> None:
        self._m, self._root, self._b = m, root, bindings
        self.created: list[Instruction] = []

    def __getattr__(self, name: str) -> Instruction:
        try:
            return self.__dict__["_b"][name]
        except KeyError:
            raise AttributeError(f"pattern bound no name {name!r}") from None

    @property
    def root(self) -> Instruction:
        return self._root

    def get(self, name: str) -> Instruction | None:
        """The instruction bound to ``name``, or None (an optional part of the pattern). Fusion checks
        ask this for every name of their chain: ``getattr(r, name, None)`` raises twice on a miss."""
        return self._b.get(name)

    def op(self, name: str, *args: Instruction, **attrs: Any) -> Instruction:
        ins = self._m.insert_instruction(self._root, make_op(name, **attrs), list(args))
        self.created.append(ins)
        return ins

    def literal(self, value: np.ndarray) -> Instruction:
        ins = self._m.add_literal(np.asarray(value))
        self.created.append(ins)
        return ins

    def fold(self, name: str, *args: Instruction, **attrs: Any) -> Instruction:
        """``name(*args)`` of constant args, computed now with the op's own ``compute`` at the args'
        compact (pre-broadcast) dims, then broadcast back: folding two broadcast scalars stays a scalar."""
        vals = [compact_value(a) for a in args]
        if any(v is None for v in vals):
            raise ShapeError(f"fold {name}: an argument is not constant")
        lens = broadcast_lens(*(v.shape for v in vals))  # type: ignore[union-attr]
        arrays = [np.broadcast_to(v, lens) for v in vals]  # type: ignore[arg-type]
        o = make_op(name, **attrs)
        shape = o.compute_shape([Shape(from_numpy(a.dtype), lens) for a in arrays])
        lit = self.literal(np.asarray(o.compute(shape, arrays)))
        full = args[0].shape.lens
        return lit if lit.shape.lens == full else self.op("multibroadcast", lit, out_lens=full)

    def undo(self) -> None:
        for ins in reversed(self.created):
            if not ins.outputs:
                self._m.remove_instruction(ins)
        self.created.clear()


Rewrite = Callable[[Builder], Instruction | None]


@dataclass(frozen=True)
class Rule:
    """``pattern`` at a root; ``check`` returns a reason to skip (or None); ``rewrite`` builds the result.
    ``prune``: after a rewrite, remove what only the replaced root read (a fused chain), so a sweep does
    not try the dead chain's inner roots (fusion passes, whose matches nest)."""

    pattern: Pattern
    rewrite: Rewrite
    check: Callable[[Builder], str | None] | None = None
    name: str = ""
    prune: bool = False
    needs: frozenset[frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", self.pattern.needs())

    def can_match(self, names: set[str]) -> bool:
        """A module whose op names are ``names`` meets ``needs``."""
        return all(not alternatives.isdisjoint(names) for alternatives in self.needs)

    def apply(self, m: Module, ins: Instruction) -> bool:
        b = self.pattern.match(ins, {})
        if b is None:
            return False
        r = Builder(m, ins, b)
        if self.check is not None:
            why = self.check(r)
            if why:
                log.debug("rule %s at %s: %s", self.name, ins.op, why)
                return False
        try:
            new = self.rewrite(r)
        except (ShapeError, ModuleError) as e:  # a rewrite the ops reject is simply not applicable
            log.debug("rule %s at %s: %s", self.name, ins.op, e)
            new = None
        if new is not None and replace_value(m, ins, new):
            if _TRACE:
                log.warning("rewrite %s: %s -> %s", self.name, ins.op, new.op)
            if self.prune:
                _remove_dead(m, ins)
            return True
        r.undo()
        return False


def _remove_dead(m: Module, root: Instruction) -> None:
    """``root`` and every instruction only it read (transitively), if nothing else reads them."""
    stack = [root]
    while stack:
        ins = stack.pop()
        if ins.module is not m or ins.outputs or ins.is_param() or ins.is_return():
            continue
        inputs = list(ins.inputs)
        m.remove_instruction(ins)
        stack.extend(inputs)


def rule(
    pattern: Pattern, rewrite: Rewrite, when: Callable[[Builder], bool] | None = None, name: str = ""
) -> Rule:
    """A one-line rule; ``when`` is an optional condition on the bindings."""
    check = None if when is None else (lambda r: None if when(r) else "condition not met")
    return Rule(pattern, rewrite, check, name or repr(pattern))


_TRACE = os.environ.get("MIGRAPHX_EP_TRACE_REWRITES", "0") not in ("", "0")


def apply_rules(m: Module, rules: Sequence[Rule], max_sweeps: int = 16, backward: bool = False) -> bool:
    """Sweep the module applying the first matching rule at each live instruction until nothing changes
    (at most ``max_sweeps`` sweeps, so a rule set that cycles cannot hang a compile). ``backward`` sweeps
    from the last instruction: where matches nest (a root's reader may extend it), the outermost root is
    tried first and the chain inside it is dead by the time the sweep reaches it."""
    by_root: dict[str, list[Rule]] = {}
    anywhere: list[Rule] = []
    for rl in rules:
        names = rl.pattern.roots()
        if names is None:
            anywhere.append(rl)
        for n in names or ():
            by_root.setdefault(n, []).append(rl)
    candidates = {n: rls + anywhere for n, rls in by_root.items()}  # per root name, in trying order
    # A rule set none of whose rules can match here (layernorm's needs a reduce_mean, a GEMM epilogue's a
    # dot) changes nothing in the first sweep, so nothing at all: skip the sweep.
    names = {ins.op.name for ins in m.instructions}
    if not any(rl.can_match(names) for rl in rules):
        return False
    changed = False
    for _ in range(max_sweeps):
        progress = False
        for ins in reversed(m.instructions[:]) if backward else m:
            # Dead or removed roots are skipped: rewriting garbage would "change" forever.
            if ins.module is not m or not ins.outputs:
                continue
            for rl in candidates.get(ins.op.name, anywhere):
                if rl.apply(m, ins):
                    progress = True
                    break
        if not progress:
            return changed
        changed = True
    log.info("apply_rules on %s: stopped after %d sweeps", m.name, max_sweeps)
    return changed


__all__ = [
    "COMMUTATIVE",
    "AnyOf",
    "Builder",
    "Pattern",
    "Rule",
    "any_of",
    "apply_rules",
    "compact_value",
    "const",
    "is_splat",
    "literal_source",
    "once",
    "op",
    "op_shape",
    "recompute_shape",
    "replace_value",
    "rule",
    "splat",
    "var",
]
