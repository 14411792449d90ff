"""The prelude's float8 codecs (``mx_from_f8``, ``mx_to_f8``, ``mx_f8_to_int``) compiled as host C++
and checked bit for bit against the ref: ml_dtypes' ``astype`` (Convert) and ``saturate_cast`` (Cast and
QuantizeLinear with saturate). Every code decodes; a dense sweep of float32, every half and bfloat16
value and doubles near the roundings encode, for each of the four formats and both saturate modes."""

from __future__ import annotations

import ctypes
import shutil
import warnings

import ml_dtypes
import numpy as np
import pytest

from migraphx_ep.ops.quant import saturate_cast

from .hostcc import host_library
from .test_device_headers import SHIM

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ for a host prelude")

# In the order of MX_F8_SWITCH below.
FORMATS = [
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
]
INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]

CALLS = r"""
#define MX_F8_SWITCH(t, F) switch (t) { \
  case 0: F(mx_fp8e4m3fn); break; case 1: F(mx_fp8e4m3fnuz); break; \
  case 2: F(mx_fp8e5m2); break; default: F(mx_fp8e5m2fnuz); }
extern "C" void dec(int t, const u8* in, float* o, int n) {
#define DEC(T) for (int i = 0; i < n; ++i) o[i] = mx_ld(T{in[i]})
  MX_F8_SWITCH(t, DEC)
}
// Saturating or not, from a float compute value (float32, and half and bfloat16 loaded to float).
extern "C" void enc(int t, int sat, const float* in, u8* o, int n) {
#define ENC(T) for (int i = 0; i < n; ++i) o[i] = mx_to_f8<T>(in[i], sat != 0).bits
  MX_F8_SWITCH(t, ENC)
}
extern "C" void enc_f16(int t, const u16* in, u8* o, int n) {
#define ENC16(T) for (int i = 0; i < n; ++i) o[i] = mx_cvt<T>(mx_ld(mx_f16{in[i]})).bits
  MX_F8_SWITCH(t, ENC16)
}
extern "C" void enc_bf16(int t, const u16* in, u8* o, int n) {
#define ENCBF(T) for (int i = 0; i < n; ++i) o[i] = mx_cvt<T>(mx_ld(mx_bf16{in[i]})).bits
  MX_F8_SWITCH(t, ENCBF)
}
extern "C" void enc_f64(int t, const double* in, u8* o, int n) {
#define ENC64(T) for (int i = 0; i < n; ++i) o[i] = mx_cvt<T>(in[i]).bits
  MX_F8_SWITCH(t, ENC64)
}
// Every code of format t to format u (decoded to float, as a kernel's convert does).
template <class T> void dec_all(float* x) { for (int i = 0; i < 256; ++i) x[i] = mx_ld(T{(u8)i}); }
#define DEC_ALL(T) dec_all<T>(x)
extern "C" void f8_to_f8(int t, int u, u8* o) {
#define TO(U) for (int i = 0; i < 256; ++i) o[i] = mx_cvt<U>(x[i]).bits
  float x[256];
  MX_F8_SWITCH(t, DEC_ALL)
  MX_F8_SWITCH(u, TO)
}
extern "C" void f8_to_int(int t, int k, void* o) {
  float x[256];
  MX_F8_SWITCH(t, DEC_ALL)
  for (int i = 0; i < 256; ++i) switch (k) {
    case 0: ((i8*)o)[i] = mx_f8_to_int<i8>(x[i]); break;
    case 1: ((u8*)o)[i] = mx_f8_to_int<u8>(x[i]); break;
    case 2: ((i16*)o)[i] = mx_f8_to_int<i16>(x[i]); break;
    case 3: ((u16*)o)[i] = mx_f8_to_int<u16>(x[i]); break;
    case 4: ((i32*)o)[i] = mx_f8_to_int<i32>(x[i]); break;
    case 5: ((u32*)o)[i] = mx_f8_to_int<u32>(x[i]); break;
    case 6: ((i64*)o)[i] = mx_f8_to_int<i64>(x[i]); break;
    default: ((u64*)o)[i] = mx_f8_to_int<u64>(x[i]); break;
  }
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:  # noqa: ANN001
    return host_library(SHIM + CALLS, tmp_path_factory.mktemp("fp8"))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


CODES = np.arange(256, dtype=np.uint8)


def astype(x: np.ndarray, dt: np.dtype, saturate: bool = False) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return saturate_cast(x, dt, True) if saturate else x.astype(dt)


def float_sweep() -> np.ndarray:
    """Every float32's top 16 bits (sign, exponent, 7 mantissa bits: past every fp8 rounding bit) with
    low halves that make ties, values just past them and the rest; then infinities, NaNs and zeros."""
    low = np.array([0, 1, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF], np.uint32)
    bits = (np.arange(1 << 16, dtype=np.uint32)[:, None] << 16 | low).ravel()
    return bits.view(np.float32)


def near_roundings(dt: np.dtype) -> np.ndarray:
    """Each finite value of ``dt``, the midpoints between neighbours, and float32's neighbours of both."""
    v = CODES.view(dt).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])
    mids = ((v[1:] + v[:-1]) / 2).astype(np.float32)
    edge = np.float32(float(ml_dtypes.finfo(dt).max) * 1.0625)  # the tie past the largest finite value
    x = np.concatenate([v.astype(np.float32), mids, [edge, 2 * edge]]).astype(np.float32)
    return np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])


