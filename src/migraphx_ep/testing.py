"""Test and example models that need no download: ONNX's bundled "light" model-zoo graphs.

Their weights are ConstantOfShape placeholders (constant fills, so the shipped expected outputs are
constant too); ``light_model(..., randomize=True)`` swaps them for seeded random initializers so a
comparison actually exercises the arithmetic.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model(name: str, randomize: bool = True, seed: int = 0) -> onnx.ModelProto:
    if name not in LIGHT_MODELS:
        raise ValueError(f"unknown light model {name!r}; choose from {', '.join(LIGHT_MODELS)}")
    model = onnx.load(os.path.join(LIGHT_DIR, f"light_{name}.onnx"))
    return randomize_weights(model, seed) if randomize else model


def light_expected_output(name: str) -> np.ndarray:
    t = onnx.TensorProto()
    with open(os.path.join(LIGHT_DIR, f"light_{name}_output_0.pb"), "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace each ConstantOfShape whose shape is a constant with a random initializer.

    Scales follow He initialisation (by fan-in) so activations stay finite through deep nets;
    BatchNormalization variances get positive values.
    """
    rng = np.random.default_rng(seed)
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    var_inputs = {n.input[4] for n in g.node if n.op_type == "BatchNormalization" and len(n.input) > 4}
    keep, new_inits = [], []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in consts:
            keep.append(n)
            continue
        shape = [int(d) for d in consts[n.input[0]].ravel()]
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(shape[0] if shape else 1, 1)
        if n.output[0] in var_inputs:
            arr = rng.uniform(0.5, 1.5, size=shape)
        else:
            arr = rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
        new_inits.append(numpy_helper.from_array(arr.astype(np.float32), n.output[0]))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    used = {i for n in keep for i in n.input}
    # Drop the now-unused shape constants, and their graph-input entries (IR < 4 lists initializers there).
    dropped = {t.name for t in out.graph.initializer if t.name not in used}
    kept_inits = [t for t in out.graph.initializer if t.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_inits + new_inits)
    kept_inputs = [vi for vi in out.graph.input if vi.name not in dropped]
    del out.graph.input[:]
    out.graph.input.extend(kept_inputs)
    return out


def light_input(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def random_feeds(
    model: onnx.ModelProto, dim: Callable[[int, str], int], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Feeds for ``model``'s graph inputs (initializers excepted): a symbolic dim is ``dim(axis,
    dim_param)``; integers are drawn from {0, 1} (valid token ids, masks, segments), booleans are fair
    coin flips, floats are standard normal."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else dim(k, d.dim_param)
            for k, d in enumerate(tt.shape.dim)
        ]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.integer):
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dt)
        elif dt == np.bool_:
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
    return feeds


@contextlib.contextmanager
def capture_compiled() -> Iterator[list[Any]]:
    """Collects the compiled subgraphs (``ep.compiled.CompiledSubgraph``) of the sessions created inside
    the block, to reach their programs and gpu executables (graph replay timing, contexts, plans)."""
    from .ep import bridge

    compiled: list[Any] = []
    real = bridge.compile

    def keep(ep: Any, graph: dict, fused_node_name: str) -> Any:
        c = real(ep, graph, fused_node_name)
        compiled.append(c)
        return c

    bridge.compile = keep
    try:
        yield compiled
    finally:
        bridge.compile = real
