"""The gpu target's prewarm thread (targets/gpu/prewarm.py): started once per device, off by switch,
never raising; on a GPU it leaves the context, the libraries and their handles ready."""

from __future__ import annotations

import logging

import pytest

from migraphx_ep.targets.gpu import prewarm as pw


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(pw, "_STARTED", {})
    return pw


def test_switched_off(fresh, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("MIGRAPHX_EP_PREWARM", "0")
    assert fresh.prewarm(0) is None and fresh._STARTED == {}


def test_a_bad_switch_value_is_an_error_naming_it(fresh, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("MIGRAPHX_EP_PREWARM", "yes")
    with pytest.raises(ValueError, match="MIGRAPHX_EP_PREWARM"):
        fresh.prewarm(0)


def test_started_once_per_device_and_never_raises(fresh, monkeypatch, caplog) -> None:  # noqa: ANN001
    calls = []

    def failing(device_id: int) -> None:
        calls.append(device_id)
        raise RuntimeError("no driver here")

    monkeypatch.setattr("migraphx_ep.targets.gpu.cuda.Device.get", failing)
    with caplog.at_level(logging.DEBUG, logger="migraphx_ep.gpu"):
        first = fresh.prewarm(3)
        assert fresh.prewarm(3) is first
        first.join(10)
    assert not first.is_alive() and calls == [3]
    assert "prewarm of device 3 stopped: no driver here" in caplog.text


@pytest.mark.gpu
def test_on_a_gpu_it_readies_the_context_and_the_libraries(fresh, gpu) -> None:  # noqa: ANN001
    from migraphx_ep.targets.gpu import blas, cuda, dnn, libs

    fresh.prewarm(0).join(60)
    assert 0 in cuda.Device._devices
    assert cuda.compute_capability(0) == cuda.Device.get(0).cc
    assert "cuBLASLt" in libs._LOADED and "cuDNN" in libs._LOADED
    assert blas._HANDLES.get()  # made on the prewarm thread's current context
    assert any(dnn._HANDLES._free.values()), "a cuDNN handle waits in the pool"
