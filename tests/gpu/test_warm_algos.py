"""Quick cuBLASLt picks prefer algorithms the process has already run (targets/gpu/warm_algos.py).

cuBLASLt's first call with an algorithm it has not run costs milliseconds of host time; its heuristic
picks another algorithm for nearly every M, so each never-seen shape paid that in its first Run. The
logic is checked without a GPU; on the GPU, quick picks for new sizes run no algorithm for the first
time, and their results are right."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from migraphx_ep.targets.gpu import tuning, warm_algos

from .test_vendor_libs import F16, cublaslt, gpu, run_gemm  # noqa: F401 - cublaslt: a fixture

needs_cublaslt = pytest.mark.usefixtures("cublaslt")


@pytest.fixture
def fresh(monkeypatch):
    """As in a fresh process: no algorithm run yet, no pick memoised."""
    monkeypatch.setattr(warm_algos, "_run", set())
    monkeypatch.setattr(warm_algos, "_by_family", {})
    monkeypatch.setattr(warm_algos, "_first_calls", [0])
    monkeypatch.setattr(tuning, "PICKS", tuning.PickMemo())


@dataclass
class FakePlan:
    handle: int
    family: tuple
    m: int
    n: int = 768
    k: int = 768
    batch: int = 1


@pytest.mark.usefixtures("fresh")
def test_a_warm_candidate_wins_then_the_nearest_warm_algorithm_of_the_family():
    f = ("half", "bias")
    warm_algos.note_run(FakePlan(1, f, 64), b"A")
    warm_algos.note_run(FakePlan(1, f, 4096), b"B")
    warm_algos.note_run(FakePlan(1, f, 3000, n=3072), b"C")  # another layer: tried after the same one
    warm_algos.note_run(FakePlan(1, f, 64), b"A")  # run again: no new first call
    assert warm_algos.first_calls() == 3
    new = FakePlan(1, f, 3000)
    assert warm_algos.pick(new, [b"x", b"A", b"B"], lambda raw: True) == b"A"  # candidates' order
    checked: list[bytes] = []
    got = warm_algos.pick(new, [b"x", b"y"], lambda raw: checked.append(raw) or raw != b"B")
    assert (got, checked) == (b"A", [b"B", b"A"])  # nearest size first; one AlgoCheck refuses B
    assert warm_algos.pick(new, [b"x"], lambda raw: False) is None
    assert warm_algos.pick(FakePlan(2, f, 3000), [b"A"], lambda raw: True) is None  # another device
    assert warm_algos.pick(FakePlan(1, ("float",), 3000), [b"x"], lambda raw: True) is None  # other kind


@pytest.mark.usefixtures("fresh")
def test_a_family_is_checked_a_bounded_number_of_times():
    for i in range(20):
        warm_algos.note_run(FakePlan(1, ("f",), 8 + i), bytes([i]))
    checked: list[bytes] = []
    assert warm_algos.pick(FakePlan(1, ("f",), 100), [b"x"], lambda raw: checked.append(raw) or False) is None
    assert len(checked) == warm_algos.MAX_CHECKS


@pytest.mark.usefixtures("fresh")
def test_the_same_layer_at_another_m_is_found_without_candidates():
    f = ("half", "rm")
    warm_algos.note_run(FakePlan(1, f, 64), b"A")
    warm_algos.note_run(FakePlan(1, f, 4096), b"B")
    warm_algos.note_run(FakePlan(1, f, 2000, n=3072), b"C")  # another layer, nearer in size
    warm_algos.note_run(FakePlan(1, ("float", "rm"), 2000), b"D")  # another family
    checked: list[bytes] = []
    assert warm_algos.same_layer(FakePlan(1, f, 3000), lambda raw: checked.append(raw) or True) == b"B"
    assert warm_algos.same_layer(FakePlan(1, f, 100), lambda raw: True) == b"A"  # the nearest M
    assert warm_algos.same_layer(FakePlan(1, f, 3000), lambda raw: raw != b"B") == b"A"  # AlgoCheck said no
    assert warm_algos.same_layer(FakePlan(1, f, 3000), lambda raw: False) is None
    assert warm_algos.same_layer(FakePlan(1, f, 3000, k=512), lambda raw: True) is None  # no such layer
    assert warm_algos.same_layer(FakePlan(2, f, 3000), lambda raw: True) is None  # another device
    assert checked == [b"B"]


@gpu
@needs_cublaslt
@pytest.mark.usefixtures("fresh")
def test_a_quick_pick_for_a_known_layer_asks_no_heuristic(cuda, monkeypatch):
    from migraphx_ep.targets.gpu import blas

    kinds = ("rm", "rm", "rm")
    run_gemm(cuda, F16, (1, 37, 256, 64), kinds, bias=True)
    asked: list[int] = []
    heuristics = blas.GemmPlan.heuristics
    monkeypatch.setattr(blas.GemmPlan, "heuristics", lambda p, *a: asked.append(p.m) or heuristics(p, *a))
    for m in (301, 2501):  # the same layer (N, K) at new M: numbers checked in run_gemm
        run_gemm(cuda, F16, (1, m, 256, 64), kinds, bias=True)
    run_gemm(cuda, F16, (1, 301, 128, 64), kinds, bias=True)  # another layer: cuBLASLt is asked
    assert asked == [301]  # not for the first two (run_gemm's numpy reference asks nothing)


@gpu
@needs_cublaslt
@pytest.mark.usefixtures("fresh")
def test_quick_picks_at_new_sizes_run_no_algorithm_for_the_first_time(cuda):
    kinds = ("rm", "rm", "rm")
    run_gemm(cuda, F16, (1, 37, 256, 64), kinds, bias=True)  # the numbers are checked in run_gemm
    assert warm_algos.first_calls() == 1
    other_than_top = 0
    for m in (301, 999, 2501, 4093):
        plan = run_gemm(cuda, F16, (1, m, 256, 64), kinds, bias=True)
        other_than_top += bytes(plan.heuristics(32 << 20)[0].algo) != bytes(plan.algo)
    assert warm_algos.first_calls() == 1, "a quick pick ran an algorithm for the first time"
    assert other_than_top, "cuBLASLt's first candidate was warm each time: nothing was tested"


@gpu
@needs_cublaslt
@pytest.mark.usefixtures("fresh")
def test_timed_picks_still_time_the_candidates(cuda):
    kinds = ("rm", "rm", "rm")
    run_gemm(cuda, F16, (1, 37, 256, 64), kinds, bias=True)
    run_gemm(cuda, F16, (1, 1999, 256, 64), kinds, bias=True, tune=True)
    assert warm_algos.first_calls() > 1  # the timed search ran candidates never run before
