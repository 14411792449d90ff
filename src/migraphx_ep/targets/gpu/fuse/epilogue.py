"""The epilogue a GEMM or convolution library call applies to its product, as one rule for both passes
(``gemm_epilogue.py``, ``conv_epilogue.py``). Matched from the root toward the product::

    [relu] [add(residual)] [add(bias)] product(a, b)       (at least one of the three)

bias broadcast along the output's channel axis from a contiguous vector, the residual in the output's
dims laid out standard, each value inside read only by the next op of the chain. The largest match
wins: a bias add whose only reader adds a residual fuses there. Binary ops take equal dims and types,
so a bias or residual always has the product's.
"""

from __future__ import annotations

from collections.abc import Callable

from ....ir.instruction import Instruction
from ....ir.module import Module
from ....ops.fused import FusedEpilogue
from ....passes.manager import Pass
from ....passes.rewrite import Builder, Pattern, Predicate, Rule, any_of, apply_rules, once, op, var
from .body import chain_inputs_outside, insert_fused, is_body, reader_extends

CHAIN = ("product", "bias_add", "residual_add", "relu")


def both(*preds: Predicate) -> Predicate:
    return lambda ins: all(p(ins) for p in preds)


def bias_along(axis: Callable[[Instruction], int]) -> Predicate:
    """A contiguous vector broadcast along ``axis(v)`` (every other stride 0)."""

    def ok(v: Instruction) -> bool:
        a, s = axis(v), v.shape
        return all((st == 0) if i != a else (st == 1 or s.lens[i] == 1) for i, st in enumerate(s.strides))

    return ok


def _standard(v: Instruction) -> bool:
    return v.shape.standard()


def epilogue_pattern(product: Callable[[Predicate], Pattern], bias: Predicate) -> Pattern:
    """``product(when)`` is the product's pattern (binding ``product`` and its operands) with ``when``."""

    def biased(when: Predicate | None) -> Pattern:
        return op("add", product(once), var("bias", bias), bind="bias_add", when=when)

    def summed(when: Predicate | None) -> Pattern:
        inner = any_of(biased(once), product(once))
        return op("add", inner, var("residual", _standard), bind="residual_add", when=when)

    relu = op("relu", any_of(summed(once), biased(once), product(once)), bind="relu")
    return any_of(relu, summed(None), biased(None))


def _bound(r: Builder, name: str) -> Instruction | None:
    return r.get(name)


class EpilogueRule:
    """The rule and pass of one library's epilogue: ``fused`` (FusedGemm or FusedConv) on the inputs
    named ``operands`` (the product's two, as the body's parameters call them)."""

    def __init__(
        self,
        name: str,
        fused: type[FusedEpilogue],
        operands: tuple[str, str],
        product: Callable[[Predicate], Pattern],
        bias: Predicate,
    ) -> None:
        self.fused, self.operands = fused, operands
        self.pattern = epilogue_pattern(product, bias)
        self.rule = Rule(self.pattern, self._rewrite, self._check, name, prune=True)

    def _inputs(self, r: Builder) -> list[tuple[str, Instruction]]:
        names = (*self.operands, "bias", "residual")  # the body's parameters, in the fused op's order
        return [(n, v) for n, v in ((n, _bound(r, n)) for n in names) if v is not None]

    def _fits(self, r: Builder) -> str | None:
        chain = [_bound(r, n) for n in CHAIN]
        if not chain_inputs_outside(chain, [v for _, v in self._inputs(r)]):
            return "the chain reads its own value as bias or residual"
        return None

    def _check(self, r: Builder) -> str | None:
        if _bound(r, "relu") is None and reader_extends(self.pattern, CHAIN, self._fits, r.root):
            return "its reader is the root"  # matched there, with more of the epilogue
        return self._fits(r)

    def _rewrite(self, r: Builder) -> Instruction:
        flags = {k: _bound(r, k) is not None for k in ("bias", "residual", "relu")}
        return insert_fused(r, self.fused(**flags), self._inputs(r), (_bound(r, n) for n in CHAIN))

    @staticmethod
    def skips(m: Module) -> bool:
        """A fused op's own body: it is the chain, not a use of it (passes leave it alone)."""
        return is_body(m)

    def apply(self, m: Module) -> bool:
        if self.skips(m):
            return False
        return apply_rules(m, [self.rule], backward=True)  # the largest match first (body.reader_extends)

    def as_pass(self) -> Pass:
        return Pass(self.rule.name, self.apply)


__all__ = ["EpilogueRule", "bias_along", "both", "epilogue_pattern"]
