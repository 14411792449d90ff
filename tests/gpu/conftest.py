"""tests/gpu: tests marked ``gpu`` run only where the gpu target has a usable device, else they skip.

CI has no GPU, so there every ``gpu`` test here is skipped with the reason ``gpu_available()`` gives
(and nothing touches a driver at import). On the GPU machine set ``MIGRAPHX_EP_REQUIRE_GPU=1`` so a
target that is unexpectedly unavailable fails the run instead of turning the whole suite into skips.

This folder is a package (``__init__.py``) on purpose: a second top-level module named ``conftest``
would replace ``tests/conftest.py`` in ``sys.modules`` and break the tests that import helpers from it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


@functools.cache
def why_no_gpu() -> str | None:
    """None when the gpu target can run here, else why not (asked once per session)."""
    try:
        from migraphx_ep.targets.gpu import gpu_available
    except ImportError as e:
        return f"the gpu target cannot be imported: {e}"
    return gpu_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [it for it in items if it.get_closest_marker("gpu") and HERE in it.path.parents]
    if not ours:
        return
    reason = why_no_gpu()
    if reason is None:
        return
    if os.environ.get("MIGRAPHX_EP_REQUIRE_GPU", "") not in ("", "0"):
        raise pytest.UsageError(f"MIGRAPHX_EP_REQUIRE_GPU is set but the gpu target is unavailable: {reason}")
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for it in ours:
        it.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh fixed-seed generator per test: its data does not depend on which tests ran before."""
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def cuda():
    """The driver layer (``targets/gpu/cuda.py``) with device 0 current; skips where no GPU is usable."""
    from migraphx_ep.targets.gpu import cuda as cuda_mod

    reason = cuda_mod.gpu_available()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    cuda_mod.Device.get(0)
    return cuda_mod


@pytest.fixture(scope="session")
def gpu():
    """The gpu target with TF32 off: float32 GEMMs and convolutions are full float32."""
    from migraphx_ep.targets.gpu import GpuTarget

    return GpuTarget(device_id=0, allow_tf32=False)


@pytest.fixture(scope="session")
def gpu_tf32():
    """The gpu target with TF32 allowed (the EP's default, like ORT's CUDA EP)."""
    from migraphx_ep.targets.gpu import GpuTarget

    return GpuTarget(device_id=0, allow_tf32=True)


@pytest.fixture(autouse=True)
def timed_picks_at_once(monkeypatch):
    """Library picks are timed in the compile itself (MIGRAPHX_EP_QUICK_PICKS=0): a quick program
    replaced by a background compile mid-test would move compile and Python-run counts at random.
    test_gpu_batch_rows.py turns quick picks on where it tests them."""
    monkeypatch.setenv("MIGRAPHX_EP_QUICK_PICKS", "0")


def count_python_runs(monkeypatch) -> dict[str, int]:
    """Counts the Compute calls that reach Python (the shell looks ``bridge.run`` up on every call).
    Graphs are captured at a shape's first Run here, so a count means "Python once, then native";
    test_native_run.py checks the default (capture at the second Run) itself."""
    from migraphx_ep.ep import bridge

    monkeypatch.setenv("MIGRAPHX_EP_CAPTURE_RUN", "1")
    calls = {"n": 0}
    real = bridge.run

    def counted(compiled, inputs):
        calls["n"] += 1
        return real(compiled, inputs)

    monkeypatch.setattr(bridge, "run", counted)
    return calls


@pytest.fixture
def python_runs(monkeypatch):
    """``count_python_runs``: after a shape's first Run the native Run path should leave the count
    alone. Batch rows are off: a batch size served by a larger batch's program runs through Python
    until its own program is compiled (test_gpu_batch_rows.py counts that)."""
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")
    return count_python_runs(monkeypatch)


@pytest.fixture(autouse=True)
def fuse_small_attention(monkeypatch):
    """The test models are tiny: fuse their attention although too few blocks would make it slower on a
    real GPU (kernels/attention.py MIN_BLOCKS), so the fusion and its kernel are what the tests check.
    test_fuse_attention.py checks the gate itself."""
    monkeypatch.setenv("MIGRAPHX_EP_ATTENTION_MIN_BLOCKS", "0")
