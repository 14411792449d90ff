"""The gpu target's device error flags (``targets/gpu/errors.py``): an index out of range or an integer
zero divisor fails the Run, as on the ref target and ORT's CPU EP, and the next Run is clean.

Without a GPU: the slots' logic over a fake mapped buffer. With one (``gpu`` marker): the
whole path through ORT, with and without the CUDA graph.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu.errors import DeviceErrors
from migraphx_ep.targets.gpu.kernels.spec import PwInput, PwOp

I32, F = DType.int32_type, DType.float_type


class FakeMemory:
    """``cuda.MappedBuffer`` over numpy: host memory a fake device address maps onto, holding garbage
    when fresh (as cuMemHostAlloc's does); ``write`` is a kernel storing an int32 at a device address."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}  # device address -> host bytes

    def MappedBuffer(self, nbytes: int) -> SimpleNamespace:  # noqa: N802 - stands in for the class
        array = np.full(nbytes, 0xAB, np.uint8)
        device_ptr = (len(self.buffers) + 1) << 20
        self.buffers[device_ptr] = array
        return SimpleNamespace(device_ptr=device_ptr, view=lambda dt, shape: array.view(dt).reshape(shape))

    def write(self, device_ptr: int, code: int) -> None:
        base = max(p for p in self.buffers if p <= device_ptr)
        self.buffers[base][device_ptr - base : device_ptr - base + 4].view(np.int32)[0] = code


def specs() -> list[K.KernelSpec]:
    gather = K.kernel_for("k1_gather", make_op("gather", axis=0), [Shape(F, (3, 2)), Shape(I32, (4,))],
                          Shape(F, (4, 2)))  # fmt: skip
    add = K.pointwise_kernel("k2_add", PwOp(make_op("add"), (PwInput(0), PwInput(0)), F), [Shape(F, (4,))],
                             Shape(F, (4,)))  # fmt: skip
    div = K.pointwise_kernel("k3_div", PwOp(make_op("div"), (PwInput(0), PwInput(1)), I32),
                             [Shape(I32, (4,))] * 2, Shape(I32, (4,)))  # fmt: skip
    return [gather, add, div]


def test_no_checking_kernel_costs_nothing() -> None:
    mem = FakeMemory()
    errors = DeviceErrors([specs()[1]], mem)
    errors.raise_if_set()
    assert not mem.buffers and errors.host.size == 0  # no buffer, nothing to look at per Run


def test_a_set_slot_raises_once_with_its_kernel_check() -> None:
    mem = FakeMemory()
    gather, add, div = specs()
    errors = DeviceErrors([gather, add, div], mem)
    assert errors.pointer(div) - errors.pointer(gather) == 4  # one int32 slot per checking kernel
    errors.raise_if_set()  # fresh memory's garbage was cleared
    mem.write(errors.pointer(div), 1)  # what mx_fail(err, 1) stores from the device
    with pytest.raises(
        ZeroDivisionError, match=r"^div: integer division by zero \(found by gpu kernel k3_div\)"
    ):
        errors.raise_if_set()
    errors.raise_if_set()  # cleared: the next Run starts clean
    mem.write(errors.pointer(gather), 1)
    mem.write(errors.pointer(div), 1)  # two failures in one Run: the first slot's is raised
    with pytest.raises(IndexError, match=r"gather: index out of range \[-3, 3\) on axis 0"):
        errors.raise_if_set()
    assert not errors.host.any()


# -- on a GPU, through ORT ----------------------------------------------------------------------------------
def _model(node, feeds: dict[str, np.ndarray]) -> bytes:
    ins = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    g = helper.make_graph([node], "g", ins, [helper.make_value_info("y", onnx.TypeProto())])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return onnx.shape_inference.infer_shapes(m).SerializeToString()


def _sessions(model: bytes):
    import onnxruntime as ort

    ep = ("MIGraphXExecutionProvider", {"migraphx_target": "gpu"})
    ours = ort.InferenceSession(model, providers=[ep, "CPUExecutionProvider"])
    assert ours.get_providers()[0] == "MIGraphXExecutionProvider"
    return ours, ort.InferenceSession(model, providers=["CPUExecutionProvider"])


@pytest.fixture(params=["graph", "no graph"])
def cuda_graph(request, monkeypatch) -> str:
    monkeypatch.setenv("MIGRAPHX_EP_DISABLE_CUDA_GRAPH", "1" if request.param == "no graph" else "0")
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["Gather", "GatherElements"])
def test_gpu_out_of_range_index_fails_the_run_then_recovers(op, cuda_graph) -> None:
    node = helper.make_node(op, ["x", "i"], ["y"], axis=1)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    good = np.tile(np.array([[0, -1, 5, -6]], np.int64), (4, 1))
    ours, cpu = _sessions(_model(node, {"x": x, "i": good}))
    for bad_value in (6, -7):
        bad = good.copy()
        bad[2, 1] = bad_value
        with pytest.raises(Exception, match=rf"{op.lower()[:6]}.*index out of range \[-6, 6\)"):
            ours.run(None, {"x": x, "i": bad})
        np.testing.assert_array_equal(
            ours.run(None, {"x": x, "i": good})[0], cpu.run(None, {"x": x, "i": good})[0]
        )


