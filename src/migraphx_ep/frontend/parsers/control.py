"""Control flow ONNX ops: If, Loop, Scan as ops owning submodules.

Subgraphs read outer-scope values through extra parameters (``ParseContext.subgraph_call``); the
op receives the values feeding them after its own inputs. Results come out of a tuple.
"""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ...ir.module import Module
from ...ir.shape import Shape
from ..context import NodeDesc, ParseContext, normalize_axis, param_deps
from ..table import Unsupported, onnx_op


def _unpack(ctx: ParseContext, t: Instruction) -> list[Instruction]:
    return [ctx.add("get_tuple_elem", [t], index=i) for i in range(len(t.shape.sub_shapes))]


def _add_or_drop(
    ctx: ParseContext, mods: list[Module], op: str, args: list[Instruction], **attrs
) -> Instruction:
    try:
        return ctx.add(op, args, mod_args=mods, **attrs)
    except Exception:
        for m in mods:
            ctx.drop_subgraph(m)  # the node is refused: its submodules must not linger in the program
        raise


def _scalar_like(declared: dict | None, t: DType) -> Shape:
    """Shape of a Loop's iteration/condition input: as the body declares it if that has one element."""
    dims = (declared or {}).get("shape")
    if dims is not None and all(isinstance(d, int) and d >= 0 for d in dims) and int(np.prod(dims)) == 1:
        return Shape(t, dims)
    return Shape(t, ())


@onnx_op("If")
def parse_if(ctx: ParseContext, node: NodeDesc, args):
    cond = args[0]
    if cond.shape.elements() != 1 or cond.shape.type != DType.bool_type:
        raise Unsupported("If: condition must be a one-element bool tensor")
    c = ctx.const(cond)
    deps = param_deps(cond) if c is None else None
    if deps and all(d in ctx.value_candidates for d in deps):
        # A condition the EP can learn at Run (e.g. computed in another partition from shapes): compile
        # only the taken branch, as ONNX runs only that one; the other may not even be valid for
        # these shapes (a Squeeze of a dim that is not 1).
        c = ctx.require_const(cond, "If condition")
    if c is not None:
        # A known condition (common after shape arithmetic folds): only the taken branch exists.
        return ctx.inline_subgraph("then_branch" if bool(np.asarray(c).reshape(())) else "else_branch")
    then_m, then_feeds = ctx.subgraph_call("then_branch")
    try:
        else_m, else_feeds = ctx.subgraph_call("else_branch")
    except Exception:
        ctx.drop_subgraph(then_m)
        raise
    t = _add_or_drop(ctx, [then_m, else_m], "if", [cond, *then_feeds, *else_feeds])
    return _unpack(ctx, t)


@onnx_op("Loop")
def parse_loop(ctx: ParseContext, node: NodeDesc, args):
    trip, cond, init = args[0], args[1] if len(args) > 1 else None, list(args[2:])
    if trip is None and cond is None:
        raise Unsupported("Loop: no trip count and no condition (an infinite loop)")
    if any(v is None for v in init):
        raise Unsupported("Loop: omitted loop-carried input")
    body = node.subgraphs.get("body")
    if body is None or len(body["inputs"]) != 2 + len(init):
        raise Unsupported("Loop: body must take iteration number, condition and each carried value")
    infos = body.get("values", {})
    it_name, cond_name = body["inputs"][:2]
    shapes = {
        it_name: _scalar_like(infos.get(it_name), DType.int64_type),
        cond_name: _scalar_like(infos.get(cond_name), DType.bool_type),
    }
    shapes.update({n: v.shape.as_standard() for n, v in zip(body["inputs"][2:], init, strict=True)})

    trip_c = ctx.const(trip) if trip is not None else None
    cond_c = ctx.const(cond) if cond is not None else None
    if trip is None:
        trip = ctx.literal(np.iinfo(np.int64).max, np.int64)  # no count: only the condition stops it
    if cond is None:
        cond = ctx.literal(True)
    for v, t, what in ((trip, DType.int64_type, "trip count"), (cond, DType.bool_type, "condition")):
        if v.shape.elements() != 1 or v.shape.type != t:
            raise Unsupported(f"Loop: {what} must be a one-element {t.name} tensor")

    mod, feeds = ctx.subgraph_call("body", shapes)
    n_scan = len(body["outputs"]) - 1 - len(init)
    iterations = -1
    if n_scan > 0:
        try:
            iterations = _static_iterations(mod, trip_c, cond_c, len(init))
        except Unsupported:
            ctx.drop_subgraph(mod)
            raise
    t = _add_or_drop(
        ctx, [mod], "loop", [trip, cond, *init, *feeds], num_carried=len(init), iterations=iterations
    )
    return _unpack(ctx, t)


