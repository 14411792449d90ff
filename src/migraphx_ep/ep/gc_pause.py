"""The cyclic garbage collector paused while a program compiles.

A compile allocates hundreds of thousands of IR objects (instructions, shapes, ops, modules) that refer
to each other. While it runs, each young collection promotes those alive at that moment, and soon all
of them sit in the oldest generation, where they die as cycles that only a full collection frees. Full
collections then come often and walk the whole heap, the subgraph's kept programs included: a 200-call
shape sweep on the H100 spent 14-20 % of its time in them, up to 1.4 s at once inside one never-seen
shape's compile (``bench/shapes.py``: ``gc_s``, ``gc_max_ms``, ``slowest_new_shape``). So a compile
runs with the collector off; when the last running compile ends, one young collection frees its cycles
(a few ms for BERT-base) and what it keeps is promoted once. ``MIGRAPHX_EP_PAUSE_GC=0`` leaves the
collector alone; a collector the process turned off stays off.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

from ..switches import env_choice

_lock = threading.Lock()
_depth = 0  # compiles running now, on any thread
_restore = False  # the collector was on when the first of them began


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block (nested and concurrent blocks: until the last one ends)."""
    global _depth, _restore
    if env_choice("MIGRAPHX_EP_PAUSE_GC", "1", ("0", "1")) == "0":
        yield
        return
    with _lock:
        if _depth == 0:
            _restore = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            collect = _depth == 0 and _restore
            if collect:
                gc.enable()
        if collect:
            gc.collect(0)


__all__ = ["gc_paused"]