@pytest.mark.gpu
def test_gpu_gathernd_and_embedding_lookup_check_indices(cuda_graph) -> None:
    emb = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)  # an embedding table lookup
    table = np.ones((50, 16), np.float32)
    ours, _ = _sessions(_model(emb, {"x": table, "i": np.zeros((1, 3), np.int32)}))
    with pytest.raises(Exception, match=r"gather: index out of range \[-50, 50\)"):
        ours.run(None, {"x": table, "i": np.array([[3, 50, 7]], np.int32)})
    assert ours.run(None, {"x": table, "i": np.array([[3, 49, -50]], np.int32)})[0].shape == (1, 3, 16)
    nd = helper.make_node("GatherND", ["x", "i"], ["y"])
    ours, _ = _sessions(_model(nd, {"x": np.ones((3, 4), np.float32), "i": np.zeros((1, 2), np.int64)}))
    with pytest.raises(Exception, match=r"gathernd: index out of range \[-4, 4\)"):
        ours.run(None, {"x": np.ones((3, 4), np.float32), "i": np.array([[1, 4]], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("op,attrs", [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_gpu_integer_division_by_zero_fails_the_run_then_recovers(op, attrs, dtype, cuda_graph) -> None:
    a = np.arange(1, 1001, dtype=np.int64).astype(dtype).reshape(10, 100)
    b = (np.arange(1000) % 7 + 1).astype(dtype).reshape(10, 100)
    ours, cpu = _sessions(_model(helper.make_node(op, ["a", "b"], ["y"], **attrs), {"a": a, "b": b}))
    bz = b.copy()
    bz[9, 99] = 0
    with pytest.raises(Exception, match=r"(div|mod): integer (division|modulo) by zero"):
        ours.run(None, {"a": a, "b": bz})
    np.testing.assert_array_equal(ours.run(None, {"a": a, "b": b})[0], cpu.run(None, {"a": a, "b": b})[0])


@pytest.mark.gpu
def test_gpu_roi_align_bad_batch_index_or_roi_fails_the_run_then_recovers(cuda_graph) -> None:
    """ORT's CPU EP rejects both too; the kernel skips the bad roi's outputs rather than read."""
    node = helper.make_node(
        "RoiAlign", ["x", "rois", "b"], ["y"], mode="max", output_height=2, output_width=2
    )
    x = np.arange(2 * 3 * 6 * 6, dtype=np.float32).reshape(2, 3, 6, 6)
    rois = np.array([[0.5, 0.5, 3.0, 4.0], [1.0, 0.0, 5.0, 5.5]], np.float32)
    good = {"x": x, "rois": rois, "b": np.array([1, 0], np.int64)}
    ours, cpu = _sessions(_model(node, good))
    for bad_index in (2, -1):
        with pytest.raises(Exception, match=r"roi_align: batch_indices value out of range \[0, 2\)"):
            ours.run(None, {**good, "b": np.array([1, bad_index], np.int64)})
        np.testing.assert_allclose(ours.run(None, good)[0], cpu.run(None, good)[0], rtol=1e-6, atol=1e-6)
    bad_roi = rois.copy()
    bad_roi[1, 2] = np.nan
    with pytest.raises(Exception, match=r"roi_align: rois must be finite"):
        ours.run(None, {**good, "rois": bad_roi})
    np.testing.assert_allclose(ours.run(None, good)[0], cpu.run(None, good)[0], rtol=1e-6, atol=1e-6)
