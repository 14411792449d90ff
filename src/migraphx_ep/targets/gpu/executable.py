"""A lowered program bound to one GPU: buffers allocated, kernels loaded, library plans chosen, and the
whole step list captured once as a CUDA graph.

Run = copy inputs in, launch the graph, copy outputs out, on one stream, then one synchronisation (and a
look at the kernels' error slots, ``errors.py``): a handful of driver calls whatever the model's size.
Runs on one executable are serialised by a lock (they share the arena), so concurrent ``Run`` calls on
one session give right answers. Inside the EP, only a shape's first Run comes here: ``native_plan``
tells the C++ shell how to do the same Run without Python (``csrc/native_run.h``), sharing the lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...ir.dtypes import to_numpy
from ...timing import carry, count, stage
from . import cuda
from .errors import DeviceErrors
from .kernels.spec import KernelSpec, Unsupported
from .lowering import Buf, ConvStep, GemmStep, KernelStep, Lowered, plan_lowered
from .memory import ALIGN, Storage, align
from .nvrtc import compile_source, source_key

log = logging.getLogger("migraphx_ep.gpu")

Launch = Callable[[int], None]


def _run_lock() -> Any:
    """The shell's RunLock (a C++ mutex the native Run path takes without the GIL), so Python and native
    Runs of one executable exclude each other; a plain lock where the extension is not built."""
    try:
        from ... import _C

        return _C.RunLock()
    except (ImportError, AttributeError):
        return threading.Lock()


def _use_graphs() -> bool:
    return os.environ.get("MIGRAPHX_EP_DISABLE_CUDA_GRAPH", "0") in ("", "0")


class GpuExecutable:
    def __init__(
        self,
        lowered: Lowered,
        device: cuda.Device,
        *,
        allow_tf32: bool,
        artifacts: dict | None = None,
        param_shapes: dict | None = None,
    ) -> None:
        t0 = time.perf_counter()
        self.device = device
        self.lowered = lowered
        self.allow_tf32 = allow_tf32
        self.param_shapes = param_shapes
        self._lock = _run_lock()
        self._local = threading.local()
        self.stream = cuda.Stream()
        artifacts = artifacts or {}
        self._images: dict[str, bytes] = dict(artifacts.get("kernels", {}))
        self._plans: dict[str, dict] = dict(artifacts.get("plans", {}))
        with stage("memory plan"):
            self.arena_bytes = plan_lowered(lowered)
        self.arena = cuda.alloc(self.arena_bytes)
        with stage("weights upload"):
            self._upload_weights()
        self.errors = DeviceErrors([s.spec for s in lowered.steps if isinstance(s, KernelStep)])
        launches = self._bind()
        self.workspace = cuda.alloc(self._workspace_bytes)
        self._launches = launches
        self.inputs = [(name, self.ptr(b), b.shape) for name, b in lowered.inputs.items()]
        self.outputs: list[tuple[int, Any] | np.ndarray] = [
            o if isinstance(o, np.ndarray) else (self.ptr(o), o.shape) for o in lowered.outputs
        ]
        # Warm up eagerly once (first launches load code; libraries allocate lazily), then capture. The
        # warm-up reads an uninitialised arena: the checks it trips are noise, cleared before any Run.
        with stage("warm-up"):
            self._issue(self.stream.handle)
            self.stream.sync()
        self.errors.clear()
        self.graph: cuda.Graph | None = None
        if _use_graphs() and self._launches:
            try:
                with stage("graph capture"):
                    self.graph = cuda.Graph(self.stream, self._issue)
            except cuda.CudaError as e:
                log.warning("CUDA graph capture failed (%s); launching steps one by one", e)
                self.graph = None
        self.compile_seconds = time.perf_counter() - t0

    # -- planning ------------------------------------------------------------------------------------------
    def _upload_weights(self) -> None:
        total = 0
        for w in self.lowered.weights:
            w.offset = total
            total += align(max(w.nbytes, 1))
        self.weights = cuda.alloc(total)
        # One host staging block, one copy: thousands of small literals cost one transfer.
        host = np.zeros(total, np.uint8)
        for w in self.lowered.weights:
            raw = np.asarray(w.value).reshape(-1).view(np.uint8)
            host[w.offset : w.offset + raw.size] = raw
        cuda.memcpy_htod(self.weights.ptr, host, self.stream)
        self.stream.sync()

    def ptr(self, b: Buf) -> int:
        base = self.weights.ptr if b.storage.kind == "weight" else self.arena.ptr
        return base + b.storage.offset + b.offset

    # -- binding -------------------------------------------------------------------------------------------
    def _bind(self) -> list[Launch]:
        steps = self.lowered.steps
        kernel_steps = [s for s in steps if isinstance(s, KernelStep)]
        self._compile_kernels([s.spec for s in kernel_steps])
        self._workspace_bytes = ALIGN
        self._ws_users: list[Any] = []
        launches: list[Launch] = []
        modules: dict[str, cuda.Module] = {}
        for i, s in enumerate(steps):
            if all(b.shape.elements() == 0 for b in s.writes):
                continue
            if isinstance(s, KernelStep):
                key = source_key(s.spec.source, self.device.arch)
                mod = modules.get(key)
                if mod is None:
                    with stage("module load"):
                        mod = modules[key] = cuda.Module(self._images[key])
                ptrs = [self.ptr(b) for b in s.reads] + [self.ptr(b) for b in s.writes]
                ptrs += [self.errors.pointer(s.spec)] if s.spec.checks else []
                launches.append(cuda.BoundLaunch(mod.function(s.spec.name), s.spec.grid, s.spec.block,
                                                 s.spec.shared_bytes, ptrs))  # fmt: skip
            elif isinstance(s, GemmStep | ConvStep):
                try:
                    bind = self._bind_gemm if isinstance(s, GemmStep) else self._bind_conv
                    launches.append(bind(i, s))
                except Unsupported as e:
                    log.info("%s: library refused (%s); using a generated kernel", s.label, e)
                    launches.append(self._bind_fallback(s, modules))
            else:  # pragma: no cover - lowering only makes the three kinds
                raise TypeError(f"unknown step {s!r}")
        return launches

    def _bind_fallback(self, s: GemmStep | ConvStep, modules: dict) -> Launch:
        """The product on a generated kernel, then bias/residual/relu as one pointwise pass in place."""
        from . import kernels as K
        from .kernels.spec import PwInput, PwOp
        from .lowering import _IDENTITY

        out = s.writes[0]
        a, b = s.reads[0], s.reads[1]
        if isinstance(s, GemmStep) and s.conv_op is not None:
            spec = K.conv_kernel(f"fb{id(s)}_conv", s.conv_op, a.shape, b.shape, out.shape)
        elif isinstance(s, GemmStep):
            spec = K.gemm_kernel(f"fb{id(s)}_gemm", a.shape, b.shape, out.shape)
        else:
            spec = K.conv_kernel(f"fb{id(s)}_conv", s.op, a.shape, b.shape, out.shape)
        specs = [(spec, [self.ptr(a), self.ptr(b), self.ptr(out)])]
        extra = s.reads[2:]
        relu = s.relu
        if extra or relu:
            from ...ir.operation import OPS

            expr = PwOp(_IDENTITY, (PwInput(0),), out.shape.type)
            for j in range(len(extra)):
                expr = PwOp(OPS["add"](), (expr, PwInput(j + 1)), out.shape.type)
            if relu:
                expr = PwOp(OPS["relu"](), (expr,), out.shape.type)
            shapes = [out.shape] + [e.shape for e in extra]
            ep = K.pointwise_kernel(f"fb{id(s)}_epilogue", expr, shapes, out.shape)
            specs.append((ep, [self.ptr(out)] + [self.ptr(e) for e in extra] + [self.ptr(out)]))
        self._compile_kernels([sp for sp, _ in specs])
        bound = []
        for sp, ptrs in specs:
            key = source_key(sp.source, self.device.arch)
            mod = modules.get(key) or modules.setdefault(key, cuda.Module(self._images[key]))
            bound.append(cuda.BoundLaunch(mod.function(sp.name), sp.grid, sp.block, sp.shared_bytes, ptrs))

        def launch(stream: int) -> None:
            for f in bound:
                f(stream)

        return launch

    def _compile_kernels(self, specs: list[KernelSpec]) -> None:
        arch = self.device.arch
        todo: dict[str, KernelSpec] = {}
        for sp in specs:
            key = source_key(sp.source, arch)
            if key not in self._images:
                todo[key] = sp
        if not todo:
            return
        workers = min(len(todo), max(os.cpu_count() or 1, 1), 16)
        work = carry(lambda sp: compile_source(sp.source, arch, sp.name))  # counts compiles vs cache hits
        with stage("nvrtc"), ThreadPoolExecutor(workers) as ex:
            images = list(ex.map(work, todo.values()))
        self._images.update(zip(todo.keys(), images, strict=True))

    def _bind_gemm(self, i: int, s: GemmStep) -> Launch:
        from . import blas

        key = f"gemm{i}"
        a, b = self.ptr(s.reads[0]), self.ptr(s.reads[1])
        rest = list(s.reads[2:])
        bias = self.ptr(rest.pop(0)) if s.has_bias else 0
        d = self.ptr(s.writes[0])
        c = self.ptr(rest.pop(0)) if s.has_residual else d
        la, lb, lc = (blas.MatLayout(*t) for t in s.layouts)
        count("library search", "gemm")
        with stage("library search"):  # cuBLASLt heuristics and timing (none with a stored plan)
            p = blas.plan_gemm(
                s.dtype, s.batch, s.m, s.n, s.k, la, lb, lc,
                beta=1.0 if s.has_residual else 0.0, bias=s.has_bias, relu=s.relu, allow_tf32=self.allow_tf32,
                tuned=self._plans.get(key), tune=True, alignment=_alignment(a, b, c, d, bias),
            )  # fmt: skip
        self._plans[key] = p.to_dict()
        self._workspace_bytes = max(self._workspace_bytes, align(p.workspace_size))
        return lambda stream: p.run(stream, a, b, c, d, bias, self.workspace.ptr)

    def _bind_conv(self, i: int, s: ConvStep) -> Launch:
        from . import dnn

        key = f"conv{i}"
        x, w = s.reads[0], s.reads[1]
        k = x.shape.ndim() - 2
        pads, strides, dil = s.op.attrs(k)  # type: ignore[attr-defined]
        y = s.writes[0]
        count("library search", "conv")
        with stage("library search"):  # cuDNN Find (none with a stored plan)
            p = dnn.plan_conv(
                x.shape.type, x.shape, w.shape, y.shape, tuple(pads[:k]), tuple(pads[k:]), tuple(strides),
                tuple(dil), s.op.group, bias=s.has_bias, relu=s.relu, residual=s.has_residual,  # type: ignore
                allow_tf32=self.allow_tf32, tuned=self._plans.get(key),
                z=s.reads[-1].shape if s.has_residual else None,
            )  # fmt: skip
        self._plans[key] = p.to_dict()
        self._workspace_bytes = max(self._workspace_bytes, align(p.workspace_size))
        rest = list(s.reads[2:])
        bias = self.ptr(rest.pop(0)) if s.has_bias else 0
        z = self.ptr(rest.pop(0)) if s.has_residual else 0
        xp, wp, yp = self.ptr(x), self.ptr(w), self.ptr(y)
        return lambda stream: p.run(stream, xp, wp, yp, bias, z, self.workspace.ptr)

    # -- running -------------------------------------------------------------------------------------------
    def _issue(self, stream: int) -> None:
        for launch in self._launches:
            launch(stream)

    # The EP copies outputs into ORT's tensors right after Run returns, so it may borrow them: they
    # are views of this thread's pinned staging buffers, valid until the thread's next Run here.
    borrows_outputs = True

    def _staging(self) -> list[np.ndarray]:
        views = getattr(self._local, "views", None)
        if views is None:
            bufs, views = [], []
            for o in self.outputs:
                if isinstance(o, np.ndarray):
                    views.append(None)
                    continue
                _, shape = o
                buf = cuda.PinnedBuffer(shape.bytes())
                bufs.append(buf)
                views.append(buf.view(to_numpy(shape.type), shape.lens))
            self._local.bufs, self._local.views = bufs, views
        return views

    def run(self, params: dict[str, np.ndarray], borrow: bool = False) -> list[np.ndarray]:
        self.device.make_current()  # ORT may call from any thread; pinned allocation needs the context
        staging = self._staging() if borrow else None
        with self._lock:
            s = self.stream.handle
            keep = []
            for name, ptr, _shape in self.inputs:
                arr = np.ascontiguousarray(params[name])
                keep.append(arr)
                cuda.memcpy_htod(ptr, arr, s)
            if self.graph is not None:
                self.graph.launch(s)
            else:
                self._issue(s)
            results: list[np.ndarray] = []
            for j, o in enumerate(self.outputs):
                if isinstance(o, np.ndarray):
                    results.append(o.copy())
                    continue
                ptr, shape = o
                host = staging[j] if staging is not None else np.empty(shape.lens, to_numpy(shape.type))
                cuda.memcpy_dtoh(host, ptr, s)
                results.append(host)
            self.stream.sync()
            self.errors.raise_if_set()
            return results

    def native_plan(self, input_names: list[str], arrays: list[np.ndarray], capacity: int) -> dict | None:
        """What the C++ shell needs to run this program without Python (``csrc/native_run.h``), for the
        fused node's inputs ``input_names`` as given in ``arrays``; None when it cannot (no CUDA graph,
        or an input whose bytes differ from the parameter's, e.g. a converted type)."""
        if (self.graph is None and self._launches) or type(self._lock).__name__ != "RunLock":
            return None
        where = {name: (ptr, shape) for name, ptr, shape in self.inputs}
        inputs = []
        for name, arr in zip(input_names, arrays, strict=True):
            if name not in where:
                inputs.append((0, 0))
                continue
            ptr, shape = where[name]
            if arr is None or shape.bytes() != arr.nbytes or tuple(shape.lens) != arr.shape:
                return None
            inputs.append((ptr, shape.bytes()))
        outputs = []
        for o in self.outputs:
            if isinstance(o, np.ndarray):
                raw = np.ascontiguousarray(o).tobytes()
                outputs.append((raw, len(raw), [int(d) for d in o.shape]))
            else:
                ptr, shape = o
                outputs.append((ptr, shape.bytes(), [int(d) for d in shape.lens]))
        slots = self.errors.host
        return {
            "context": int(self.device.context),
            "device": self.device.id,
            "stream": self.stream.handle,
            "graph": self.graph.exec_handle if self.graph is not None else 0,  # 0: nothing to launch
            "inputs": inputs,
            "outputs": outputs,
            "errors": (slots.ctypes.data if slots.size else 0, int(slots.size)),
            "lock": self._lock,
            "owner": self,
            "capacity": capacity,
        }

    def artifacts(self) -> dict:
        """Kernel images and library plans: stored in a .mxr so a load compiles and searches nothing."""
        return {"kernels": dict(self._images), "plans": dict(self._plans)}

    def serialize(self) -> bytes:
        """The .mxr "compiled" section (``mxr.save`` calls this)."""
        import msgpack

        return msgpack.packb(
            {**self.artifacts(), "arch": self.device.arch, "allow_tf32": self.allow_tf32}, use_bin_type=True
        )

    def summary(self) -> dict:
        kinds: dict[str, int] = {}
        for s in self.lowered.steps:
            kinds[type(s).__name__] = kinds.get(type(s).__name__, 0) + 1
        return {
            "steps": len(self.lowered.steps),
            "kinds": kinds,
            "arena_bytes": self.arena_bytes,
            "weight_bytes": self.weights.nbytes,
            "workspace_bytes": self.workspace.nbytes,
            "cuda_graph": self.graph is not None,
            "checking_kernels": len(self.errors.specs),
        }


def _alignment(*ptrs: int) -> int:
    """The largest power of two (at most 256) dividing every non-null pointer: views such as slices
    can start off a 256-byte boundary, and cuBLASLt must pick kernels that allow it."""
    a = 256
    for p in ptrs:
        while p and p % a:
            a //= 2
    return a


__all__ = ["GpuExecutable", "Storage"]
