"""CumProd, Det, AffineGrid, Col2Im, TensorScatter and BitCast: one-node models vs ORT's CPU EP / numpy."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference.ops.op_col2im import Col2Im as RefCol2Im
from test_pointwise import refuses, run_op

from migraphx_ep.ir.dtypes import from_numpy
from migraphx_ep.ir.module import Module
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape, ShapeError
from migraphx_ep.targets.gpu.support import instruction_supported
from opcheck import assert_close, make_model, run_ort, run_ours

RNG = np.random.default_rng(26)


def model(node: onnx.NodeProto, inputs: dict, opset: int, consts: dict | None = None) -> onnx.ModelProto:
    m = make_model(node, inputs, opset=opset, initializers=consts)
    m.ir_version = 11  # opsets 24+ need IR 11 in ORT
    return m


def check(node, inputs: dict, opset: int, consts: dict | None = None, tol: float = 1e-5) -> list[np.ndarray]:
    m = model(node, inputs, opset, consts)
    want, got = run_ort(m, inputs), run_ours(m, inputs)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=tol, atol=tol)
    return got


def scalar(v: int) -> np.ndarray:
    return np.array(v, np.int64)


# -- CumProd (shares prefix_scan with CumSum) ---------------------------------------------------------
@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint32, np.uint64]
)
@pytest.mark.parametrize("exclusive,reverse", list(itertools.product([0, 1], [0, 1])))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod_vs_ort(dtype, exclusive, reverse, axis):
    x = RNG.integers(1, 4, (3, 4, 2)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x = (x * RNG.uniform(0.5, 1.2, x.shape)).astype(dtype)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    check(node, {"x": x}, 26, {"axis": scalar(axis)}, tol=2e-3 if dtype == np.float16 else 1e-6)


def test_cumprod_narrow_floats_round_once_and_ints_wrap():
    h = RNG.uniform(0.9, 1.1, 64).astype(np.float16)
    want = np.cumprod(h.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(run_op("prefix_scan_prod", h, axis=0), want)
    big = np.full(3, 2**20, np.int32)
    np.testing.assert_array_equal(run_op("prefix_scan_prod", big, axis=0), np.cumprod(big, dtype=np.int32))
    v = np.array([2, 3, 4], np.int64)
    np.testing.assert_array_equal(
        run_op("prefix_scan_prod", v, axis=0, exclusive=True, reverse=True), [12, 4, 1]
    )
    empty = np.zeros((2, 0), np.float32)  # an exclusive scan of an empty axis is empty, not an error
    assert run_op("prefix_scan_prod", empty, axis=1, exclusive=True).shape == (2, 0)
    assert run_op("prefix_scan_sum", empty, axis=1, exclusive=True).shape == (2, 0)


def test_cumprod_refuses_bad_attributes_and_runtime_axis():
    x = {"x": np.ones((2, 3), np.float32)}
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=2)
    assert "exclusive/reverse must be 0 or 1" in refuses(node, x, opset=26, initializers={"axis": scalar(0)})
    node = helper.make_node("CumProd", ["x", "axis"], ["y"])
    assert "compile-time constant" in refuses(node, {**x, "axis": scalar(0)}, opset=26)


# -- Det ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dims", [(3, 3), (2, 4, 4), (2, 3, 2, 2), (1, 1), (0, 0), (0, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_det_vs_ort(dims, dtype):
    x = RNG.standard_normal(dims).astype(dtype)
    check(helper.make_node("Det", ["x"], ["y"]), {"x": x}, 22, tol=2e-3 if dtype == np.float16 else 1e-4)


def test_det_double_and_bfloat16_vs_numpy():
    # ORT's CPU EP has no double or bfloat16 Det kernel: numpy's LU is the reference.
    x = RNG.standard_normal((3, 5, 5))
    np.testing.assert_allclose(run_op("det", x), np.linalg.det(x), rtol=1e-12)
    b = x.astype(ml_dtypes.bfloat16)
    want = np.linalg.det(b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(run_op("det", b), want)


def test_det_refuses_non_square_and_vectors():
    assert "(*, M, M)" in refuses(
        helper.make_node("Det", ["x"], ["y"]), {"x": np.ones((2, 3), np.float32)}, opset=22
    )
    assert "(*, M, M)" in refuses(
        helper.make_node("Det", ["x"], ["y"]), {"x": np.ones(4, np.float32)}, opset=22
    )
    with pytest.raises(ShapeError, match="not square"):
        run_op("det", np.ones((3, 2), np.float32))


# -- AffineGrid ---------------------------------------------------------------------------------------
SIZES = [(2, 3, 4, 5), (2, 1, 1, 3), (2, 1, 3, 2, 4), (2, 2, 1, 1, 2)]
# align_corners=1 with a spatial size of 1 is refused (ORT and ONNX's reference disagree: see below).
AFFINE = [(a, s) for a in (0, 1) for s in SIZES if not (a and 1 in s[2:])]


@pytest.mark.parametrize("align,size", AFFINE)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_affine_grid_vs_ort(align, size, dtype):
    k = len(size) - 2
    theta = (np.eye(k, k + 1) + 0.3 * RNG.standard_normal((2, k, k + 1))).astype(dtype)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    got = check(node, {"theta": theta}, 20, {"size": np.array(size, np.int64)}, tol=1e-5)
    assert got[0].shape == (2, *size[2:], k)


def test_affine_grid_refusals():
    theta = {"theta": np.tile(np.eye(2, 3, dtype=np.float32), (1, 1, 1))}
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=1)
    lone = {"size": np.array([1, 1, 1, 4], np.int64)}
    assert "spatial size of 1" in refuses(node, theta, opset=20, initializers=lone)
    ok = {"size": np.array([1, 1, 3, 4], np.int64)}
    half = {"theta": theta["theta"].astype(np.float16)}
    assert "narrow floats" in refuses(node, half, opset=20, initializers=ok)
    wrong_n = {"size": np.array([2, 1, 3, 4], np.int64)}
    assert "does not fit theta" in refuses(node, theta, opset=20, initializers=wrong_n)
    bad = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=2)
    assert "align_corners=2" in refuses(bad, theta, opset=20, initializers=ok)
    assert "compile-time constant" in refuses(node, {**theta, **ok}, opset=20)


# -- Col2Im -------------------------------------------------------------------------------------------
COL2IM = [
    # (image, block, attrs)
    ((5, 5), (2, 2), {}),
    ((5, 5), (2, 3), {"strides": [2, 1]}),
    ((4, 5), (2, 2), {"pads": [1, 0, 2, 1]}),
    ((6, 6), (2, 2), {"dilations": [2, 3], "strides": [1, 2]}),
    ((3, 4, 3), (2, 2, 1), {"pads": [0, 1, 0, 1, 0, 1]}),
    ((7,), (3,), {"strides": [2], "pads": [1, 2]}),
]
# ORT 1.32's 1-D Col2Im mis-sums dilated blocks when C > 1 (its (7, 1) twin is right): ONNX's
# reference is the oracle for these.
COL2IM_REF_ONLY = [
    ((7,), (3,), {"dilations": [2]}),
    ((7,), (3,), {"strides": [2], "dilations": [2], "pads": [1, 2]}),
]


def col2im_input(image, block, attrs, n=2, c=3, dtype=np.float32) -> np.ndarray:
    op = make_op("col2im", image_shape=image, block_shape=block, **col2im_attrs(len(image), attrs))
    length = int(np.prod(op.blocks()))  # type: ignore[attr-defined]
    return RNG.standard_normal((n, c * int(np.prod(block)), length)).astype(dtype)


def col2im_attrs(k: int, attrs: dict) -> dict:
    return {"strides": [1] * k, "pads": [0] * 2 * k, "dilations": [1] * k, **attrs}


@pytest.mark.parametrize("image,block,attrs", COL2IM)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_col2im_vs_ort(image, block, attrs, dtype):
    x = col2im_input(image, block, attrs, dtype=dtype)
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    consts = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    check(node, {"x": x}, 18, consts, tol=2e-3 if dtype == np.float16 else 1e-5)


@pytest.mark.parametrize("image,block,attrs", COL2IM[:4] + COL2IM_REF_ONLY)
@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_col2im_vs_onnx_reference(image, block, attrs, dtype):
    # ORT's CPU EP runs float/half only; ONNX's reference sums integers in their own type.
    x = RNG.integers(-100, 100, col2im_input(image, block, attrs).shape).astype(dtype)
    full = col2im_attrs(len(image), attrs)
    want = RefCol2Im._run(None, x, np.array(image), np.array(block), **full)[0]  # type: ignore[arg-type]
    got = run_op("col2im", x, image_shape=image, block_shape=block, **full)
    np.testing.assert_array_equal(got, want)


def test_col2im_refusals():
    x = {"x": np.ones((1, 4, 5), np.float32)}  # 5 columns: (3, 3) with (2, 2) blocks needs 4
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"])
    consts = {"image": np.array([3, 3], np.int64), "block": np.array([2, 2], np.int64)}
    assert "does not hold blocks" in refuses(node, x, opset=18, initializers=consts)
    short = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=[1])
    assert "strides [1] needs 2 values" in refuses(short, x, opset=18, initializers=consts)
    assert "compile-time constant" in refuses(
        node, {**x, "image": consts["image"]}, opset=18, initializers={"block": consts["block"]}
    )


# -- TensorScatter ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.bool_])
def test_tensor_scatter_vs_ort(mode, axis, dtype):
    past = RNG.standard_normal((2, 3, 5, 4)) > 0 if dtype == np.bool_ else RNG.standard_normal((2, 3, 5, 4))
    past = (past * 10).astype(dtype) if dtype != np.bool_ else past
    upd_dims = list(past.shape)
    upd_dims[axis] = 2
    upd = (
        np.ones(upd_dims, dtype) if dtype == np.bool_ else (RNG.standard_normal(upd_dims) * 10).astype(dtype)
    )
    m = past.shape[axis]
    w = np.array([m - 2, m - 1] if mode == "circular" else [0, m - 2], np.int64)
    node = helper.make_node("TensorScatter", ["past", "upd", "w"], ["present"], mode=mode, axis=axis)
    check(node, {"past": past, "upd": upd, "w": w}, 24)
    node = helper.make_node("TensorScatter", ["past", "upd"], ["present"], mode=mode, axis=axis)
    check(node, {"past": past, "upd": upd}, 24)


def test_tensor_scatter_out_of_range_is_a_runtime_error():
    past, upd = np.zeros((2, 4, 3), np.float32), np.ones((2, 2, 3), np.float32)
    for mode, w in [("linear", [0, 3]), ("linear", [-1, 0]), ("circular", [0, -1])]:
        node = helper.make_node("TensorScatter", ["past", "upd", "w"], ["present"], mode=mode, axis=1)
        inputs = {"past": past, "upd": upd, "w": np.array(w, np.int64)}
        with pytest.raises(IndexError, match="tensor_scatter"):
            run_ours(model(node, inputs, 24), inputs)
    wrapped = run_op("tensor_scatter", past, upd, np.array([3, 7], np.int64), axis=1, circular=True)
    np.testing.assert_array_equal(wrapped[:, :, 0], [[1, 0, 0, 1], [1, 0, 0, 1]])


def test_tensor_scatter_refusals():
    ins = {"past": np.zeros((2, 4, 3), np.float32), "upd": np.ones((2, 2, 3), np.float32)}
    bad_mode = helper.make_node("TensorScatter", ["past", "upd"], ["present"], mode="ring", axis=1)
    assert "mode 'ring'" in refuses(bad_mode, ins, opset=24)
    batch_axis = helper.make_node("TensorScatter", ["past", "upd"], ["present"], axis=0)
    assert "batch dim" in refuses(batch_axis, ins, opset=24)
    too_long = {"past": ins["past"], "upd": np.ones((2, 5, 3), np.float32)}
    assert "does not fit cache" in refuses(
        helper.make_node("TensorScatter", ["past", "upd"], ["present"], axis=1), too_long, opset=24
    )


# -- BitCast ------------------------------------------------------------------------------------------
BITCASTS = [
    (np.float32, np.int32),
    (np.int32, np.float32),
    (np.float64, np.uint64),
    (np.float16, np.int16),
    (np.uint16, np.float16),
    (np.int8, np.uint8),
    (np.uint32, np.int32),
]


@pytest.mark.parametrize("src,dst", BITCASTS)
@pytest.mark.parametrize("dims", [(), (5,), (2, 3)])
def test_bitcast_vs_ort(src, dst, dims):
    x = np.asarray(RNG.standard_normal(dims) * 100).astype(src)
    node = helper.make_node("BitCast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))
    got = check(node, {"x": x}, 26)
    assert got[0].tobytes() == x.tobytes()


def test_bitcast_narrow_floats_vs_numpy():
    x = np.array([1.5, -2.0, np.inf], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(run_op("bit_cast", x, target_type=from_numpy(np.int16)), x.view(np.int16))
    b = np.arange(6, dtype=np.uint8).reshape(2, 3)
    f8 = run_op("bit_cast", b, target_type=from_numpy(ml_dtypes.float8_e4m3fn))
    assert f8.dtype == ml_dtypes.float8_e4m3fn and f8.tobytes() == b.tobytes()


def test_bitcast_refusals():
    x = {"x": np.ones(3, np.float32)}
    to_bool = helper.make_node("BitCast", ["x"], ["y"], to=onnx.TensorProto.BOOL)
    assert "bool" in refuses(to_bool, {"x": np.ones(3, np.uint8)}, opset=26)
    wider = helper.make_node("BitCast", ["x"], ["y"], to=onnx.TensorProto.INT64)
    assert "differ in width" in refuses(wider, x, opset=26)
    with pytest.raises(ShapeError, match="element sizes"):
        run_op("bit_cast", x["x"], target_type=from_numpy(np.int64))


# -- the gpu target has no kernel for these: it refuses them (the ref target runs them) -------------
GPU_CASES = [
    ("prefix_scan_prod", [((4, 3), np.float32)], {"axis": 1}),
    (
        "col2im",
        [((1, 4, 4), np.float32)],
        dict(image_shape=[3, 3], block_shape=[2, 2], **col2im_attrs(2, {})),
    ),
]  # bit_cast runs there as a view (tests/gpu/test_decompose_ops.py); det has a kernel and tensor_scatter
# a decomposition (tests/gpu/test_kernel_host_pool_det.py, test_decompose_scatter_dft.py)


@pytest.mark.parametrize("name,inputs,attrs", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_target_refuses_new_ops(name, inputs, attrs):
    m = Module()
    params = [m.add_parameter(f"p{i}", Shape(from_numpy(dt), dims)) for i, (dims, dt) in enumerate(inputs)]
    ins = m.add_instruction(make_op(name, **attrs), params)
    assert instruction_supported(ins) == f"no gpu kernel for {name}"