def _static_iterations(body: Module, trip: np.ndarray | None, cond: np.ndarray | None, n_carried: int) -> int:
    """Scan outputs stack one slice per iteration, so their shape needs the count before running."""
    if trip is None:
        raise Unsupported("Loop: scan outputs with a run-time trip count")
    first = True if cond is None else bool(np.asarray(cond).reshape(()))
    if not first:
        return 0
    out_cond = body.outputs()[0]
    always = out_cond.eval()
    passes_through = out_cond is body.get_parameters()[1]
    if not passes_through and (always is None or not bool(np.asarray(always).reshape(()))):
        raise Unsupported("Loop: scan outputs with a condition computed at run time")
    return max(int(np.asarray(trip).reshape(())), 0)


@onnx_op("Scan", min_opset=9)
def parse_scan(ctx: ParseContext, node: NodeDesc, args):
    k = int(node.attr("num_scan_inputs"))
    n_state = len(args) - k
    if k < 1 or n_state < 0 or any(a is None for a in args):
        raise Unsupported("Scan: bad number of inputs")
    body = node.subgraphs.get("body")
    if body is None or len(body["inputs"]) != len(args):
        raise Unsupported("Scan: body inputs do not match the states and scan inputs")
    scan_in = args[n_state:]
    in_axes = [
        normalize_axis(int(a), x.shape.ndim(), "Scan input axis")
        for a, x in zip(node.attr("scan_input_axes", [0] * k), scan_in, strict=True)
    ]
    in_dirs = [int(d) for d in node.attr("scan_input_directions", [0] * k)]
    shapes = {n: a.shape.as_standard() for n, a in zip(body["inputs"][:n_state], args, strict=False)}
    for n, x, a in zip(body["inputs"][n_state:], scan_in, in_axes, strict=True):
        shapes[n] = Shape(x.shape.type, x.shape.lens[:a] + x.shape.lens[a + 1 :])
    n_out = len(body["outputs"]) - n_state
    out_dirs = [int(d) for d in node.attr("scan_output_directions", [0] * n_out)]
    raw_out_axes = [int(a) for a in node.attr("scan_output_axes", [0] * n_out)]
    if (
        len(in_dirs) != k
        or len(out_dirs) != n_out
        or len(raw_out_axes) != n_out
        or any(d not in (0, 1) for d in in_dirs + out_dirs)
    ):
        raise Unsupported("Scan: axes/directions attributes do not match the inputs and outputs")
    mod, feeds = ctx.subgraph_call("body", shapes)
    try:
        elem = mod.get_output_shapes()[n_state:]
        out_axes = [
            normalize_axis(a, s.ndim() + 1, "Scan output axis")
            for a, s in zip(raw_out_axes, elem, strict=True)
        ]
    except Unsupported:
        ctx.drop_subgraph(mod)
        raise
    t = _add_or_drop(
        ctx,
        [mod],
        "scan",
        [*args, *feeds],
        num_state=n_state,
        num_scan_inputs=k,
        scan_input_axes=in_axes,
        scan_input_directions=in_dirs,
        scan_output_axes=out_axes,
        scan_output_directions=out_dirs,
    )
    return _unpack(ctx, t)
