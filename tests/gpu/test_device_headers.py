"""The device headers (``kernels/include/*.cuh``) without a GPU: generated sources include them instead of
carrying their text, every header a generator includes ships as package data, the compiled-image key
follows the headers' text (and NVRTC compiles the texts the key was made from), and the prelude compiles
as host C++ with a small shim, where its numpy rules are checked against numpy."""

from __future__ import annotations

import ctypes
import functools
import re
import shutil
import subprocess
import types
from importlib import resources

import numpy as np
import pytest

from migraphx_ep.ir.dtypes import DType
from migraphx_ep.ir.operation import OPS, make_op
from migraphx_ep.ir.shape import Shape
from migraphx_ep.targets.gpu import kernels as K
from migraphx_ep.targets.gpu import nvrtc
from migraphx_ep.targets.gpu.executable import GpuExecutable
from migraphx_ep.targets.gpu.kernels import gqa as KG
from migraphx_ep.targets.gpu.kernels import headers
from migraphx_ep.targets.gpu.kernels.headers import HEADERS, INCLUDE_DIR, Headers, expand, included
from migraphx_ep.targets.gpu.kernels.spec import KernelSpec, PwInput, PwOp, canonical

from .attentioncheck import Chain
from .test_attention_kernel import fused_op, spec_of
from .test_quant_lowering import kernel_specs as quant_specs

F, H = DType.float_type, DType.half_type
ARCH = "sm_90"
needs_nvrtc = pytest.mark.skipif(nvrtc.nvrtc_available() is not None, reason=str(nvrtc.nvrtc_available()))
GXX = shutil.which("g++")


def relu_kernel(name: str = "k_relu") -> KernelSpec:
    shape = Shape(F, (4, 33))
    return K.pointwise_kernel(name, PwOp(OPS["relu"](), (PwInput(0),), F), [shape], shape)


@functools.cache
def family_specs() -> dict[str, KernelSpec]:
    """A kernel of every generator family that includes headers of its own, and two that need only the
    prelude."""
    x = Shape(F, (4, 33))
    specs = {"pointwise": relu_kernel(), "softmax": K.kernel_for("k_sm", make_op("softmax", axis=1), [x], x)}
    specs |= {f"quant {k}": v for k, v in quant_specs().items()}
    specs["attention simt"] = spec_of(fused_op(Chain(dtype=np.float32, d=16)))
    specs["attention mma"] = spec_of(fused_op(Chain(dtype=np.float16, d=64)))
    op = make_op(
        "group_query_attention", num_heads=4, kv_num_heads=2, present_len=8, has_past=True, rotary=True
    )
    q, kv, present = Shape(H, (2, 1, 64)), Shape(H, (2, 1, 32)), Shape(H, (2, 2, 8, 16))
    cos = Shape(H, (12, 8))
    lay = KG.gqa_layout(op, q, cos)
    part = Shape(F, (8, 2, 18))
    specs["gqa update"] = KG.gqa_update_kernel("k_up", lay, kv, kv, (present, present), cos, present)
    specs["gqa attend"] = KG.gqa_attend_kernel("k_at", lay, q, present, 7, cos, 2, KG.MIN_CHUNK)
    specs["gqa combine"] = KG.gqa_combine_kernel("k_co", lay, part, Shape(H, (2, 1, 64)))
    gs, grid = make_op("grid_sample"), [Shape(F, (1, 2, 4, 4)), Shape(F, (1, 3, 3, 2))]
    specs["grid sample"] = K.kernel_for("k_gs", gs, grid, gs.compute_shape(grid))
    return specs


def test_a_generated_source_includes_the_prelude_instead_of_carrying_it() -> None:
    spec = relu_kernel()
    prelude = HEADERS.texts["mx_prelude.cuh"]
    assert spec.source.startswith('#include "mx_prelude.cuh"\n')
    assert "struct mx_f16" not in spec.source and "mx_same_t" not in spec.source
    assert len(spec.source) < len(prelude) // 4  # the kernel, not the library
    assert expand(spec.source).count(prelude) == 1  # the whole text NVRTC sees
    assert expand(expand(spec.source)) == expand(spec.source)


