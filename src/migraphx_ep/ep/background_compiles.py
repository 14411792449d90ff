"""What a compiled subgraph compiles off a Run's critical path (ep/compiled.py mixes it in):

* batch rows: a never-seen batch size runs at once on a larger batch's program, its own compiles on the
  background thread (ep/batch_rows.py, ep/batch_serve.py);
* quick picks: a compile on a Run's critical path takes the libraries' untimed picks (the gpu target,
  targets/gpu/tuning.py), and the same shape compiles again, timed, in the background and replaces it.

Both wait for ``QUIET_S`` without a compile on a Run's critical path (any subgraph), so a background
compile never holds the build lock or the GIL that a new shape's compile is waiting for.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.program import Program
from ..switches import env_choice
from .background import BACKGROUND
from .batch_rows import BatchRows, capacity
from .batch_serve import BatchServing
from .cache import ProgramStore
from .options import EpOptions
from .runtime_dims import RuntimeDims

log = logging.getLogger("migraphx_ep")

ShapeKey = tuple[tuple[int, ...], ...]
# Seconds without a compile on a Run's critical path before a background compile starts.
QUIET_S = 1.0


def library_picks(quick: bool) -> contextlib.AbstractContextManager:
    """The gpu target's untimed library picks for a compile (targets/gpu/tuning.py), when ``quick``."""
    if not quick:
        return contextlib.nullcontext()
    from ..targets.gpu.tuning import quick_picks

    return quick_picks()


