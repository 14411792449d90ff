"""NVRTC compiles are counted (no GPU needed): a second compile of one source is a cache hit, not a
compile, for the process (``compile_count``, ``cache_stats``) and for the compile being timed, also when
the compiles run on the executable's thread pool."""

from __future__ import annotations

import dataclasses
import types

import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import OPS
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu import nvrtc
from migraphx_ep.targets.gpu.executable import GpuExecutable
from migraphx_ep.targets.gpu.kernels.spec import PwInput, PwOp, canonical
from migraphx_ep.timing import record

pytestmark = pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))

ARCH = "sm_90"


def source(name: str) -> str:
    # A source no other test compiles: the process cache starts without it.
    return f'extern "C" __global__ void {name}(float* x) {{ x[threadIdx.x] *= 2.0f; }}\n'


def delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in nvrtc.cache_stats().items()}


@pytest.fixture(autouse=True)
def no_disk_cache(monkeypatch):
    monkeypatch.delenv("MIGRAPHX_EP_KERNEL_CACHE", raising=False)


def test_same_source_twice_is_one_compile_and_one_cache_hit():
    before, n = nvrtc.cache_stats(), nvrtc.compile_count()
    with record() as t:
        first = nvrtc.compile_source(source("k_counted_twice"), ARCH, "k_counted_twice")
        second = nvrtc.compile_source(source("k_counted_twice"), ARCH, "k_counted_twice")
    assert first == second and len(first) > 0
    assert nvrtc.compile_count() == n + 1
    assert delta(before) == {"compiled": 1, "cache hits": 1, "disk hits": 0}
    assert t.counts == {"nvrtc": {"compiled": 1, "cache hits": 1}}
    nvrtc.compile_source(source("k_counted_twice"), ARCH, "k_counted_twice", options=("-lineinfo",))
    assert nvrtc.compile_count() == n + 2  # other options: another image


def test_disk_cache_hits_are_counted_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_KERNEL_CACHE", str(tmp_path))
    src = source("k_counted_on_disk")
    before = nvrtc.cache_stats()
    image = nvrtc.compile_source(src, ARCH, "k_counted_on_disk")
    monkeypatch.delitem(nvrtc._CACHE, nvrtc.source_key(src, ARCH))  # as a new process would start
    with record() as t:
        assert nvrtc.compile_source(src, ARCH, "k_counted_on_disk") == image
    assert delta(before) == {"compiled": 1, "cache hits": 0, "disk hits": 1}
    assert t.counts == {"nvrtc": {"disk hits": 1}}


def test_the_executables_pool_counts_into_the_compile_record():
    # Only the NVRTC part of GpuExecutable (no device): its thread pool must carry the record.
    exe = GpuExecutable.__new__(GpuExecutable)
    exe.device, exe._images = types.SimpleNamespace(arch=ARCH), {}
    shape = Shape(DType.float_type, (1, 33))  # batch 1: no batch-1 twin (others) to compile
    expr = PwOp(OPS["relu"](), (PwInput(0),), DType.float_type)
    specs = [K.pointwise_kernel(f"k_timing_pool_{i}", expr, [shape], shape) for i in range(3)]
    n = nvrtc.compile_count()
    with record() as t:
        exe._compile_kernels(specs + specs[:1])  # the repeat is the same image: compiled once
    assert nvrtc.compile_count() == n + 3 and len(exe._images) == 3
    assert t.counts == {"nvrtc": {"compiled": 3}} and t.seconds("nvrtc") > 0
    with record() as again:
        exe._compile_kernels(specs)  # every image already held: not even a cache lookup
    assert again.counts == {} and nvrtc.compile_count() == n + 3


def test_a_kernels_others_compile_beside_it_and_serve_later_shapes():
    # A pointwise kernel of batch 4 carries its batch-1 twin: compiled in the same pool, kept in
    # nvrtc's cache (not in the program's images), and a batch-1 program then finds it there.
    exe = GpuExecutable.__new__(GpuExecutable)
    exe.device, exe._images = types.SimpleNamespace(arch=ARCH), {}
    expr = PwOp(OPS["sigmoid"](), (PwInput(0),), DType.float_type)
    bcast = Shape(DType.float_type, (4, 32, 8), (0, 8, 1))  # broadcast over the batch: strided at batch 4
    four, one = Shape(DType.float_type, (4, 32, 8)), Shape(DType.float_type, (1, 32, 8))
    spec = canonical(K.pointwise_kernel("k_twin", expr, [bcast], four))
    twin = canonical(
        K.pointwise_kernel("k_twin", expr, [Shape(DType.float_type, (1, 32, 8), (0, 8, 1))], one)
    )
    assert spec.others is not None and twin.source != spec.source
    n = nvrtc.compile_count()
    with record() as t:
        exe._compile_kernels([spec])
    assert nvrtc.compile_count() == n + 2 and t.counts == {"nvrtc": {"compiled": 2}}
    assert len(exe._images) == 1
    with record() as later:
        exe._compile_kernels([twin])
    assert nvrtc.compile_count() == n + 2 and later.counts == {"nvrtc": {"cache hits": 1}}


