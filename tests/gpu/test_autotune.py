"""autotune.fastest: the candidate with least device time, captured and timed in interleaved rounds."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _memset(cuda, buf, nbytes: int, runs: list[int], i: int):  # noqa: ANN001, ANN202
    def trial(h: int) -> bool:
        runs[i] += 1
        cuda.memset(buf.ptr, nbytes, h)
        return True

    return trial


def test_the_cheapest_candidate_wins_and_failing_ones_drop_out(cuda) -> None:  # noqa: ANN001
    from migraphx_ep.targets.gpu.autotune import fastest

    big = cuda.alloc(256 << 20)
    runs = [0, 0, 0, 0]
    never = lambda h: runs.__setitem__(2, runs[2] + 1) or False  # noqa: E731 - cannot run at all
    trials = [_memset(cuda, big, 256 << 20, runs, 0), _memset(cuda, big, 1 << 20, runs, 1), never,
              _memset(cuda, big, 64 << 20, runs, 3)]  # fmt: skip
    stream = cuda.Stream()
    assert fastest(trials, stream, reps=3, rounds=2) == 1
    # each runnable one: once eagerly, then 3 runs captured (the graph replays them without calling it)
    assert runs == [4, 4, 1, 4]
    big.free()


def test_nothing_runnable_or_one_candidate(cuda) -> None:  # noqa: ANN001
    from migraphx_ep.targets.gpu.autotune import fastest

    stream = cuda.Stream()
    assert fastest([lambda h: False, lambda h: False], stream) is None
    assert fastest([], stream) is None
    buf = cuda.alloc(1 << 20)
    runs = [0]
    assert fastest([lambda h: False, _memset(cuda, buf, 1 << 20, runs, 0)], stream) == 1
    buf.free()


def test_a_candidate_that_fails_inside_capture_drops_out(cuda) -> None:  # noqa: ANN001
    from migraphx_ep.targets.gpu.autotune import fastest

    buf = cuda.alloc(64 << 20)
    calls = [0]

    def flaky(h: int) -> bool:  # runs eagerly, then fails once captured: must not be picked
        calls[0] += 1
        cuda.memset(buf.ptr, 1 << 10, h)
        return calls[0] == 1

    runs = [0, 0]
    stream = cuda.Stream()
    assert fastest([flaky, _memset(cuda, buf, 64 << 20, runs, 1)], stream) == 1
    cuda.memset(buf.ptr, 1 << 20, stream.handle)  # the stream still works after the aborted capture
    stream.sync()
    buf.free()


def test_a_failed_capture_destroys_its_partial_graph(cuda, monkeypatch) -> None:  # noqa: ANN001
    """The graph cuStreamEndCapture returns after a failed issue is freed, not leaked (one per failed
    autotune candidate)."""
    from migraphx_ep.targets.gpu import cuda as gpu_cuda

    destroyed: list[int] = []
    real = gpu_cuda.cu

    class Counting:  # the driver, with cuGraphDestroy counted (its module's attributes may be read-only)
        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(real, name)

        def cuGraphDestroy(self, graph):  # noqa: ANN001, ANN201, N802 - the driver's name
            destroyed.append(int(graph))
            return real.cuGraphDestroy(graph)

    monkeypatch.setattr(gpu_cuda, "cu", Counting())
    buf = cuda.alloc(1 << 20)
    stream = cuda.Stream()

    def issue(h: int) -> None:
        cuda.memset(buf.ptr, 1 << 10, h)  # captured: the partial graph has a node
        raise cuda.CudaError("planted failure")

    with pytest.raises(cuda.CudaError, match="planted"):
        cuda.Graph(stream, issue)
    assert len(destroyed) == 1 and destroyed[0] != 0
    cuda.memset(buf.ptr, 1 << 20, stream.handle)  # the stream left capture mode
    stream.sync()
    buf.free()


def test_a_captured_graph_counts_its_nodes_by_type(cuda) -> None:  # noqa: ANN001
    """What the benchmark reports as kernels per model: the captured graph's nodes by type."""
    buf = cuda.alloc(1 << 12)
    stream = cuda.Stream()

    def issue(h: int) -> None:
        cuda.memset(buf.ptr, 1 << 10, h)
        cuda.memset(buf.ptr + (1 << 10), 1 << 10, h)

    graph = cuda.Graph(stream, issue)
    assert graph.node_counts() == {"memset": 2}
    del graph
    buf.free()
