"""Control flow: ``if``, ``loop`` and ``scan`` own submodules and run them with the ref semantics.

Calling convention (set up by the frontend's subgraph parser): a submodule's parameters, in module
order, are its ONNX formal inputs followed by one parameter per outer-scope value it reads. The op's
own inputs come first and the values feeding those outer-scope parameters follow, in the same order.
Every op returns a tuple; the frontend takes its elements with ``get_tuple_elem``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..ir.dtypes import DType
from ..ir.module import Module
from ..ir.operation import ModuleOp, RunModule, op_class, register_op
from ..ir.shape import Shape, ShapeError


def _bind(mod: Module, args: list[np.ndarray]) -> dict[str, np.ndarray]:
    names = mod.get_parameter_names()
    if len(names) != len(args):
        raise ValueError(f"module {mod.name!r} takes {len(names)} parameters, got {len(args)}")
    return dict(zip(names, args, strict=True))


def _check_feeds(op: str, mod: Module, shapes: list[Shape]) -> None:
    want = list(mod.get_parameter_shapes().values())
    if len(want) != len(shapes):
        raise ShapeError(f"{op}: module {mod.name!r} takes {len(want)} parameters, given {len(shapes)}")
    for w, s in zip(want, shapes, strict=True):
        if (w.type, w.lens) != (s.type, s.lens):
            raise ShapeError(f"{op}: module {mod.name!r} expects {w}, given {s}")


def _as_param(value: object, shape: Shape) -> np.ndarray:
    return np.asarray(value, dtype=shape.dtype).reshape(shape.lens)


@register_op
@op_class
class If(ModuleOp):
    """Inputs: cond, then the then-branch's parameter feeds, then the else-branch's."""

    name: ClassVar[str] = "if"

    def compute_shape_with_modules(self, inputs: list[Shape], mods: list[Module]) -> Shape:
        if len(mods) != 2 or not inputs or inputs[0].elements() != 1 or inputs[0].type != DType.bool_type:
            raise ShapeError("if: needs a one-element bool condition and two branch modules")
        then_m, else_m = mods
        n_then = len(then_m.get_parameters())
        _check_feeds(self.name, then_m, inputs[1 : 1 + n_then])
        _check_feeds(self.name, else_m, inputs[1 + n_then :])
        a, b = then_m.get_output_shapes(), else_m.get_output_shapes()
        if [(s.type, s.lens) for s in a] != [(s.type, s.lens) for s in b]:
            raise ShapeError(f"if: branches produce different shapes {a} vs {b}")
        return Shape.tuple_of([s.as_standard() for s in a])

    def compute_with_modules(
        self, out: Shape, args: list[np.ndarray], mods: list[Module], run: RunModule
    ) -> list[np.ndarray]:
        then_m, else_m = mods
        n_then = len(then_m.get_parameters())
        if bool(np.asarray(args[0]).reshape(())):
            return run(then_m, _bind(then_m, args[1 : 1 + n_then]))
        return run(else_m, _bind(else_m, args[1 + n_then :]))


@register_op
@op_class
class Loop(ModuleOp):
    """ONNX Loop. Inputs: trip count (int64), cond (bool), ``num_carried`` initial values, outer feeds.

    Outputs: the final carried values, then the scan outputs stacked over iterations. Scan outputs need
    a count known when compiling (``iterations``); running a different number of times is an error.
    """

    name: ClassVar[str] = "loop"
    num_carried: int = 0
    iterations: int = -1

    def compute_shape_with_modules(self, inputs: list[Shape], mods: list[Module]) -> Shape:
        if len(mods) != 1 or len(inputs) < 2 + self.num_carried:
            raise ShapeError("loop: needs trip count, condition, carried values and one body module")
        body = mods[0]
        params = body.get_parameters()
        if len(params) != len(inputs):
            raise ShapeError(f"loop: body takes {len(params)} parameters, given {len(inputs)} inputs")
        for i, (p, s) in enumerate(zip(params, inputs, strict=True)):
            # The first two parameters are the iteration number and condition, fed by the op itself.
            ok = p.shape.elements() == 1 if i < 2 else (p.shape.type, p.shape.lens) == (s.type, s.lens)
            if not ok:
                raise ShapeError(f"loop: body parameter {i} is {p.shape}, given {s}")
        outs = body.get_output_shapes()
        if len(outs) < 1 + self.num_carried:
            raise ShapeError(f"loop: body returns {len(outs)} values, fewer than 1 + {self.num_carried}")
        carried = inputs[2 : 2 + self.num_carried]
        for i, (o, c) in enumerate(zip(outs[1 : 1 + self.num_carried], carried, strict=True)):
            if (o.type, o.lens) != (c.type, c.lens):
                raise ShapeError(f"loop: carried value {i} changes from {c} to {o} across iterations")
        scans = outs[1 + self.num_carried :]
        if scans and self.iterations < 0:
            raise ShapeError("loop: scan outputs need a known iteration count")
        return Shape.tuple_of(
            [c.as_standard() for c in carried] + [Shape(s.type, (self.iterations, *s.lens)) for s in scans]
        )

    def compute_with_modules(
        self, out: Shape, args: list[np.ndarray], mods: list[Module], run: RunModule
    ) -> list[np.ndarray]:
        body = mods[0]
        pshapes = list(body.get_parameter_shapes().values())
        trip, cond = int(np.asarray(args[0]).reshape(())), bool(np.asarray(args[1]).reshape(()))
        values = list(args[2 : 2 + self.num_carried])
        outer = list(args[2 + self.num_carried :])
        n_scan = len(out.sub_shapes) - self.num_carried
        scans: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
        i = 0
        while i < trip and cond:
            res = run(
                body, _bind(body, [_as_param(i, pshapes[0]), _as_param(cond, pshapes[1]), *values, *outer])
            )
            cond = bool(np.asarray(res[0]).reshape(()))
            values = list(res[1 : 1 + self.num_carried])
            for acc, v in zip(scans, res[1 + self.num_carried :], strict=True):
                acc.append(v)
            i += 1
        if n_scan and i != self.iterations:
            raise RuntimeError(f"loop: ran {i} iterations, compiled for {self.iterations}")
        stacked = [
            np.stack(acc) if acc else np.zeros(s.lens, s.dtype)
            for acc, s in zip(scans, out.sub_shapes[self.num_carried :], strict=True)
        ]
        return [np.asarray(v) for v in values] + stacked


@register_op
@op_class
class Scan(ModuleOp):
    """ONNX Scan (opset 9+). Inputs: ``num_state`` initial states, the scan inputs, outer feeds."""

    name: ClassVar[str] = "scan"
    num_state: int = 0
    num_scan_inputs: int = 1
    scan_input_axes: tuple[int, ...] = ()
    scan_input_directions: tuple[int, ...] = ()
    scan_output_axes: tuple[int, ...] = ()
    scan_output_directions: tuple[int, ...] = ()

    def _length(self, inputs: list[Shape]) -> int:
        scan_in = inputs[self.num_state : self.num_state + self.num_scan_inputs]
        lens = {s.lens[a] for s, a in zip(scan_in, self.scan_input_axes, strict=True)}
        if len(lens) != 1:
            raise ShapeError(f"scan: scan inputs have different sequence lengths {sorted(lens)}")
        return lens.pop()

    def compute_shape_with_modules(self, inputs: list[Shape], mods: list[Module]) -> Shape:
        m, k = self.num_state, self.num_scan_inputs
        if len(mods) != 1 or k < 1 or len(self.scan_input_axes) != k or len(self.scan_input_directions) != k:
            raise ShapeError("scan: needs one body, scan inputs, and axes/directions for each")
        body = mods[0]
        n = self._length(inputs)
        sliced = [
            Shape(s.type, s.lens[:a] + s.lens[a + 1 :])
            for s, a in zip(inputs[m : m + k], self.scan_input_axes, strict=True)
        ]
        _check_feeds(self.name, body, inputs[:m] + sliced + inputs[m + k :])
        outs = body.get_output_shapes()
        for i, (o, s) in enumerate(zip(outs[:m], inputs[:m], strict=False)):
            if (o.type, o.lens) != (s.type, s.lens):
                raise ShapeError(f"scan: state {i} changes from {s} to {o}")
        scan_outs = outs[m:]
        if len(self.scan_output_axes) != len(scan_outs) or len(self.scan_output_directions) != len(scan_outs):
            raise ShapeError("scan: scan_output_axes/directions must cover every scan output")
        res = [s.as_standard() for s in inputs[:m]]
        for o, a in zip(scan_outs, self.scan_output_axes, strict=True):
            if not 0 <= a <= o.ndim():
                raise ShapeError(f"scan: output axis {a} out of range for {o}")
            res.append(Shape(o.type, o.lens[:a] + (n,) + o.lens[a:]))
        return Shape.tuple_of(res)

    def compute_with_modules(
        self, out: Shape, args: list[np.ndarray], mods: list[Module], run: RunModule
    ) -> list[np.ndarray]:
        body = mods[0]
        m, k = self.num_state, self.num_scan_inputs
        states = list(args[:m])
        scan_in = args[m : m + k]
        outer = list(args[m + k :])
        n = scan_in[0].shape[self.scan_input_axes[0]] if k else 0
        n_out = len(out.sub_shapes) - m
        acc: list[list[np.ndarray]] = [[] for _ in range(n_out)]
        for t in range(n):
            slices = [
                np.take(x, n - 1 - t if d else t, axis=a)
                for x, a, d in zip(scan_in, self.scan_input_axes, self.scan_input_directions, strict=True)
            ]
            res = run(body, _bind(body, [*states, *slices, *outer]))
            states = list(res[:m])
            for a, v in zip(acc, res[m:], strict=True):
                a.append(np.asarray(v))
        results = [np.asarray(s) for s in states]
        for j, s in enumerate(out.sub_shapes[m:]):
            if not acc[j]:
                results.append(np.zeros(s.lens, s.dtype))
                continue
            seq = acc[j][::-1] if self.scan_output_directions[j] else acc[j]
            results.append(np.stack(seq, axis=self.scan_output_axes[j]))
        return results
