"""A fused subgraph's compiles share its weights (ir/weights.py): a never-seen input shape reads the same
weight literals as the earlier programs (nothing folded, converted or hashed again), and its numbers are
bit for bit those of a subgraph that compiled only that shape."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from migraphx_ep.ep.provider import create_ep
from migraphx_ep.frontend import model_to_dict

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
SHAPES = [(2, 7), (3, 11), (1, 7)]  # (batch, sequence)


@pytest.fixture(autouse=True)
def per_shape_programs(monkeypatch):
    # Run-time dims would serve every shape with one program on the ref target: here each compiles.
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_DIMS", "0")


def bert() -> dict:
    return model_to_dict(onnx.load(os.path.join(MODELS, "bert.onnx")))


def feeds(batch: int, seq: int) -> list[np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq)
    ids = rng.integers(0, 100, (batch, seq))
    return [ids, np.ones((batch, seq), np.int64), rng.integers(0, 2, (batch, seq))]


def weight_memory(prog) -> dict[tuple[int, int], np.ndarray]:
    """(address, bytes) -> value of the program's literals that hold no batch or sequence dim: a
    weight at batch 1 may be a [1, ...] view of it (folded multibroadcast), the same memory."""
    return {
        (i.op.value.__array_interface__["data"][0], i.op.value.nbytes): i.op.value
        for m in prog.modules.values()
        for i in m.instructions
        if i.is_literal() and i.op.value.nbytes > 256 and not {2, 3, 7, 11} & set(i.op.value.shape)
    }


@pytest.mark.parametrize("options", [{}, {"migraphx_fp16_enable": "1"}], ids=["fp32", "fp16_enable"])
def test_new_shapes_share_the_weights_and_compute_the_same(options):
    ep = create_ep({"migraphx_target": "ref", **options})
    c = ep.compile(bert(), "fused_0")
    outs = [c.run(feeds(*s)) for s in SHAPES]
    assert c.compiles == len(SHAPES)
    progs = list(c.programs.values())
    first = weight_memory(progs[0])
    assert sum(v.nbytes for v in first.values()) > 40_000  # the model's weights
    for p in progs[1:]:
        assert weight_memory(p).keys() == first.keys()  # the same host memory, not copies
    assert c.weights.hits > 0
    for shape, got in zip(SHAPES, outs, strict=True):
        alone = create_ep({"migraphx_target": "ref", **options}).compile(bert(), "fused_1")
        want = alone.run(feeds(*shape))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.tobytes() == w.tobytes(), shape


def test_an_evicted_programs_weights_are_derived_again_not_reused_stale():
    ep = create_ep(
        {"migraphx_target": "ref", "migraphx_fp16_enable": "1", "migraphx_max_compiled_models": "1"}
    )
    c = ep.compile(bert(), "fused_0")
    outs = [c.run(feeds(*s)) for s in SHAPES + SHAPES[:1]]
    assert c.compiles == len(SHAPES) + 1 and len(c.programs) == 1
    for g, w in zip(outs[-1], outs[0], strict=True):
        assert g.tobytes() == w.tobytes()
