"""Timing library candidates against each other (cuBLASLt algorithms, cuDNN convolution algorithms) so
that a timed pick is the same pick from one process to the next.

Timed one after the other, once each, from Python, candidates were at the mercy of the GPU's clock
ramping up after the compile's idle host work and of the host's launch gaps: on an H100, five processes
compiling ResNet-50 fp32 bs1 picked different convolution algorithms and their CUDA graphs replayed in
0.73 to 1.02 ms. Here each candidate's runs are captured in a CUDA graph (what the program itself
replays, without host gaps between kernels), and the candidates are timed in interleaved rounds after
an untimed one, each keeping its fastest round: a clock still ramping up, or another process's
kernels, hit every candidate alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from . import cuda

# A trial enqueues one run of a candidate on the given stream and says whether it could.
Trial = Callable[[int], bool]


def fastest(trials: Sequence[Trial], stream: cuda.Stream, reps: int = 5, rounds: int = 3) -> int | None:
    """The index of the trial whose ``reps`` runs take least device time, None when none runs. Each
    trial runs once eagerly first (loads its kernels; one that cannot run drops out) and is then
    captured ``reps`` times into a CUDA graph; one that cannot be captured drops out too."""
    graphs: dict[int, cuda.Graph] = {}
    for i, trial in enumerate(trials):
        if not trial(stream.handle):
            continue
        stream.sync()

        def issue(h: int, trial: Trial = trial) -> None:
            for _ in range(reps):
                if not trial(h):
                    raise cuda.CudaError("a candidate that ran eagerly failed inside capture")

        try:
            graphs[i] = cuda.Graph(stream, issue)
        except cuda.CudaError:
            stream.sync()
    if len(graphs) <= 1:
        return next(iter(graphs), None)
    start, stop = cuda.Event(), cuda.Event()
    best = dict.fromkeys(graphs, math.inf)
    for r in range(rounds + 1):  # round 0 is untimed: it brings the clock up
        for i, graph in graphs.items():
            start.record(stream.handle)
            graph.launch(stream.handle)
            stop.record(stream.handle)
            stop.sync()
            if r:
                best[i] = min(best[i], stop.elapsed_ms(start))
    return min(best, key=best.__getitem__)


__all__ = ["Trial", "fastest"]
