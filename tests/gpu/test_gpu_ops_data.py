"""Data movement (gather, concat, pad, resize, slice, transpose, reshape, split) and whole small graphs
that mix every family, on the gpu target vs the ref target."""

from __future__ import annotations

import numpy as np
import pytest

from .gpucheck import (
    BF16,
    EXACT,
    F16,
    F32,
    FP16,
    FP32_SUM,
    check_nodes,
    check_op,
    ints,
    node,
    normal,
    uniform,
)

pytestmark = pytest.mark.gpu

I64 = np.int64


def i64(*v: int) -> np.ndarray:
    return np.array(v, I64)


# -- gather ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data,indices,axis,dtype",
    [
        ((10, 6), (3, 4), 0, F32),
        ((4, 9, 5), (7,), 1, F16),
        ((4, 9, 5), (2, 2), -1, I64),
        ((12, 8), (), 0, F32),  # a scalar index drops the axis
        ((5, 300), (50,), 1, BF16),
    ],
    ids=["rows", "middle-f16", "last-i64", "scalar-index", "wide-bf16"],
)
@pytest.mark.parametrize("index_type", [np.int64, np.int32])
def test_gather(gpu, rng, data, indices, axis, dtype, index_type):
    n = data[axis]
    # Negative indices count from the end; the data is integer-valued so any dtype compares exactly.
    feeds = {"x": ints(rng, data, -100, 100).astype(dtype), "i": ints(rng, indices, -n, n, index_type)}
    check_op("Gather", feeds, gpu, EXACT, axis=axis)


def test_gather_embedding_table_constant(gpu, rng):
    # BERT's embeddings: a constant table indexed by token ids that arrive at run time.
    feeds = {"ids": ints(rng, (2, 9), 0, 100, I64)}
    check_op("Gather", feeds, gpu, EXACT, inits={"table": normal(rng, (100, 32))}, inputs=["table", "ids"])


def test_gather_elements(gpu, rng):
    feeds = {"x": uniform(rng, (4, 6, 5)), "i": ints(rng, (4, 3, 5), -6, 6, I64)}
    check_op("GatherElements", feeds, gpu, EXACT, axis=1)


# -- concat, split, pad ----------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [F32, F16, I64], ids=["f32", "f16", "i64"])
def test_concat(gpu, rng, axis, dtype):
    shapes = [[3, 4, 5], [3, 4, 5], [3, 4, 5]]
    for k, n in enumerate((2, 7, 1)):
        shapes[k][axis] = n
    feeds = {f"x{k}": ints(rng, s, -50, 50).astype(dtype) for k, s in enumerate(shapes)}
    check_op("Concat", feeds, gpu, EXACT, axis=axis)


def test_concat_of_views(gpu, rng):
    # A transposed input and a broadcast one: concat must read through their strides.
    feeds = {"a": uniform(rng, (5, 3)), "b": uniform(rng, (1, 5))}
    inits = {"shape": i64(4, 5)}
    nodes = [
        node("Transpose", ["a"], ["at"]),
        node("Expand", ["b", "shape"], ["be"]),
        node("Concat", ["at", "be", "at"], ["y"], axis=0),
    ]
    check_nodes(nodes, feeds, gpu, EXACT, inits=inits)


def test_split(gpu, rng):
    feeds = {"x": uniform(rng, (4, 10, 3))}
    nodes = [node("Split", ["x", "parts"], ["a", "b", "c"], axis=1)]
    check_nodes(nodes, feeds, gpu, EXACT, inits={"parts": i64(2, 5, 3)}, outputs=["a", "b", "c"])


@pytest.mark.parametrize(
    "mode,pads",
    [("constant", (0, 1, 2, 0, 2, 1)), ("reflect", (0, 2, 1, 0, 2, 3)), ("edge", (1, 0, 3, 1, 2, 0))],
)
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_pad(gpu, rng, mode, pads, dtype):
    feeds = {"x": uniform(rng, (2, 5, 6), dtype=dtype)}
    inits = {"pads": i64(*pads)}
    inputs = ["x", "pads"]
    if mode == "constant":
        inits["value"] = np.array(1.5, dtype)
        inputs.append("value")
    check_op("Pad", feeds, gpu, EXACT, inits=inits, inputs=inputs, mode=mode)


