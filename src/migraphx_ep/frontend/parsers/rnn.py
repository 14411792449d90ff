"""RNN, GRU and LSTM parsers: fill absent optional inputs, normalise layout, split the tuple output."""

from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ...ir.instruction import Instruction
from ...ops.rnn import ACTIVATIONS, GATES, RNN_TYPES
from ..context import NodeDesc, ParseContext
from ..table import Unsupported, onnx_op

DEFAULT_ACTS = {"rnn": ["tanh"], "gru": ["sigmoid", "tanh"], "lstm": ["sigmoid", "tanh", "tanh"]}


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@onnx_op("RNN", "GRU", "LSTM")
def parse_recurrent(ctx: ParseContext, node: NodeDesc, args):
    kind = node.op_type.lower()
    x, w, r = args[:3]
    opt = list(args[3:]) + [None] * (8 - len(args))
    b, seq, h0 = opt[0], opt[1], opt[2]
    c0, p = (opt[3], opt[4]) if kind == "lstm" else (None, None)
    if x.shape.type not in RNN_TYPES:
        raise Unsupported(f"{node.op_type} of {x.shape.type.name}")
    if node.attr("output_sequence") is not None:
        raise Unsupported("output_sequence attribute (opset 1)")
    if node.attr("activation_alpha") is not None or node.attr("activation_beta") is not None:
        raise Unsupported("activation_alpha/activation_beta (parameterised activations)")
    direction = _str(node.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise Unsupported(f"direction {direction!r}")
    d = 2 if direction == "bidirectional" else 1
    acts = [_str(a).lower() for a in node.attr("activations", [])] or DEFAULT_ACTS[kind] * d
    if kind == "rnn" and d == 1 and acts == ["tanh", "tanh"]:
        # ONNX's schema default for RNN is [Tanh, Tanh] whatever the direction (ORT >= 1.32 passes
        # defaults on); one direction uses the first, as ONNX's reference does.
        acts = acts[:1]
    bad = [a for a in acts if a not in ACTIVATIONS]
    if bad or len(acts) != len(DEFAULT_ACTS[kind]) * d:
        raise Unsupported(f"activations {acts}")
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1) or (layout and ctx.opset < 14):
        raise Unsupported(f"layout {layout}")
    if x.shape.ndim() != 3 or w.shape.ndim() != 3:
        raise Unsupported(f"{node.op_type} input/weight ranks")
    hs = int(node.attr("hidden_size", r.shape.lens[-1]))
    g = GATES[kind]
    if layout:
        x = ctx.add("transpose", [x], permutation=[1, 0, 2])
    s, bsz = x.shape.lens[:2]
    dt = x.shape.dtype

    def zeros(*lens: int) -> Instruction:
        return ctx.literal(np.zeros(lens, dt))

    def state(v: Instruction | None) -> Instruction:
        if v is None:
            return zeros(d, bsz, hs)
        return ctx.add("transpose", [v], permutation=[1, 0, 2]) if layout else v

    if seq is None:
        seq = ctx.literal(np.full(bsz, s, np.int32))
    else:
        if seq.shape.lens != (bsz,):
            raise Unsupported("sequence_lens dims")
        seq = ctx.convert(seq, DType.int32_type)
    ins = [x, w, r, b if b is not None else zeros(d, 2 * g * hs), seq, state(h0)]
    attrs: dict = dict(
        hidden_size=hs, direction=direction, actv_funcs=acts, clip=float(node.attr("clip", 0.0))
    )
    if kind == "gru":
        attrs["linear_before_reset"] = bool(node.attr("linear_before_reset", 0))
    if kind == "lstm":
        ins += [state(c0), p if p is not None else zeros(d, 3 * hs)]
        attrs["input_forget"] = bool(node.attr("input_forget", 0))
    if attrs["clip"] < 0:
        raise Unsupported("negative clip")
    if kind == "lstm" and attrs["clip"] > 0:
        raise Unsupported("LSTM clip (ORT clips at points its kernel does not document; not matched)")
    t = ctx.add(kind, ins, **attrs)
    outs = [ctx.add("get_tuple_elem", [t], index=i) for i in range(3 if kind == "lstm" else 2)]
    if layout:
        outs = [ctx.add("transpose", [outs[0]], permutation=[2, 0, 1, 3])] + [
            ctx.add("transpose", [o], permutation=[1, 0, 2]) for o in outs[1:]
        ]
    return outs
