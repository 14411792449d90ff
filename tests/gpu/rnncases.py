"""RNN, GRU and LSTM test models with fixed shapes, for the decomposition checks (no GPU) and the
device tests."""

from __future__ import annotations

import numpy as np
import onnx

from .gpucheck import F32, make_model, node, normal

S, B, IN, H = 4, 3, 5, 6  # steps, batch, input size, hidden size
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
# Row 0 runs every step, row 1 none (Y zeros, Y_h = initial_h), row 2 stops halfway.
LENS = np.array([4, 0, 2], np.int32)
DIRECTIONS = ["forward", "reverse", "bidirectional"]


def rnn_model(
    rng: np.random.Generator,
    op: str,
    direction: str = "forward",
    *,
    lens: np.ndarray | None = LENS,
    initial: bool = True,
    bias: bool = True,
    peepholes: bool = False,
    layout: int = 0,
    dtype: np.dtype = F32,
    outputs: tuple[str, ...] | None = None,
    steps: int = S,
    weights_as_inits: bool = False,
    **attrs: object,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """(model, feeds) of one ``op`` node; absent optional inputs are passed as "". With
    ``weights_as_inits`` W, R, B and P are initializers (constants the compile folds), as in models."""
    d, g = 2 if direction == "bidirectional" else 1, GATES[op]
    x_lens, state = ((B, steps, IN), (B, d, H)) if layout else ((steps, B, IN), (d, B, H))
    feeds = {
        "x": normal(rng, x_lens, dtype),
        "w": normal(rng, (d, g * H, IN), dtype, 0.5),
        "r": normal(rng, (d, g * H, H), dtype, 0.5),
    }
    if bias:
        feeds["b"] = normal(rng, (d, 2 * g * H), dtype, 0.5)
    if lens is not None:
        feeds["lens"] = lens
    if initial:
        feeds["h0"] = normal(rng, state, dtype)
        if op == "LSTM":
            feeds["c0"] = normal(rng, state, dtype)
    if peepholes:
        feeds["p"] = normal(rng, (d, 3 * H), dtype, 0.5)
    order = ["x", "w", "r", "b", "lens", "h0", "c0", "p"][: 8 if op == "LSTM" else 6]
    names = [k if k in feeds else "" for k in order]
    while names[-1] == "":
        names.pop()
    outs = list(outputs or (("y", "yh", "yc") if op == "LSTM" else ("y", "yh")))
    attrs = {"hidden_size": H, "direction": direction, **attrs} | ({"layout": layout} if layout else {})
    inits = {k: feeds.pop(k) for k in ("w", "r", "b", "p") if k in feeds} if weights_as_inits else None
    model = make_model([node(op, names, outs, **attrs)], feeds, [o for o in outs if o], inits)
    return model, feeds
