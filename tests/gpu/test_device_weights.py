"""The programs of one subgraph share the device copies of its weights (targets/gpu/weights.py): a new
input shape uploads only what no live program uploaded. The placement logic and what the lowering
hands it are checked here without a GPU (a fake allocator); the ``gpu`` tests check real programs."""

from __future__ import annotations

import gc
import os

import numpy as np
import onnx
import pytest

from migraphx_ep.frontend.graph import model_to_dict
from migraphx_ep.frontend.parser import parse_graph
from migraphx_ep.ir.dtypes import from_onnx
from migraphx_ep.ir.shape import Shape
from migraphx_ep.ir.weights import WeightCache
from migraphx_ep.passes import run_passes
from migraphx_ep.targets.gpu.decompose import gpu_pipeline
from migraphx_ep.targets.gpu.lowering import lower
from migraphx_ep.targets.gpu.memory import Storage
from migraphx_ep.targets.gpu.weights import DeviceWeights

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


class FakeBlock:
    """Device memory stand-in: an address range over one shared byte space."""

    next_ptr = 1 << 20

    def __init__(self, nbytes: int) -> None:
        self.ptr, self.nbytes = FakeBlock.next_ptr, nbytes
        FakeBlock.next_ptr += nbytes + 4096
        self.data = np.zeros(nbytes, np.uint8)


class FakeDevice:
    def __init__(self) -> None:
        self.uploads: list[int] = []  # the bytes of each copy
        self.calls = 0  # upload calls: one per program with new weights

    def upload(self, block: FakeBlock, copies: list[tuple[int, np.ndarray]]) -> None:
        self.calls += 1
        for offset, host in copies:
            assert offset + host.nbytes <= block.nbytes
            block.data[offset : offset + host.nbytes] = host
            self.uploads.append(host.nbytes)

    def pool(self) -> DeviceWeights:
        return DeviceWeights(FakeBlock, self.upload)


def weights(*values: np.ndarray) -> list[Storage]:
    # As the lowering makes them: a new Storage (and array view) per program for the same host memory.
    return [Storage(v.nbytes, "weight", value=np.ascontiguousarray(v).reshape(v.shape)) for v in values]


def read(placed, blocks: list[FakeBlock], st: Storage) -> np.ndarray:
    addr = placed.addresses[id(st)]
    block = next(b for b in blocks if b.ptr <= addr < b.ptr + b.nbytes)
    v = np.asarray(st.value)
    return block.data[addr - block.ptr : addr - block.ptr + v.nbytes].view(v.dtype).reshape(v.shape)


A = np.arange(300, dtype=np.float32).reshape(3, 100)
B = np.linspace(-1, 1, 7).astype(np.float16)
C = np.ones((2, 2), np.int64)


def test_second_program_uploads_nothing_and_reads_the_same_bytes():
    dev = FakeDevice()
    pool = dev.pool()
    first_st = weights(A, B)
    first = pool.place(first_st)
    second_st = weights(A, B)
    second = pool.place(second_st)
    assert first.uploaded > 0 and second.uploaded == 0 and second.shared == 2
    assert len(dev.uploads) == 1  # one transfer for the first program, none for the second
    assert [second.addresses[id(s)] for s in second_st] == [first.addresses[id(s)] for s in first_st]
    for st in second_st:
        assert np.array_equal(read(second, second.blocks, st), np.asarray(st.value))


def test_only_new_weights_are_uploaded_in_one_block():
    dev = FakeDevice()
    pool = dev.pool()
    first = pool.place(weights(A))
    sts = weights(A, B, C)
    placed = pool.place(sts)
    assert placed.shared == 1 and placed.uploaded == 256 + 256  # B and C, each 256-byte aligned
    assert len(placed.blocks) == 2 and first.blocks[0] in placed.blocks
    for st in sts:
        assert np.array_equal(read(placed, placed.blocks, st), np.asarray(st.value))


def test_equal_host_memory_twice_in_one_program_is_uploaded_once():
    dev = FakeDevice()
    sts = weights(A, A, B)
    placed = dev.pool().place(sts)
    assert placed.uploaded == 1280 + 256 and placed.addresses[id(sts[0])] == placed.addresses[id(sts[1])]


