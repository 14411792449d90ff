"""cuBLASLt algorithms this process has already run, which quick picks prefer.

Measured on an H100 with cuBLASLt 13.1 (``blas.GemmPlan.run``, ``time.thread_time``): the first
``cublasLtMatmul`` with an algorithm (a kernel and its configuration) the process has not run costs
3-4.4 ms of host time, in the call itself; an algorithm once run costs 30-70 us on its first call for
any other M (8 to 4096 tried), and a second plan of a problem already run costs nothing extra. Its
heuristic picks a different algorithm for nearly every M, so each never-seen BERT-base shape paid
five such first calls (10-19 ms) inside its first Run. A quick pick (a compile on a Run's critical
path, replaced by a timed program in the background) therefore takes a warm algorithm where one is
valid: the best of cuBLASLt's candidates that is warm, else one run for a GEMM of the same kind (types,
transposes, epilogue, alignment) at the nearest size that passes AlgoCheck for this problem, else
cuBLASLt's first candidate. Before asking cuBLASLt at all, a quick pick tries the warm algorithms of
the same layer at other M (``same_layer``): where AlgoCheck takes one, no heuristic query is made.
Timed searches are unchanged (their candidates run, and so become warm).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

# Warm algorithms tried with AlgoCheck before falling back to cuBLASLt's first candidate: each check is
# cheap, but a family may hold many algorithms.
MAX_CHECKS = 6


class WarmPlan(Protocol):
    handle: int  # one per device: what warm state is kept by
    family: Hashable
    m: int
    n: int
    k: int
    batch: int


_lock = threading.Lock()
_run: set[tuple[int, bytes]] = set()  # (handle, algorithm) run in this process
_by_family: dict[tuple[int, Hashable], dict[bytes, tuple[int, int, int, int]]] = {}  # -> (b, m, n, k)
_first_calls = [0]  # algorithms run for the first time in this process (what a warm pick avoids)


def note_run(plan: WarmPlan, algo: bytes) -> None:
    """``plan`` has called cuBLASLt with ``algo``."""
    with _lock:
        if (plan.handle, algo) not in _run:
            _run.add((plan.handle, algo))
            _first_calls[0] += 1
        _by_family.setdefault((plan.handle, plan.family), {})[algo] = (plan.batch, plan.m, plan.n, plan.k)


def first_calls() -> int:
    """How many algorithms this process has run for the first time (tests, benchmarks)."""
    return _first_calls[0]


def _distance(plan: WarmPlan, size: tuple[int, int, int, int]) -> tuple[int, float]:
    """Same N and K first (the same layer at another M), then the nearest problem size."""
    b, m, n, k = size
    same_layer = 0 if (n, k) == (plan.n, plan.k) else 1
    return same_layer, abs(math.log(b * m * n * k) - math.log(plan.batch * plan.m * plan.n * plan.k))


def pick(plan: WarmPlan, candidates: Sequence[bytes], check: Callable[[bytes], bool]) -> bytes | None:
    """The warm algorithm a quick pick takes for ``plan``: the best warm one of cuBLASLt's
    ``candidates`` (best first), else the nearest warm one of its family that ``check`` (AlgoCheck for
    this problem, workspace limit) accepts; None: no warm algorithm serves, take the first candidate."""
    with _lock:
        for algo in candidates:
            if (plan.handle, algo) in _run:
                return algo
        family = dict(_by_family.get((plan.handle, plan.family), {}))
    tried = 0
    for algo in sorted(family, key=lambda a: _distance(plan, family[a])):
        if tried == MAX_CHECKS:
            break
        tried += 1
        if check(algo):
            return algo
    return None


def same_layer(plan: WarmPlan, check: Callable[[bytes], bool]) -> bytes | None:
    """The warm algorithm of ``plan``'s layer at another M (the same family, N and K: a detector's new
    image size, a server's new batch), nearest M first, that ``check`` accepts; None if none. A quick
    pick that finds one makes no heuristic query: ~0.3 ms per GEMM on the H100 host, 13 of them (3.8
    ms) for each never-seen ResNet-50 image size."""
    with _lock:
        family = _by_family.get((plan.handle, plan.family), {})
        mine = {a: size for a, size in family.items() if size[2:] == (plan.n, plan.k)}
    for algo in sorted(mine, key=lambda a: _distance(plan, mine[a]))[:MAX_CHECKS]:
        if check(algo):
            return algo
    return None


__all__ = ["first_calls", "note_run", "pick", "same_layer"]