# -- resize ------------------------------------------------------------------------------------------------
RESIZE = {
    "nearest-up2": ({"mode": "nearest"}, "scales", (1, 1, 2, 2)),
    "nearest-halfpixel-sizes": (
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "half_pixel",
            "nearest_mode": "round_prefer_ceil",
        },
        "sizes",
        (2, 3, 11, 7),
    ),
    "nearest-down": ({"mode": "nearest", "nearest_mode": "floor"}, "scales", (1, 1, 0.5, 0.6)),
    "linear-up": ({"mode": "linear"}, "scales", (1, 1, 2, 1.5)),
    "linear-align-corners": (
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        "sizes",
        (2, 3, 9, 13),
    ),
    "linear-asymmetric-down": (
        {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
        "scales",
        (1, 1, 0.5, 0.5),
    ),
    "linear-pytorch-half-pixel": (
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
        "sizes",
        (2, 3, 1, 10),
    ),
}


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", sorted(RESIZE))
def test_resize(gpu, rng, name, dtype):
    attrs, kind, value = RESIZE[name]
    feeds = {"x": uniform(rng, (2, 3, 6, 8), dtype=dtype)}
    if kind == "scales":
        inits, inputs = {"scales": np.array(value, np.float32)}, ["x", "", "scales"]
    else:
        inits, inputs = {"sizes": i64(*value)}, ["x", "", "", "sizes"]
    tol = EXACT if attrs["mode"] == "nearest" else (FP32_SUM if dtype == F32 else FP16)
    check_op("Resize", feeds, gpu, tol, inits=inits, inputs=inputs, **attrs)


# -- slice, transpose, reshape ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "starts,ends,axes,steps",
    [
        ((1, 2), (4, 9), (0, 2), (1, 3)),
        ((-1,), (-100,), (1,), (-2,)),  # backwards from the end
        ((0, 1, 0), (100, -1, 5), (0, 1, 2), (2, 1, 1)),
    ],
    ids=["steps", "reverse", "clamped"],
)
def test_slice(gpu, rng, starts, ends, axes, steps):
    feeds = {"x": uniform(rng, (5, 8, 10))}
    inits = {"s": i64(*starts), "e": i64(*ends), "a": i64(*axes), "p": i64(*steps)}
    check_op("Slice", feeds, gpu, EXACT, inits=inits, inputs=["x", "s", "e", "a", "p"])


@pytest.mark.parametrize("perm", [(1, 0, 2, 3), (0, 2, 3, 1), (3, 1, 2, 0), (0, 3, 1, 2)])
@pytest.mark.parametrize("dtype", [F32, F16, np.int8], ids=["f32", "f16", "i8"])
def test_transpose(gpu, rng, perm, dtype):
    x = ints(rng, (2, 33, 17, 5), -100, 100).astype(dtype)
    check_op("Transpose", {"x": x}, gpu, EXACT, perm=list(perm))


def test_reshape_of_transpose_and_flatten_squeeze(gpu, rng):
    # Reshape of a transposed view needs a real copy; Flatten/Squeeze/Unsqueeze are views.
    feeds = {"x": uniform(rng, (2, 9, 4, 8))}
    inits = {"shape": i64(2, 4, -1), "ax": i64(0, 3)}
    nodes = [
        node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        node("Reshape", ["t", "shape"], ["r"]),
        node("Flatten", ["t"], ["f"], axis=2),
        node("Unsqueeze", ["r", "ax"], ["u"]),
        node("Squeeze", ["u", "ax"], ["y"]),
    ]
    check_nodes(nodes, feeds, gpu, EXACT, inits=inits, outputs=["r", "f", "y"])


