"""Turn an ONNX graph (bridge dict form) into a program, strictly or tolerantly.

Strict parsing is what ``parse_onnx`` and the EP's Compile do: every node must translate.
Tolerant parsing is the partitioner's probe: a node that fails is recorded with its reason and its
outputs become opaque parameters, so the nodes after it are still judged on their own merits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir.dtypes import DType, UnsupportedTypeError, from_numpy, from_onnx, to_numpy
from ..ir.instruction import Instruction
from ..ir.module import Module
from ..ir.program import Program
from ..ir.shape import Shape, ShapeError
from ..ir.weights import WeightCache
from ..timing import checkpoint, stage
from .context import NodeDesc, ParseContext
from .table import DimMismatch, NeedsValue, Unsupported, lookup

if TYPE_CHECKING:
    from .subgraph import SubgraphParser

DimResolver = Callable[[str, int, Any], int]


class ParseError(ValueError):
    """A model (or node) cannot be compiled; the message names the node and the reason."""


class ParseNeedsValue(ParseError):
    """Strict parsing stopped at a node that needs the values of these inputs (see NeedsValue)."""

    def __init__(self, message: str, names: list[str]) -> None:
        super().__init__(message)
        self.names = names


@dataclass
class ParseResult:
    program: Program
    refused: dict[int, str] = field(default_factory=dict)  # node index -> reason (tolerant mode)
    outputs: dict[str, Instruction] = field(default_factory=dict)
    needs_values: dict[int, list[str]] = field(default_factory=dict)  # node index -> inputs to specialise
    # ONNX value name -> its instruction in the main module (calibration tables name tensors so)
    values: dict[str, Instruction] = field(default_factory=dict)
    # tolerant mode: symbolic dim -> the size a node needs it at (see DimMismatch and probe_parse)
    pins: dict[str, int] = field(default_factory=dict)


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
    def __init__(
        self,
        program: Program,
        input_shapes: dict[str, Shape] | None = None,
        resolve_dim: DimResolver | None = None,
        tolerant: bool = False,
        claimed: set[int] | None = None,
        group_of: dict[int, int] | None = None,
        specialize: bool = False,
        input_values: dict[str, np.ndarray] | None = None,
        check: Callable[[Instruction], str | None] | None = None,
        runtime_dims: dict[str, tuple[int, ...]] | None = None,
        weights: WeightCache | None = None,
    ) -> None:
        self.program = program
        # The subgraph's weight cache (ir/weights.py): every compile reads an initializer as the same
        # literal, so what later passes compute from it (and its hash) is computed once per subgraph.
        self.weights = weights
        # Graph inputs whose sizes on these axes arrive only at run (ep/runtime_dims.py): their Shape is
        # read at run, and parsers may assume what such programs need (ParseContext.assume_runtime).
        self.runtime_dims = runtime_dims or {}
        # A target's veto (the partition probe for the gpu target): a node any of whose instructions
        # the target cannot run is refused with the target's reason.
        self.check = check
        # Value specialisation: with `specialize`, small static inputs a parser needs as constants are
        # noted (needs_values) instead of refusing the node; `input_values` then supplies them.
        self.specialize = specialize
        self.input_values = input_values or {}
        self.value_candidates: set[str] = set()
        self.needs_values: dict[int, list[str]] = {}
        # With group_of (the partition probe), a value produced in one group and read in another is
        # an opaque parameter for the reader: at run time ORT passes it in, so it is never constant.
        self.group_of = group_of
        self.input_shapes = input_shapes or {}
        self.resolve_dim = resolve_dim or _no_symbolic
        self.tolerant = tolerant
        self.claimed = claimed
        self.refused: dict[int, str] = {}
        self.deferred: dict[str, list[str]] = {}  # value of unknown rank -> the inputs it waits on
        self._sub_count = 0
        self.values: dict[str, Instruction] = {}  # of the last graph parsed (the main one finishes last)
        self.pins: dict[str, int] = {}
        self._declared: dict[int, list] = {}  # id of a parameter -> its value's declared ONNX dims

    def parse(
        self,
        graph: dict,
        module: Module,
        outer: dict[str, Instruction] | None = None,
        as_params: Iterable[str] = (),
    ) -> dict[str, Instruction]:
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
                        pname = f"{name}@{current_group[0]}"
                        boundary[key] = module.add_parameter(pname, values[name].shape)
                        self._declare(boundary[key], infos.get(name))
                        self._note_candidate(pname, values[name].shape, static=True)
                    return boundary[key]
                return values[name]
            if name in inits:
                src, load = inits[name], lambda v: _as_supported(np.asarray(v), name)
                lit = self.weights.literal(src, load) if self.weights is not None else load(src)
                values[name] = module.add_literal(lit)
                return values[name]
            if name in lazy_outer:
                values[name] = lazy_outer[name]
                return values[name]
            if name in bad_inputs:
                raise Unsupported(bad_inputs[name])
            if name in self.deferred:
                raise NeedsValue(self.deferred[name], f"the shape of {name!r}")
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
            if name in self.input_values:
                values[name] = module.add_literal(_specialised(name, self.input_values[name], shape))
                continue
            values[name] = module.add_parameter(name, shape, self.runtime_dims.get(name, ()))
            self._declare(values[name], infos.get(name))
            self._note_candidate(name, shape, _static_dims(infos.get(name)) or name in self.input_shapes)

        for node in topo_order(graph["nodes"], values):
            checkpoint("parse")  # a background compile's parse gives way here (ep/background.py)
            desc = NodeDesc.from_dict(node)
            if self.group_of is not None:
                current_group[0] = self.group_of.get(desc.index, -2)
            try:
                if self.claimed is not None and desc.index not in self.claimed:
                    raise Unsupported("not in this partition")
                before = len(module.instructions)
                outs = self._parse_node(desc, module, get, infos)
                if self.check is not None:
                    self._veto(module, len(module.instructions) - before)
            except NeedsValue as e:
                if not self.tolerant:
                    raise ParseNeedsValue(f"node {desc.label()}: {e}", e.names) from None
                if not self.specialize:
                    self._refuse(desc, str(e), module, values, infos)
                    continue
                if not self._deferrable(desc, e):
                    self._refuse(desc, f"{e} (only known at Run)", module, values, infos)
                    continue
                # Claimable once the EP knows the values: outputs are opaque for the rest of the probe.
                self.needs_values[desc.index] = e.names
                self._opaque_outputs(desc, module, values, infos, deferred_on=e.names)
                continue
            except DimMismatch as e:
                symbol = self._symbol(e.ins, e.axis)
                if self.tolerant and isinstance(symbol, str) and symbol not in self.pins:
                    self.pins[symbol] = e.size  # the probe retries with it (probe_parse)
                self._refuse(desc, str(e), module, values, infos)
                continue
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
        self.values = values
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
        # A node without subgraphs gets no subgraph parser: ParseContext refuses a subgraph attribute
        # the node lacks either way.
        subgraphs = self._parse_subgraph_for(module, get) if desc.subgraphs else None
        ctx = ParseContext(module, desc, subgraphs, frozenset(self.value_candidates))
        ctx.assume_runtime = bool(self.runtime_dims)
        ctx.weights = self.weights
        result = entry.parser(ctx, desc, args)
        outs = [result] if isinstance(result, Instruction) else list(result)
        missing = [o for o in desc.outputs[len(outs) :] if o]
        if missing:
            raise Unsupported(f"outputs {missing} are not produced")
        for oname, ins in zip(desc.outputs, outs, strict=False):
            if oname:
                _check_declared(oname, ins, infos.get(oname))
        return outs

    def _veto(self, module: Module, added: int) -> None:
        # New instructions are appended (literals go first, but those always run), so the last
        # `added` hold every new one; re-checking an older one there is harmless.
        for ins in module.instructions[len(module.instructions) - added :] if added > 0 else ():
            reason = self.check(ins)  # type: ignore[misc]
            if reason is not None:
                raise Unsupported(reason)

    def _parse_subgraph_for(self, module: Module, get: Callable | None = None) -> SubgraphParser:
        """The subgraph parser for nodes of ``module``; ``get`` resolves names visible in its graph.

        A submodule cannot read another module's instructions, so every outer-scope value a subgraph
        reads becomes a parameter of the submodule, named like the value, after the subgraph's own
        formal inputs (constants are copied in as literals instead, so shape arithmetic still folds).
        The control-flow instruction then takes those outer values as extra inputs, in the same order.
        """
        from .subgraph import SubgraphParser  # it builds GraphParsers in turn

        return SubgraphParser(self, module, get)

    def _refuse(self, desc: NodeDesc, reason: str, module: Module, values: dict, infos: dict) -> None:
        if not self.tolerant:
            raise ParseError(f"node {desc.label()}: {reason}")
        self.refused[desc.index] = reason
        self._opaque_outputs(desc, module, values, infos)
        for o in desc.outputs:  # a refused node's small outputs reach the EP as run-time inputs
            if o and o in values and values[o].is_param():
                self._note_candidate(o, values[o].shape, _static_dims(infos.get(o)))

    def _deferrable(self, desc: NodeDesc, e: NeedsValue) -> bool:
        """A node waiting on a value-specialised input is claimable; one waiting only on the *shape* of
        a value computed from such an input only when its op cannot refuse over a shape."""
        if not any(n in self.deferred for n in desc.inputs):
            return True
        return desc.domain in ("", "ai.onnx") and desc.op_type in SHAPE_AGNOSTIC_OPS

    def _opaque_outputs(
        self, desc: NodeDesc, module: Module, values: dict, infos: dict, deferred_on: list[str] | None = None
    ) -> None:
        for o in desc.outputs:
            if not o:
                continue
            try:
                values[o] = module.add_parameter(o, value_shape(infos.get(o), o, self.resolve_dim))
                self._declare(values[o], infos.get(o))
            except (Unsupported, ShapeError, ValueError):
                values.pop(o, None)
                # Unknown rank (ONNX can't infer it without the value): a value-specialised node's
                # output is known at Run, so its shape-agnostic readers wait for it too; anything
                # else reading it is refused ("not defined").
                if deferred_on and (infos.get(o) or {}).get("dtype"):
                    self.deferred[o] = deferred_on

    def _declare(self, param: Instruction, info: dict | None) -> None:
        if self.tolerant and info is not None and info.get("shape") is not None:
            self._declared[id(param)] = list(info["shape"])

    def _symbol(self, ins: Instruction, axis: int) -> Any:
        """The ONNX dim a parameter's ``axis`` was declared with (a str for a symbolic one)."""
        dims = self._declared.get(id(ins))
        return dims[axis] if dims is not None and 0 <= axis < len(dims) else None

    def _note_candidate(self, name: str, shape: Shape, static: bool) -> None:
        if self.specialize and static and shape.elements() <= MAX_SPECIALISED_ELEMENTS:
            self.value_candidates.add(name)


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
            raise Unsupported(
                f"output {name!r} would have rank {ins.shape.ndim()}, ONNX declares {len(dims)}"
            )
        for i, (d, n) in enumerate(zip(dims, ins.shape.lens, strict=True)):
            if isinstance(d, int) and d >= 0 and d != n:
                raise Unsupported(f"output {name!r} dim {i} would be {n}, ONNX declares {d}")


