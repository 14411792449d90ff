"""Scan on the gpu target through its unrolled decomposition (``decompose/control.py``), checked
against the ref target's loop without a GPU: states, scan input and output axes and directions, several
scan inputs, outer-scope values (fed and constant), a body op that decomposes in turn, more iterations
than one concat takes, and the refusals (too many unrolled instructions, a nested loop)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from migraphx_ep.ep.partition import partition
from migraphx_ep.frontend import model_to_dict
from migraphx_ep.targets.gpu.decompose import control
from migraphx_ep.targets.gpu.steps import KernelStep
from migraphx_ep.targets.gpu.support import instruction_supported

from .decomposecheck import check_decomposed, compile_kernels
from .gpucheck import F32, node
from .scancases import cumsum_scan, gemm_scan


def _feeds(rng: np.random.Generator, x_shape: tuple[int, ...], state: tuple[int, ...]) -> dict:
    return {
        "s0": rng.standard_normal(state).astype(F32),
        "x": rng.standard_normal(x_shape).astype(F32),
    }


def test_running_state_and_per_step_outputs(rng) -> None:  # noqa: ANN001
    feeds = _feeds(rng, (5, 3, 2), (3, 2))
    low = check_decomposed(cumsum_scan(feeds), feeds, ["scan"])
    # Per iteration one kernel for the new state (read twice: by the next iteration and by tanh) and
    # one for tanh(state) * slice; the slices are views and the stacked output one concat.
    kernels = [s.label for s in low.steps if isinstance(s, KernelStep)]
    assert kernels == ["pointwise add", "pointwise mul"] * 5 + ["concat"], kernels
    assert compile_kernels(low) >= 1


@pytest.mark.parametrize("in_axis,out_axis", [(1, 0), (2, 2), (0, 1)])
@pytest.mark.parametrize("in_dir,out_dir", [(1, 0), (0, 1), (1, 1)])
def test_axes_and_directions(rng, in_axis: int, out_axis: int, in_dir: int, out_dir: int) -> None:  # noqa: ANN001
    x_shape = [3, 4, 2]
    x_shape[in_axis] = 6
    state = tuple(n for i, n in enumerate(x_shape) if i != in_axis)
    feeds = _feeds(rng, tuple(x_shape), state)
    model = cumsum_scan(feeds, (in_axis,), (in_dir,), (out_axis,), (out_dir,))
    check_decomposed(model, feeds, ["scan"])


def test_outer_values_fed_and_constant(rng) -> None:  # noqa: ANN001
    feeds = _feeds(rng, (4, 3), (3,))
    feeds["w"] = rng.standard_normal((3,)).astype(F32)
    check_decomposed(cumsum_scan(feeds), feeds, ["scan"])
    feeds.pop("w")
    inits = {"w": rng.standard_normal((3,)).astype(F32)}
    check_decomposed(cumsum_scan(feeds, inits=inits), feeds, ["scan"])


def test_two_scan_inputs_gemm_and_a_body_op_that_decomposes(rng) -> None:  # noqa: ANN001
    feeds = {
        "h0": rng.standard_normal((2, 8)).astype(F32),
        "x": rng.standard_normal((2, 5, 8)).astype(F32),
        "u": rng.standard_normal((5, 2, 8)).astype(F32),
    }
    check_decomposed(gemm_scan(feeds), feeds, ["scan", "einsum"])


def test_more_iterations_than_one_concat_takes(rng) -> None:  # noqa: ANN001
    n = 2 * control.FAN_IN + 3
    feeds = _feeds(rng, (n, 2), (2,))
    low = check_decomposed(cumsum_scan(feeds), feeds, ["scan"])
    concats = [s for s in low.steps if isinstance(s, KernelStep) and s.label == "concat"]
    assert concats and all(len(s.reads) <= control.FAN_IN for s in concats)


def _refusal(model) -> str:  # noqa: ANN001
    refused = partition(model_to_dict(model), instruction_supported).refused
    assert list(refused) and partition(model_to_dict(model)).refused == {}, "the ref claims it, the gpu not"
    return " ".join(refused.values())


def test_too_many_unrolled_instructions_stay_on_the_host(rng) -> None:  # noqa: ANN001
    n = control.MAX_UNROLLED // 3 + 1  # the body has 4 instructions, one an identity
    feeds = _feeds(rng, (n, 2), (2,))
    assert "unrolled instructions" in _refusal(cumsum_scan(feeds))


def test_a_body_with_control_flow_of_its_own_stays_on_the_host(rng) -> None:  # noqa: ANN001
    feeds = _feeds(rng, (3, 2), (2,))
    out = [helper.make_tensor_value_info("z", 1, [2])]
    then = helper.make_graph([node("Identity", ["xt"], ["z"])], "then", [], out)
    other = helper.make_graph([node("Neg", ["xt"], ["z"])], "else", [], out)
    extra = [  # the condition is computed, so the frontend cannot inline the If
        node("ReduceSum", ["xt"], ["tot"], keepdims=0),
        node("Greater", ["tot", "zero"], ["cond"]),
        node("If", ["cond"], ["x_if"], then_branch=then, else_branch=other),
    ]
    inits = {"zero": np.zeros((), F32)}
    reason = _refusal(cumsum_scan(feeds, body_extra=extra, inits=inits, y_from="x_if"))
    assert "control flow of its own" in reason, reason