def assert_codes(got: np.ndarray, want: np.ndarray, x: np.ndarray, what: str) -> None:
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{what}: {bad.size} wrong, e.g. {x[bad[:4]]} -> {got[bad[:4]]} not {want[bad[:4]]}"


@pytest.mark.parametrize("k", range(4), ids=[str(f) for f in FORMATS])
def test_every_code_decodes_as_ml_dtypes(lib: ctypes.CDLL, k: int) -> None:
    got = np.zeros(256, np.float32)
    lib.dec(k, ptr(CODES), ptr(got), 256)
    want = CODES.view(FORMATS[k]).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN's sign and -0 too
    assert np.isnan(want).sum() == (1 if FORMATS[k].name.endswith("fnuz") else 2 if k == 0 else 6)


@pytest.mark.parametrize("saturate", [False, True], ids=["wrap", "saturate"])
@pytest.mark.parametrize("k", range(4), ids=[str(f) for f in FORMATS])
def test_float_encodes_as_the_ref(lib: ctypes.CDLL, k: int, saturate: bool) -> None:
    dt = FORMATS[k]
    specials = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-45, -1e-45, 3e38], np.float32)
    x = np.concatenate([float_sweep(), near_roundings(dt), specials])
    got = np.zeros(x.size, np.uint8)
    lib.enc(k, int(saturate), ptr(x), ptr(got), x.size)
    assert_codes(got, astype(x, dt, saturate).view(np.uint8), x, f"{dt} saturate={saturate}")


@pytest.mark.parametrize("k", range(4), ids=[str(f) for f in FORMATS])
def test_half_and_bfloat16_encode_as_the_ref(lib: ctypes.CDLL, k: int) -> None:
    """Every 16-bit pattern; both widen to float exactly, so one rounding, as ml_dtypes'."""
    dt, bits = FORMATS[k], np.arange(1 << 16, dtype=np.uint16)
    for fn, src in (("enc_f16", np.float16), ("enc_bf16", ml_dtypes.bfloat16)):
        got = np.zeros(bits.size, np.uint8)
        getattr(lib, fn)(k, ptr(bits), ptr(got), bits.size)
        x = bits.view(src)
        assert_codes(got, astype(x, dt).view(np.uint8), x, f"{fn} {dt}")


@pytest.mark.parametrize("k", range(4), ids=[str(f) for f in FORMATS])
def test_double_rounds_through_float_as_ml_dtypes(lib: ctypes.CDLL, k: int) -> None:
    """ml_dtypes takes a double to float first: a value just past a float8 tie, which float rounds onto
    the tie, then goes to the even neighbour, where one rounding from double would go up."""
    dt = FORMATS[k]
    x = near_roundings(dt).astype(np.float64)
    x = np.concatenate([x, x * (1 + 2.0**-40), x * (1 - 2.0**-40), x * (1 + 2.0**-25), [1e300, -1e-300]])
    got = np.zeros(x.size, np.uint8)
    lib.enc_f64(k, ptr(x), ptr(got), x.size)
    want = astype(x, dt).view(np.uint8)
    assert_codes(got, want, x, f"double {dt}")
    one = np.array([1 + 2.0**-4 + 2.0**-40])  # past the tie between 1 and 1.125 in E4M3, float32's tie
    if k < 2:
        assert astype(one, dt).astype(np.float64)[0] == 1.0  # the double rounding this test pins


@pytest.mark.parametrize("k", range(4), ids=[str(f) for f in FORMATS])
def test_float8_to_float8_and_to_integers_as_the_ref(lib: ctypes.CDLL, k: int) -> None:
    src = CODES.view(FORMATS[k])
    for u, dt in enumerate(FORMATS):
        if u == k:  # a convert to its own type is a copy of the bytes (pointwise _is_copy), NaN payloads kept
            continue
        got = np.zeros(256, np.uint8)
        lib.f8_to_f8(k, u, ptr(got))
        assert_codes(got, astype(src, dt).view(np.uint8), CODES, f"{FORMATS[k]} -> {dt}")
    for j, it in enumerate(INTS):
        got = np.zeros(256, it)
        lib.f8_to_int(k, j, ptr(got))
        assert_codes(got, astype(src, np.dtype(it)), CODES, f"{FORMATS[k]} -> {np.dtype(it)}")
