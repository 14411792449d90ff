"""A lowered program bound to one GPU: buffers allocated, kernels loaded, library plans chosen, and the
whole step list captured once as a CUDA graph.

Run = copy inputs in, launch the graph, copy outputs out, on one stream, then one synchronisation (and a
look at the kernels' error slots, ``errors.py``): a handful of driver calls whatever the model's size.
Runs on one executable are serialised by a lock (they share the arena), so concurrent ``Run`` calls on
one session give right answers. Inside the EP, only a shape's first Runs come here (two by default: the
first launches the steps eagerly, the second captures the graph, ``context.capture_run``); then
``native_plan`` tells the C++ shell how to do the same Run without Python (``csrc/native_run.h``),
sharing the lock.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import Hashable
from concurrent.futures import Future
from typing import Any

import numpy as np

from ...ir.dtypes import to_numpy
from ...timing import count, record, stage
from . import cuda
from .context import RunContext, max_contexts
from .errors import DeviceErrors
from .kernels.spec import KernelSpec, Unsupported, canonical
from .library_steps import Launch, LibrarySteps
from .memory import ALIGN, Storage, align
from .nvrtc import adopt_images, compile_images, compile_others_later
from .runtime_dims import native_pad, pad_inputs
from .steps import Buf, ConvStep, GemmStep, KernelStep, Lowered, plan_lowered
from .tuning import QUICK
from .weights import DeviceWeights

log = logging.getLogger("migraphx_ep.gpu")


def _plan_token() -> object | None:
    """The shell's PlanToken (native_run.h), None where the extension is not built."""
    try:
        from ... import _C

        return _C.PlanToken()
    except (ImportError, AttributeError):
        return None


# Loaded modules by (device, image key), while some program holds them (GpuExecutable._module).
_LOADED: weakref.WeakValueDictionary[tuple[int, str], cuda.Module] = weakref.WeakValueDictionary()
_LOADED_LOCK = threading.Lock()


# Each thread's pinned staging buffer per device, which every program's Python Runs on it borrow for
# their outputs (grown as needed). Pinning host memory costs about a millisecond per call, and a
# never-seen shape's program makes only its first two Runs through Python (the shell runs the rest).
_STAGING = threading.local()


