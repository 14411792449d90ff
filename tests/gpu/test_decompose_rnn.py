"""RNN, GRU and LSTM on the gpu target through their unrolled decomposition (``decompose/rnn.py``),
checked against the ref target without a GPU: directions, activations, clip, GRU's
linear_before_reset, LSTM's peepholes and input_forget, absent inputs, sequence lengths, layouts,
types, and which tuple outputs are read."""

from __future__ import annotations

import numpy as np
import pytest

from migraphx_ep.targets.gpu import nvrtc

from .decomposecheck import check_decomposed, compile_kernels
from .gpucheck import F16, F64, Tol
from .rnncases import DIRECTIONS, GATES, rnn_model


def _check(
    rng: np.random.Generator, op: str, direction: str = "forward", tol: Tol | None = None, **kw: object
) -> None:
    model, feeds = rnn_model(rng, op, direction, **kw)  # type: ignore[arg-type]
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
    model, feeds = rnn_model(rng, op, direction, clip=0.5, activations=acts)
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


@pytest.mark.parametrize("op", list(GATES))
def test_weights_as_initializers(rng, op: str) -> None:  # noqa: ANN001
    # As in exported models: the weights' transposes and slices fold into constants.
    _check(rng, op, "bidirectional", weights_as_inits=True, peepholes=op == "LSTM")


def test_one_step(rng) -> None:  # noqa: ANN001
    _check(rng, "LSTM", "bidirectional", steps=1, lens=np.array([1, 0, 1], np.int32), peepholes=True)


def test_long_sequences_are_refused(rng) -> None:  # noqa: ANN001
    from migraphx_ep.ep.partition import partition
    from migraphx_ep.frontend import model_to_dict
    from migraphx_ep.targets.gpu.decompose.rnn import MAX_STEPS
    from migraphx_ep.targets.gpu.support import instruction_supported

    for steps, refused in ((MAX_STEPS, False), (MAX_STEPS + 1, True)):
        model, _ = rnn_model(rng, "RNN", steps=steps)
        why = partition(model_to_dict(model), instruction_supported).refused
        assert bool(why) == refused, why
        assert not refused or f"over {MAX_STEPS}" in next(iter(why.values()))


@pytest.mark.parametrize("op,gemms,launches", [("RNN", 1, 2), ("GRU", 2, 5), ("LSTM", 1, 4)])
def test_launches_per_step(rng, op: str, gemms: int, launches: int) -> None:  # noqa: ANN001
    # Both directions share each step's GEMMs, plus one input GEMM for all steps; the pointwise work
    # of a step fuses into one kernel per value read later (RNN: state; GRU: z, r*h, state; LSTM: c
    # and the two states), so four more steps add four times a step's launches.
    counts = []
    for steps in (4, 8):
        model, feeds = rnn_model(
            rng, op, "bidirectional", steps=steps, lens=np.array([steps, 0, 2], np.int32)
        )
        low = check_decomposed(model, feeds, [op.lower()])
        assert sum("gemm" in s.label for s in low.steps) == 1 + gemms * steps, [s.label for s in low.steps]
        counts.append(len(low.steps))
    assert counts[1] - counts[0] == 4 * launches, counts


@pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
def test_decomposed_kernels_compile(rng) -> None:  # noqa: ANN001
    model, feeds = rnn_model(rng, "LSTM", "bidirectional", peepholes=True, dtype=F16)
    assert compile_kernels(check_decomposed(model, feeds, ["lstm"])) >= 3
    model, feeds = rnn_model(rng, "GRU", "reverse", clip=1.0, activations=["softplus", "softsign"])
    assert compile_kernels(check_decomposed(model, feeds, ["gru"])) >= 3
