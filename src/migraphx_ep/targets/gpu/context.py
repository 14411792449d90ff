"""One execution context of a gpu executable: what a Run needs for itself while other Runs of the same
program go on beside it -- an arena, a library workspace, a stream, error slots, the launches bound to
those addresses and their captured CUDA graph, and the lock that makes the context one Run's at a time.

Weights, kernel images, loaded modules and library plans belong to the executable and are shared: a
second context costs its arena and a graph capture, never a compile or a library search. The executable
makes its first context at compile time; the shell's native Run path asks for more (up to
``MIGRAPHX_EP_RUN_CONTEXTS``, default 4) only when concurrent Runs find every context busy.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ...switches import env_int
from ...timing import stage
from . import cuda
from .errors import DeviceErrors
from .runtime_dims import DIMS_SUFFIX
from .steps import Buf

if TYPE_CHECKING:
    from .executable import GpuExecutable, Launch

log = logging.getLogger("migraphx_ep.gpu")


def max_contexts() -> int:
    """``MIGRAPHX_EP_RUN_CONTEXTS``: how many Runs of one program may be on the device at once."""
    return env_int("MIGRAPHX_EP_RUN_CONTEXTS", 4, 1)


def run_lock() -> Any:
    """The shell's RunLock (a C++ mutex the native Run path takes without the GIL), so Python and native
    Runs of one context exclude each other; a plain lock where the extension is not built."""
    try:
        from ... import _C

        return _C.RunLock()
    except (ImportError, AttributeError):
        return threading.Lock()


def capture_run() -> int:
    """``MIGRAPHX_EP_CAPTURE_RUN``: the Run of a program (one input shape) at which its CUDA graph is
    captured and the shell's native Run path takes over; the Runs before it launch the steps one by one.
    Default 2: a shape met once -- an OCR or detection model fed a new image size nearly every call --
    never pays for a capture (4 ms a shape for ResNet-50) nor for a native plan it would never use, as
    torch.compile's CUDA graph trees warm up once before they record. 1: capture after the first Run."""
    return env_int("MIGRAPHX_EP_CAPTURE_RUN", 2, 1)


def _use_graphs() -> bool:
    return os.environ.get("MIGRAPHX_EP_DISABLE_CUDA_GRAPH", "0") in ("", "0")


class RunContext:
    """``defer``: no warm-up or capture now. The first Run (``GpuExecutable.run``) launches the steps
    eagerly, which warms them up as the warm-up would, and the graph is captured when first asked for
    (the Run numbered ``capture_run()``, or the native plan asked for after it): a never-seen shape's
    first Run then executes the program once, not twice (warm-up, then the graph). Capturing at once
    instead, with no warm-up, measured no faster on the H100 (lazy loading then happens inside the
    capture)."""

    def __init__(self, exe: GpuExecutable, defer: bool = False) -> None:
        self.exe = exe
        self.lock = run_lock()
        with stage("context"):  # stream, arena, error slots: what a new shape's context costs beyond binding
            self.stream = cuda.Stream()
            self.arena = cuda.alloc(exe.arena_bytes)
            self.errors = DeviceErrors(exe.checking_specs)
        self.workspace: cuda.DeviceBuffer | None = None  # sized by binding (library plans ask)
        with stage("bind"):  # kernel arguments and library plans per step (library search is its own stage)
            self.launches: list[Launch] = exe.bind(self)
        self.workspace = cuda.alloc(exe.workspace_bytes)
        lowered = exe.lowered
        self.inputs = [(name, self.ptr(b), b.shape) for name, b in lowered.inputs.items()]
        self.outputs: list[tuple[int, Any] | np.ndarray] = [
            o if isinstance(o, np.ndarray) else (self.ptr(o), o.shape) for o in lowered.outputs
        ]
        self.warm = False  # the steps ran once (code loaded, libraries' lazy allocations made)
        self.runs = 0  # Runs through Python (GpuExecutable.run): the graph waits for ``capture_run()``
        self.captured = False  # capture was tried (``_graph`` None after it: steps run one by one)
        self._graph: cuda.Graph | None = None
        if not defer:
            self.prepare()

    def prepare(self) -> None:
        """Warm up (unless a Run did) and capture the CUDA graph, once."""
        if self.captured:
            return
        if not self.warm:
            # First launches load code and libraries allocate lazily: not inside a capture. This warm-up
            # reads an uninitialised arena: the checks it trips are noise, cleared before any Run.
            with stage("warm-up"):
                self.issue(self.stream.handle)
                self.stream.sync()
            self.errors.clear()
            self.warm = True
        self.captured = True
        if _use_graphs() and self.launches:
            try:
                with stage("graph capture"):
                    self._graph = cuda.Graph(self.stream, self.issue)
            except cuda.CudaError as e:
                log.warning("CUDA graph capture failed (%s); launching steps one by one", e)
                self._graph = None

    def capture_due(self, runs: int) -> bool:
        """Whether the graph is (or is to be) captured once ``runs`` Runs have gone through Python: the
        one place the ``capture_run()`` policy is read (the Run deciding, and the native plan after it)."""
        return self.captured or runs >= capture_run()

    @property
    def graph(self) -> cuda.Graph | None:
        """The captured graph (captured now if it was deferred); None: the steps run one by one."""
        self.prepare()
        return self._graph

    def ptr(self, b: Buf) -> int:
        if b.storage.kind == "weight":
            return self.exe.weight_address(b.storage) + b.offset
        return self.arena.ptr + b.storage.offset + b.offset

    def workspace_ptr(self) -> int:
        assert self.workspace is not None
        return self.workspace.ptr

    def issue(self, stream: int) -> None:
        for launch in self.launches:
            launch(stream)

    def native(self, input_names: list[str]) -> dict:
        """This context's part of a native plan (``csrc/native_run.h``): per fused-node input its arena
        address (0: not a program parameter) and that of its run-time dims (0: none, runtime_dims.py),
        per output its address (0: a constant)."""
        where = {name: ptr for name, ptr, _ in self.inputs}
        slots = self.errors.host
        return {
            "stream": self.stream.handle,
            "graph": self.graph.exec_handle if self.graph is not None else 0,  # 0: nothing to launch
            "graph_template": self.graph.graph_handle if self.graph is not None else 0,
            "inputs": [where.get(n, 0) for n in input_names],
            "dims": [where.get(n + DIMS_SUFFIX, 0) for n in input_names],
            "outputs": [0 if isinstance(o, np.ndarray) else o[0] for o in self.outputs],
            "errors": (slots.ctypes.data if slots.size else 0, int(slots.size)),
            "lock": self.lock,
        }
