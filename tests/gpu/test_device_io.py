"""Device-resident I/O (csrc/device_memory.h) on the GPU: our EpDevice advertises GPU memory, ORT copies
numpy feeds through our data transfer, IOBinding hands device buffers (ORT's, torch's) straight to the
native Run path, and bad bindings and the memory limit give clear errors."""

from __future__ import annotations

import gc

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

import migraphx_ep
from conftest import make_model, tensor
from migraphx_ep import _C

pytestmark = pytest.mark.gpu

EP = "MIGraphXExecutionProvider"
GPU = {"migraphx_target": "gpu", "migraphx_tf32_enable": "0"}


def _mlp() -> bytes:
    rng = np.random.default_rng(0)
    w = oh.make_tensor(
        "w", TensorProto.FLOAT, [64, 32], rng.standard_normal((64, 32)).astype(np.float32).ravel()
    )
    b = oh.make_tensor("b", TensorProto.FLOAT, [32], rng.standard_normal(32).astype(np.float32))
    return make_model(
        [oh.make_node("MatMul", ["x", "w"], ["h"]), oh.make_node("Add", ["h", "b"], ["a"]),
         oh.make_node("Relu", ["a"], ["y"])],
        [tensor("x", TensorProto.FLOAT, ["n", 64])],
        [tensor("y", TensorProto.FLOAT, ["n", 32])],
        [w, b],
    )  # fmt: skip


def _want(blob: bytes, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _session(blob: bytes, options: dict | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(blob, providers=[(EP, {**GPU, **(options or {})}), "CPUExecutionProvider"])


def test_ep_device_advertises_gpu_memory():
    assert _C.device_io_status() == ""
    info = migraphx_ep.get_ep_device().memory_info(ort.OrtDeviceMemoryType.DEFAULT)
    assert info is not None and info.device_mem_type == ort.OrtDeviceMemoryType.DEFAULT
    assert info.device_vendor_id == 0x10DE and info.device_id == 0


def test_numpy_feeds_copy_through_our_transfer():
    blob = _mlp()
    sess = _session(blob)
    for n in (3, 5, 3):
        x = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _want(blob, x), rtol=1e-5, atol=1e-5)


def test_iobinding_with_ort_device_values(python_runs):
    blob = _mlp()
    sess = _session(blob)
    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal((4, 64)).astype(np.float32)
        xv = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
        io = sess.io_binding()
        io.bind_ortvalue_input("x", xv)
        io.bind_output("y", "cuda")
        sess.run_with_iobinding(io)
        out = io.get_outputs()[0]
        assert out.device_name().lower() == "cuda"
        np.testing.assert_allclose(out.numpy(), _want(blob, x), rtol=1e-5, atol=1e-5)
    assert python_runs["n"] == 1  # the first Run compiled in Python; the rest ran natively on device buffers


def test_iobinding_torch_pointers_zero_copy():
    torch = pytest.importorskip("torch")
    blob = _mlp()
    sess = _session(blob)
    x = torch.randn(6, 64, device="cuda")
    y = torch.empty(6, 32, device="cuda")
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, list(x.shape), x.data_ptr())
    io.bind_output("y", "cuda", 0, np.float32, list(y.shape), y.data_ptr())
    for _ in range(3):
        torch.cuda.synchronize()
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(y.cpu().numpy(), _want(blob, x.cpu().numpy()), rtol=1e-5, atol=1e-5)


def test_host_buffer_bound_as_device_memory_is_an_error():
    blob = _mlp()
    sess = _session(blob)
    x = np.ones((2, 64), np.float32)
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, [2, 64], x.ctypes.data)
    io.bind_output("y", "cuda")
    with pytest.raises(Exception, match="not device memory"):
        sess.run_with_iobinding(io)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _want(blob, x), rtol=1e-5, atol=1e-5)


def test_mem_limit_is_enforced_and_named(capfd):
    blob = _mlp()
    sess = _session(blob, {"migraphx_mem_limit": "1024"})
    with pytest.raises(Exception):  # noqa: B017 - ORT's message is generic; ours goes to stderr
        sess.run(None, {"x": np.ones((64, 64), np.float32)})
    assert "migraphx_mem_limit=1024" in capfd.readouterr().err


