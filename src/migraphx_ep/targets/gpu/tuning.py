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

import threading
from collections.abc import Hashable
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


class Plan(Protocol):
    """What blas.GemmPlan and dnn.ConvPlan have in common for the memo."""

    handle: int
    key: str

    def restore(self, saved: dict, limit: int) -> bool: ...

    def to_dict(self) -> dict: ...


def restore_pick(plan: Plan, kind: str, limit: int, search: Hashable) -> bool:
    """Whether ``plan`` took the pick made for the same problem before (``search``: the settings of
    the search that made it, e.g. timed or heuristic only)."""
    picked = PICKS.get((kind, plan.handle, plan.key, limit, search))
    return picked is not None and plan.restore(picked, limit)


def keep_pick(plan: Plan, kind: str, limit: int, search: Hashable) -> None:
    PICKS.put((kind, plan.handle, plan.key, limit, search), plan.to_dict())


__all__ = ["PICKS", "PickMemo", "keep_pick", "restore_pick"]