def pinned_staging(device_id: int, nbytes: int) -> cuda.PinnedBuffer:
    """This thread's staging buffer on ``device_id``, at least ``nbytes`` long. It grows to a quarter
    more than asked (a few regrowths as shapes grow, and at most 25% over the largest outputs: an
    LLM's logits may be a gigabyte), and the old buffer is freed."""
    pools: dict[int, cuda.PinnedBuffer] | None = getattr(_STAGING, "pools", None)
    if pools is None:
        pools = _STAGING.pools = {}
    buf = pools.get(device_id)
    if buf is None or buf.nbytes < nbytes:
        pools.pop(device_id, None)
        del buf  # freed before the larger one is pinned
        buf = pools[device_id] = cuda.PinnedBuffer(nbytes + nbytes // 4)
    return buf


class GpuExecutable(LibrarySteps):
    def __init__(
        self,
        lowered: Lowered,
        device: cuda.Device,
        *,
        allow_tf32: bool,
        artifacts: dict | None = None,
        param_shapes: dict | None = None,
        weights: DeviceWeights | None = None,
        padded: dict | None = None,
    ) -> None:
        t0 = time.perf_counter()
        self.device = device
        self.lowered = lowered
        self.allow_tf32 = allow_tf32
        self.param_shapes = param_shapes
        # Inputs with run-time axes, compiled at a capacity (runtime_dims.py): padded before each run.
        self.padded = dict(padded or {})
        artifacts = artifacts or {}
        self._images: dict[str, bytes] = dict(artifacts.get("kernels", {}))
        self._loaded_images = bool(self._images)
        self._plans: dict[str, dict] = dict(artifacts.get("plans", {}))
        self._modules: dict[str, cuda.Module] = {}  # loaded once, shared by every context
        self._grow = threading.Lock()  # one context built at a time (library handles, capture)
        # Library picks without timing (tuning.QUICK): such a program is replaced by a timed one.
        self.quick = QUICK.get()
        # Revoked when the EP replaces this program: the shell then drops its plans (native_run.h).
        self.token = _plan_token()
        with stage("memory plan"):
            self.arena_bytes = plan_lowered(lowered)
        with stage("weights upload"):
            # ``weights``: the device copies the other programs of this subgraph uploaded (weights.py).
            self._place_weights(weights if weights is not None else DeviceWeights(device_id=device.id))
        self.checking_specs = [s.spec for s in lowered.steps if isinstance(s, KernelStep)]
        self.workspace_bytes = ALIGN
        # The first context serves the Python Run path; more come when native Runs overlap.
        self.contexts: list[RunContext] = [RunContext(self, defer=True)]
        self.compile_seconds = time.perf_counter() - t0

    # -- planning ------------------------------------------------------------------------------------------
    def _place_weights(self, pool: DeviceWeights) -> None:
        placed = pool.place(self.lowered.weights)
        self.weight_blocks = placed.blocks  # held: every Run (and the captured graph) reads them
        self._weight_at = placed.addresses
        self.weight_bytes = sum(align(max(w.nbytes, 1)) for w in self.lowered.weights)
        self.uploaded_weight_bytes = placed.uploaded
        count("weights upload", "shared", placed.shared)
        count("weights upload", "uploaded", len(self.lowered.weights) - placed.shared)

    def weight_address(self, st: Storage) -> int:
        """The device address of weight storage ``st`` (a block this program shares or uploaded)."""
        return self._weight_at[id(st)]

    # The first context's parts, for the Python Run path and the tools that time a program's graph.
    @property
    def stream(self) -> cuda.Stream:
        return self.contexts[0].stream

    @property
    def graph(self) -> cuda.Graph | None:
        return self.contexts[0].graph

    @property
    def errors(self) -> DeviceErrors:
        return self.contexts[0].errors

    @property
    def arena(self) -> cuda.DeviceBuffer:
        return self.contexts[0].arena

    @property
    def workspace(self) -> cuda.DeviceBuffer:
        return self.contexts[0].workspace  # type: ignore[return-value]

    @property
    def inputs(self) -> list:
        return self.contexts[0].inputs

    @property
    def outputs(self) -> list:
        return self.contexts[0].outputs

    @property
    def _launches(self) -> list[Launch]:
        return self.contexts[0].launches

    def ptr(self, b: Buf) -> int:
        return self.contexts[0].ptr(b)

    # -- binding -------------------------------------------------------------------------------------------
    def bind(self, ctx: RunContext) -> list[Launch]:
        """The steps as launches on ``ctx``'s addresses (kernels compiled and library plans chosen once,
        by the first context; later ones reuse them)."""
        steps = self.lowered.steps
        # One compile and module per distinct kernel body (canonical: the symbol renamed).
        kernels = {id(s): canonical(s.spec) for s in steps if isinstance(s, KernelStep)}
        keys = self._compile_kernels(list(kernels.values()))
        launches: list[Launch] = []
        modules = self._modules
        # Library plans by problem: repeated layers' GEMMs (and blocks' convolutions) share one plan.
        # A plan takes its pointers at each call, so the steps of one context may share it; contexts
        # (concurrent Runs) do not.
        plans: dict[Hashable, Any] = {}
        for i, s in enumerate(steps):
            if all(b.shape.elements() == 0 for b in s.writes):
                continue
            if isinstance(s, KernelStep):
                spec = kernels[id(s)]
                key = keys[spec.source]
                mod = modules.get(key)
                if mod is None:
                    mod = modules[key] = self._module(key)
                ptrs = [ctx.ptr(b) for b in s.reads] + [ctx.ptr(b) for b in s.writes]
                ptrs += [ctx.errors.pointer(s.spec)] if s.spec.checks else []
                launches.append(cuda.BoundLaunch(mod.function(spec.name), spec.grid, spec.block,
                                                 spec.shared_bytes, ptrs, label=s.spec.name,
                                                 scalars=spec.args, scalar_bits=spec.arg_bits))  # fmt: skip
            elif isinstance(s, GemmStep | ConvStep):
                try:
                    bind = self._bind_gemm if isinstance(s, GemmStep) else self._bind_conv
                    launches.append(bind(i, s, ctx, plans))  # type: ignore[operator]
                except Unsupported as e:
                    log.info("%s: library refused (%s); using a generated kernel", s.label, e)
                    launches.append(self._bind_fallback(s, ctx))
            else:  # pragma: no cover - lowering only makes the three kinds
                raise TypeError(f"unknown step {s!r}")
        return launches

    def _module(self, key: str) -> cuda.Module:
        """The image ``key`` loaded on this device: shared with the live programs that loaded it (a
        never-seen shape's kernels are nearly all loaded already), unloaded when none holds it."""
        with _LOADED_LOCK:
            mod = _LOADED.get((self.device.id, key))
            if mod is None:
                with stage("module load"):
                    mod = _LOADED[(self.device.id, key)] = cuda.Module(self._images[key])
            return mod

    # Kernels that came with the program (a .mxr): at the first binding they join the process's cache,
    # for later shapes, and their variants for other sizes are compiled in the background (``variants``:
    # that work); a compile here does both itself.
    _loaded_images = False
    variants: Future | None = None

    def _compile_kernels(self, specs: list[KernelSpec]) -> dict[str, str]:
        """Every spec's image in ``_images``; each source's image key."""
        keys = compile_images(specs, self.device.arch, self._images)
        if self._loaded_images:
            self._loaded_images = False
            adopt_images(self._images)
            self.variants = compile_others_later(specs, self.device.arch)
        return keys

    # -- running -------------------------------------------------------------------------------------------
    def _issue(self, stream: int) -> None:
        self.contexts[0].issue(stream)

    # The EP copies outputs into ORT's tensors right after Run returns, so it may borrow them: they
    # are views of this thread's pinned staging buffer, valid until the thread's next Run of a program.
    borrows_outputs = True

    def _staging(self) -> list[np.ndarray | None]:
        offsets: list[int | None] = []
        total = 0
        for o in self.outputs:
            offsets.append(None if isinstance(o, np.ndarray) else total)
            total += 0 if isinstance(o, np.ndarray) else align(max(o[1].bytes(), 1))
        buf = pinned_staging(self.device.id, total)
        return [
            None if at is None else buf.view(to_numpy(o[1].type), o[1].lens, at)  # type: ignore[index]
            for o, at in zip(self.outputs, offsets, strict=True)
        ]

    def prepare(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``params`` as the program's parameters take them (Program.run_numpy calls this first)."""
        return pad_inputs(params, self.padded) if self.padded else params

    def run(self, params: dict[str, np.ndarray], borrow: bool = False) -> list[np.ndarray]:
        self.device.make_current()  # ORT may call from any thread; pinned allocation needs the context
        staging = self._staging() if borrow else None
        ctx = self.contexts[0]
        # A shape's first Run (eager: copies, every step launched one by one, the sync) is a stage of its
        # own in a record around the Run (bench/shapes.py): it is most of what no compile stage shows.
        with ctx.lock, stage("first run") if not ctx.warm else contextlib.nullcontext():
            s = self.stream.handle
            keep = []
            for name, ptr, _shape in self.inputs:
                arr = np.ascontiguousarray(params[name])
                keep.append(arr)
                cuda.memcpy_htod(ptr, arr, s)
            # Eager until the Run that captures (context.capture_run); the first Run is the warm-up.
            graph = ctx.graph if ctx.warm and ctx.capture_due(ctx.runs + 1) else None
            if graph is not None:
                graph.launch(s)
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
            ctx.warm = True
            ctx.runs += 1
            self.errors.raise_if_set()
            return results

    def native_plan(
        self, input_names: list[str], arrays: list[np.ndarray], capacity: int
    ) -> dict | bool | None:
        """What the C++ shell needs to run this program without Python (``csrc/native_run.h``), for the
        fused node's inputs ``input_names`` as given in ``arrays``; None when it cannot (no CUDA graph,
        or an input whose bytes differ from the parameter's, e.g. a converted type); False when not yet:
        the graph is captured at the program's ``capture_run()``-th Run (context.py), so ask again then."""
        first = self.contexts[0]
        if type(first.lock).__name__ != "RunLock":
            return None
        with first.lock:  # a deferred capture (RunContext) while another thread's Run uses the stream
            if not first.capture_due(first.runs):
                return False
            graph = first.graph  # would capture that Run's launches too, or invalidate the capture
        if graph is None and first.launches:
            return None
        shapes = {name: shape for name, _, shape in first.inputs}
        input_bytes, pads = [], []
        for name, arr in zip(input_names, arrays, strict=True):
            shape = shapes.get(name)
            pads.append(None)
            if shape is None:
                input_bytes.append(0)  # not a program parameter (the program ignores it)
                continue
            if arr is None:
                return None
            if name in self.padded:
                pad = native_pad(arr, *self.padded[name])
                if pad is None:
                    return None
                pads[-1] = pad
            elif shape.bytes() != arr.nbytes or tuple(shape.lens) != arr.shape:
                return None
            input_bytes.append(shape.bytes())
        outputs = []
        for o in first.outputs:
            if isinstance(o, np.ndarray):
                raw = np.ascontiguousarray(o).tobytes()
                outputs.append((raw, len(raw), [int(d) for d in o.shape]))
            else:
                outputs.append((None, o[1].bytes(), [int(d) for d in o[1].lens]))
        return {
            "context": int(self.device.context),
            "device": self.device.id,
            "input_bytes": input_bytes,
            "pads": pads,
            "outputs": outputs,
            "contexts": [c.native(input_names) for c in self.contexts],
            "max_contexts": max_contexts(),
            "grow": functools.partial(self.add_context, list(input_names)),
            "owner": self,
            **({"token": self.token} if self.token is not None else {}),
            "capacity": capacity,
        }

    def add_context(self, input_names: list[str]) -> dict:
        """Another execution context (the shell asks when concurrent Runs find all of them busy)."""
        with self._grow:
            self.device.make_current()
            with record():  # its warm-up and capture are not a compile: keep them out of any report
                ctx = RunContext(self)
            self.contexts.append(ctx)
            log.info("gpu program: execution context %d for concurrent Runs", len(self.contexts))
            return ctx.native(input_names)

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
            "weight_bytes": self.weight_bytes,
            "weight_bytes_uploaded": self.uploaded_weight_bytes,
            "workspace_bytes": self.workspace.nbytes,
            "cuda_graph": self.graph is not None,
            "checking_kernels": len(self.errors.specs),
            "contexts": len(self.contexts),
        }


__all__ = ["GpuExecutable", "Storage"]
