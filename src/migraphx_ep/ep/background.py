"""One background thread for compiles nobody waits on (ep/batch_rows.py: a batch size served by a
larger program gets its own program here, off the Run that first saw it).

One thread for the process, so background compiles never compete with each other for the GPU's
library timing, only with the Runs; jobs run in the order given. At interpreter exit the queue is
dropped and the running job is waited for (a compile torn down halfway through CUDA calls could take
the host process with it).
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger("migraphx_ep")

_SWITCH_S = 0.0005


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

    def quiet(self, seconds: float) -> bool:
        """No compile on a Run's critical path for ``seconds``."""
        return time.monotonic() - self.last_foreground > seconds

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
            try:
                if not self._stopping:
                    job()
            except Exception:  # noqa: BLE001 - a job reports its own failures; the thread must live on
                log.exception("migraphx_ep: a background compile failed")
            finally:
                with self._idle:
                    self._pending -= 1
                    self.done += 1
                    if self._pending == 0 and self._saved_interval is not None:
                        sys.setswitchinterval(self._saved_interval)
                        self._saved_interval = None
                    self._idle.notify_all()

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


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Block until the background compiles (batch sizes served by a larger program meanwhile) are
    done; False if ``timeout`` seconds passed first. Benchmarks call it before timing steady state."""
    return BACKGROUND.wait(timeout)


__all__ = ["BACKGROUND", "Background", "wait_for_compiles"]
