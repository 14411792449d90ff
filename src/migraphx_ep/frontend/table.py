"""The ONNX op → parser table (STYLE.md §8). Parsers register with ``@onnx_op``.

A parser turns one ONNX node into instructions: ``parser(ctx, node, args) -> Instruction | list``.
``args`` holds one instruction per ONNX input (None for an omitted optional input). A parser raises
``Unsupported(reason)`` for anything it cannot translate exactly: that node then stays on ORT's CPU EP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..ir.instruction import Instruction
    from .context import NodeDesc, ParseContext

Parser = Callable[["ParseContext", "NodeDesc", list["Instruction | None"]], "Instruction | list[Instruction]"]


class Unsupported(Exception):
    """This node (with these attributes, types or non-constant inputs) cannot be compiled exactly."""


class NeedsValue(Unsupported):
    """The node needs the *value* of small graph inputs (axes, shapes, pads...) to compile.

    The EP can specialise on such inputs: their values join the compile key (see ep/compiled.py).
    """

    def __init__(self, names: list[str], what: str) -> None:
        super().__init__(f"{what} must be a compile-time constant (it depends on input(s) {names})")
        self.names = names


class DimMismatch(Unsupported):
    """Dim ``axis`` of input ``ins`` must be ``size`` (GroupQueryAttention's past head size).

    Strictly parsed, it is a refusal like any other. In the partition probe, where an input's symbolic
    dim got a made-up size, the probe pins that symbol to ``size`` and parses again (see
    ``probe.probe_parse``): GenAI's builder declares the KV cache's head size as ``kv_cache_dim``."""

    def __init__(self, ins: Instruction, axis: int, size: int, reason: str) -> None:
        super().__init__(reason)
        self.ins, self.axis, self.size = ins, axis, size


@dataclass(frozen=True)
class Entry:
    parser: Parser
    domain: str = ""
    min_opset: int = 1
    const_inputs: tuple[int, ...] = ()  # inputs that must be compile-time constants
    extra: dict[str, Any] = field(default_factory=dict)


PARSERS: dict[tuple[str, str], Entry] = {}


def onnx_op(
    *op_types: str, domain: str = "", min_opset: int = 1, const_inputs: tuple[int, ...] = ()
) -> Callable:
    """Register ``fn`` as the parser of ``op_types`` in ``domain`` ("" is ai.onnx)."""

    def wrap(fn: Parser) -> Parser:
        for t in op_types:
            key = (domain, t)
            if key in PARSERS:
                raise TypeError(f"ONNX op {domain or 'ai.onnx'}::{t} has two parsers")
            PARSERS[key] = Entry(fn, domain, min_opset, const_inputs)
        return fn

    return wrap


def lookup(op_type: str, domain: str) -> Entry | None:
    return PARSERS.get(("" if domain == "ai.onnx" else domain, op_type))
