"""Kernels per model in the benchmark report: the IOBinding row's ``launches`` (steps by kind, CUDA graph
nodes by type) become one table row per model; rows without them add no table."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import report  # noqa: E402


def row(system: str, **extra: object) -> dict:
    return {
        "kind": "result",
        "model": "resnet50",
        "batch": 1,
        "dtype": "fp16",
        "system": system,
        "ms": 1.0,
        **extra,
    }


def test_a_row_with_launches_gets_its_kernel_counts() -> None:
    launches = {"steps": 60, "generated": 20, "gemm": 23, "conv": 17, "graph_kernel": 95, "graph_memset": 3}
    by = report.latest([row("migraphx_ep"), row("migraphx_ep_iobinding", launches=launches)])
    table = report.launches_table(by)
    assert table[0] == "## Kernels per model"
    assert "| ResNet-50 | 1 | fp16 | 60 | 20 | 23 | 17 | 95 | 3 |" in table


def test_without_launches_there_is_no_table_and_a_graph_error_shows_as_missing() -> None:
    assert report.launches_table(report.latest([row("migraphx_ep_iobinding")])) == []
    launches = {"steps": 5, "generated": 5, "gemm": 0, "conv": 0, "graph_error": "cuGraphGetNodes failed"}
    table = report.launches_table(report.latest([row("migraphx_ep_iobinding", launches=launches)]))
    assert "| ResNet-50 | 1 | fp16 | 5 | 5 | 0 | 0 | — | — |" in table


def test_launches_count_the_steps_of_the_one_program_only() -> None:
    import systems

    from migraphx_ep.targets.gpu.steps import ConvStep, GemmStep, KernelStep

    class Exe:  # the executable's parts the benchmark reads (no graph: a program off the GPU)
        def __init__(self, steps: list) -> None:
            self.lowered = type("Lowered", (), {"steps": steps})()

    class Compiled:
        def __init__(self, *exes: Exe) -> None:
            self.programs = {i: type("P", (), {"_exe": e})() for i, e in enumerate(exes)}

    steps = [object.__new__(KernelStep), object.__new__(GemmStep), object.__new__(ConvStep)]
    assert systems._launches([Compiled(Exe(steps))]) == {"steps": 3, "generated": 1, "gemm": 1, "conv": 1}
    assert systems._launches([Compiled(Exe(steps), Exe(steps))]) is None  # two programs: no one count
    assert systems._graph_replay([Compiled(Exe(steps))]) is None  # no CUDA graph to replay
