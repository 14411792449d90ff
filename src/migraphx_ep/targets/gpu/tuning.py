"""Library algorithm picks by problem, kept for the process: a GEMM or convolution that was timed once
(cuBLASLt candidates, cuDNN Find) is not timed again.

A transformer repeats the same four GEMMs in every layer and a CNN the same convolutions in every block
of a stage: without this, BERT-base timed 48 GEMMs per compile where 4 differ, and every new input shape
of a model timed all of them again. A pick is keyed by the planner's own problem key (element type,
dims, strides, epilogue, TF32, pointer alignment for cuBLASLt), the library handle (one per device)
and the search settings, and is restored through the planner's ``restore``, which re-checks it with the
library (AlgoCheck, workspace limit) -- so a memo can make a pick cheaper, never wrong. It also makes
identical problems use identical algorithms, where separate timings could pick differently by noise.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Hashable, Iterator
from typing import Protocol

_LIMIT = 1 << 16  # picks kept; past it the memo starts afresh (a process fed ever-new shapes)


class PickMemo:
    def __init__(self) -> None:
        self._picks: dict[Hashable, dict] = {}
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: Hashable) -> dict | None:
        with self._lock:
            pick = self._picks.get(key)
            self.hits += pick is not None
            return pick

    def put(self, key: Hashable, pick: dict) -> None:
        with self._lock:
            if len(self._picks) >= _LIMIT:
                self._picks.clear()
            self._picks[key] = pick

    def clear(self) -> None:
        with self._lock:
            self._picks.clear()
            self.hits = 0


PICKS = PickMemo()

# Quick picks: the libraries' own heuristic choice, no timing (cuBLASLt's first candidate, cuDNN's
# heuristic). A compile on a Run's critical path takes them; the EP then compiles the same shape again,
# timed, in the background and replaces the program (ep/compiled.py). Picks are memoised per search
# kind, so a quick pick never stands in for a timed one.
QUICK = contextvars.ContextVar("migraphx_ep_quick_picks", default=False)


@contextlib.contextmanager
def quick_picks(on: bool = True) -> Iterator[None]:
    """Library picks without timing for the compiles in this block (this thread only)."""
    token = QUICK.set(on)
    try:
        yield
    finally:
        QUICK.reset(token)


class Plan(Protocol):
    """What blas.GemmPlan and dnn.ConvPlan have in common for the memo."""

    handle: int
    key: str

    def restore(self, saved: dict, limit: int) -> bool: ...

    def to_dict(self) -> dict: ...


class LayerPicks:
    """The algorithm last picked for each convolution layer (its weights, geometry, epilogue, layouts;
    not its input's spatial size) on each device, which a quick pick for the layer at a new image
    size tries first (dnn.py). cuDNN's heuristic query cost ~2.5 ms per convolution on the H100 host:
    49 ms of each never-seen image size of ResNet-50 (about 20 distinct convolutions). A timed pick
    replaces any; a quick one only a quick one. The caller checks that cuDNN runs the algorithm at the
    new size within the workspace limit (the check ``restore`` makes), so a layer pick is never wrong,
    only maybe slower than the heuristic's until the timed program replaces the quick one."""

    def __init__(self) -> None:
        self._picks: dict[Hashable, tuple[int, int, bool]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> tuple[int, int] | None:
        with self._lock:
            pick = self._picks.get(key)
        return None if pick is None else pick[:2]

    def put(self, key: Hashable, algo: int, math: int, timed: bool) -> None:
        with self._lock:
            if len(self._picks) >= _LIMIT:
                self._picks.clear()
            old = self._picks.get(key)
            if timed or old is None or not old[2]:
                self._picks[key] = (algo, math, timed)


LAYERS = LayerPicks()


def restore_pick(plan: Plan, kind: str, limit: int, search: Hashable) -> bool:
    """Whether ``plan`` took the pick made for the same problem before (``search``: the settings of
    the search that made it, e.g. timed or heuristic only)."""
    picked = PICKS.get((kind, plan.handle, plan.key, limit, search))
    return picked is not None and plan.restore(picked, limit)


def keep_pick(plan: Plan, kind: str, limit: int, search: Hashable) -> None:
    PICKS.put((kind, plan.handle, plan.key, limit, search), plan.to_dict())


__all__ = ["LAYERS", "PICKS", "QUICK", "LayerPicks", "PickMemo", "keep_pick", "quick_picks", "restore_pick"]
