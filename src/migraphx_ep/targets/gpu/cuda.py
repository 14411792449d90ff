"""A thin layer over the CUDA driver API (``cuda.bindings.driver``): devices, memory, streams, modules,
kernel launches and graph capture. Pointers and streams are plain ints so the vendor libraries (ctypes)
and generated kernels share them without conversions.

Every call is checked: a failure raises ``CudaError`` naming the call and the driver's error name, never
a crash. Contexts are the devices' primary contexts (what the CUDA runtime, PyTorch and ORT's CUDA EP
use), made current on whichever thread ORT calls us from.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .backend import driver as cu


class CudaError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the error)."""


def _err_name(err: Any) -> str:
    try:
        r = cu.cuGetErrorName(err)
        return r[1].decode() if int(r[0]) == 0 else repr(err)
    except Exception:  # noqa: BLE001 - error reporting must not raise
        return repr(err)


def check(result: Any, what: str) -> Any:
    """Unpack a ``cuda.bindings`` result tuple ``(err, *values)``; raise ``CudaError`` on failure."""
    if not isinstance(result, tuple):
        result = (result,)
    err = result[0]
    if int(err) != 0:
        raise CudaError(f"{what} failed: {_err_name(err)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


_INIT_LOCK = threading.Lock()
_INIT_ERROR: str | None = None
_INITIALISED = False


def init() -> None:
    """cuInit once; a machine without a driver raises CudaError with the reason."""
    global _INITIALISED, _INIT_ERROR
    with _INIT_LOCK:
        if _INITIALISED:
            return
        if _INIT_ERROR is not None:
            raise CudaError(_INIT_ERROR)
        if cu is None:
            _INIT_ERROR = "the CUDA Python bindings (cuda-bindings) are not installed"
            raise CudaError(_INIT_ERROR)
        try:
            check(cu.cuInit(0), "cuInit")
        except CudaError as e:
            _INIT_ERROR = f"no usable CUDA driver: {e}"
            raise CudaError(_INIT_ERROR) from None
        except Exception as e:  # noqa: BLE001 - the bindings raise RuntimeError when libcuda is absent
            _INIT_ERROR = f"no usable CUDA driver: {e}"
            raise CudaError(_INIT_ERROR) from None
        _INITIALISED = True


def device_count() -> int:
    init()
    return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def gpu_available(device_id: int = 0) -> str | None:
    """None when device ``device_id`` can be used, else why not (for notices and test skips)."""
    try:
        n = device_count()
    except CudaError as e:
        return str(e)
    if n == 0:
        return "the CUDA driver reports no GPU"
    if not 0 <= device_id < n:
        return f"device_id {device_id} does not exist: this machine has {n} GPU(s) (0..{n - 1})"
    return None


def compute_capability(device_id: int) -> tuple[int, int]:
    """Device ``device_id``'s compute capability, read without making its context (``Device`` does)."""
    init()
    handle = check(cu.cuDeviceGet(device_id), "cuDeviceGet")
    attr = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle), "attr")
    minor = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle), "attr")
    return int(major), int(minor)


class Device:
    """One GPU and its primary context. ``Device.get(i)`` is cached; ``make_current`` is cheap."""

    _devices: dict[int, Device] = {}
    _lock = threading.Lock()

    def __init__(self, device_id: int) -> None:
        reason = gpu_available(device_id)
        if reason is not None:
            raise CudaError(reason)
        self.id = device_id
        self.handle = check(cu.cuDeviceGet(device_id), "cuDeviceGet")
        self.context = check(cu.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        self.make_current()
        attr = cu.CUdevice_attribute
        self.cc = compute_capability(device_id)
        self.sm_count = int(
            check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.handle), "attr")
        )
        raw = check(cu.cuDeviceGetName(256, self.handle), "cuDeviceGetName")
        self.name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace").strip()

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"

    @classmethod
    def get(cls, device_id: int = 0) -> Device:
        with cls._lock:
            dev = cls._devices.get(device_id)
            if dev is None:
                dev = cls._devices[device_id] = Device(device_id)
        dev.make_current()
        return dev

    @classmethod
    def current(cls) -> Device:
        init()
        ctx = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        for dev in cls._devices.values():
            if int(dev.context) == int(ctx):
                return dev
        return cls.get(0)

    def make_current(self) -> None:
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def __repr__(self) -> str:
        return f"Device({self.id}, {self.name!r}, {self.arch})"


_live = [0]  # bytes of DeviceBuffers not yet freed, in this process (``live_bytes``)
_live_lock = threading.Lock()


def live_bytes() -> int:
    """Device memory this process's programs hold (arenas, weights, workspaces): unlike the device's free
    memory, other processes on the GPU do not move it, so leak tests can read it."""
    return _live[0]


