"""A fused subgraph claimed by the EP: compiled once per input-shape key, run on every Compute.

Shapes seen at Run pick a compiled program from a bounded LRU cache; a new shape compiles (once,
under a lock: ORT may call Compute concurrently) instead of failing or silently recompiling forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

import numpy as np

from ..frontend.parser import ParseNeedsValue, parse_graph
from ..frontend.probe import probe_parse
from ..ir.dtypes import DType, from_onnx, to_numpy
from ..ir.evaluate import AssumptionFailed
from ..ir.instruction import Instruction
from ..ir.program import Program
from ..ir.shape import Shape
from ..ir.weights import WeightCache
from ..timing import CompileTimes, record
from .background import BACKGROUND
from .background_compiles import BackgroundCompiles, library_picks
from .batch_serve import BatchServing, batch_inputs
from .batch_serve import enabled as batch_rows_enabled
from .cache import ProgramStore, graph_fingerprint, program_key
from .gc_pause import gc_paused
from .options import EpOptions
from .progress import compile_progress
from .runtime_dims import RuntimeDims, candidates, other_size, prove, with_free_axes
from .shape_template import TemplateCompiles, Templates, templates_enabled
from .subgraphs import EP_NAME

log = logging.getLogger("migraphx_ep")

ShapeKey = tuple[tuple[int, ...], ...]
# compile_program(prog, options, tensors): tensors maps ONNX value names to the parsed program's
# instructions (calibration tables name tensors so).
CompileProgram = Callable[[Program, EpOptions, Mapping[str, Instruction]], None]


class InputError(ValueError):
    """Run was given inputs the compiled subgraph cannot take (count, element type, dims)."""


def _owned(graph: dict) -> dict:
    """Keep the initializers as given: ORT keeps their buffers alive as fused-node inputs until release
    (see ep/bridge.py), so views stay valid and multi-GB weights are never copied."""
    return dict(graph)


class CompiledSubgraph(BackgroundCompiles, TemplateCompiles):
    def __init__(
        self,
        graph: dict,
        name: str,
        options: EpOptions,
        compile_program: CompileProgram,
        store: ProgramStore | None = None,
        target: str = "ref",
        programs: Mapping[ShapeKey, Program] | None = None,
        compile_optimised: Callable[[Program, EpOptions, str], None] | None = None,
        needs_values: dict[int, list[str]] | None = None,
    ) -> None:
        self.name = name
        self.options = options
        self.graph = _owned(graph)
        self._compile_program = compile_program
        self.store = store
        self.target = target
        self.loads = 0  # programs taken from .mxr files instead of compiling
        self._fingerprint: str | None = None
        values = graph.get("values", {})
        self.input_names: list[str] = list(graph["inputs"])
        self.output_names: list[str] = list(graph["outputs"])
        self.input_types: list[DType] = [from_onnx(values[n]["dtype"]) for n in self.input_names]
        self.input_dims: list[list | None] = [values[n].get("shape") for n in self.input_names]
        self.programs: OrderedDict[ShapeKey, Program] = OrderedDict()
        self.compiles = 0  # how many programs were built (tests and stats read this)
        self._lock = threading.Lock()  # the programs and the keys' state
        self._build_lock = threading.Lock()  # one compile of this subgraph at a time (background too)
        self._closed = False
        self._warned_values = False
        # What the compiles for each input shape share about the weights (ir/weights.py): literals,
        # folded and converted weights, host layouts, the gpu target's device copies.
        self.weights = WeightCache()
        # Input axes one program may serve at every size (ep/runtime_dims.py), proven at the first
        # compile (``_settle_runtime``); until then ``_runtime_pending``. ``padded``: the gpu target
        # compiles them at a capacity and pads (targets/gpu/runtime_dims.py); the ref as they come.
        self.runtime: RuntimeDims = {}
        self._runtime_pending = False
        self.padded = target == "gpu"
        # A batch size served by a larger batch's program while its own compiles (ep/batch_serve.py).
        self.rows: BatchServing | None = None
        # A never-seen shape instantiated from the optimised programs of others (ep/shape_template.py).
        self.templates: Templates | None = None
        self._compile_optimised = compile_optimised
        # An EPContext node (ep/epcontext.py): its programs were compiled earlier and loaded; the graph
        # holds nothing to parse, so a shape without a program is an error rather than a compile.
        self.frozen = programs is not None
        if programs is not None:
            self.value_inputs: list[int] = []
            self.programs.update(programs)
            self.loads = len(programs)
            return
        # Inputs whose *values* some node needs at compile time (axes, shapes, pads...): their values
        # join the compile key, so each distinct value compiles once (value specialisation). The
        # partition's probe found them where it claimed the whole graph (``needs_values``).
        if needs_values is None:
            needs_values = probe_parse(self.graph, specialize=True).needs_values
        wanted = {n for names in needs_values.values() for n in names}
        self.value_inputs = [i for i, n in enumerate(self.input_names) if n in wanted]
        if target in ("ref", "gpu") and os.environ.get("MIGRAPHX_EP_RUNTIME_DIMS", "1") not in ("", "0"):
            self.runtime = candidates(self.graph)
            self._runtime_pending = bool(self.runtime)
        if compile_optimised is not None and not self.value_inputs and templates_enabled(target):
            self.templates = Templates(self.input_names, self.input_dims)
        batch = batch_inputs(self.graph) if batch_rows_enabled(target) else []
        # Two programs at least: a capacity and a size of its own (with one, each would evict the other).
        if batch and not self.value_inputs and not self.runtime and options.max_compiled_models >= 2:
            self.rows = BatchServing(self.graph, self.input_types, batch, self.weights, self._build_lock)
        if self.value_inputs:
            pass  # nothing can compile before the values are seen at the first Run
        elif all(d is not None and all(isinstance(x, int) and x >= 0 for x in d) for d in self.input_dims):
            self.program_for(tuple(tuple(d) for d in self.input_dims))  # type: ignore[arg-type]
        else:
            self._precompile_batches()

    # -- compiling --------------------------------------------------------------------------------
    def _build(
        self,
        key: ShapeKey,
        values: dict[str, np.ndarray] | None = None,
        dims: ShapeKey | None = None,
        runtime: RuntimeDims | None = None,
        store: bool = True,
        quick: bool = False,
    ) -> Program:
        """Compile for ``key``; ``dims`` are the real input dims when ``key`` leaves run-time axes free
        (-1), ``runtime`` those axes. ``store``: look up and save .mxr files (not for a proof's probe).
        ``quick``: library picks without timing (``_time_later`` replaces the program; not saved)."""
        dims = dims if dims is not None else key[: len(self.input_names)]
        if self.frozen:
            raise InputError(
                f"{self.name}: this EPContext node holds programs for input dims "
                f"{' or '.join(str([list(d) for d in k]) for k in self.programs)}, not "
                f"{[list(d) for d in dims]}; compile the original model for these dims, or run it instead"
            )
        shapes = {n: Shape(t, d) for n, t, d in zip(self.input_names, self.input_types, dims, strict=True)}
        pkey = None
        if store and self.store is not None and self.store.enabled:
            if self._fingerprint is None:
                self._fingerprint = graph_fingerprint(self.graph)
            pkey = program_key(self._fingerprint, key[: len(dims)], values, self.options, self.target)
            loaded = self.store.lookup(pkey, self.name)
            if loaded is not None:
                self.loads += 1
                return loaded
        # Every new input shape compiles anew: the log says what each one cost, and where the time went.
        # On a Run's critical path, a background compile gives way first (it may hold the build lock).
        # The garbage collector waits for the compile to end (ep/gc_pause.py).
        named = [f"{n}{list(d)}" for n, d in zip(self.input_names, key[: len(dims)], strict=True)]
        inputs = ", ".join(named[:6]) + (f" and {len(named) - 6} more" if len(named) > 6 else "")  # KV caches
        with (
            gc_paused(),
            BACKGROUND.foreground(),
            self._build_lock,
            record() as times,
            library_picks(quick),
            self._progress(f"{EP_NAME}: {self.name}, inputs {inputs}", times),
        ):
            prog = self._instantiate(dims) if not values and not runtime else None
            how = "instantiated from a shape template" if prog is not None else "compiled"
            if prog is None:
                parsed = parse_graph(
                    self.graph, shapes, specialize=True, input_values=values, runtime_dims=runtime,
                    weights=self.weights,
                )  # fmt: skip
                prog = parsed.program
                self._compile_program(prog, self.options, parsed.values)
                if self.templates is not None and not values and not runtime:
                    self._learn(dims, prog)
        prog.quick_picks = quick  # type: ignore[attr-defined]
        self.compiles += 1
        if log.isEnabledFor(logging.INFO):  # the summary is built only for a log that shows it
            summary = times.summary()
            log.info("%s: %s for %s, inputs %s, in %s", EP_NAME, how, prog.target_name, inputs, summary)
        if pkey is not None and not quick:
            self.store.store(pkey, prog, self.name)  # type: ignore[union-attr]
        return prog

    @staticmethod
    def _progress(what: str, times: CompileTimes) -> contextlib.AbstractContextManager:
        """Progress warnings while a compile that a Run waits for takes long (ep/progress.py)."""
        return contextlib.nullcontext() if BACKGROUND.on_thread() else compile_progress(what, times)

    def _key(self, key: ShapeKey) -> ShapeKey:
        """The cache key of input dims ``key`` (plus value bytes): run-time axes as -1."""
        if not self.runtime:
            return key
        n = len(self.input_names)
        return with_free_axes(key[:n], self.input_names, self.runtime, self.padded) + key[n:]

    def _compile_dims(self, key: ShapeKey) -> ShapeKey:
        """The dims the program for input dims ``key`` is compiled at: padded run-time axes at their
        capacity (the key holds minus it), the rest as they are."""
        dims = self._key(key)[: len(self.input_names)] if self.padded else key[: len(self.input_names)]
        return tuple(tuple(abs(d) for d in ds) for ds in dims)

    def _settle_runtime(self, exact: ShapeKey, values: dict[str, np.ndarray] | None) -> None:
        """At the first compile: keep the run-time axes only if a program for these dims is, instruction
        for instruction, the one for other sizes (runtime_dims.prove); the proven program is kept."""
        self._runtime_pending = False
        n = len(self.input_names)
        dims = exact[:n]
        try:
            first = self._build(self._key(exact), values, self._compile_dims(exact), self.runtime)
            if self.padded and first.target_name == "gpu":
                reason = None  # its pipeline checked that padding is exact, or raised
            else:  # the ref's proof (also for a gpu subgraph the EP compiled for the ref target instead)
                other = other_size(dims, self.input_names, self.runtime)
                second = self._build(other, values, other, self.runtime, store=False)
                reason = prove(first, second)
        except ParseNeedsValue:
            self._runtime_pending = True  # run() learns the value input, then proves with its value
            raise
        except Exception as e:  # noqa: BLE001 - any failure only means: compile per size, as before
            reason = f"{type(e).__name__}: {e}"
        if reason is None:
            self.programs[self._key(exact)] = first
            log.info(
                "%s: one program serves every size of %s (run-time dims)",
                self.name,
                ", ".join(f"{k} axes {list(v)}" for k, v in self.runtime.items()),
            )
            return
        log.info("%s: sizes of %s stay in the compile key: %s", self.name, sorted(self.runtime), reason)
        self.runtime = {}

    def _drop_runtime(self, why: str) -> None:
        """A run broke an assumption of the run-time-dims program: compile per size from now on."""
        with self._lock:
            if not self.runtime:
                return
            log.info("%s: %s; compiling per size of %s from now on", self.name, why, sorted(self.runtime))
            self.runtime = {}
            n = len(self.input_names)
            for key in [k for k in self.programs if any(x < 0 for d in k[:n] for x in d)]:
                del self.programs[key]

    def program_for(self, key: ShapeKey, values: dict[str, np.ndarray] | None = None) -> Program:
        with self._lock:
            if self._runtime_pending:
                self._settle_runtime(key, values)
            exact, key = key, self._key(key)
            prog = self.programs.get(key)
            if prog is not None:
                self.programs.move_to_end(key)
                return prog
            if values and self.compiles >= self.options.max_compiled_models and not self._warned_values:
                self._warned_values = True
                log.warning(
                    "%s: input(s) %s change value between runs and each new value compiles a new "
                    "program; make them constants (initializers) to avoid recompiling",
                    self.name,
                    sorted(values),
                )
            quick = self._quick() and not values
            prog = self._build(key, values, self._compile_dims(exact), self.runtime, quick=quick)
            self._insert(key, prog)
            BACKGROUND.note_foreground()
            if getattr(prog, "quick_picks", False):
                self._time_later(key, prog)
            return prog

    def _insert(self, key: ShapeKey, prog: Program) -> None:
        """Keep ``prog`` for ``key`` (under ``_lock``), evicting the least recently used past the limit."""
        self.programs[key] = prog
        self.programs.move_to_end(key)
        # A batch capacity's program serves the sizes below it (ep/batch_serve.py): evicted last.
        keep = self.rows.capacities if self.rows is not None else set()
        while len(self.programs) > self.options.max_compiled_models:
            evicted = next((k for k in self.programs if k not in keep), next(iter(self.programs)))
            del self.programs[evicted]
            log.info(
                "%s: evicted compiled program for input dims %s (max_compiled_models=%d)",
                self.name,
                evicted,
                self.options.max_compiled_models,
            )

    def release(self) -> None:
        """The session let go of this subgraph: its queued background compiles are dropped."""
        self._closed = True

    def _precompile_batches(self) -> None:
        """With max_dynamic_batch, compile power-of-two batch sizes ahead of the first Run."""
        limit = self.options.max_dynamic_batch
        if limit <= 0 or not self.input_dims:
            return
        if any(d is None or not d for d in self.input_dims):
            return
        rest_static = all(all(isinstance(x, int) and x >= 0 for x in d[1:]) for d in self.input_dims)  # type: ignore
        batch_syms = {d[0] for d in self.input_dims if not isinstance(d[0], int)}  # type: ignore[index]
        if not rest_static or len(batch_syms) != 1:
            return
        b = 1
        while b <= limit:
            key = tuple(
                tuple([b if not isinstance(d[0], int) else d[0], *d[1:]])  # type: ignore[index]
                for d in self.input_dims
            )
            self.program_for(key)  # type: ignore[arg-type]
            b *= 2

    # -- running ----------------------------------------------------------------------------------
    def native_plan(self, inputs: list[np.ndarray]) -> dict | bool | None:
        """After a Run of ``inputs``: how the C++ shell may run the same input dims again without Python
        (``GpuExecutable.native_plan``); None when it cannot (value-specialised inputs, the ref target);
        False when not yet (a larger batch's program serves the dims, or the graph is not captured yet)."""
        if self.value_inputs:
            return None
        key = self._key(tuple(tuple(int(n) for n in a.shape) for a in inputs))
        with self._lock:
            prog = self.programs.get(key)
            if prog is None and self.rows is not None and key not in self.rows.failed:
                # Served by a larger batch's program while its own compiles (again, if it was
                # evicted): ask after the next Run, rather than never.
                return False
        plan = getattr(getattr(prog, "_exe", None), "native_plan", None)
        if plan is None:
            return None
        return plan(self.input_names, inputs, self.options.max_compiled_models)

    def check_inputs(self, inputs: list[np.ndarray]) -> ShapeKey:
        if len(inputs) != len(self.input_names):
            raise InputError(f"{self.name}: expected {len(self.input_names)} inputs, got {len(inputs)}")
        for name, t, dims, arr in zip(
            self.input_names, self.input_types, self.input_dims, inputs, strict=True
        ):
            if arr.dtype != to_numpy(t):
                raise InputError(
                    f"{self.name}: input {name!r} has element type {arr.dtype}, expected {to_numpy(t)}"
                )
            if dims is not None:
                if len(dims) != arr.ndim:
                    raise InputError(f"{self.name}: input {name!r} has rank {arr.ndim}, expected {len(dims)}")
                for axis, (want, got) in enumerate(zip(dims, arr.shape, strict=True)):
                    if isinstance(want, int) and want >= 0 and want != got:
                        raise InputError(f"{self.name}: input {name!r} dim {axis} is {got}, expected {want}")
        return tuple(tuple(int(n) for n in a.shape) for a in inputs)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        dims = self.check_inputs(inputs)
        served = None
        for _ in range(len(self.input_names) + 1):
            values = None
            key = dims
            if self.value_inputs:
                values = {self.input_names[i]: inputs[i] for i in self.value_inputs}
                key = dims + tuple((inputs[i].tobytes(),) for i in self.value_inputs)  # type: ignore[operator]
            try:
                served = None if values else self._serve(key)
                if served is not None:
                    break
                prog = self.program_for(key, values)
                break
            except ParseNeedsValue as e:
                # A parser stops at the first input it needs by value (Slice: starts, then ends):
                # learn the next one now that real values are at hand, and specialise on it too.
                new = [
                    i for i, n in enumerate(self.input_names) if n in e.names and i not in self.value_inputs
                ]
                if not new:
                    raise
                with self._lock:
                    self.value_inputs = sorted(set(self.value_inputs) | set(new))
        else:  # pragma: no cover - each round adds an input, so the loop ends first
            raise RuntimeError(f"{self.name}: value specialisation did not settle")
        if served is not None:
            return self._run_padded(served, inputs, key)
        # The C++ shell copies the results into ORT's output tensors before this thread runs again.
        try:
            outs = prog.run_numpy(dict(zip(self.input_names, inputs, strict=True)), borrow_outputs=True)
        except AssumptionFailed as e:
            if not self.runtime:
                raise
            self._drop_runtime(str(e))
            return self.run(inputs)
        return [np.asarray(o) for o in outs]