def test_a_kernel_includes_only_its_own_part_of_a_family() -> None:
    specs = family_specs()
    attend = expand(specs["gqa attend"].source)
    assert "struct mx_gqa_attend_args" in attend and "mx_gqa_update_args" not in attend
    mma = specs["attention mma"].source  # the header's asm takes the element type from a macro
    assert '#define MX_MMA_AB "f16"\n#include "mx_attention_mma.cuh"' in mma
    assert "mx_attention_mma.cuh" not in specs["attention simt"].source


def test_every_header_a_generator_includes_ships_as_package_data() -> None:
    """Through importlib.resources, as an installed wheel would be read; and no header is left over."""
    package = resources.files("migraphx_ep.targets.gpu.kernels") / "include"
    reached: set[str] = set()
    todo = [name for spec in family_specs().values() for name in included(spec.source)]
    while todo:
        name = todo.pop()
        assert not name.startswith("<"), f"{name}: a system header (the package ships none for NVRTC)"
        if name in reached:
            continue
        assert (package / name).is_file(), f"{name} is not package data"
        reached.add(name)
        todo += included((package / name).read_text(encoding="utf-8"))
    assert reached == set(HEADERS.texts) == {p.name for p in INCLUDE_DIR.glob("*.cuh")}


def test_each_header_has_an_include_guard() -> None:
    for name, text in HEADERS.texts.items():
        guard = name.upper().replace(".", "_")
        assert re.search(rf"^#ifndef {guard}\n#define {guard}\n", text, re.MULTILINE), name
        assert text.rstrip().endswith(f"#endif  // {guard}"), name


def test_an_edited_header_changes_the_image_key(monkeypatch) -> None:
    src = relu_kernel().source
    key = nvrtc.source_key(src, ARCH)
    for name in HEADERS.texts:
        edited = Headers({**HEADERS.texts, name: HEADERS.texts[name] + "\n// edited\n"})
        monkeypatch.setattr(headers, "HEADERS", edited)
        assert nvrtc.source_key(src, ARCH) != key, name
    monkeypatch.undo()
    assert nvrtc.source_key(src, ARCH) == key  # the same texts: the same key
    assert nvrtc.source_key(src, ARCH, hdrs=Headers(dict(HEADERS.texts))) == key


