"""Turn an ONNX graph (bridge dict form) into a program, strictly or tolerantly.

Strict parsing is what ``parse_onnx`` and the EP's Compile do: every node must translate.
Tolerant parsing is the partitioner's probe: a node that fails is recorded with its reason and its
outputs become opaque parameters, so the nodes after it are still judged on their own merits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.dtypes import DType, UnsupportedTypeError, from_numpy, from_onnx, to_numpy
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.program import Program
from ..ir.shape import Shape, ShapeError
from .context import NodeDesc, ParseContext
from .table import Unsupported, lookup

DimResolver = Callable[[str, int, Any], int]


class ParseError(ValueError):
    """A model (or node) cannot be compiled; the message names the node and the reason."""


@dataclass
class ParseResult:
    program: Program
    refused: dict[int, str] = field(default_factory=dict)  # node index -> reason (tolerant mode)
    outputs: dict[str, Instruction] = field(default_factory=dict)


def topo_order(nodes: list[dict], known: Iterable[str]) -> list[dict]:
    """Nodes in an order where producers come first (ORT's node list is not promised to be)."""
    produced = {o: i for i, n in enumerate(nodes) for o in n["outputs"] if o}
    order: list[dict] = []
    state = [0] * len(nodes)  # 0 new, 1 visiting, 2 done
    for start in range(len(nodes)):
        stack = [(start, False)]
        while stack:
            i, ready = stack.pop()
            if ready:
                state[i] = 2
                order.append(nodes[i])
                continue
            if state[i]:
                continue
            state[i] = 1
            stack.append((i, True))
            deps = list(nodes[i]["inputs"]) + list(nodes[i].get("implicit_inputs", ()))
            stack.extend((produced[d], False) for d in deps if d in produced and state[produced[d]] == 0)
    return order


def value_shape(info: dict | None, name: str, resolve: DimResolver) -> Shape:
    if info is None or not info.get("dtype"):
        raise Unsupported(f"value {name!r} has no tensor type information")
    try:
        t = from_onnx(info["dtype"])
    except UnsupportedTypeError as e:
        raise Unsupported(f"value {name!r}: {e}") from None
    dims = info.get("shape")
    if dims is None:
        raise Unsupported(f"value {name!r} has unknown rank")
    return Shape(t, [d if isinstance(d, int) and d >= 0 else resolve(name, i, d) for i, d in enumerate(dims)])


class GraphParser:
    def __init__(self, program: Program, input_shapes: dict[str, Shape] | None = None,
                 resolve_dim: DimResolver | None = None, tolerant: bool = False,
                 claimed: set[int] | None = None, group_of: dict[int, int] | None = None) -> None:
        self.program = program
        # With group_of (the partition probe), a value produced in one group and read in another is
        # an opaque parameter for the reader: at run time ORT passes it in, so it is never constant.
        self.group_of = group_of
        self.input_shapes = input_shapes or {}
        self.resolve_dim = resolve_dim or _no_symbolic
        self.tolerant = tolerant
        self.claimed = claimed
        self.refused: dict[int, str] = {}
        self._sub_count = 0

    def parse(self, graph: dict, module: Module, outer: dict[str, Instruction] | None = None,
              as_params: Iterable[str] = ()) -> dict[str, Instruction]:
        values: dict[str, Instruction] = {}
        producer_group: dict[str, int] = {}
        boundary: dict[tuple[str, int], Instruction] = {}
        current_group = [-1]
        inits = graph.get("initializers", {})
        infos = graph.get("values", {})
        lazy_outer = dict(outer or {})

        def get(name: str) -> Instruction | None:
            if not name:
                return None
            if name in values:
                g = producer_group.get(name, -1)
                if g != -1 and g != current_group[0] and current_group[0] != -1:
                    key = (name, current_group[0])
                    if key not in boundary:
                        boundary[key] = module.add_parameter(f"{name}@{current_group[0]}", values[name].shape)
                    return boundary[key]
                return values[name]
            if name in inits:
                values[name] = module.add_literal(_as_supported(np.asarray(inits[name]), name))
                return values[name]
            if name in lazy_outer:
                values[name] = lazy_outer[name]
                return values[name]
            if name in bad_inputs:
                raise Unsupported(bad_inputs[name])
            raise Unsupported(f"value {name!r} is not defined")

        bad_inputs: dict[str, str] = {}
        for name in list(graph.get("inputs", ())) + list(as_params):
            if name in values or name in inits:
                continue
            try:
                shape = self.input_shapes.get(name) or value_shape(infos.get(name), name, self.resolve_dim)
            except Unsupported as e:
                if not self.tolerant:
                    raise ParseError(f"graph input {name!r}: {e}") from None
                bad_inputs[name] = str(e)  # its readers are refused with this reason
                continue
            values[name] = module.add_parameter(name, shape)

        for node in topo_order(graph["nodes"], values):
            desc = NodeDesc.from_dict(node)
            if self.group_of is not None:
                current_group[0] = self.group_of.get(desc.index, -2)
            try:
                if self.claimed is not None and desc.index not in self.claimed:
                    raise Unsupported("not in this partition")
                outs = self._parse_node(desc, module, get, infos)
            except (Unsupported, ShapeError, UnsupportedTypeError, ParseError) as e:
                self._refuse(desc, str(e), module, values, infos)
                continue
            except Exception as e:  # noqa: BLE001 - a parser bug must refuse the node, not crash
                self._refuse(desc, f"internal error {type(e).__name__}: {e}", module, values, infos)
                continue
            for oname, ins in zip(desc.outputs, outs, strict=False):
                if oname:
                    values[oname] = ins
                    if self.group_of is not None:
                        producer_group[oname] = current_group[0]
        outs: dict[str, Instruction] = {}
        for n in graph.get("outputs", ()):
            try:
                outs[n] = get(n)  # type: ignore[assignment]
            except Unsupported:
                if not self.tolerant:
                    raise ParseError(f"graph output {n!r} is not computed by any node") from None
        return outs

    def _parse_node(self, desc: NodeDesc, module: Module, get: Callable, infos: dict) -> list[Instruction]:
        entry = lookup(desc.op_type, desc.domain)
        if entry is None:
            raise Unsupported(f"no parser for {desc.domain or 'ai.onnx'}::{desc.op_type}")
        if desc.since_version < entry.min_opset:
            raise Unsupported(f"opset {desc.since_version} older than supported {entry.min_opset}")
        for name in desc.inputs + desc.outputs:
            info = infos.get(name)
            if name and info is not None and info.get("dtype"):
                try:
                    from_onnx(info["dtype"])
                except UnsupportedTypeError as e:
                    raise Unsupported(f"value {name!r}: {e}") from None
        args = [get(n) for n in desc.inputs]
        ctx = ParseContext(module, desc, self._parse_subgraph_for(module))
        result = entry.parser(ctx, desc, args)
        outs = [result] if isinstance(result, Instruction) else list(result)
        missing = [o for o in desc.outputs[len(outs):] if o]
        if missing:
            raise Unsupported(f"outputs {missing} are not produced")
        for oname, ins in zip(desc.outputs, outs, strict=False):
            if oname:
                _check_declared(oname, ins, infos.get(oname))
        return outs

    def _parse_subgraph_for(self, module: Module) -> Callable:
        def parse_sub(graph: dict, outer: dict[str, Instruction], label: str) -> Module:
            self._sub_count += 1
            sub = self.program.create_module(f"{label}#{self._sub_count}")
            sub_parser = GraphParser(self.program, {}, self.resolve_dim, tolerant=False)
            outs = sub_parser.parse(graph, sub, outer)
            sub.add_return([outs[n] for n in graph["outputs"]])
            return sub
        return parse_sub

    def _refuse(self, desc: NodeDesc, reason: str, module: Module, values: dict, infos: dict) -> None:
        if not self.tolerant:
            raise ParseError(f"node {desc.label()}: {reason}")
        self.refused[desc.index] = reason
        for o in desc.outputs:
            if not o:
                continue
            try:
                values[o] = module.add_parameter(o, value_shape(infos.get(o), o, self.resolve_dim))
            except (Unsupported, ShapeError, ValueError):
                values.pop(o, None)  # unknown: consumers will be refused with "not defined"


def _check_declared(name: str, ins: Instruction, info: dict | None) -> None:
    """The compiled value must have the type (and static dims) ORT expects, or we don't claim it."""
    if info is None or not info.get("dtype"):
        return
    want = from_onnx(info["dtype"])
    if ins.shape.type != want:
        raise Unsupported(f"output {name!r} would be {ins.shape.type.name}, ONNX declares {want.name}")
    dims = info.get("shape")
    if dims is not None:
        if len(dims) != ins.shape.ndim():
            raise Unsupported(f"output {name!r} would have rank {ins.shape.ndim()}, ONNX declares {len(dims)}")
        for i, (d, n) in enumerate(zip(dims, ins.shape.lens, strict=True)):
            if isinstance(d, int) and d >= 0 and d != n:
                raise Unsupported(f"output {name!r} dim {i} would be {n}, ONNX declares {d}")


def _as_supported(arr: np.ndarray, name: str) -> np.ndarray:
    try:
        from_numpy(arr.dtype)
    except UnsupportedTypeError as e:
        raise Unsupported(f"initializer {name!r}: {e}") from None
    return arr


def _no_symbolic(name: str, axis: int, dim: Any) -> int:
    raise Unsupported(f"input {name!r} dim {axis} is symbolic ({dim!r}); a concrete size is needed")


def fixed_dims(value: int) -> DimResolver:
    def resolve(name: str, axis: int, dim: Any) -> int:
        return value
    return resolve


def probe_dims() -> DimResolver:
    """Distinct small sizes per symbol so the probe doesn't mistake unrelated dims for equal ones."""
    sizes: dict[str, int] = {}

    def resolve(name: str, axis: int, dim: Any) -> int:
        if not dim:
            return 1
        return sizes.setdefault(str(dim), 2 + len(sizes))
    return resolve


def parse_graph(graph: dict, input_shapes: dict[str, Shape] | None = None, resolve_dim: DimResolver | None = None,
                tolerant: bool = False, claimed: set[int] | None = None,
                group_of: dict[int, int] | None = None) -> ParseResult:
    prog = Program()
    main = prog.get_main_module()
    gp = GraphParser(prog, input_shapes, resolve_dim, tolerant, claimed, group_of)
    outs = gp.parse(graph, main)
    ret = [outs[n] for n in graph["outputs"] if outs.get(n) is not None]
    main.add_return(ret)
    return ParseResult(prog, gp.refused, outs)


__all__ = ["DType", "GraphParser", "ParseError", "ParseResult", "fixed_dims", "parse_graph", "probe_dims",
           "to_numpy", "topo_order", "value_shape"]
