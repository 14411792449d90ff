"""Serving a never-seen batch size from a program compiled for a larger one (ep/batch_rows.py).

A subgraph whose inputs share a symbolic axis 0 (``batch_inputs``) is proven row by row once per
combination of its other dims (``BatchServing.proof``: two parses, no compile). Then a batch size with
no program of its own runs on the smallest compiled program of a larger batch -- its inputs padded
with copies of their last row (valid inputs: no index goes out of range, no NaN appears), its outputs
cut to their first rows -- and its own program compiles on the background thread (ep/background.py);
once there, Runs of that size use it (steady state is the specialised program). Where no larger
program exists, the next power of two compiles (``batch_rows.capacity``), so sizes up to N put about
log2(N) compiles on the critical path.

``MIGRAPHX_EP_BATCH_ROWS``: 0 off; 1 on for every target; unset: on for the gpu target (where a
compile costs what this saves) and off for the ref.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import numpy as np

from ..frontend.parser import parse_graph
from ..ir.dtypes import DType
from ..ir.module import Module
from ..ir.shape import Shape
from ..ir.weights import WeightCache
from ..switches import env_choice
from .background import BACKGROUND
from .batch_rows import BatchRows, NotRowwise, prove

log = logging.getLogger("migraphx_ep")

ShapeKey = tuple[tuple[int, ...], ...]


def enabled(target: str) -> bool:
    flag = env_choice("MIGRAPHX_EP_BATCH_ROWS", "auto", ("auto", "0", "1"))
    return flag == "1" or (flag == "auto" and target == "gpu")


def batch_inputs(graph: dict) -> list[int]:
    """The inputs whose axis 0 is one shared symbolic dim (by name; an unnamed one only when it is the
    only such input): the batch. Empty when there is none, or several that may differ."""
    values = graph.get("values", {})
    found: dict[object, list[int]] = {}
    for i, name in enumerate(graph["inputs"]):
        dims = (values.get(name) or {}).get("shape")
        if dims and not (isinstance(dims[0], int) and dims[0] >= 0):
            found.setdefault(dims[0] if isinstance(dims[0], str) and dims[0] else None, []).append(i)
    if len(found) != 1 or (None in found and len(found[None]) > 1):
        return []
    return next(iter(found.values()))


class BatchServing:
    def __init__(
        self,
        graph: dict,
        input_types: list[DType],
        batch: list[int],
        weights: WeightCache,
        build_lock: threading.Lock,
    ) -> None:
        self.graph = graph
        # The subgraph's compiles hold it: a parse shares ``weights`` (and its per-compile state) with them.
        self.build_lock = build_lock
        self.names: list[str] = list(graph["inputs"])
        self.types = input_types
        self.batch = batch
        self.weights = weights
        self._proofs: dict[ShapeKey, BatchRows | None] = {}
        self.pending: set[ShapeKey] = set()  # sizes compiling in the background
        self.failed: set[ShapeKey] = set()  # sizes whose own compile failed: served padded from now on
        self.capacities: set[ShapeKey] = set()  # programs compiled to serve smaller sizes
        self.refused = False  # a proof failed: no batch is served padded in this subgraph

    # -- keys ---------------------------------------------------------------------------------------
    def batch_of(self, key: ShapeKey) -> int | None:
        """The batch size of input dims ``key``: axis 0 of the batch inputs, when they agree."""
        sizes = {key[i][0] for i in self.batch if len(key[i]) > 0}
        return sizes.pop() if len(sizes) == 1 and len(key) == len(self.names) else None

    def rest(self, key: ShapeKey) -> ShapeKey:
        return self.with_batch(key, -1)

    def with_batch(self, key: ShapeKey, b: int) -> ShapeKey:
        return tuple((b, *d[1:]) if i in self.batch else d for i, d in enumerate(key))

    # -- the proof ----------------------------------------------------------------------------------
    def proof(self, key: ShapeKey) -> BatchRows | None:
        """Whether these dims (all but the batch) may be served padded; proven once per such dims.
        After the first refusal nothing more is proven: the reason is the graph's, not the dims'."""
        rest = self.rest(key)
        if rest not in self._proofs:
            self._proofs[rest] = None if self.refused else self._prove(key)
            self.refused = self._proofs[rest] is None
        return self._proofs[rest]

    def known(self, key: ShapeKey) -> bool:
        """Whether ``proof(key)`` is settled (no parse to wait for)."""
        return self.refused or self.rest(key) in self._proofs

    @property
    def first(self) -> bool:
        """No dims proven yet: the subgraph's first compile, which proves on the critical path."""
        return not self._proofs

    def _prove(self, key: ShapeKey) -> BatchRows | None:
        sizes = (3, 5)  # odd, so no other dim is a multiple of both by chance
        try:
            with BACKGROUND.foreground(), self.build_lock:  # on a Run's path: background gives way
                mods = [self._parse(key, b) for b in sizes]
            rows = prove(mods[0], mods[1], sizes, {self.names[i] for i in self.batch})
        except NotRowwise as e:
            log.info("batch sizes of %s stay in the compile key: %s", self._label(), e)
            return None
        except Exception as e:  # noqa: BLE001 - the compile of this size will say what is wrong
            log.info("batch sizes of %s stay in the compile key: %s: %s", self._label(), type(e).__name__, e)
            return None
        log.info("%s: one program serves every smaller batch size (padded rows)", self._label())
        return rows

    def _parse(self, key: ShapeKey, b: int) -> Module:
        dims = self.with_batch(key, b)
        shapes = {n: Shape(t, d) for n, t, d in zip(self.names, self.types, dims, strict=True)}
        parsed = parse_graph(self.graph, shapes, specialize=True, weights=self.weights)
        return parsed.program.get_main_module()

    def _label(self) -> str:
        return ", ".join(self.names[i] for i in self.batch)

    # -- serving ------------------------------------------------------------------------------------
    def donor(self, key: ShapeKey, programs: Mapping[ShapeKey, object]) -> ShapeKey | None:
        """The compiled program of the smallest larger batch with the same other dims as ``key``."""
        b, rest = self.batch_of(key), self.rest(key)
        best = None
        for k in programs:
            kb = self.batch_of(k)
            if kb is not None and b is not None and kb > b and self.rest(k) == rest:
                if best is None or kb < self.batch_of(best):  # type: ignore[operator]
                    best = k
        return best

    def pad(self, inputs: list[np.ndarray], size: int) -> list[np.ndarray]:
        """The batch inputs grown to ``size`` rows with copies of their last row."""
        out = list(inputs)
        for i in self.batch:
            a = inputs[i]
            out[i] = np.concatenate([a, np.repeat(a[-1:], size - a.shape[0], axis=0)])
        return out

    @staticmethod
    def cut(outputs: list[np.ndarray], rows: BatchRows, b: int) -> list[np.ndarray]:
        """Each output that follows the batch, cut to the rows of ``b`` samples."""
        return [o if k is None else o[: b * k] for o, k in zip(outputs, rows.outputs, strict=True)]

    def later(self, key: ShapeKey, submit: Callable[[ShapeKey], bool]) -> None:
        """Queue the compile of ``key``'s own program (once)."""
        if key in self.pending or key in self.failed:
            return
        self.pending.add(key)
        if not submit(key):
            self.pending.discard(key)


__all__ = ["BatchServing", "batch_inputs", "enabled"]