def test_external_alloc_needs_free():
    with pytest.raises(Exception, match="migraphx_external_free"):
        _session(_mlp(), {"migraphx_external_alloc": "0x1000"})


def test_session_cycles_leave_device_memory_flat():
    import os

    from cuda.bindings import driver as cu

    from migraphx_ep.targets.gpu import cuda

    blob = _mlp()
    x = np.ones((8, 64), np.float32)

    def cycle() -> None:
        sess = _session(blob)
        sess.run(None, {"x": x})
        del sess
        gc.collect()

    cycle()
    free0, live0 = cu.cuMemGetInfo()[1], cuda.live_bytes()
    for _ in range(30):
        cycle()
    free1, live1 = cu.cuMemGetInfo()[1], cuda.live_bytes()
    assert live1 - live0 < 1 << 20, (live0, live1)  # what this process's programs hold
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the device's free memory also moves with other workers
        assert free0 - free1 < 32 << 20, (free0, free1)


@pytest.mark.parametrize("io_graph", ["1", "0"])
def test_copies_and_program_in_one_launch(monkeypatch, io_graph):
    # All-device I/O: the input copy, the program and the output copy go out as one graph (the IO graph),
    # re-pointed when a Run binds other buffers; MIGRAPHX_EP_IO_GRAPH=0 issues them one by one. Same
    # answers either way, whichever buffers each Run gets.
    monkeypatch.setenv("MIGRAPHX_EP_IO_GRAPH", io_graph)
    blob = _mlp()
    sess = _session(blob)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((4, 64)).astype(np.float32) for _ in range(3)]
    ins = [ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0) for x in xs]
    outs = [ort.OrtValue.ortvalue_from_shape_and_type((4, 32), np.float32, "cuda", 0) for _ in range(2)]
    for _ in range(2):  # compiles, then captures the graph; the native path takes the next Runs
        sess.run(None, {"x": xs[0]})
    before = _C.io_graph_launches()
    # the same buffers twice (nothing re-pointed), then each side re-pointed, then both
    for i, o in ((0, 0), (0, 0), (1, 0), (1, 1), (2, 0), (0, 1)):
        io = sess.io_binding()
        io.bind_ortvalue_input("x", ins[i])
        io.bind_ortvalue_output("y", outs[o])
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(outs[o].numpy(), _want(blob, xs[i]), rtol=1e-5, atol=1e-5)
    launched = _C.io_graph_launches() - before
    assert launched == (6 if io_graph == "1" else 0)


def test_recurring_buffers_keep_their_io_graphs():
    # ORT's buffers for numpy feeds come back from the caching allocator in another order every other
    # Run: each set of addresses keeps its own IO graph (up to four), so a recurring set launches with
    # nothing built or re-pointed; a fifth set re-points the least recently launched graph.
    blob = _mlp()
    sess = _session(blob)
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((4, 64)).astype(np.float32) for _ in range(5)]
    ins = [ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0) for x in xs]
    outs = [ort.OrtValue.ortvalue_from_shape_and_type((4, 32), np.float32, "cuda", 0) for _ in range(5)]
    for _ in range(2):
        sess.run(None, {"x": xs[0]})

    def run(i: int) -> None:
        io = sess.io_binding()
        io.bind_ortvalue_input("x", ins[i])
        io.bind_ortvalue_output("y", outs[i])
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(outs[i].numpy(), _want(blob, xs[i]), rtol=1e-5, atol=1e-5)

    builds0, repoints0 = _C.io_graph_counts()
    for i in (0, 1, 0, 1, 0, 1):
        run(i)
    assert _C.io_graph_counts() == (builds0 + 2, repoints0)
    for i in (2, 3, 0, 1, 2, 3):
        run(i)
    assert _C.io_graph_counts() == (builds0 + 4, repoints0)
    run(4)  # a fifth set: the least recently launched graph (set 0's) is re-pointed, input and output
    assert _C.io_graph_counts() == (builds0 + 4, repoints0 + 2)
    run(3)
    assert _C.io_graph_counts() == (builds0 + 4, repoints0 + 2)


