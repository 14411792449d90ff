"""What a session's first compile would wait for, started when the EP is created.

Measured on the H100 (a fresh process, ResNet-50 fp16, bytecode cached as after a pip install): of
~1.0 s from ``InferenceSession`` to the first Run's end, the device's primary context took 0.16 s
inside EP creation, loading cuBLASLt and cuDNN 0.08 s, and the libraries' first heuristic queries
(their one-time set-up) ~0.1 s inside the compile. None of it needs the model. So EP creation starts
it on a daemon thread, and ORT's model load and our partitioner's parse run meanwhile: the driver's and
the libraries' C calls release the GIL. Whatever the thread has not finished, the compile waits for
(``Device.get`` and the library loaders take locks); whatever fails there, the compile meets again and
reports as it always did, so the thread only logs at DEBUG. ``MIGRAPHX_EP_PREWARM=0`` turns it off.
"""

from __future__ import annotations

import logging
import threading

from ...ir.dtypes import DType
from ...switches import env_choice

log = logging.getLogger("migraphx_ep.gpu")

_STARTED: dict[int, threading.Thread] = {}
_LOCK = threading.Lock()


def prewarm(device_id: int) -> threading.Thread | None:
    """Start (once per device and process) the thread that readies ``device_id``; returns it (None when
    switched off)."""
    if env_choice("MIGRAPHX_EP_PREWARM", "1", ("0", "1")) == "0":
        return None
    with _LOCK:
        thread = _STARTED.get(device_id)
        if thread is None:
            thread = threading.Thread(
                target=_prewarm, args=(device_id,), name=f"migraphx-ep-prewarm-{device_id}", daemon=True
            )
            _STARTED[device_id] = thread
            thread.start()
    return thread


def _prewarm(device_id: int) -> None:
    try:
        from . import _libraries
        from .cuda import Device

        Device.get(device_id)  # the primary context, current on this thread from here
        use_blas, use_dnn = _libraries()
        if use_blas:
            _first_gemm_query()
        if use_dnn:
            from . import dnn

            with dnn.borrow_handle():  # made now, kept in the pool for the compile to borrow
                pass
    except Exception as e:  # noqa: BLE001 - the compile meets it again and reports it
        log.debug("gpu prewarm of device %d stopped: %s", device_id, e)


def _first_gemm_query() -> None:
    """One heuristic query for a small half GEMM: cuBLASLt's first one sets up what every later one
    reads. Nothing is kept (no pick is stored, no algorithm run)."""
    from . import blas

    lay = blas.MatLayout(64, 1, 0)
    plan = blas.GemmPlan(DType.half_type, 1, 64, 64, 64, (lay, lay, lay), 1.0, 0.0, False, False, False, 256)
    try:
        plan.handle = blas.handle()
        plan.heuristics(1 << 20)
    finally:
        plan.close()


__all__ = ["prewarm"]
