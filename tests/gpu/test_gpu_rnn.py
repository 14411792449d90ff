"""RNN, GRU and LSTM on the device vs ref: the graphs of ``test_decompose_rnn`` (which checks the
unrolled decomposition and its lowering without a GPU), here run by cuBLASLt and generated kernels.
Each case runs twice, the second time on reshuffled inputs (lengths included), as ``check_model`` does.
"""

from __future__ import annotations

import numpy as np
import pytest

from .gpucheck import F16, F32, F64, FP16_OP, FP32_SUM, FP64, check_model
from .rnncases import DIRECTIONS, GATES, rnn_model

pytestmark = pytest.mark.gpu

# half computes in float32 and rounds once, as the ref does: one half ulp apart at most
TOL = {F32: FP32_SUM, F16: FP16_OP, F64: FP64}


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", list(GATES))
def test_directions_with_sequence_lengths(gpu, rng, op: str, direction: str) -> None:  # noqa: ANN001
    model, feeds = rnn_model(rng, op, direction, peepholes=op == "LSTM")
    check_model(model, feeds, gpu, FP32_SUM)


@pytest.mark.parametrize("dtype", [F16, F64], ids=["f16", "f64"])
@pytest.mark.parametrize("op", list(GATES))
def test_types_weights_as_initializers(gpu, rng, op: str, dtype) -> None:  # noqa: ANN001
    model, feeds = rnn_model(rng, op, "bidirectional", dtype=dtype, weights_as_inits=True)
    check_model(model, feeds, gpu, TOL[dtype])


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("RNN", {"activations": ["relu", "softsign"], "clip": 0.5}),  # one per direction
        ("GRU", {"activations": ["softplus", "tanh"] * 2, "clip": 0.5, "linear_before_reset": 1}),
        ("GRU", {"linear_before_reset": 0, "layout": 1}),
        ("LSTM", {"activations": ["sigmoid", "relu", "softsign"] * 2, "input_forget": 1, "layout": 1}),
    ],
    ids=str,
)
def test_attributes(gpu, rng, op: str, attrs: dict) -> None:  # noqa: ANN001
    model, feeds = rnn_model(rng, op, "bidirectional", peepholes=op == "LSTM", **attrs)
    check_model(model, feeds, gpu, FP32_SUM)


def test_no_optional_inputs_only_y_h_read(gpu, rng) -> None:  # noqa: ANN001
    model, feeds = rnn_model(rng, "LSTM", "reverse", lens=None, initial=False, bias=False, outputs=("", "yh"))
    check_model(model, feeds, gpu, FP32_SUM)


def test_lengths_outside_the_sequence(gpu, rng) -> None:  # noqa: ANN001
    model, feeds = rnn_model(rng, "GRU", "bidirectional", lens=np.array([7, -2, 3], np.int32))
    check_model(model, feeds, gpu, FP32_SUM)
