"""Progress of a long compile on a Run's critical path: a warning every ``MIGRAPHX_EP_PROGRESS_S``
seconds (default 5; 0: never) while it runs, naming the subgraph, its input dims, the time so far, the
stage it is in and the stages done, so a first Run that takes a while is not mistaken for a hang.

A watcher thread per compile waits on an event that the compile's end sets, so a compile shorter than
the interval logs nothing and costs only the thread's start (tens of microseconds). Background compiles
(ep/background.py) report nothing: nobody waits on them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator

from ..timing import CompileTimes

log = logging.getLogger("migraphx_ep")

_DEFAULT_S = 5.0


def progress_interval() -> float:
    """``MIGRAPHX_EP_PROGRESS_S``: seconds between reports (0 or less: none); a non-number is an error."""
    raw = os.environ.get("MIGRAPHX_EP_PROGRESS_S", "").strip()
    if not raw:
        return _DEFAULT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ValueError(f"MIGRAPHX_EP_PROGRESS_S={raw!r}: expected seconds between reports (0: none)")
    return seconds


@contextlib.contextmanager
def compile_progress(what: str, times: CompileTimes) -> Iterator[None]:
    """Report ``times`` (the compile's own record) every interval until the block ends."""
    every = progress_interval()
    if every <= 0:
        yield
        return
    done = threading.Event()
    t0 = time.monotonic()

    def watch() -> None:
        while not done.wait(every):
            finished = [f"{name} {s:.1f} s" for name, s in list(times.stages.items()) if s >= 0.05]
            log.warning(
                "%s: still compiling, %.0f s so far, now %s%s",
                what,
                time.monotonic() - t0,
                times.now() or "between stages",
                f" (so far: {', '.join(finished)})" if finished else "",
            )

    watcher = threading.Thread(target=watch, name="migraphx-ep-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


__all__ = ["compile_progress", "progress_interval"]
