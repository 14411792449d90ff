"""One background thread for compiles nobody waits on (ep/batch_rows.py: a batch size served by a
larger program gets its own program here, off the Run that first saw it).

One thread for the process, so background compiles never compete with each other for the GPU's
library timing, only with the Runs; jobs run in the order given. At interpreter exit the queue is
dropped and the running job is waited for (a compile torn down halfway through CUDA calls could take
the host process with it).

A compile on a Run's critical path (``foreground``) comes first: the running job gives way at its next
checkpoint (each stage's start: parse, passes, lowering, NVRTC, each library search; within them each
parsed node and each pass), raising ``Preempted``, which unwinds it (and releases the subgraph's build
lock the Run's compile may be waiting for); it is queued again, to start over once no compile is on a
Run's critical path.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator

from .. import timing

log = logging.getLogger("migraphx_ep")

_SWITCH_S = 0.0005


class Preempted(BaseException):
    """A background job gave way to a compile on a Run's critical path; it runs again later. Not an
    Exception: the ``except Exception`` that turns a failed compile into a warning must let it pass."""


class Background:
    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # queued + running
        self.done = 0  # jobs finished (benchmarks report it)
        self._saved_interval: float | None = None  # the switch interval found before the jobs began
        self.last_foreground = 0.0  # time.monotonic() of the latest compile on a Run's critical path
        self._foreground = 0  # compiles on a Run's critical path running or waiting now (any subgraph)
        self.preempted = 0  # jobs that gave way to one (benchmarks and tests read it)
        self._stopping = False

    def submit(self, job: Callable[[], None]) -> bool:
        """Run ``job`` on the background thread; False when the process is exiting (not queued)."""
        with self._lock:
            if self._stopping:
                return False
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="migraphx-ep-compile", daemon=True)
                self._thread.start()
        self._jobs.put(job)
        return True

    @property
    def stopping(self) -> bool:
        """The process is exiting: a job still running should end without starting more work."""
        return self._stopping

    def note_foreground(self) -> None:
        """A compile on a Run's critical path just finished (any subgraph)."""
        self.last_foreground = time.monotonic()

    def on_thread(self) -> bool:
        """The caller is the background thread (a job's own compile)."""
        return threading.current_thread() is self._thread

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """A compile on a Run's critical path: from here until it ends, a running job gives way at its
        next stage. Nothing on the background thread itself."""
        if self.on_thread():
            yield
            return
        with self._lock:
            self._foreground += 1
        try:
            yield
        finally:
            with self._lock:
                self._foreground -= 1
            self.note_foreground()

    def checkpoint(self, stage: str = "") -> None:
        """Where a job may give way: raises ``Preempted`` on the background thread while a compile on a
        Run's critical path runs or waits (``timing.stage`` calls it as each stage begins)."""
        if self._foreground and self.on_thread():
            raise Preempted(stage)

    def quiet(self, seconds: float) -> bool:
        """No compile on a Run's critical path now, nor for the last ``seconds``."""
        return not self._foreground and time.monotonic() - self.last_foreground > seconds

    def wait_quiet(self, seconds: float) -> None:
        """Block (a job) until ``quiet(seconds)``, or the process is exiting."""
        while not self._stopping and not self.quiet(seconds):
            time.sleep(min(seconds, 0.05))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no job is queued or running; False if ``timeout`` seconds passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            # A compile is Python through and through: at the default 5 ms switch interval, a Run
            # served meanwhile waits up to 5 ms for the GIL after each of its driver calls. While a
            # job runs, the interval is 0.5 ms (the value found is restored when the queue empties).
            with self._lock:
                if self._saved_interval is None:
                    self._saved_interval = sys.getswitchinterval()
                    sys.setswitchinterval(min(self._saved_interval, _SWITCH_S))
            if self._run(job):
                continue  # queued again: still pending
            with self._idle:
                self._pending -= 1
                self.done += 1
                if self._pending == 0 and self._saved_interval is not None:
                    sys.setswitchinterval(self._saved_interval)
                    self._saved_interval = None
                self._idle.notify_all()

    def _run(self, job: Callable[[], None]) -> bool:
        """Run ``job``; True when it gave way (``Preempted``) and is queued again, at the back, to start
        once no compile is on a Run's critical path."""
        try:
            if not self._stopping:
                job()
        except Preempted as e:
            self.preempted += 1
            log.debug("migraphx_ep: a background compile gave way at stage %s; queued again", e)
            self._jobs.put(self._after_foreground(job))
            return True
        except Exception:  # noqa: BLE001 - a job reports its own failures; the thread must live on
            log.exception("migraphx_ep: a background compile failed")
        return False

    def _after_foreground(self, job: Callable[[], None]) -> Callable[[], None]:
        def later() -> None:
            while self._foreground and not self._stopping:
                time.sleep(0.01)
            job()

        return later

    def stop(self, timeout: float = 120.0) -> None:
        """At exit: drop queued jobs, let the running one finish (up to ``timeout`` seconds)."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout)


BACKGROUND = Background()
atexit.register(BACKGROUND.stop)
timing.set_checkpoint(BACKGROUND.checkpoint)


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Block until the background compiles (batch sizes served by a larger program meanwhile) are
    done; False if ``timeout`` seconds passed first. Benchmarks call it before timing steady state."""
    return BACKGROUND.wait(timeout)


__all__ = ["BACKGROUND", "Background", "Preempted", "wait_for_compiles"]