MAX_SPECIALISED_ELEMENTS = 64  # axes, shapes, pads, scales, k...: never data tensors

# Ops that translate for any input shape (only the element type can refuse them): the probe may claim
# them on a value whose rank is only known at Run (see GraphParser._deferrable).
SHAPE_AGNOSTIC_OPS = frozenset(
    "Cast CastLike Identity Abs Neg Sqrt Reciprocal Exp Log Relu Sigmoid Tanh Erf Floor Ceil Sign "
    "Sin Cos Softplus Softsign".split()
)


def _static_dims(info: dict | None) -> bool:
    dims = None if info is None else info.get("shape")
    return dims is not None and all(isinstance(d, int) and d >= 0 for d in dims)


def _specialised(name: str, value: np.ndarray, shape: Shape) -> np.ndarray:
    v = np.asarray(value)
    if v.dtype != shape.dtype or tuple(v.shape) != shape.lens:
        raise ParseError(f"value for input {name!r} is {v.dtype}{list(v.shape)}, expected {shape}")
    return v.copy()  # the caller's buffer is only valid during its call


def _as_supported(arr: np.ndarray, name: str) -> np.ndarray:
    try:
        from_numpy(arr.dtype)
    except UnsupportedTypeError as e:
        raise Unsupported(f"initializer {name!r}: {e}") from None
    return arr