@needs_nvrtc
def test_nvrtc_compiles_the_header_texts_the_key_was_made_from(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MIGRAPHX_EP_KERNEL_CACHE", str(tmp_path))
    src = relu_kernel("k_headers_from_memory").source
    assert nvrtc.compile_source(src, ARCH, "k_headers_from_memory")
    broken = HEADERS.texts["mx_prelude.cuh"] + '\n#error "the edited prelude"\n'
    monkeypatch.setattr(headers, "HEADERS", Headers({**HEADERS.texts, "mx_prelude.cuh": broken}))
    # Another key, so neither the image in memory nor the one on disk is taken: NVRTC sees the edit.
    with pytest.raises(nvrtc.KernelCompileError, match="the edited prelude"):
        nvrtc.compile_source(src, ARCH, "k_headers_from_memory")


@needs_nvrtc
def test_stored_images_are_used_only_under_the_headers_they_were_built_with() -> None:
    """A stored program (.mxr) holds images by key: one from the same headers loads as it is, one built
    under other header texts is never picked up, its kernel compiles again."""
    exe = GpuExecutable.__new__(GpuExecutable)
    exe.device = types.SimpleNamespace(arch=ARCH)
    spec = canonical(relu_kernel("k_stored_image"))
    key = nvrtc.source_key(spec.source, ARCH)
    exe._images = {key: b"stored image"}
    n = nvrtc.compile_count()
    exe._compile_kernels([spec])
    assert exe._images == {key: b"stored image"} and nvrtc.compile_count() == n
    older = Headers({**HEADERS.texts, "mx_prelude.cuh": HEADERS.texts["mx_prelude.cuh"] + "// older\n"})
    exe._images = {nvrtc.source_key(spec.source, ARCH, hdrs=older): b"stored image"}
    exe._compile_kernels([spec])
    assert key in exe._images and exe._images[key] != b"stored image"


# -- the prelude as host C++ -------------------------------------------------------------------------------
# What the prelude needs from CUDA, for a host compiler: qualifiers, the built-ins its templates name, and
# the four PTX conversions it declares only under __CUDA_ARCH__ (here by the compiler's own IEEE half).
SHIM = r"""
#include <cmath>
#include <cstring>
using std::fabs; using std::fmod; using std::copysign; using std::pow; using std::log1p; using std::exp;
struct mx_dim3 { unsigned x, y, z; };
static mx_dim3 threadIdx = {0, 0, 0};
#define __device__
#define __forceinline__ inline
#define __shared__ static
static inline void __syncthreads() {}
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int) { return v; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float mx_h2f(unsigned short h) { _Float16 f; std::memcpy(&f, &h, 2); return (float)f; }
static inline unsigned short mx_f2h(float x) { _Float16 f = (_Float16)x; unsigned short h; std::memcpy(&h, &f, 2); return h; }
static inline unsigned short mx_d2h(double x) { _Float16 f = (_Float16)x; unsigned short h; std::memcpy(&h, &f, 2); return h; }
static inline unsigned short mx_f2bf(float x) {
  unsigned u; std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#include "mx_prelude.cuh"
#include "mx_attention.cuh"
"""  # noqa: E501 - C++ kept one definition a line

CALLS = r"""
extern "C" void div_i32(const i32* a, const i32* b, i32* o, int n) { for (int i = 0; i < n; ++i) o[i] = mx_div(a[i], b[i]); }
extern "C" void mod_i32(const i32* a, const i32* b, i32* o, int n) { for (int i = 0; i < n; ++i) o[i] = mx_mod(a[i], b[i]); }
extern "C" void mod_f64(const double* a, const double* b, double* o, int n) { for (int i = 0; i < n; ++i) o[i] = mx_mod(a[i], b[i]); }
extern "C" void cvt_i32(const float* a, i32* o, int n) { for (int i = 0; i < n; ++i) o[i] = mx_cvt<i32>(a[i]); }
extern "C" void cvt_f16(const double* a, u16* o, int n) { for (int i = 0; i < n; ++i) o[i] = mx_cvt<mx_f16>(a[i]).bits; }
extern "C" void pow_f32(const float* a, const float* b, float* o, int n) { for (int i = 0; i < n; ++i) o[i] = mx_pow(a[i], b[i]); }
extern "C" void max_f32(const float* a, const float* b, float* o, float* f, int n) {
  for (int i = 0; i < n; ++i) { o[i] = mx_max(a[i], b[i]); f[i] = mx_fmax(a[i], b[i]); }
}
"""  # noqa: E501


@pytest.fixture(scope="module")
def host_prelude(tmp_path_factory) -> ctypes.CDLL:
    if GXX is None:
        pytest.skip("no g++ here to compile mx_prelude.cuh as host C++")
    tmp = tmp_path_factory.mktemp("prelude")
    src, lib = tmp / "prelude.cpp", tmp / "prelude.so"
    src.write_text(SHIM + CALLS)
    # Warnings are errors, but for CUDA's own "#pragma unroll".
    cmd = [
        GXX,
        "-std=c++17",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-unknown-pragmas",
        "-shared",
        "-fPIC",
    ]
    cmd += ["-I", str(INCLUDE_DIR)]
    done = subprocess.run([*cmd, "-o", str(lib), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[:4000]
    return ctypes.CDLL(str(lib))


def call(lib: ctypes.CDLL, fn: str, *arrays: np.ndarray) -> None:
    getattr(lib, fn)(*(ctypes.c_void_p(a.ctypes.data) for a in arrays), ctypes.c_int(arrays[0].size))


def test_prelude_integer_division_and_mod_are_numpys(host_prelude: ctypes.CDLL) -> None:
    i32 = np.iinfo(np.int32)
    a = np.array([7, -7, 7, -7, i32.min, i32.min, 5, 0], np.int32)
    b = np.array([2, 2, -2, -2, -1, 1, 0, 3], np.int32)
    got, mod = np.empty_like(a), np.empty_like(a)
    call(host_prelude, "div_i32", a, b, got)
    call(host_prelude, "mod_i32", a, b, mod)
    with np.errstate(all="ignore"):  # ONNX/C truncation; numpy's wrap at MIN / -1; 0 for a zero divisor
        want = np.where(b == 0, 0, np.trunc(a.astype(np.float64) / np.where(b == 0, 1, b)))
        want = want.astype(np.int64).astype(np.int32)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(mod, np.mod(a, b))
    x = np.array([7.5, -7.5, 7.5, -7.5, 0.0, -0.0, 6.0], np.float64)
    y = np.array([2.0, 2.0, -2.0, -2.0, -3.0, 3.0, -3.0], np.float64)
    out = np.empty_like(x)
    call(host_prelude, "mod_f64", x, y, out)  # the divisor's sign, zeros included
    np.testing.assert_array_equal(out, np.mod(x, y))
    np.testing.assert_array_equal(np.signbit(out), np.signbit(np.mod(x, y)))


def test_prelude_conversions_are_numpys_astype(host_prelude: ctypes.CDLL) -> None:
    x = np.array([1.9, -1.9, 3e9, -3e9, np.nan, np.inf, 2147483520.0], np.float32)
    got = np.empty(x.size, np.int32)
    call(host_prelude, "cvt_i32", x, got)
    low = np.iinfo(np.int32).min  # numpy's result on x86 out of range and for NaN: "integer indefinite"
    np.testing.assert_array_equal(got, [1, -1, low, low, low, low, 2147483520])
    d = np.array([1.0 + 2.0**-11, 65520.0, -1e-8, 0.1, 65504.0], np.float64)
    bits = np.empty(d.size, np.uint16)
    call(host_prelude, "cvt_f16", d, bits)
    with np.errstate(over="ignore"):  # one rounding from double, as numpy's astype
        np.testing.assert_array_equal(bits, d.astype(np.float16).view(np.uint16))


def test_prelude_max_propagates_nan_and_fmax_skips_it(host_prelude: ctypes.CDLL) -> None:
    a = np.array([np.nan, 1.0, np.nan, 2.0], np.float32)
    b = np.array([1.0, np.nan, np.nan, -2.0], np.float32)
    got, skip = np.empty_like(a), np.empty_like(a)
    call(host_prelude, "max_f32", a, b, got, skip)
    np.testing.assert_array_equal(got, np.maximum(a, b))
    np.testing.assert_array_equal(skip, np.fmax(a, b))


def test_prelude_squares_and_cubes_match_pow(host_prelude: ctypes.CDLL) -> None:
    """Exponents 2 and 3 take products in double (GELU's cube was a double pow per element): the same
    floats as pow in double rounded to float (what every other exponent still computes) over a dense
    sweep, the specials included, and within an ulp of numpy's float32 power, which is not correctly
    rounded (it is farther from the exact cube wherever the two differ)."""
    rng = np.random.default_rng(3)
    a = np.concatenate([
        rng.standard_normal(200_000).astype(np.float32) * np.float32(4),
        np.ldexp(rng.random(50_000), rng.integers(-140, 50, 50_000)).astype(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e15, -1e13, 3e38, 1e-45, -1e-20], np.float32),
    ])  # fmt: skip
    for e in (2.0, 3.0, 0.5, -1.5):
        a = a if e in (2.0, 3.0) else a[np.isfinite(a)]  # numpy's (-inf) ** 0.5 is NaN, C's pow +inf
        got = np.empty_like(a)
        call(host_prelude, "pow_f32", a, np.full_like(a, e), got)
        with np.errstate(all="ignore"):
            want = np.power(a.astype(np.float64), e).astype(np.float32)
            ulps = np.abs(got.view(np.int32).astype(np.int64) - np.power(a, np.float32(e)).view(np.int32))
        differ = (got != want) & ~(np.isnan(got) & np.isnan(want))
        assert not differ.any(), (e, a[differ][:5], got[differ][:5], want[differ][:5])
        if e in (2.0, 3.0):  # -0 ** 3 is -0 (numpy's -0 ** 0.5 is -0 where C's pow gives +0)
            num = ~np.isnan(got)
            assert np.array_equal(np.signbit(got[num]), np.signbit(want[num]))
        assert ulps[np.isfinite(got) & (got != 0)].max() <= 1, e
