"""Host-side pieces of the shell's native Run path (csrc/native_run.h) that need no GPU: the shared run
lock, the off switch, and which backends offer plans. The path itself is tested on the GPU machine
(tests/gpu/test_native_run.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

import migraphx_ep
from conftest import make_model, tensor
from migraphx_ep import _C
from migraphx_ep.ep import bridge


def test_run_lock_excludes_and_lets_python_run_while_waiting():
    lock = _C.RunLock()
    order: list[str] = []
    held = threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            time.sleep(0.2)
            order.append("holder done")

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    ticks = []
    ticker = threading.Thread(target=lambda: [ticks.append(time.sleep(0.01)) for _ in range(5)])
    ticker.start()  # must make progress while the main thread waits on the lock (GIL released)
    with lock:
        order.append("waiter in")
    ticker.join()
    t.join()
    assert order == ["holder done", "waiter in"]
    assert len(ticks) == 5


def test_off_switch(monkeypatch):
    monkeypatch.delenv("MIGRAPHX_EP_NATIVE_RUN", raising=False)
    assert _C.native_run_enabled()
    monkeypatch.setenv("MIGRAPHX_EP_NATIVE_RUN", "0")
    assert not _C.native_run_enabled()


def test_driver_status_is_a_reason_or_empty():
    status = _C.cuda_driver_status()
    assert isinstance(status, str)
    if status:
        assert "libcuda" in status


def test_backends_without_plans_keep_the_python_path(monkeypatch):
    """The ref target offers no plan: every Run goes through bridge.run, with right answers."""
    calls = {"run": 0, "plans": []}
    real_run, real_plan = bridge.run, bridge.native_plan

    def run(compiled, inputs):
        calls["run"] += 1
        return real_run(compiled, inputs)

    def plan(compiled, inputs):
        p = real_plan(compiled, inputs)
        calls["plans"].append(p)
        return p

    monkeypatch.setattr(bridge, "run", run)
    monkeypatch.setattr(bridge, "native_plan", plan)
    blob = make_model(
        [oh.make_node("Relu", ["x"], ["y"])],
        [tensor("x", TensorProto.FLOAT, [2, 3])],
        [tensor("y", TensorProto.FLOAT, [2, 3])],
    )
    sess = ort.InferenceSession(
        blob, providers=[("MIGraphXExecutionProvider", {"migraphx_target": "ref"}), "CPUExecutionProvider"]
    )
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    assert calls["run"] == 3
    assert all(p is None for p in calls["plans"])  # asked only where a CUDA driver exists
    assert bridge.native_plan(object(), [x]) is None  # a backend without native_plan


def test_without_a_gpu_the_ep_device_keeps_cpu_memory():
    """No driver or no GPU: no GPU memory info, so CI's sessions keep host-memory I/O (as before)."""
    if _C.device_io_status() == "":
        pytest.skip("this machine has a GPU: tests/gpu/test_device_io.py covers it")
    assert migraphx_ep.get_ep_device().memory_info(ort.OrtDeviceMemoryType.DEFAULT) is None


def test_external_alloc_without_free_is_an_option_error():
    from migraphx_ep.ep.options import OptionError
    from migraphx_ep.ep.provider import create_ep

    ep = create_ep({"migraphx_external_alloc": "0x1000"})
    try:
        ep.allocator_settings()
    except OptionError as e:
        assert "migraphx_external_free" in str(e)
    else:
        raise AssertionError("expected an OptionError")
    ok = create_ep({"migraphx_mem_limit": "4096", "migraphx_arena_extend_strategy": "kSameAsRequested"})
    assert ok.allocator_settings() == {
        "mem_limit": 4096, "power_of_two": False, "external_alloc": 0, "external_free": 0,
        "external_empty_cache": 0,
    }  # fmt: skip


@pytest.mark.parametrize(
    "name, switch, default",
    [("MIGRAPHX_EP_RUN_CONTEXTS", "max_contexts", 4), ("MIGRAPHX_EP_CAPTURE_RUN", "capture_run", 2)],
)
def test_context_switches_are_validated(monkeypatch, name, switch, default):
    # Execution contexts per program; the Run that captures a shape's graph (2: its second).
    from migraphx_ep.targets.gpu import context

    read = getattr(context, switch)
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    monkeypatch.setenv(name, "1")
    assert read() == 1
    for bad in ("0", "-1", "four"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            read()


def test_copy_to_device_refuses_what_it_cannot_copy():
    """``_C.copy_to_device`` (the gpu target's weight upload) takes only a contiguous buffer, and says why
    when there is no driver; it never reads past a strided view."""
    strided = np.zeros((4, 4), np.float32)[:, 1]
    with pytest.raises(ValueError, match="not a contiguous buffer"):
        _C.copy_to_device(0, strided, 0, 0)
    if _C.cuda_driver_status():  # no GPU here: the reason, by name
        with pytest.raises(RuntimeError, match="no CUDA driver"):
            _C.copy_to_device(0, np.zeros(4, np.float32), 0, 0)


def test_create_ep_retains_the_context_early_only_for_the_gpu_target(monkeypatch):
    """Which GPU's primary context CreateEp starts retaining before its first Python call (ep.h)."""
    for var in ("MIGRAPHX_EP_PREWARM", "ORT_MIGRAPHX_TARGET"):
        monkeypatch.delenv(var, raising=False)
    ordinal = _C.early_context_ordinal
    assert ordinal({}) == 0 and ordinal({"migraphx_target": "gpu"}) == 0
    assert ordinal({"device_id": "3"}) == 3 and ordinal({"migraphx_target": "auto", "device_id": "1"}) == 1
    assert ordinal({"migraphx_target": "ref"}) == -1 and ordinal({"migraphx_target": " REF "}) == -1
    for bad in ("x", "-1", "1.5", "", "99999999999"):
        assert ordinal({"device_id": bad}) == -1, bad  # Python reports these; nothing starts here
    monkeypatch.setenv("ORT_MIGRAPHX_TARGET", "ref")  # the environment wins, as in options.py
    assert ordinal({"migraphx_target": "gpu"}) == -1
    monkeypatch.setenv("ORT_MIGRAPHX_TARGET", "gpu")
    assert ordinal({"migraphx_target": "ref"}) == 0
    monkeypatch.setenv("MIGRAPHX_EP_PREWARM", "0")
    assert ordinal({}) == -1


@pytest.mark.parametrize("nbytes", [0, 1, 4095, (4 << 20) - 1, 4 << 20, (9 << 20) + 13])
def test_host_copy_is_exact_on_one_thread_and_on_many(nbytes):
    """The marshal's copy of a large initializer (host_copy: the staging pool's threads from 4 MiB)."""
    src = np.frombuffer(np.random.default_rng(nbytes).bytes(nbytes), np.uint8)
    for threads in (1, 4):
        _C.configure_staging(threads=threads)
        try:
            dst = np.full(nbytes, 0xAB, np.uint8)
            _C.host_copy(dst, src)
            np.testing.assert_array_equal(dst, src)
        finally:
            _C.reset_staging()
    with pytest.raises(ValueError, match="differ in size"):
        _C.host_copy(np.empty(nbytes + 1, np.uint8), src)


def test_empty_array_for_a_copied_initializer():
    a = bridge.empty_array(int(TensorProto.FLOAT16), [3, 4])
    assert a.dtype == np.float16 and a.shape == (3, 4) and a.flags.writeable
    assert not isinstance(bridge.empty_array(int(TensorProto.STRING), [2]), np.ndarray)