class DeviceBuffer:
    """Device memory that frees itself; ``ptr`` is the address as an int."""

    __slots__ = ("ptr", "nbytes", "__weakref__")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        self.ptr = 0
        if self.nbytes > 0:
            try:
                self.ptr = int(check(cu.cuMemAlloc(self.nbytes), "cuMemAlloc"))
            except CudaError as e:
                raise CudaError(f"{e} (asked for {self.nbytes} bytes)") from None
            with _live_lock:
                _live[0] += self.nbytes

    def free(self) -> None:
        if self.ptr:
            try:
                cu.cuMemFree(self.ptr)
            finally:
                self.ptr = 0
                with _live_lock:
                    _live[0] -= self.nbytes

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def alloc(nbytes: int) -> DeviceBuffer:
    return DeviceBuffer(nbytes)


class PinnedBuffer:
    """Page-locked host memory: device copies into it run at full bus speed and never page-fault."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(cu.cuMemHostAlloc(self.nbytes, 0), "cuMemHostAlloc"))
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.ptr))

    def view(self, dtype: np.dtype, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.array[offset : offset + n].view(dtype).reshape(shape)

    def __del__(self) -> None:
        try:
            if self.ptr:
                cu.cuMemFreeHost(self.ptr)
                self.ptr = 0
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class MappedBuffer(PinnedBuffer):
    """Pinned host memory that kernels write in place through ``device_ptr`` (zero-copy): for flags set
    rarely, which the host reads after a synchronisation with no copy at all. Kernel writes are visible
    to the host once the stream that ran them is synchronised."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP
        self.ptr = int(check(cu.cuMemHostAlloc(self.nbytes, flags), "cuMemHostAlloc(DEVICEMAP)"))
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.ptr))
        self.device_ptr = int(check(cu.cuMemHostGetDevicePointer(self.ptr, 0), "cuMemHostGetDevicePointer"))


class Stream:
    """A non-blocking stream (no implicit sync with the legacy default stream)."""

    def __init__(self) -> None:
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        self._s = check(cu.cuStreamCreate(flags), "cuStreamCreate")
        self.handle = int(self._s)

    def sync(self) -> None:
        check(cu.cuStreamSynchronize(self._s), "cuStreamSynchronize")

    def __del__(self) -> None:
        try:
            cu.cuStreamDestroy(self._s)
        except Exception:  # noqa: BLE001
            pass


def memcpy_htod(dst: int, src: np.ndarray, stream: Stream | int) -> None:
    s = stream.handle if isinstance(stream, Stream) else stream
    if src.nbytes:
        check(cu.cuMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, s), "cuMemcpyHtoDAsync")


def memcpy_dtoh(dst: np.ndarray, src: int, stream: Stream | int) -> None:
    s = stream.handle if isinstance(stream, Stream) else stream
    if dst.nbytes:
        check(cu.cuMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, s), "cuMemcpyDtoHAsync")


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Stream | int) -> None:
    s = stream.handle if isinstance(stream, Stream) else stream
    if nbytes:
        check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, s), "cuMemcpyDtoDAsync")


def memset(dst: int, nbytes: int, stream: Stream | int) -> None:
    s = stream.handle if isinstance(stream, Stream) else stream
    if nbytes:
        check(cu.cuMemsetD8Async(dst, 0, nbytes, s), "cuMemsetD8Async")


class Kernel:
    """A loaded kernel with its launch arguments bound once (device pointers fixed at compile time)."""

    def __init__(self, module: Module, name: str) -> None:
        self.module = module  # keeps the module loaded
        self.name = name
        self.func = check(
            cu.cuModuleGetFunction(module.handle, name.encode()), f"cuModuleGetFunction({name})"
        )
        self._shared_limit = 48 * 1024  # what a launch may ask for without raising the attribute

    def set_shared(self, nbytes: int) -> None:
        if nbytes > self._shared_limit:  # raised once to the largest request (a never-seen shape binds again)
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(self.func, attr, nbytes), "cuFuncSetAttribute")
            self._shared_limit = nbytes


class BoundLaunch:
    """``kernel<<<grid, block, shared, stream>>>(*pointers, *scalars)`` with the argument block built once
    (``scalars``: run-time sizes, unsigned integers of ``scalar_bits``)."""

    def __init__(
        self,
        kernel: Kernel,
        grid: Sequence[int],
        block: Sequence[int],
        shared: int,
        pointers: Sequence[int],
        label: str = "",
        scalars: Sequence[int] = (),
        scalar_bits: int = 32,
    ) -> None:
        self.kernel = kernel
        self.label = label or kernel.name  # the lowering's name: kernels share compiled symbols
        self.grid = tuple(int(g) for g in grid)
        self.block = tuple(int(b) for b in block)
        self.shared = int(shared)
        kernel.set_shared(self.shared)
        self.pointers = tuple(int(p) for p in pointers)
        # Every argument in an 8-byte slot of one array, ``_argv`` pointing at each: a 32-bit scalar is
        # read from its slot's first 4 bytes (little-endian), masked as ``c_uint32`` would cut it. Two
        # ctypes arrays instead of an object per argument: a never-seen shape binds every kernel again.
        mask = (1 << 64) - 1 if scalar_bits == 64 else (1 << 32) - 1
        values = [p & ((1 << 64) - 1) for p in self.pointers] + [int(v) & mask for v in scalars]
        n = max(len(values), 1)
        self._values = (ctypes.c_uint64 * n)(*values)
        base = ctypes.addressof(self._values)
        self._argv = (ctypes.c_void_p * n)(*range(base, base + 8 * n, 8))

    def __call__(self, stream: int) -> None:
        g, b = self.grid, self.block
        check(
            cu.cuLaunchKernel(
                self.kernel.func,
                g[0],
                g[1],
                g[2],
                b[0],
                b[1],
                b[2],
                self.shared,
                stream,
                ctypes.addressof(self._argv),
                0,
            ),
            f"launch of {self.label}",
        )