def test_repeated_layers_compile_each_kernel_body_once(monkeypatch):
    monkeypatch.setenv("MIGRAPHX_EP_RUNTIME_SIZES", "0")
    """Kernels are compiled under one symbol (``canonical``): the same op in every layer of a transformer
    is one NVRTC compile. The two-layer test BERT lowers to 17 kernels with 11 distinct bodies (10 by
    default, with run-time sizes: same-structure kernels of other sizes merge too); each layer's attention
    is one of them (27 and 15 with MIGRAPHX_EP_DISABLE_PASSES=fuse_attention)."""
    import os

    import onnx

    from migraphx_ep.frontend.graph import model_to_dict
    from migraphx_ep.frontend.parser import parse_graph
    from migraphx_ep.ir.dtypes import from_onnx
    from migraphx_ep.passes import run_passes
    from migraphx_ep.targets.gpu.decompose import gpu_pipeline
    from migraphx_ep.targets.gpu.kernels.spec import KERNEL_SYMBOL, canonical
    from migraphx_ep.targets.gpu.lowering import lower
    from migraphx_ep.targets.gpu.steps import KernelStep

    path = os.path.join(os.path.dirname(__file__), "..", "models", "bert.onnx")
    g = model_to_dict(onnx.load(path))
    shapes = {n: Shape(from_onnx(g["values"][n]["dtype"]), (2, 16)) for n in g["inputs"]}
    m = parse_graph(g, shapes, specialize=True).program.get_main_module()
    run_passes(m, gpu_pipeline())
    specs = [s.spec for s in lower(m, True, True).steps if isinstance(s, KernelStep)]
    bodies = {canonical(sp).source for sp in specs}
    assert len(specs) == 17 and len(bodies) == 11
    assert all(canonical(sp).name == KERNEL_SYMBOL and sp.name not in canonical(sp).source for sp in specs)
    exe = GpuExecutable.__new__(GpuExecutable)
    exe.device, exe._images = types.SimpleNamespace(arch=ARCH), {}
    # The kernels' others (batch-1 twins, other key splits) compile beside them unless held already.
    others = {o.source for sp in specs if sp.others for o in sp.others()} - bodies
    fresh = [o for o in others if not nvrtc.has_image(nvrtc.source_key(o, ARCH))]
    before = nvrtc.cache_stats()
    exe._compile_kernels([canonical(sp) for sp in specs])
    d = delta(before)
    assert d["compiled"] + d["cache hits"] + d["disk hits"] == 11 + len(fresh) and len(exe._images) == 11
    assert all(nvrtc.has_image(nvrtc.source_key(o, ARCH)) for o in others)


def test_variants_that_fail_only_warn(caplog):
    # Making or compiling a kernel's variants for other sizes must not fail the program at hand.
    import dataclasses

    exe = GpuExecutable.__new__(GpuExecutable)
    exe.device, exe._images = types.SimpleNamespace(arch=ARCH), {}
    shape = Shape(DType.float_type, (1, 35))
    spec = K.pointwise_kernel(
        "k_variants_fail", PwOp(OPS["exp"](), (PwInput(0),), DType.float_type), [shape], shape
    )

    def broken() -> list:
        raise ValueError("no variant here")

    bad_source = dataclasses.replace(spec, name="mx_kernel", source="this is not CUDA", others=None)
    for others in (broken, lambda: [bad_source]):
        exe._images = {}
        with caplog.at_level("WARNING", logger="migraphx_ep.gpu"):
            exe._compile_kernels(
                [dataclasses.replace(spec, source=spec.source + f"// {id(others)}\n", others=others)]
            )
        assert len(exe._images) == 1
    assert "were not made" in caplog.text and "did not compile" in caplog.text


def test_a_loaded_programs_kernels_join_the_cache_and_compile_their_others_in_the_background(monkeypatch):
    # A program from a .mxr brings its kernels' images, so nothing compiles at its binding; they join the
    # process's cache (a later shape's same kernel is a hit), and the variants its kernels would have
    # compiled beside them are compiled on a background thread instead.
    expr = PwOp(OPS["exp"](), (PwInput(0),), DType.float_type)
    four = Shape(DType.float_type, (4, 48, 8))
    spec = canonical(
        K.pointwise_kernel("k_loaded", expr, [Shape(DType.float_type, (4, 48, 8), (0, 8, 1))], four)
    )
    assert spec.others is not None
    twins = {nvrtc.source_key(o.source, ARCH) for o in spec.others()}
    made: list[int] = []
    real_others = spec.others
    spec = dataclasses.replace(spec, others=lambda: made.append(1) or real_others())
    key = nvrtc.source_key(spec.source, ARCH)
    exe = GpuExecutable.__new__(GpuExecutable)
    exe.device = types.SimpleNamespace(arch=ARCH)
    exe._images = {key: nvrtc.compile_source(spec.source, ARCH, spec.name)}  # as the .mxr holds it
    exe._loaded_images = True
    assert not any(nvrtc.has_image(k) for k in twins), "a variant is compiled already: nothing to test"
    n = nvrtc.compile_count()
    monkeypatch.delitem(nvrtc._CACHE, key)  # as in a new process that loaded it: held by the program only
    with record() as t:
        exe._compile_kernels([spec, spec])  # a program's steps repeat their layers' kernels
    assert t.counts == {}  # the program's own kernel is held: no compile, no lookup on the Run's path
    assert nvrtc.has_image(key), "the loaded image did not join the process's cache"
    assert exe.variants is not None and exe.variants.result(timeout=300) == len(twins)
    assert all(nvrtc.has_image(k) for k in twins) and nvrtc.compile_count() == n + len(twins)
    assert made == [1], "the variants of one kernel body were made more than once"
    first = exe.variants
    exe._compile_kernels([spec])  # a later binding (another context) schedules nothing again
    assert exe.variants is first


def test_a_compiled_programs_binding_schedules_no_background_variants():
    exe = GpuExecutable.__new__(GpuExecutable)
    exe.device, exe._images = types.SimpleNamespace(arch=ARCH), {}
    shape = Shape(DType.float_type, (1, 35))
    spec = K.pointwise_kernel(
        "k_not_loaded", PwOp(OPS["relu"](), (PwInput(0),), DType.float_type), [shape], shape
    )
    exe._compile_kernels([canonical(spec)])
    assert exe.variants is None
