"""RNN, GRU and LSTM on the gpu target through their unrolled decomposition (``decompose/rnn.py``),
checked against the ref target without a GPU: directions, activations, clip, GRU's
linear_before_reset, LSTM's peepholes and input_forget, absent inputs, sequence lengths, layouts,
types, and which tuple outputs are read."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.targets.gpu import nvrtc

from .decomposecheck import check_decomposed, compile_kernels, make_model, node
from .gpucheck import F16, F32, F64, Tol, normal

S, B, IN, H = 4, 3, 5, 6  # steps, batch, input size, hidden size
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
# Row 0 runs every step, row 1 none (Y zeros, Y_h = initial_h), row 2 stops halfway.
LENS = np.array([4, 0, 2], np.int32)
DIRECTIONS = ["forward", "reverse", "bidirectional"]


def _model(
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
    **attrs: object,
):  # noqa: ANN202
    """(model, feeds) of one ``op`` node; absent optional inputs are passed as ""."""
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
    model = make_model([node(op, names, outs, **attrs)], feeds, [o for o in outs if o])
    return model, feeds


def _check(
    rng: np.random.Generator, op: str, direction: str = "forward", tol: Tol | None = None, **kw: object
) -> None:
    model, feeds = _model(rng, op, direction, **kw)  # type: ignore[arg-type]
    check_decomposed(model, feeds, [op.lower()], tol)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", list(GATES))
def test_directions_with_sequence_lengths(rng, op: str, direction: str) -> None:  # noqa: ANN001
    _check(rng, op, direction)


@pytest.mark.parametrize("op", list(GATES))
def test_defaults_no_optional_inputs(rng, op: str) -> None:  # noqa: ANN001
    _check(rng, op, "bidirectional", lens=None, initial=False, bias=False)


@pytest.mark.parametrize("op", list(GATES))
def test_lengths_outside_the_sequence_are_clipped(rng, op: str) -> None:  # noqa: ANN001
    # The ref clips lengths to [0, S] (ONNX leaves larger or negative ones undefined).
    _check(rng, op, "bidirectional", lens=np.array([7, -2, 3], np.int32))


# The activations the ref knows, each used at least once per op; two directions with different ones
# take the per-direction path (no shared GEMM).
ACTS = {
    "RNN": [["relu"], ["softsign"], ["softplus"], ["sigmoid"], ["tanh", "relu"]],
    "GRU": [["softsign", "softplus"], ["relu", "sigmoid"], ["sigmoid", "tanh", "tanh", "softsign"]],
    "LSTM": [["softplus", "relu", "softsign"], ["tanh", "sigmoid", "relu", "sigmoid", "tanh", "tanh"]],
}


@pytest.mark.parametrize("op,acts", [(op, a) for op, cases in ACTS.items() for a in cases], ids=str)
def test_activations(rng, op: str, acts: list[str]) -> None:  # noqa: ANN001
    n_dir = 1 if len(acts) == {"RNN": 1, "GRU": 2, "LSTM": 3}[op] else 2
    _check(rng, op, "forward" if n_dir == 1 else "bidirectional", activations=acts)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU"])  # the parser refuses LSTM's clip (ORT's is undocumented)
def test_clip(rng, op: str, direction: str) -> None:  # noqa: ANN001
    acts = {"RNN": ["relu"], "GRU": ["sigmoid", "relu"]}[op] * (2 if direction == "bidirectional" else 1)
    model, feeds = _model(rng, op, direction, clip=0.5, activations=acts)
    feeds["x"] *= 4  # most pre-activations beyond the clip
    check_decomposed(model, feeds, [op.lower()])


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(rng, lbr: int, direction: str) -> None:  # noqa: ANN001
    _check(rng, "GRU", direction, linear_before_reset=lbr)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("input_forget", [0, 1])
def test_lstm_peepholes_input_forget(rng, input_forget: int, direction: str) -> None:  # noqa: ANN001
    _check(rng, "LSTM", direction, peepholes=True, input_forget=input_forget)


@pytest.mark.parametrize("op", list(GATES))
def test_layout_batch_major(rng, op: str) -> None:  # noqa: ANN001
    _check(rng, op, "bidirectional", layout=1, peepholes=op == "LSTM")


@pytest.mark.parametrize("dtype", [F16, F64], ids=["f16", "f64"])
@pytest.mark.parametrize("op", list(GATES))
def test_types(rng, op: str, dtype) -> None:  # noqa: ANN001
    # half computes in float32 and rounds once, as the ref: one half ulp (2**-10), not a drift per step
    _check(rng, op, "bidirectional", Tol(1e-3, 1e-4) if dtype == F16 else None, dtype=dtype)


@pytest.mark.parametrize(
    "op,outputs",
    [("RNN", ("", "yh")), ("GRU", ("y",)), ("LSTM", ("", "", "yc")), ("LSTM", ("y", "", "yc"))],
    ids=str,
)
def test_some_outputs_read(rng, op: str, outputs: tuple[str, ...]) -> None:  # noqa: ANN001
    _check(rng, op, "reverse", outputs=outputs)


def test_one_step(rng) -> None:  # noqa: ANN001
    _check(rng, "LSTM", "bidirectional", steps=1, lens=np.array([1, 0, 1], np.int32), peepholes=True)


def test_long_sequences_are_refused(rng) -> None:  # noqa: ANN001
    from migraphx_ep.ep.partition import partition
    from migraphx_ep.frontend import model_to_dict
    from migraphx_ep.targets.gpu.decompose.rnn import MAX_STEPS
    from migraphx_ep.targets.gpu.lowering import instruction_supported

    for steps, refused in ((MAX_STEPS, False), (MAX_STEPS + 1, True)):
        model, _ = _model(rng, "RNN", steps=steps)
        why = partition(model_to_dict(model), instruction_supported).refused
        assert bool(why) == refused, why
        assert not refused or f"over {MAX_STEPS}" in next(iter(why.values()))


def test_kernel_counts_per_step(rng) -> None:  # noqa: ANN001
    # Both directions share each step's GEMM: one per step, plus the input GEMM of all steps.
    for op, per_step in (("RNN", 1), ("GRU", 2), ("LSTM", 1)):
        model, feeds = _model(rng, op, "bidirectional")
        low = check_decomposed(model, feeds, [op.lower()])
        assert sum("gemm" in s.label for s in low.steps) == 1 + per_step * S, [s.label for s in low.steps]


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
def test_decomposed_kernels_compile(rng) -> None:  # noqa: ANN001
    model, feeds = _model(rng, "LSTM", "bidirectional", peepholes=True, dtype=F16)
    assert compile_kernels(check_decomposed(model, feeds, ["lstm"])) >= 3
    model, feeds = _model(rng, "GRU", "reverse", clip=1.0, activations=["softplus", "softsign"])
    assert compile_kernels(check_decomposed(model, feeds, ["gru"])) >= 3