class BackgroundCompiles:
    """What ``CompiledSubgraph`` compiles off a Run's critical path: batch sizes served by a larger
    batch's program until their own is compiled (ep/batch_serve.py), and quick programs replaced by
    timed ones. Mixed into ``CompiledSubgraph``; it uses that class's programs, locks and ``_build``."""

    name: str
    target: str
    input_names: list[str]
    options: EpOptions
    store: ProgramStore | None
    programs: OrderedDict[ShapeKey, Program]
    rows: BatchServing | None
    runtime: RuntimeDims
    _runtime_pending: bool
    _closed: bool
    _lock: threading.Lock
    _build: Callable[..., Program]
    _insert: Callable[[ShapeKey, Program], None]
    _compile_dims: Callable[[ShapeKey], ShapeKey]

    # -- batch sizes served by a larger batch's program (ep/batch_serve.py) ------------------------
    def _serve(self, key: ShapeKey) -> tuple[Program, int, BatchRows] | None:
        """A program of a larger batch for input dims ``key`` with none of its own, that batch and
        the proof (``_run_padded`` queues its own program for the background). None: compile ``key``
        as usual."""
        rows = self.rows
        if rows is None or self._runtime_pending:
            return None
        with self._lock:
            b = rows.batch_of(key)
            if key in self.programs or b is None or rows.refused:
                return None
            donor = rows.donor(key, self.programs)
            if donor is None and capacity(b) == b:
                return None  # compiled as it is (batch 1, say): nothing to serve, nothing to prove yet
            if not rows.first and not rows.known(key):
                # New other dims (a new sequence length, say): compiled as usual, and proven in the
                # background once no compile has been on the critical path for QUIET_S (the proof's
                # parses hold the build lock), so a workload whose new shapes are not batch sizes
                # pays nothing more.
                if BACKGROUND.quiet(QUIET_S):
                    self._submit(lambda me: me.rows.proof(key))
                return None
            proof = rows.proof(key)
            if proof is None:
                return None
            if donor is None:
                donor = rows.with_batch(key, capacity(b))
                rows.capacities.add(donor)
                prog = self._build(donor, None, donor, {}, quick=self._quick())
                self._insert(donor, prog)
                BACKGROUND.note_foreground()
                if getattr(prog, "quick_picks", False):
                    self._time_later(donor, prog)
            self.programs.move_to_end(donor)
            return self.programs[donor], rows.batch_of(donor), proof  # type: ignore[return-value]

    def _compile_later(self, key: ShapeKey) -> None:
        """On the background thread: ``key``'s own program, used by its Runs from then on."""
        rows = self.rows
        assert rows is not None
        try:
            prog = None if self._closed else self._build(key, None, key, {})
        except Exception as e:  # noqa: BLE001 - keep serving it padded; say why once
            log.warning("%s: compiling input dims %s failed (%s); a larger batch's program serves them",
                        self.name, [list(d) for d in key], e)  # fmt: skip
            with self._lock:
                rows.failed.add(key)
                rows.pending.discard(key)
            return
        with self._lock:
            if prog is not None and not self._closed:
                self._insert(key, prog)
            rows.pending.discard(key)

    # -- quick library picks on the critical path, timed ones in the background ---------------------
    def _quick(self) -> bool:
        """Whether a compile on a Run's critical path takes the libraries' untimed picks (the gpu
        target; not with migraphx_exhaustive_tune, nor for run-time dims). ``MIGRAPHX_EP_QUICK_PICKS``:
        0 off, 1 on for every target, unset: the gpu target."""
        flag = env_choice("MIGRAPHX_EP_QUICK_PICKS", "auto", ("auto", "0", "1"))
        if flag == "0" or self.options.exhaustive_tune or self.runtime or self._runtime_pending:
            return False
        store = self.store
        if store is not None and store.enabled and (store.save_path or store.load_path or not self.programs):
            # A file named to save a program to gets the timed one at once, and so does a model cache
            # at a subgraph's first compile: a process that runs one shape and exits stores what the
            # next one loads. Later shapes take quick picks; their timed programs, compiled in the
            # background, are what the cache stores (a process that exits first stores none of them).
            return False
        return flag == "1" or self.target == "gpu"

    def _time_later(self, key: ShapeKey, quick: Program) -> None:
        """Queue the timed compile of ``key``, run once no compile is on a Run's critical path: it
        replaces ``quick`` (if that is still ``key``'s program) and revokes the shell's plans of it."""
        quick_ref = weakref.ref(quick)

        def work(me: BackgroundCompiles) -> None:
            with me._lock:
                if me.programs.get(key) is not quick_ref():
                    return
            try:
                me._replace_quick(key, quick_ref())  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - the quick program goes on serving
                log.warning("%s: the timed compile of input dims %s failed (%s)", me.name, key, e)

        self._submit(work, wait_quiet=True)

    def _submit(self, work: Callable[[Any], None], wait_quiet: bool = False) -> bool:
        """Queue ``work(self)`` on the background thread (after ``QUIET_S`` without a compile on a Run's
        critical path, if ``wait_quiet``), holding this subgraph only weakly until it starts. A queued job
        waits behind the others, and while new shapes keep compiling no job starts at all: a strong
        reference would keep every session destroyed meanwhile alive, its programs' device memory and
        the graph's initializer views included (200 ResNet-50 sessions: 12 GB of device memory)."""
        me = weakref.ref(self)

        def job() -> None:
            if wait_quiet:
                BACKGROUND.wait_quiet(QUIET_S)
            target = me()
            if target is None or target._closed or BACKGROUND.stopping:
                return  # the session is gone, or the process is exiting: no compile now
            work(target)

        return BACKGROUND.submit(job)

    def _replace_quick(self, key: ShapeKey, quick: Program) -> None:
        """Compile ``key`` timed; it replaces ``quick`` if that is still ``key``'s program, and the
        shell's plans of ``quick`` are revoked (its next Run of ``key`` asks Python for the new one)."""
        timed = self._build(key, None, self._compile_dims(key), self.runtime)
        with self._lock:
            if self.programs.get(key) is quick and not self._closed:
                self.programs[key] = timed
                token = getattr(getattr(quick, "_exe", None), "token", None)
                if token is not None:
                    token.revoke()

    def settle(self) -> None:
        """Every quick program replaced by its timed one now (an EPContext model keeps what it gets)."""
        with self._lock:
            quick = [(k, p) for k, p in self.programs.items() if getattr(p, "quick_picks", False)]
        for key, prog in quick:
            self._replace_quick(key, prog)

    def _run_padded(
        self, served: tuple[Program, int, BatchRows], inputs: list[np.ndarray], key: ShapeKey
    ) -> list[np.ndarray]:
        """Run a batch on a larger batch's program: inputs padded, outputs cut (ep/batch_serve.py);
        then queue its own program (after the Run, which would otherwise share the GIL with it)."""
        prog, size, proof = served
        rows = self.rows
        assert rows is not None
        b = int(inputs[rows.batch[0]].shape[0])
        feeds = dict(zip(self.input_names, rows.pad(inputs, size), strict=True))
        outs = [np.asarray(o) for o in rows.cut(list(prog.run_numpy(feeds, borrow_outputs=True)), proof, b)]
        with self._lock:
            # Not while new shapes still compile on the critical path: a background compile would
            # hold the build lock they wait for. A later padded Run of this size asks again.
            if key not in self.programs and BACKGROUND.quiet(QUIET_S):
                rows.later(key, lambda k: self._submit(lambda me: me._compile_later(k)))
        return outs