def _add_one() -> bytes:
    return make_model(
        [oh.make_node("Add", ["x", "one"], ["y"])],
        [tensor("x", TensorProto.FLOAT, ["n"])],
        [tensor("y", TensorProto.FLOAT, ["n"])],
        [oh.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )


def test_large_numpy_copies_go_through_pinned_staging():
    # Large pageable copies (8 MiB and more into the GPU, 2 MiB and more out of it) go through pinned
    # buffers filled by several threads (csrc/host_staging.h): an odd size (a partial last chunk, pieces
    # not a multiple of anything) comes back exact, staged or not, and smaller copies and pinned host
    # memory are left to the driver.
    assert _C.copy_threads() >= 2
    sess = _session(_add_one())
    x = np.random.default_rng(3).standard_normal(5_000_011).astype(np.float32)
    for _ in range(3):  # the Python path's Runs, then the native path's
        before = _C.staged_copy_count()
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + np.float32(1))
        assert _C.staged_copy_count() - before >= 2  # the feed in and the fetch out at least
    _C.configure_staging(False)
    try:
        before = _C.staged_copy_count()
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + np.float32(1))
        assert _C.staged_copy_count() == before
    finally:
        _C.reset_staging()
    small = x[: (1 << 19) - 1]  # just under 2 MiB: the driver's copies both ways
    before = _C.staged_copy_count()
    np.testing.assert_array_equal(sess.run(None, {"x": small})[0], small + np.float32(1))
    assert _C.staged_copy_count() == before
    mid = x[: 1 << 19]  # 2 MiB: staged out of the GPU (from 2 MiB), not into it (from 8 MiB)
    dev = ort.OrtValue.ortvalue_from_numpy(mid, "cuda", 0)
    assert _C.staged_copy_count() == before
    np.testing.assert_array_equal(dev.numpy(), mid)
    assert _C.staged_copy_count() == before + 1
    from migraphx_ep.targets.gpu.cuda import PinnedBuffer

    pinned = PinnedBuffer(x.nbytes)
    view = pinned.view(np.float32, x.shape)
    view[:] = x
    before = _C.staged_copy_count()
    dev = ort.OrtValue.ortvalue_from_numpy(view, "cuda", 0)  # host to device from pinned: the driver's DMA
    assert _C.staged_copy_count() == before
    np.testing.assert_array_equal(dev.numpy(), x)  # into a new (pageable) array: staged
    assert _C.staged_copy_count() == before + 1


def test_concurrent_large_copies_are_exact():
    # Threads copying at once: one stages, the others go the driver's way beside it (never waiting on
    # the staging buffers); every result is exact.
    from concurrent.futures import ThreadPoolExecutor

    sess = _session(_add_one())
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(2_300_003).astype(np.float32) for _ in range(6)]  # 9.2 MB each

    def check(x: np.ndarray) -> bool:
        for _ in range(4):
            if not np.array_equal(sess.run(None, {"x": x})[0], x + np.float32(1)):
                return False
        return True

    with ThreadPoolExecutor(6) as ex:
        assert all(ex.map(check, xs))


def test_large_initializers_are_copied_exactly_while_orts_buffers_live():
    """With device I/O ORT drops the fused node's constant initializers, so the Compile's marshal owns a
    copy of each: from 4 MiB on threads (graph_marshal.cpp copied_array). Exact, and outliving ORT's."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal((1536, 1024)).astype(np.float32)  # 6 MiB
    odd = rng.standard_normal((1031, 1029)).astype(np.float32)  # just over 4 MiB, an odd size
    blob = make_model(
        [oh.make_node("Add", ["x", "big"], ["s"]), oh.make_node("Mul", ["z", "odd"], ["t"])],
        [tensor("x", TensorProto.FLOAT, [1536, 1024]), tensor("z", TensorProto.FLOAT, [1031, 1029])],
        [tensor("s", TensorProto.FLOAT, [1536, 1024]), tensor("t", TensorProto.FLOAT, [1031, 1029])],
        [oh.make_tensor("big", TensorProto.FLOAT, big.shape, big.ravel()),
         oh.make_tensor("odd", TensorProto.FLOAT, odd.shape, odd.ravel())],
    )  # fmt: skip
    sess = _session(blob)
    gc.collect()
    x = rng.standard_normal(big.shape).astype(np.float32)
    z = rng.standard_normal(odd.shape).astype(np.float32)
    for _ in range(3):  # the Python path, then the captured graph's native Runs
        s, t = sess.run(None, {"x": x, "z": z})
        np.testing.assert_array_equal(s, x + big)
        np.testing.assert_array_equal(t, z * odd)
