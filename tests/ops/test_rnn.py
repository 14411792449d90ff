"""rnn / gru / lstm vs ORT CPU (every direction, sequence_lens, initial states, peepholes) and vs numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from migraphx_ep.frontend import ParseError
from opcheck import check_node, make_model, run_ours

RNG = np.random.default_rng(3)
S, B, IN, H = 4, 3, 5, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def inputs(kind: str, d: int, dtype=np.float32) -> dict[str, np.ndarray]:
    g = GATES[kind]
    ins = {
        "x": RNG.standard_normal((S, B, IN)),
        "w": RNG.standard_normal((d, g * H, IN)) * 0.5,
        "r": RNG.standard_normal((d, g * H, H)) * 0.5,
        "b": RNG.standard_normal((d, 2 * g * H)),
        "seq": np.array([4, 2, 3]),
        "h0": RNG.standard_normal((d, B, H)),
    }
    if kind == "LSTM":
        ins["c0"] = RNG.standard_normal((d, B, H))
        ins["p"] = RNG.standard_normal((d, 3 * H))
    return {k: v.astype(np.int32 if k == "seq" else dtype) for k, v in ins.items()}


CASES = [
    (k, kw)
    for k in GATES
    for kw in (dict(direction="forward"), dict(direction="reverse"), dict(direction="bidirectional"))
]
CASES += [
    ("RNN", dict(direction="reverse", clip=0.7, activations=["Relu"])),
    ("GRU", dict(linear_before_reset=1, activations=["Relu", "Softsign"])),
    ("GRU", dict(clip=0.5)),
    ("LSTM", dict(input_forget=1)),
]


@pytest.mark.parametrize("kind,kw", CASES)
def test_recurrent_vs_ort(kind, kw):
    d = 2 if kw.get("direction") == "bidirectional" else 1
    ins = inputs(kind, d)
    outs = ["y", "yh"] + (["yc"] if kind == "LSTM" else [])
    check_node(helper.make_node(kind, list(ins), outs, hidden_size=H, **kw), ins, rtol=1e-4, atol=1e-5)


def test_recurrent_optional_inputs_omitted_vs_ort():
    ins = {k: v for k, v in inputs("GRU", 1).items() if k in ("x", "w", "r")}
    check_node(
        helper.make_node("GRU", ["x", "w", "r"], ["y", "yh"], hidden_size=H), ins, rtol=1e-4, atol=1e-5
    )


def test_rnn_matches_numpy_loop_and_batchwise_layout():
    ins = inputs("RNN", 1)
    ins["seq"] = np.full(B, S, np.int32)
    x, w, r, b, h = ins["x"], ins["w"][0], ins["r"][0], ins["b"][0], ins["h0"][0]
    ys = []
    for t in range(S):
        h = np.tanh(x[t] @ w.T + h @ r.T + b[:H] + b[H:])
        ys.append(h)
    # layout=1 (ORT's CPU kernel refuses it, so compare with the loop): batch-major X, h0 and outputs
    bw = dict(ins, x=x.transpose(1, 0, 2).copy(), h0=ins["h0"].transpose(1, 0, 2).copy())
    got = run_ours(
        make_model(helper.make_node("RNN", list(bw), ["y", "yh"], hidden_size=H, layout=1), bw, opset=21), bw
    )
    np.testing.assert_allclose(got[0][:, :, 0], np.stack(ys, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1][:, 0], ys[-1], rtol=1e-5, atol=1e-5)


def test_refusals():
    ins = inputs("LSTM", 1)
    node = helper.make_node("LSTM", list(ins), ["y"], hidden_size=H, clip=1.0)
    with pytest.raises(ParseError, match="clip"):
        run_ours(make_model(node, ins), ins)
    node = helper.make_node(
        "RNN", ["x", "w", "r"], ["y"], hidden_size=H, activations=["LeakyRelu"], activation_alpha=[0.1]
    )
    ins = {k: v for k, v in inputs("RNN", 1).items() if k in ("x", "w", "r")}
    with pytest.raises(ParseError, match="activation_alpha"):
        run_ours(make_model(node, ins), ins)
