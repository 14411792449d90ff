"""Subgraphs of control-flow nodes (If/Loop/Scan bodies) as submodules, or inline into the parent.

A submodule cannot read another module's instructions, so every outer-scope value a subgraph reads
becomes a parameter of the submodule (constants are copied in as literals instead, so shape arithmetic
still folds); the control-flow instruction then takes those outer values as extra inputs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.shape import Shape
from .parser import GraphParser, value_shape
from .table import Unsupported


class SubgraphParser:
    """Parses a node's subgraphs into submodules (or inline) for ``GraphParser._parse_subgraph_for``."""

    def __init__(self, parent: GraphParser, module: Module, get: Callable | None) -> None:
        self.parent = parent
        self.module = module
        self.get = get
        self.feeds: dict[str, list[Instruction]] = {}  # submodule name -> values for its outer parameters
        self._created: dict[str, list[str]] = {}  # submodule name -> it and the modules nested in it

    def _outer(self, name: str, outer: dict[str, Instruction]) -> Instruction:
        if name in outer:
            return outer[name]
        if self.get is not None:
            ins = self.get(name)
            if ins is not None:
                return ins
        raise Unsupported(f"subgraph reads {name!r}, which is not defined in an enclosing graph")

    def parse(
        self,
        graph: dict,
        label: str,
        input_shapes: dict[str, Shape] | None = None,
        outer: dict[str, Instruction] | None = None,
    ) -> tuple[Module, list[Instruction]]:
        """A submodule for ``graph`` and the outer values (in parameter order) that must feed it."""
        p = self.parent
        n = len(p.program.modules)
        while f"{label}#{n}" in p.program.modules:  # nested parsers count separately: stay unique
            n += 1
        before = set(p.program.modules)
        sub = p.program.create_module(f"{label}#{n}")
        try:
            feeds = self._fill(sub, graph, input_shapes, outer or {})
        finally:
            self._created[sub.name] = [m for m in p.program.modules if m not in before]
            if sub.get_return() is None:  # failed: a refused node must leave no half-built modules
                self.drop(sub)
        self.feeds[sub.name] = feeds
        return sub, feeds

    def drop(self, sub: Module) -> None:
        """Forget a submodule (and the ones nested in it) whose node ends up refused."""
        for name in self._created.pop(sub.name, [sub.name]):
            self.parent.program.modules.pop(name, None)
        self.feeds.pop(sub.name, None)

    def _fill(
        self, sub: Module, graph: dict, input_shapes: dict[str, Shape] | None, outer: dict[str, Instruction]
    ) -> list[Instruction]:
        p = self.parent
        infos = graph.get("values", {})
        scope: dict[str, Instruction] = {}
        for name in graph.get("inputs", ()):
            shape = (input_shapes or {}).get(name) or value_shape(infos.get(name), name, p.resolve_dim)
            scope[name] = sub.add_parameter(name, shape)
        feeds: list[Instruction] = []
        for name in free_names(graph):
            src = self._outer(name, outer)
            value = src.eval()
            if value is not None:
                scope[name] = sub.add_literal(value)
            else:
                scope[name] = sub.add_parameter(name, src.shape)
                feeds.append(src)
        outs = GraphParser(p.program, {}, p.resolve_dim, weights=p.weights).parse(
            {**graph, "inputs": []}, sub, scope
        )
        sub.add_return([outs[n] for n in graph["outputs"]])
        return feeds

    def inline(self, graph: dict) -> list[Instruction]:
        """Parse a graph without formal inputs straight into the parent module (If with a constant cond)."""
        if graph.get("inputs"):
            raise Unsupported("only a subgraph without inputs can be inlined")
        scope = {name: self._outer(name, {}) for name in free_names(graph)}
        parser = GraphParser(self.parent.program, {}, self.parent.resolve_dim, weights=self.parent.weights)
        outs = parser.parse(graph, self.module, scope)
        return [outs[n] for n in graph["outputs"]]

    def __call__(self, graph: dict, outer: dict[str, Instruction], label: str) -> Module:
        return self.parse(graph, label, outer=outer)[0]


def free_names(graph: dict) -> list[str]:
    """Names a graph (and its nested subgraphs) reads but does not define, in first-use order."""
    defined = set(graph.get("inputs", ())) | set(graph.get("initializers", {}))
    for n in graph["nodes"]:
        defined.update(o for o in n["outputs"] if o)
    used: dict[str, None] = {}
    for n in graph["nodes"]:
        for name in n["inputs"]:
            if name:
                used.setdefault(name)
        for sub in n.get("subgraphs", {}).values():
            for name in free_names(sub):
                used.setdefault(name)
    for name in graph.get("outputs", ()):
        used.setdefault(name)
    return [n for n in used if n not in defined]