def test_large_weights_are_copied_from_their_own_arrays_small_ones_packed():
    # Packing (zeroing and filling one host buffer the size of all weights) cost more than the upload for
    # BERT-base's 220 MB: weights of _DIRECT bytes or more are copied on their own, the rest in one.
    from migraphx_ep.targets.gpu import weights as W

    big = np.random.default_rng(0).standard_normal(W._DIRECT // 4 + 3).astype(np.float32)
    big2 = np.arange(W._DIRECT // 2, dtype=np.float16)  # exactly _DIRECT bytes
    dev = FakeDevice()
    sts = weights(big, A, big2, B)
    placed = dev.pool().place(sts)
    assert sorted(dev.uploads) == sorted([big.nbytes, big2.nbytes, 1280 + 14])  # A, B packed: end of B
    assert dev.calls == 1  # one call (one stream) for the program's copies
    for st in sts:
        assert np.array_equal(read(placed, placed.blocks, st), np.asarray(st.value))
    assert placed.uploaded == 1280 + 256 + W.align(big.nbytes) + big2.nbytes


def test_blocks_go_when_no_program_reads_them():
    dev = FakeDevice()
    pool = dev.pool()
    placed = pool.place(weights(A, B))
    assert len(pool) == 2
    del placed
    gc.collect()
    assert len(pool) == 0
    again = pool.place(weights(A, B))
    assert again.uploaded > 0  # uploaded afresh, into a new block


def test_a_copy_with_equal_bytes_is_another_weight():
    # Only the same host memory is the same weight: equal bytes elsewhere are not looked at.
    dev = FakeDevice()
    pool = dev.pool()
    held = pool.place(weights(A))
    placed = pool.place(weights(A.copy()))
    assert placed.uploaded > 0 and held.blocks[0] not in placed.blocks


def graph(name: str) -> dict:
    return model_to_dict(onnx.load(os.path.join(MODELS, f"{name}.onnx")))


def lowered(g: dict, dims: dict[str, int], cache: WeightCache):
    """Parse (the one graph dict of a subgraph, as the EP holds it), passes, lowering at ``dims``."""
    shapes = {}
    for n in g["inputs"]:
        info = g["values"][n]
        shapes[n] = Shape(
            from_onnx(info["dtype"]), [d if isinstance(d, int) else dims[d] for d in info["shape"]]
        )
    prog = parse_graph(g, shapes, specialize=True, weights=cache).program
    run_passes(prog.get_main_module(), gpu_pipeline(cache))
    return prog, lower(prog.get_main_module(), True, True, weights=cache)


@pytest.mark.parametrize(
    "name, first, second",
    [
        ("resnet", {"batch": 2}, {"batch": 5}),  # NHWC: conv filters transposed to KRSC on the host
        ("resnet_fp16", {"batch": 1}, {"batch": 3}),
        ("bert", {"batch": 2, "sequence": 16}, {"batch": 3, "sequence": 24}),
        ("bert_fp16", {"batch": 1, "sequence": 8}, {"batch": 4, "sequence": 8}),
    ],
)
def test_a_new_shape_of_a_model_uploads_only_shape_dependent_constants(name, first, second):
    cache, dev, g = WeightCache(), FakeDevice(), graph(name)
    pool = dev.pool()
    prog1, low1 = lowered(g, first, cache)
    placed1 = pool.place(low1.weights)
    gc.collect()  # only what the first program holds may be shared
    prog2, low2 = lowered(g, second, cache)
    placed2 = pool.place(low2.weights)
    assert placed1.uploaded > 10_000
    assert placed2.shared > 0 and placed1.blocks[0] in placed2.blocks
    old = [(b.ptr, b.ptr + b.nbytes) for b in placed1.blocks]
    new = [st for st in low2.weights if not any(lo <= placed2.addresses[id(st)] < hi for lo, hi in old)]
    # Uploaded again: only constants of the new sizes (BERT's attention mask, position rows, and
    # scalars: a size may be one).
    sizes = set(second.values())
    assert all(np.size(st.value) == 1 or sizes & set(np.shape(st.value)) for st in new), new
    assert placed2.uploaded <= 0.06 * placed1.uploaded


def test_executable_reads_weights_at_their_shared_addresses():
    """GpuExecutable's part (no device: its placement and a context's pointers, on the fake pool)."""
    from migraphx_ep.targets.gpu.context import RunContext
    from migraphx_ep.targets.gpu.executable import GpuExecutable
    from migraphx_ep.targets.gpu.steps import Buf

    cache, pool, g = WeightCache(), FakeDevice().pool(), graph("resnet")
    exes, progs = [], []  # a compiled Program holds its literals, its executable the lowered steps
    for batch in (2, 3):
        exe = GpuExecutable.__new__(GpuExecutable)
        prog, exe.lowered = lowered(g, {"batch": batch}, cache)
        exe._place_weights(pool)
        exes.append(exe)
        progs.append(prog)
        gc.collect()  # what no program holds is gone: only what they hold may be shared
    first, second = exes
    assert second.uploaded_weight_bytes == 0 and second.weight_blocks == first.weight_blocks
    assert second.weight_bytes == first.weight_bytes > 0
    ctx = RunContext.__new__(RunContext)
    ctx.exe, ctx.arena = second, FakeBlock(16)
    for a, b in zip(first.lowered.weights, second.lowered.weights, strict=True):
        assert second.weight_address(b) == first.weight_address(a)
        assert ctx.ptr(Buf(b, 64, Shape.of(np.asarray(b.value)))) == first.weight_address(a) + 64


# -- on a GPU ---------------------------------------------------------------------------------------------
def bert_feeds(batch: int, seq: int) -> list[np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq)
    return [
        rng.integers(0, 100, (batch, seq)),
        np.ones((batch, seq), np.int64),
        rng.integers(0, 2, (batch, seq)),
    ]


def resnet_feeds(batch: int, dtype: type) -> list[np.ndarray]:
    return [np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(dtype)]


CASES = {
    "bert": [bert_feeds(2, 7), bert_feeds(3, 11), bert_feeds(1, 7)],
    "bert_fp16": [bert_feeds(2, 7), bert_feeds(3, 11), bert_feeds(1, 7)],
    "resnet": [resnet_feeds(2, np.float32), resnet_feeds(5, np.float32), resnet_feeds(1, np.float32)],
    "resnet_fp16": [resnet_feeds(2, np.float16), resnet_feeds(5, np.float16), resnet_feeds(1, np.float16)],
}


@pytest.fixture
def gpu_subgraphs(monkeypatch):
    """Fresh per-shape compiles: no stored programs (a loaded one shares nothing), no run-time dims, no
    batch size served by a larger batch's program."""
    for k in list(os.environ):
        if k.startswith("ORT_MIGRAPHX_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_DIMS", "0")
    monkeypatch.setenv("MIGRAPHX_EP_BATCH_ROWS", "0")


def subgraph(name: str, target: str, **options: str):
    from migraphx_ep.ep.provider import create_ep

    ep = create_ep({"migraphx_target": target, "migraphx_tf32_enable": "0", **options})
    return ep.compile(graph(name), "fused_0")


def run(c, feeds: list[np.ndarray]) -> list[np.ndarray]:
    return [o.copy() for o in c.run(feeds)]  # the gpu outputs are views of the program's staging memory


def assert_close(got: list[np.ndarray], want: list[np.ndarray], fp16: bool) -> None:
    tol = 2e-2 if fp16 else 1e-4
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(np.abs(w.astype(np.float64)).max()), 1.0)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale)