# -- whole small graphs --------------------------------------------------------------------------------------
def mlp_graph(rng, dtype):
    d, h = 32, 64
    inits = {
        "w1": normal(rng, (d, h), dtype, d**-0.5),
        "b1": normal(rng, (h,), dtype, 0.1),
        "w2": normal(rng, (h, 10), dtype, h**-0.5),
        "b2": normal(rng, (10,), dtype, 0.1),
        "sqrt2": np.array(2**0.5, dtype),
        "one": np.array(1, dtype),
        "half": np.array(0.5, dtype),
    }
    nodes = [
        node("MatMul", ["x", "w1"], ["m1"]),
        node("Add", ["m1", "b1"], ["h"]),
        node("Div", ["h", "sqrt2"], ["hs"]),  # erf-GELU as exporters spell it
        node("Erf", ["hs"], ["e"]),
        node("Add", ["e", "one"], ["e1"]),
        node("Mul", ["h", "e1"], ["g"]),
        node("Mul", ["g", "half"], ["gh"]),
        node("MatMul", ["gh", "w2"], ["m2"]),
        node("Add", ["m2", "b2"], ["z"]),
        node("Softmax", ["z"], ["y"], axis=-1),
    ]
    return nodes, {"x": normal(rng, (4, 7, d), dtype)}, inits


def attention_graph(rng, dtype):
    b, s, d, heads = 2, 9, 32, 2
    hd = d // heads
    inits = {w: normal(rng, (d, d), dtype, d**-0.5) for w in ("wq", "wk", "wv", "wo")}
    inits |= {
        "split": i64(b, s, heads, hd),
        "merge": i64(b, s, d),
        "scale": np.array(hd**-0.5, dtype),
        "zero": np.array(0, dtype),
        "neg": np.array(-1e4, dtype),
        "g": normal(rng, (d,), dtype),
        "beta": normal(rng, (d,), dtype),
    }
    mask = np.ones((b, 1, 1, s), bool)
    mask[1, ..., -3:] = False  # padding in the second sequence
    nodes = [node("Where", ["mask", "zero", "neg"], ["bias"])]
    for n in "qkv":
        nodes += [
            node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
            node("Reshape", [f"{n}0", "split"], [f"{n}1"]),
            node("Transpose", [f"{n}1"], [n], perm=[0, 2, 1, 3]),
        ]
    nodes += [
        node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q", "kt"], ["qk"]),
        node("Mul", ["qk", "scale"], ["qks"]),
        node("Add", ["qks", "bias"], ["logits"]),
        node("Softmax", ["logits"], ["p"], axis=-1),
        node("MatMul", ["p", "v"], ["ctx"]),
        node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        node("Reshape", ["ctxt", "merge"], ["merged"]),
        node("MatMul", ["merged", "wo"], ["o"]),
        node("Add", ["o", "x"], ["res"]),
        node("LayerNormalization", ["res", "g", "beta"], ["y"], axis=-1),
    ]
    return nodes, {"x": normal(rng, (b, s, d), dtype), "mask": mask}, inits


def cnn_graph(rng, dtype):
    c = 8
    inits = {
        "w1": normal(rng, (c, 3, 3, 3), dtype, 27**-0.5),
        "b1": normal(rng, (c,), dtype, 0.1),
        "s": uniform(rng, (c,), 0.5, 1.5, dtype),
        "o": normal(rng, (c,), dtype, 0.1),
        "mu": normal(rng, (c,), dtype, 0.1),
        "var": uniform(rng, (c,), 0.5, 2.0, dtype),
        "w2": normal(rng, (2 * c, c, 3, 3), dtype, (9 * c) ** -0.5),
        "wd": normal(rng, (2 * c, c, 1, 1), dtype, c**-0.5),
        "fc": normal(rng, (10, 2 * c), dtype, (2 * c) ** -0.5),
        "fcb": normal(rng, (10,), dtype, 0.1),
    }
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c1", "s", "o", "mu", "var"], ["bn"]),
        node("Relu", ["bn"], ["r1"]),
        node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        node("Conv", ["p1", "wd"], ["down"], strides=[2, 2]),
        node("Add", ["c2", "down"], ["a"]),
        node("Relu", ["a"], ["r2"]),
        node("GlobalAveragePool", ["r2"], ["gap"]),
        node("Flatten", ["gap"], ["f"]),
        node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    return nodes, {"x": normal(rng, (2, 3, 16, 16), dtype)}, inits


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("graph", [mlp_graph, attention_graph, cnn_graph], ids=["mlp", "attention", "cnn"])
def test_small_graph(gpu, rng, graph, dtype):
    nodes, feeds, inits = graph(rng, dtype)
    check_nodes(nodes, feeds, gpu, FP32_SUM if dtype == F32 else FP16, inits=inits)
