"""Where one compile's time goes: named stages (parse, passes, lowering, nvrtc...) and counts.

``with record() as times:`` collects what this thread runs into ``times`` (a ``CompileTimes``);
``with stage("passes"):`` inside it adds the block's seconds to the stage, ``count("nvrtc", "compiled")``
adds to a stage's counts. With no ``record`` active, ``stage`` and ``count`` only read a context
variable, so the instrumented code pays nearly nothing when nobody asks.

A stage's seconds are its own: a stage nested in another is subtracted from the outer one (the same
name nested, as a subgraph's parse inside its graph's, adds up once), so the stages of one record never
overlap and their shares sum to at most 100%; what no stage covers is shown as ``other``. The recording
is per thread (a ``ContextVar``): two sessions compiling at once do not mix. Work handed to a pool
thread carries it with ``carry(fn)`` (counts only: a pool's time belongs to the caller's stage).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class CompileTimes:
    """Seconds and counts per stage of one compile (or several, when a record is continued)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # pool threads count into the same record
        self.stages: dict[str, float] = {}  # in the order the stages started
        self.counts: dict[str, dict[str, int]] = {}
        self.total = 0.0
        self.running: list[str] = []  # the stages open now, outermost first (a progress report reads it)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.stages[name] = self.stages.get(name, 0.0) + seconds

    def count(self, name: str, what: str, n: int = 1) -> None:
        with self._lock:
            self.stages.setdefault(name, 0.0)
            c = self.counts.setdefault(name, {})
            c[what] = c.get(what, 0) + n

    def merge(self, other: CompileTimes) -> None:
        for name, seconds in other.stages.items():
            self.add(name, seconds)
        for name, c in other.counts.items():
            for what, n in c.items():
                self.count(name, what, n)

    def now(self) -> str:
        """The innermost stage running now ('' between stages). Read from another thread (a progress
        report) while the compile's thread pushes and pops: the stage may end between a length check and
        the read, so the read itself is what is guarded."""
        try:
            return self.running[-1]
        except IndexError:
            return ""

    def seconds(self, name: str) -> float:
        return self.stages.get(name, 0.0)

    def other(self) -> float:
        return max(0.0, self.total - sum(self.stages.values()))

    def rows(self) -> list[tuple[str, float, dict[str, int]]]:
        """(stage, seconds, counts) in the order the stages started, then ``other``."""
        with self._lock:
            rows = [(n, s, dict(self.counts.get(n, {}))) for n, s in self.stages.items()]
        return rows + [("other", self.other(), {})]

    def table(self) -> str:
        total = self.total or 1.0
        lines = [f"{'stage':<16} {'seconds':>9} {'share':>7}  counts"]
        for name, s, c in self.rows():
            lines.append(f"{name:<16} {s:9.3f} {100 * s / total:6.1f}%  {_counts(c)}".rstrip())
        lines.append(f"{'total':<16} {self.total:9.3f} {100.0:6.1f}%")
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: the total, then each stage that ran (and ``other`` if it shows), largest first."""
        rows = sorted(self.rows(), key=lambda r: -r[1])
        shown = [(n, s, c) for n, s, c in rows if n != "other" or round(s, 3)]
        parts = [f"{n} {s:.3f} s" + (f" ({_counts(c)})" if c else "") for n, s, c in shown]
        return f"{self.total:.3f} s" + (f": {', '.join(parts)}" if parts else "")


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in c.items())


@dataclass
class _Frame:
    times: CompileTimes
    nested: float = 0.0  # seconds of the stages directly inside this one
    detached: bool = False  # a pool thread's (``carry``): counts only, its time is the caller's stage


_FRAME: ContextVar[_Frame | None] = ContextVar("migraphx_ep_timing", default=None)


def current() -> CompileTimes | None:
    """The record this thread is filling, if any."""
    f = _FRAME.get()
    return f.times if f is not None else None


@contextmanager
def record(into: CompileTimes | None = None) -> Iterator[CompileTimes]:
    """Collect the stages run inside the block; ``into`` continues an earlier record (its total grows
    by this block's span). A record inside another also adds its stages to the outer one."""
    times = into if into is not None else CompileTimes()
    outer = _FRAME.get()
    frame = _Frame(times)
    token = _FRAME.set(frame)
    t0 = time.perf_counter()
    try:
        yield times
    finally:
        span = time.perf_counter() - t0
        _FRAME.reset(token)
        if outer is None or outer.times is not times:  # else the outer record already spans this one
            times.total += span
        if outer is not None:
            if outer.times is not times:
                outer.times.merge(times)
            outer.nested += frame.nested  # what no stage covered here stays the outer stage's own time


# Called as each stage begins: where a background compile gives way to one on a Run's critical path
# (ep/background.py sets it; it raises there and returns at once everywhere else).
_checkpoint: Callable[[str], None] | None = None


def set_checkpoint(fn: Callable[[str], None] | None) -> None:
    global _checkpoint
    _checkpoint = fn


def checkpoint(name: str) -> None:
    """A point inside a long stage where a background compile may give way too (``set_checkpoint``):
    each node of a parse, each pass."""
    if _checkpoint is not None:
        _checkpoint(name)


def stage(name: str) -> AbstractContextManager[None]:
    """Add the block's own seconds (less those of stages inside it) to ``name`` in the active record.
    A stage's start is a checkpoint (``set_checkpoint``)."""
    checkpoint(name)
    outer = _FRAME.get()
    if outer is None or outer.detached:
        return _NOTHING  # no clock, no frame: what instrumented code pays when nobody records
    return _Stage(outer, name)


class _Stage:
    def __init__(self, outer: _Frame, name: str) -> None:
        self.outer, self.name = outer, name

    def __enter__(self) -> None:
        self.outer.times.add(self.name, 0.0)  # the table lists stages in the order they started
        self.frame = _Frame(self.outer.times)
        self.token = _FRAME.set(self.frame)
        self.outer.times.running.append(self.name)
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        dt = time.perf_counter() - self.t0
        _FRAME.reset(self.token)
        self.outer.times.running.pop()
        self.outer.nested += dt
        self.outer.times.add(self.name, dt - self.frame.nested)


_NOTHING = nullcontext()


def count(name: str, what: str, n: int = 1) -> None:
    """Add ``n`` to the count ``what`` of stage ``name`` in the active record (if any)."""
    f = _FRAME.get()
    if f is not None:
        f.times.count(name, what, n)


def carry(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` for a pool thread, counting into this thread's record (a pool thread has its own context).
    Stages there add nothing: the caller's stage around the pool already holds their wall time."""
    f = _FRAME.get()
    if f is None:
        return fn
    times = f.times

    def run(*args, **kwargs) -> T:
        token = _FRAME.set(_Frame(times, detached=True))
        try:
            return fn(*args, **kwargs)
        finally:
            _FRAME.reset(token)

    return run


__all__ = ["CompileTimes", "carry", "count", "current", "record", "stage"]