def uploaded_again(exe, earlier) -> list[tuple[int, ...]]:
    """Shapes of ``exe``'s weights that are in none of the device blocks ``earlier`` uploaded."""
    spans = [(b.ptr, b.ptr + b.nbytes) for b in earlier.weight_blocks]
    return [
        np.shape(st.value)
        for st in exe.lowered.weights
        if not any(lo <= exe.weight_address(st) < hi for lo, hi in spans)
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_programs_of_one_subgraph_share_device_weights(name, gpu_subgraphs):
    c, ref = subgraph(name, "gpu"), subgraph(name, "ref")
    for feeds in CASES[name]:
        assert_close(run(c, feeds), run(ref, feeds), "fp16" in name)
    exes = [p._exe for p in c.programs.values()]
    assert len(exes) == 3 and all(type(e).__name__ == "GpuExecutable" for e in exes)
    first = exes[0]
    assert first.uploaded_weight_bytes > 10_000
    for exe, feeds in zip(exes[1:], CASES[name][1:], strict=True):
        # Device memory grows by the new shape's own constants (attention mask, position rows,
        # scalars), never by another copy of the weights.
        assert first.weight_blocks[0] in exe.weight_blocks
        sizes = set(feeds[0].shape)
        again = uploaded_again(exe, first)
        assert all(int(np.prod(s)) == 1 or sizes & set(s) for s in again), again
        assert exe.uploaded_weight_bytes < 0.1 * first.uploaded_weight_bytes


@pytest.mark.gpu
def test_gpu_evicted_programs_free_nothing_a_live_program_reads(gpu_subgraphs):
    c = subgraph("bert", "gpu", migraphx_max_compiled_models="1")
    feeds = CASES["bert"]
    first = run(c, feeds[0])
    run(c, feeds[1])  # evicts the first program: its blocks stay while the second reads them
    gc.collect()
    assert len(c.programs) == 1
    again = run(c, feeds[0])  # compiled again, reading the weights the live program holds
    assert c.compiles == 3
    exe = next(iter(c.programs.values()))._exe
    assert exe.uploaded_weight_bytes < 10_000
    assert_close(again, first, False)


@pytest.mark.parametrize("name", ["resnet", "resnet_fp16", "mobilenet_v2"])
def test_only_weights_a_step_reads_are_uploaded(name):
    # NHWC convolutions read their filters transposed to KRSC; the original layout must not go to the
    # device as well (before: every conv filter was uploaded twice).
    g = graph(name)
    dims = {d: 2 for n in g["inputs"] for d in g["values"][n]["shape"] if not isinstance(d, int)}
    _, low = lowered(g, dims, WeightCache())
    read = {id(b.storage) for s in low.steps for b in s.reads}
    assert low.weights and all(id(w) in read for w in low.weights)
    assert any("KRSC" in w.label for w in low.weights)
    model_bytes = sum(np.asarray(v).nbytes for v in g["initializers"].values())
    assert sum(w.nbytes for w in low.weights) <= 1.05 * model_bytes  # each filter once, not twice