class Module:
    """A loaded device-code image (cubin)."""

    def __init__(self, image: bytes) -> None:
        self._buf = ctypes.create_string_buffer(image, len(image))
        self.handle = check(cu.cuModuleLoadData(ctypes.addressof(self._buf)), "cuModuleLoadData")
        # Weakly: a kernel holds its module (kept loaded while launches use it), not the other way.
        self._kernels: weakref.WeakValueDictionary[str, Kernel] = weakref.WeakValueDictionary()

    def function(self, name: str) -> Kernel:
        """The kernel ``name``, looked up once per module (every program sharing the image binds it)."""
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = Kernel(self, name)
        return k

    def __del__(self) -> None:
        try:
            cu.cuModuleUnload(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Graph:
    """A CUDA graph captured from work issued on a stream, replayed with one launch."""

    def __init__(self, stream: Stream, issue: Any) -> None:
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(cu.cuStreamBeginCapture(stream.handle, mode), "cuStreamBeginCapture")
        try:
            issue(stream.handle)
        except BaseException:
            # End the capture (the stream is unusable until then) and free the partial graph it returns:
            # the autotune captures candidates that may fail, and each failure leaked one.
            try:
                _destroy_graph(cu.cuStreamEndCapture(stream.handle))
            except Exception:  # noqa: BLE001 - report the original failure
                pass
            raise
        self._graph = check(cu.cuStreamEndCapture(stream.handle), "cuStreamEndCapture")
        try:
            self._exec = check(cu.cuGraphInstantiate(self._graph, 0), "cuGraphInstantiate")
        except BaseException:
            cu.cuGraphDestroy(self._graph)
            raise

    def launch(self, stream: int) -> None:
        check(cu.cuGraphLaunch(self._exec, stream), "cuGraphLaunch")

    @property
    def exec_handle(self) -> int:
        """The CUgraphExec's address, for the shell's native Run path."""
        return int(self._exec)

    @property
    def graph_handle(self) -> int:
        """The captured CUgraph's address: the shell embeds it between its input and output copies."""
        return int(self._graph)

    def node_counts(self) -> dict[str, int]:
        """The captured graph's nodes by type (``kernel``, ``memcpy``, ``memset``, ...): every kernel a
        replay launches, the libraries' own included (what the benchmark reports as kernels per model)."""
        # cuda.bindings returns (nodes, count): asked for 0 nodes it gives the count only.
        count = int(check(cu.cuGraphGetNodes(self._graph, 0), "cuGraphGetNodes")[-1])
        nodes = check(cu.cuGraphGetNodes(self._graph, count), "cuGraphGetNodes")[0] if count else []
        out: dict[str, int] = {}
        for node in nodes:
            kind = check(cu.cuGraphNodeGetType(node), "cuGraphNodeGetType")
            name = kind.name.removeprefix("CU_GRAPH_NODE_TYPE_").lower()
            out[name] = out.get(name, 0) + 1
        return out

    def __del__(self) -> None:
        try:
            cu.cuGraphExecDestroy(self._exec)
            cu.cuGraphDestroy(self._graph)
        except Exception:  # noqa: BLE001
            pass


def _destroy_graph(ended: Any) -> None:
    """Destroy the graph an ended capture returned, if it returned one (``(err, graph)``)."""
    graph = ended[1] if isinstance(ended, tuple) and len(ended) > 1 else None
    if graph is not None and int(graph) != 0:
        cu.cuGraphDestroy(graph)


class Event:
    def __init__(self) -> None:
        self._e = check(cu.cuEventCreate(0), "cuEventCreate")

    def record(self, stream: int) -> None:
        check(cu.cuEventRecord(self._e, stream), "cuEventRecord")

    def sync(self) -> None:
        check(cu.cuEventSynchronize(self._e), "cuEventSynchronize")

    def elapsed_ms(self, start: Event) -> float:
        return float(check(cu.cuEventElapsedTime(start._e, self._e), "cuEventElapsedTime"))