def _no_symbolic(name: str, axis: int, dim: Any) -> int:
    raise Unsupported(f"input {name!r} dim {axis} is symbolic ({dim!r}); a concrete size is needed")


def parse_graph(
    graph: dict,
    input_shapes: dict[str, Shape] | None = None,
    resolve_dim: DimResolver | None = None,
    tolerant: bool = False,
    claimed: set[int] | None = None,
    group_of: dict[int, int] | None = None,
    specialize: bool = False,
    input_values: dict[str, np.ndarray] | None = None,
    check: Callable[[Instruction], str | None] | None = None,
    runtime_dims: dict[str, tuple[int, ...]] | None = None,
    weights: WeightCache | None = None,
) -> ParseResult:
    """``weights``: the cache the compiles of one subgraph share (``ir/weights.py``); the program keeps
    it (``Program.weights``) so its compile shares it too."""
    prog = Program()
    prog.weights = weights
    if weights is not None:
        prog.derived_weights = weights.begin()
    main = prog.get_main_module()
    gp = GraphParser(
        prog, input_shapes, resolve_dim, tolerant, claimed, group_of, specialize, input_values, check,
        runtime_dims, weights,
    )  # fmt: skip
    with stage("parse"):
        outs = gp.parse(graph, main)
    ret = [outs[n] for n in graph["outputs"] if outs.get(n) is not None]
    main.add_return(ret)
    return ParseResult(prog, gp.refused, outs, gp.needs_values, gp.values, gp.pins)


__all__ = [
    "DType",
    "GraphParser",
    "ParseError",
    "ParseResult",
    "parse_graph",
    "to_numpy",
    "topo_order",
    "value_shape",
]
