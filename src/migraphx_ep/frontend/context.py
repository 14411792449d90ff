"""What a parser sees: the node's description and helpers to emit instructions into a module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.dtypes import DType, from_onnx
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.operation import Op, make_op
from ..ir.weights import WeightCache
from ..ops.core import broadcast_lens
from .table import NeedsValue, Unsupported


@dataclass
class NodeDesc:
    """One ONNX node, in the EP bridge's dict form (also built from a NodeProto by ``parse_onnx``)."""

    op_type: str
    domain: str = ""
    since_version: int = 1
    name: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)
    subgraphs: dict[str, dict] = field(default_factory=dict)
    index: int = -1

    @classmethod
    def from_dict(cls, d: dict) -> NodeDesc:
        return cls(
            op_type=d["op_type"],
            domain=d.get("domain", ""),
            since_version=int(d.get("since_version", 1)),
            name=d.get("name", ""),
            inputs=list(d.get("inputs", ())),
            outputs=list(d.get("outputs", ())),
            attributes=dict(d.get("attributes", {})),
            subgraphs=dict(d.get("subgraphs", {})),
            index=int(d.get("index", -1)),
        )

    def attr(self, name: str, default: Any = None) -> Any:
        v = self.attributes.get(name, default)
        if type(v).__name__ == "Unsupported":
            raise Unsupported(f"attribute {name!r} of kind {getattr(v, 'kind', '?')} is not supported")
        return v

    def label(self) -> str:
        return f"{self.op_type}({self.name})" if self.name else self.op_type


class ParseContext:
    """Emits instructions for one node; ``add`` builds ops by name, ``const`` folds constant inputs."""

    def __init__(
        self,
        module: Module,
        node: NodeDesc,
        parse_subgraph: Any = None,
        value_candidates: frozenset[str] = frozenset(),
    ) -> None:
        self.module = module
        self.node = node
        self.opset = node.since_version
        self._parse_subgraph = parse_subgraph
        self.value_candidates = value_candidates  # params whose values the EP can specialise on
        # Set when the program is compiled for run-time dims (ep/runtime_dims.py): a parser may then
        # take a value that follows from those dims as a run-time input under an assumption that its
        # op checks at run, raising ``AssumptionFailed`` (the EP then recompiles without run-time dims).
        self.assume_runtime = False
        # The subgraph's weight cache (ir/weights.py), when compiling for the EP: see ``weight``.
        self.weights: WeightCache | None = None

    # -- emitting ---------------------------------------------------------------------------------
    def add(
        self, op: str | Op, args: Sequence[Instruction] = (), mod_args: Sequence[Module] = (), **attrs: Any
    ):
        o = make_op(op, **attrs) if isinstance(op, str) else op
        return self.module.add_instruction(o, list(args), list(mod_args))

    def literal(self, value: Any, dtype: Any = None) -> Instruction:
        return self.module.add_literal(np.asarray(value, dtype=dtype))

    def weight(self, value: np.ndarray) -> Instruction:
        """A literal of a tensor the graph holds (a Constant node's value): with a weight cache, the
        same literal in every compile, so what is computed from it is computed once (ir/weights.py)."""
        return self.module.add_literal(self.weights.literal(value) if self.weights is not None else value)

    def convert(self, x: Instruction, t: DType) -> Instruction:
        return x if x.shape.type == t else self.add("convert", [x], target_type=t)

    def broadcast_to(self, x: Instruction, lens: Sequence[int]) -> Instruction:
        lens = tuple(lens)
        return x if x.shape.lens == lens else self.add("multibroadcast", [x], out_lens=lens)

    def broadcast(self, *xs: Instruction) -> list[Instruction]:
        """ONNX multidirectional broadcasting: each input viewed at the common dims."""
        lens = broadcast_lens(*(x.shape.lens for x in xs))
        return [self.broadcast_to(x, lens) for x in xs]

    def elementwise(self, name: str, *xs: Instruction, **attrs: Any) -> Instruction:
        return self.add(name, self.broadcast(*xs), **attrs)

    # -- constants ----------------------------------------------------------------------------------
    def const(self, x: Instruction | None) -> np.ndarray | None:
        return None if x is None else x.eval()

    def require_const(self, x: Instruction | None, what: str) -> np.ndarray:
        v = self.const(x)
        if v is None:
            deps = param_deps(x) if x is not None else None
            if deps and all(d in self.value_candidates for d in deps):
                raise NeedsValue(sorted(deps), what)
            raise Unsupported(f"{what} must be a compile-time constant")
        return np.asarray(v)

    def const_ints(self, x: Instruction | None, what: str) -> list[int]:
        return [int(v) for v in self.require_const(x, what).ravel()]

    # -- subgraphs ----------------------------------------------------------------------------------
    def subgraph(self, attr: str, outer: dict[str, Instruction]) -> Module:
        if self._parse_subgraph is None or attr not in self.node.subgraphs:
            raise Unsupported(f"subgraph attribute {attr!r} unavailable")
        return self._parse_subgraph(
            self.node.subgraphs[attr], outer, f"{self.node.name or self.node.op_type}:{attr}"
        )

    def subgraph_call(
        self, attr: str, input_shapes: dict[str, Any] | None = None
    ) -> tuple[Module, list[Instruction]]:
        """Parse subgraph ``attr`` (formal inputs given ``input_shapes`` where known) into a submodule.

        Returns the module and the outer values that feed its outer-scope parameters: a control-flow
        op takes them, in this order, after its own inputs (see ``GraphParser._parse_subgraph_for``).
        """
        if not hasattr(self._parse_subgraph, "parse") or attr not in self.node.subgraphs:
            raise Unsupported(f"subgraph attribute {attr!r} unavailable")
        label = f"{self.node.name or self.node.op_type}:{attr}"
        return self._parse_subgraph.parse(self.node.subgraphs[attr], label, input_shapes)

    def inline_subgraph(self, attr: str) -> list[Instruction]:
        """Parse subgraph ``attr`` (no formal inputs) straight into this module; returns its outputs."""
        if not hasattr(self._parse_subgraph, "inline") or attr not in self.node.subgraphs:
            raise Unsupported(f"subgraph attribute {attr!r} unavailable")
        return self._parse_subgraph.inline(self.node.subgraphs[attr])

    def drop_subgraph(self, mod: Module) -> None:
        """Discard a submodule from ``subgraph_call`` when the node is refused after all."""
        if hasattr(self._parse_subgraph, "drop"):
            self._parse_subgraph.drop(mod)


def param_deps(x: Instruction) -> set[str] | None:
    """Names of the parameters a value depends on, or None if it goes through an op that can't fold."""
    names: set[str] = set()
    seen: set[int] = set()
    stack = [x]
    while stack:
        ins = stack.pop()
        if id(ins) in seen:
            continue
        seen.add(id(ins))
        if ins.is_param():
            names.add(ins.op.parameter)  # type: ignore[attr-defined]
        elif ins.module_args:
            return None
        else:
            stack.extend(ins.inputs)
    return names


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"{what} {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def onnx_type(elem_type: int) -> DType:
    try:
        return from_onnx(elem_type)
    except TypeError as e:
        raise Unsupported(str(e)) from None
