// mx_prelude.cuh: the device header every generated kernel includes first.
//
// Self-contained CUDA C++ (NVRTC gets no toolkit headers, so nothing here includes any): fixed-width
// integer names, 16-bit storage types for half and bfloat16, 8-bit ones for the four float8 formats
// (converted in software, so on any GPU), and numpy's element semantics as small
// templates (mx_add wraps integers, mx_div is ONNX/C integer division with numpy's answer at MIN / -1,
// mx_cvt is astype including x86's float-to-int results out of range, mx_max propagates NaN and mx_fmax
// skips it; mx_fail reports a failed run-time check). Half and bfloat16 values live in float ("compute
// type") between a load and a store; generators round them back to 16 bits after every op, as the ref
// target does; float8 values too, though generators only convert them. Then the warp and block
// reductions the row, reduce and attention kernels share.
//
// The four PTX conversions sit under __CUDA_ARCH__ so the same text compiles on a host with a small shim
// that defines them (tests/gpu/test_device_headers.py, and the host launchers in tests/gpu/), and
// float's bits come from a union there; everything else is plain C++17.
#ifndef MX_PRELUDE_CUH
#define MX_PRELUDE_CUH
typedef signed char i8; typedef unsigned char u8; typedef short i16; typedef unsigned short u16;
typedef int i32; typedef unsigned int u32; typedef long long i64; typedef unsigned long long u64;
struct mx_f16 { u16 bits; };
struct mx_bf16 { u16 bits; };
struct mx_fp8e4m3fn { u8 bits; };
struct mx_fp8e4m3fnuz { u8 bits; };
struct mx_fp8e5m2 { u8 bits; };
struct mx_fp8e5m2fnuz { u8 bits; };
#define MX_DEV __device__ __forceinline__
#define MX_UNROLL _Pragma("unroll")

#ifdef __CUDA_ARCH__
MX_DEV float mx_h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
MX_DEV u16 mx_f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
MX_DEV u16 mx_d2h(double d) { u16 h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
MX_DEV u16 mx_f2bf(float f) { u16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
MX_DEV u32 mx_fbits(float f) { return __float_as_uint(f); }
#else
MX_DEV u32 mx_fbits(float f) { union { float f; u32 u; } c = {f}; return c.u; }  // GCC defines the pun
#endif

template <class A, class B> struct mx_same_t { enum : bool { v = false }; };
template <class A> struct mx_same_t<A, A> { enum : bool { v = true }; };
template <class A, class B> constexpr bool mx_same = mx_same_t<A, B>::v;
// flt: IEEE compute type; sgn: signed; W: the unsigned type integer arithmetic wraps in.
template <class T> struct mx_t { enum : bool { flt = false, sgn = false }; typedef u32 W; };
template <> struct mx_t<i8> { enum : bool { flt = false, sgn = true }; typedef u32 W; };
template <> struct mx_t<i16> { enum : bool { flt = false, sgn = true }; typedef u32 W; };
template <> struct mx_t<i32> { enum : bool { flt = false, sgn = true }; typedef u32 W; };
template <> struct mx_t<i64> { enum : bool { flt = false, sgn = true }; typedef u64 W; };
template <> struct mx_t<u64> { enum : bool { flt = false, sgn = false }; typedef u64 W; };
template <> struct mx_t<float> { enum : bool { flt = true, sgn = true }; typedef float W; };
template <> struct mx_t<double> { enum : bool { flt = true, sgn = true }; typedef double W; };
template <class T, int V> struct alignas(sizeof(T) * V) mx_vec { T v[V]; };

// float8 <-> float in software: exact decoding, encoding as ml_dtypes' astype (the ref's), ties to even.
// A format is M mantissa bits, exponent BIAS and its largest finite code MAX (sign off); FNUZ: 0x80 is
// the one NaN (ml_dtypes decodes it as -NaN) and there is no -0; INF: 0x7c is infinity (E5M2 only).
// Without saturate a magnitude rounding past MAX is infinity where the format has one, else NaN; with
// it, finite overflow and infinities give +-MAX (ONNX Cast's saturate) and NaN stays NaN.
template <u32 M_, u32 BIAS_, u32 MAX_, bool FNUZ_, bool INF_> struct mx_f8_fmt {
  enum : bool { is = true, FNUZ = FNUZ_, INF = INF_ };
  enum : u32 { M = M_, BIAS = BIAS_, MAX = MAX_ };
};
template <class T> struct mx_f8 { enum : bool { is = false }; };
template <> struct mx_f8<mx_fp8e4m3fn> : mx_f8_fmt<3, 7, 0x7e, false, false> {};
template <> struct mx_f8<mx_fp8e4m3fnuz> : mx_f8_fmt<3, 8, 0x7f, true, false> {};
template <> struct mx_f8<mx_fp8e5m2> : mx_f8_fmt<2, 15, 0x7b, false, true> {};
template <> struct mx_f8<mx_fp8e5m2fnuz> : mx_f8_fmt<2, 16, 0x7f, true, false> {};
template <class T> MX_DEV float mx_from_f8(u8 v) {
  typedef mx_f8<T> F;
  const u32 s = (u32)(v & 0x80u) << 24, a = v & 0x7fu, e = a >> F::M, m = a & ((1u << F::M) - 1u);
  if (F::FNUZ ? v == 0x80u : a > F::MAX + (F::INF ? 1u : 0u))
    return __int_as_float((int)(F::FNUZ ? 0xffc00000u : s | 0x7fc00000u));
  if (F::INF && a == 0x7cu) return __int_as_float((int)(s | 0x7f800000u));
  if (e == 0u) {  // subnormal: m units of 2^(1 - BIAS - M), a normal float
    const float f = (float)m * __int_as_float((int)((128u - F::BIAS - F::M) << 23));
    return s ? -f : f;
  }
  return __int_as_float((int)(s | ((e + 127u - F::BIAS) << 23) | (m << (23u - F::M))));
}
template <class T> MX_DEV T mx_to_f8(float f, bool saturate) {
  typedef mx_f8<T> F;
  const u32 b = mx_fbits(f), s = (b >> 24) & 0x80u, a = b & 0x7fffffffu, e = a >> 23;
  if (a > 0x7f800000u) return T{(u8)(F::FNUZ ? 0x80u : s | (F::INF ? 0x7eu : 0x7fu))};  // NaN
  u32 r = 0x100u;  // infinity: past every finite code
  if (a < 0x7f800000u && e + F::BIAS >= 128u) {
    // In fp8's normal range: drop 23 - M mantissa bits rounding to even on the whole magnitude, so a
    // carry moves into the exponent; then rebias.
    const u32 sh = 23u - F::M;
    r = ((a + (1u << (sh - 1u)) - 1u + ((a >> sh) & 1u)) >> sh) - ((127u - F::BIAS) << F::M);
  } else if (a < 0x7f800000u) {
    // Below it: whole units of the subnormal step 2^(1 - BIAS - M), sh >= 21 bits of the significand
    // dropped (a result of 1 << M is the smallest normal code); past 24 less than half a unit is left.
    const u32 sig = (a & 0x7fffffu) | (e ? 0x800000u : 0u), sh = 151u - F::BIAS - F::M - (e ? e : 1u);
    r = 0u;
    if (sh < 25u) {
      const u32 q = sig >> sh, rem = sig & ((1u << sh) - 1u), half = 1u << (sh - 1u);
      r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    }
  }
  if (r > F::MAX) {
    if (!saturate) return T{(u8)(F::FNUZ ? 0x80u : s | (F::INF ? 0x7cu : 0x7fu))};  // inf, or NaN
    r = F::MAX;
  }
  return T{(u8)((F::FNUZ && r == 0u) ? 0u : s | r)};  // fnuz has no -0
}

// Storage -> compute type (half and bfloat16 compute in float).
MX_DEV float mx_ld(mx_f16 h) { return mx_h2f(h.bits); }
MX_DEV float mx_ld(mx_bf16 h) { return __int_as_float((u32)h.bits << 16); }
MX_DEV float mx_ld(mx_fp8e4m3fn v) { return mx_from_f8<mx_fp8e4m3fn>(v.bits); }
MX_DEV float mx_ld(mx_fp8e4m3fnuz v) { return mx_from_f8<mx_fp8e4m3fnuz>(v.bits); }
MX_DEV float mx_ld(mx_fp8e5m2 v) { return mx_from_f8<mx_fp8e5m2>(v.bits); }
MX_DEV float mx_ld(mx_fp8e5m2fnuz v) { return mx_from_f8<mx_fp8e5m2fnuz>(v.bits); }
template <class T> MX_DEV T mx_ld(T x) { return x; }

// numpy's float -> int astype on x86: out of range and NaN give the "integer indefinite" pattern.
template <class F> MX_DEV i32 mx_cvtt32(F x) {
  return (x >= (F)-2147483648.0 && x < (F)2147483648.0) ? (i32)x : (i32)0x80000000u;
}
template <class F> MX_DEV i64 mx_cvtt64(F x) {
  return (x >= (F)-9223372036854775808.0 && x < (F)9223372036854775808.0) ? (i64)x
                                                                            : (i64)0x8000000000000000ull;
}
template <class To, class F> MX_DEV To mx_f2i(F x) {
  if constexpr (mx_same<To, u32>)
    return x >= (F)2147483648.0 ? (u32)mx_cvtt32(x - (F)2147483648.0) ^ 0x80000000u : (u32)mx_cvtt32(x);
  else if constexpr (mx_same<To, u64>)
    return x >= (F)9223372036854775808.0 ? (u64)mx_cvtt64(x - (F)9223372036854775808.0) ^ (1ull << 63)
                                         : (u64)mx_cvtt64(x);
  else if constexpr (mx_same<To, i64>) return mx_cvtt64(x);
  else return (To)mx_cvtt32(x);  // 8/16-bit results keep the low bits of the 32-bit conversion
}
// A float8 value (decoded to float) to an integer, as ml_dtypes casts it: NaN is 0 and an infinity the
// type's limit; finite values as from float.
template <class To> MX_DEV To mx_f8_to_int(float x) {
  const float inf = __int_as_float(0x7f800000);
  if (x != x) return (To)0;
  if (x != inf && x != -inf) return mx_f2i<To>(x);
  const To hi = mx_t<To>::sgn ? (To)(((typename mx_t<To>::W)1 << (8 * sizeof(To) - 1)) - 1u) : (To)~(To)0;
  return x > 0 ? hi : mx_t<To>::sgn ? (To)(-hi - 1) : (To)0;
}
// astype(To) of a compute value; returns the storage type. f16 from double rounds once (numpy);
// bfloat16 and float8 go through float, as ml_dtypes does (from double: two roundings).
template <class To, class From> MX_DEV To mx_cvt(From x) {
  if constexpr (mx_same<To, From>) return x;
  else if constexpr (mx_same<To, bool>) return x != (From)0;
  else if constexpr (mx_same<To, mx_f16>) {
    if constexpr (mx_same<From, double>) return mx_f16{mx_d2h(x)};
    else return mx_f16{mx_f2h((float)x)};
  } else if constexpr (mx_same<To, mx_bf16>) return mx_bf16{mx_f2bf((float)x)};
  else if constexpr (mx_f8<To>::is) return mx_to_f8<To>((float)x, false);
  else if constexpr (mx_t<To>::flt || !mx_t<From>::flt) return (To)x;
  else return mx_f2i<To>(x);
}
// Round a compute value to the element type T and return it as a compute value again.
template <class T, class From> MX_DEV auto mx_round(From x) { return mx_ld(mx_cvt<T>(x)); }

// Elementwise semantics of the IR ops (numpy's), on compute types.
// Integers wrap (numpy): arithmetic in the unsigned W, truncated back; for floats W is the type itself.
template <class T> using mx_w = typename mx_t<T>::W;
template <class T> MX_DEV T mx_add(T a, T b) { return (T)((mx_w<T>)a + (mx_w<T>)b); }
template <class T> MX_DEV T mx_sub(T a, T b) { return (T)((mx_w<T>)a - (mx_w<T>)b); }
template <class T> MX_DEV T mx_mul(T a, T b) { return (T)((mx_w<T>)a * (mx_w<T>)b); }
template <class T> MX_DEV T mx_neg(T a) {
  if constexpr (mx_t<T>::flt) return -a;  // 0 - a would lose the sign of zero
  else return (T)((mx_w<T>)0 - (mx_w<T>)a);
}
template <class T> MX_DEV T mx_abs(T a) {
  if constexpr (mx_t<T>::flt) return fabs(a);
  else if constexpr (mx_t<T>::sgn) return a < 0 ? mx_neg(a) : a;
  else return a;
}
template <class T> MX_DEV T mx_sign(T a) {
  if constexpr (mx_t<T>::flt) return a > 0 ? (T)1 : a < 0 ? (T)-1 : a == 0 ? (T)0 : a;
  else return (T)((a > 0) - (a < 0));
}
template <class T> MX_DEV T mx_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <class T> MX_DEV T mx_min(T a, T b) { return (a != a || a < b) ? a : b; }
// reduce_max/min and max pooling skip NaN (the ref's np.fmax rule): NaN only when both are NaN.
template <class T> MX_DEV T mx_fmax(T a, T b) { return (b != b || a > b) ? a : b; }
template <class T> MX_DEV T mx_fmin(T a, T b) { return (b != b || a < b) ? a : b; }
template <class T> MX_DEV bool mx_isnan(T a) { return a != a; }
// Run-time checks: a failing one stores its code in the kernel's error slot (the host raises after the
// Run, as the ref would) and the kernel goes on with a harmless value: never an out-of-bounds access.
MX_DEV void mx_fail(i32* err, i32 code) { *err = code; }
template <class T> MX_DEV T mx_nz(T b, i32* err, i32 code) {  // a divisor, 1 in place of a zero
  if (b == 0) { mx_fail(err, code); return (T)1; }
  return b;
}
// Integer division truncates and MIN/-1 wraps, as the ref computes them; a zero divisor (which
// generated kernels check with mx_nz first) gives 0 rather than undefined behaviour.
template <class T> MX_DEV T mx_div(T a, T b) {
  if constexpr (mx_t<T>::flt) return a / b;
  else if constexpr (mx_t<T>::sgn) return b == 0 ? (T)0 : b == (T)-1 ? mx_neg(a) : (T)(a / b);
  else return b == 0 ? (T)0 : (T)(a / b);
}
template <class T> MX_DEV T mx_fmod(T a, T b) {
  if constexpr (mx_t<T>::flt) return fmod(a, b);
  else if constexpr (mx_t<T>::sgn) return (b == 0 || b == (T)-1) ? (T)0 : (T)(a % b);
  else return b == 0 ? (T)0 : (T)(a % b);
}
template <class T> MX_DEV T mx_mod(T a, T b) {  // numpy's mod: the sign of the divisor
  if constexpr (mx_t<T>::flt) {
    T m = fmod(a, b);
    if (b == 0) return m;
    if (m != 0) return ((b < 0) != (m < 0)) ? m + b : m;
    return copysign((T)0, b);
  } else {
    T r = mx_fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
  }
}
template <class T> MX_DEV T mx_pow(T a, T b) {
  if constexpr (mx_same<T, double>) return pow(a, b);
  else if constexpr (mx_t<T>::flt) {
    // Squares and cubes by products in double: a^2 is exact there and a^3 rounds once, as pow does,
    // at a few instructions where double pow takes a hundred (GPT-2's GELU cubes every activation:
    // 7.0 us a layer at batch 1, against 1.7 for torch's). A literal exponent folds the tests away.
    if (b == (T)2) return (T)((double)a * (double)a);
    if (b == (T)3) return (T)((double)a * (double)a * (double)a);
    return (T)pow((double)a, (double)b);
  } else {
    // Exact for results below 2^53 (repeated squaring); libm's pow may miss an exact integer by an
    // ulp, which truncation would turn into an off-by-one.
    i64 e = (i64)b;
    if (e < 0) return mx_f2i<T>(pow((double)a, (double)b));
    double r = 1.0, base = (double)a;
    while (e) { if (e & 1) r *= base; base *= base; e >>= 1; }
    return mx_f2i<T>(r);
  }
}
// A product the compiler may not fuse into an fma with a following add (the ref rounds it).
MX_DEV float mx_mul_rn(float a, float b) { return __fmul_rn(a, b); }
MX_DEV double mx_mul_rn(double a, double b) { return __dmul_rn(a, b); }
template <class T> MX_DEV T mx_softplus(T v) {  // numpy's logaddexp(0, v): stable, like the ref
  if (v == 0) return (T)0.6931471805599453;
  if (v < 0) return log1p(exp(v));
  if (v > 0) return v + log1p(exp(-v));
  return v;
}
template <class T> MX_DEV bool mx_shift_ok(T b) { return (i64)b >= 0 && (i64)b < (i64)(8 * sizeof(T)); }
template <class T> MX_DEV T mx_shl(T a, T b) {
  return mx_shift_ok(b) ? (T)((mx_w<T>)a << (int)b) : (T)0;
}
template <class T> MX_DEV T mx_shr(T a, T b) {
  return mx_shift_ok(b) ? (T)(a >> (int)b) : (a < 0 ? (T)-1 : (T)0);
}

// V consecutive elements to or from compute values; V > 1 needs V-aligned pointers.
template <int V, class T, class C> MX_DEV void mx_ldv(const T* p, C* d) {
  if constexpr (V == 1) d[0] = (C)mx_ld(p[0]);
  else {
    const mx_vec<T, V> w = *reinterpret_cast<const mx_vec<T, V>*>(p);
#pragma unroll
    for (int q = 0; q < V; ++q) d[q] = (C)mx_ld(w.v[q]);
  }
}
template <int V, class T, class C> MX_DEV void mx_stv(T* p, const C* s) {
  if constexpr (V == 1) p[0] = mx_cvt<T>(s[0]);
  else {
    mx_vec<T, V> w;
#pragma unroll
    for (int q = 0; q < V; ++q) w.v[q] = mx_cvt<T>(s[q]);
    *reinterpret_cast<mx_vec<T, V>*>(p) = w;
  }
}

// Reductions: all NT threads of the block (or the 32 of a warp) call these together.
template <class S> MX_DEV S mx_shfl_xor(S s, int m) {
  union { S s; u32 w[(sizeof(S) + 3) / 4]; } u;
  u.s = s;
#pragma unroll
  for (int i = 0; i < (int)((sizeof(S) + 3) / 4); ++i) u.w[i] = __shfl_xor_sync(0xffffffffu, u.w[i], m);
  return u.s;
}
// Butterfly over groups of W lanes (a power of two <= 32): every lane of a group gets the group's total.
template <int W, class S, class F> MX_DEV S mx_warp_reduce(S s, F f) {
#pragma unroll
  for (int m = W / 2; m > 0; m >>= 1) s = f(s, mx_shfl_xor(s, m));
  return s;
}
// The same over groups of w lanes, w a run-time power of two <= 32 equal across the warp (row kernels
// whose lanes per row are a run-time argument).
template <class S, class F> MX_DEV S mx_group_reduce(S s, F f, u32 w) {
  for (u32 m = w / 2u; m > 0u; m >>= 1) s = f(s, mx_shfl_xor(s, (int)m));
  return s;
}
template <int NT, class S, class F> MX_DEV S mx_block_reduce(S s, F f) {
  s = mx_warp_reduce<32>(s, f);
  if constexpr (NT > 32) {
    __shared__ S part[NT / 32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    s = part[0];
#pragma unroll
    for (int w = 1; w < NT / 32; ++w) s = f(s, part[w]);
    __syncthreads();  // part may be reused by the next call
  }
  return s;
}
struct mx_sum_f { template <class T> MX_DEV T operator()(T a, T b) const { return mx_add(a, b); } };
struct mx_prod_f { template <class T> MX_DEV T operator()(T a, T b) const { return mx_mul(a, b); } };
struct mx_max_f { template <class T> MX_DEV T operator()(T a, T b) const { return mx_max(a, b); } };
struct mx_min_f { template <class T> MX_DEV T operator()(T a, T b) const { return mx_min(a, b); } };
struct mx_fmax_f { template <class T> MX_DEV T operator()(T a, T b) const { return mx_fmax(a, b); } };
struct mx_fmin_f { template <class T> MX_DEV T operator()(T a, T b) const { return mx_fmin(a, b); } };
// (value, index) for argmax/argmin: NaN loses (the ref's rule), then the larger (smaller), then the first
// (last); among NaN only the first, so all NaN gives index 0. Index -1 marks an empty partial.
template <class T> struct mx_arg { T v; i64 i; };
template <class T, bool MAX, bool LAST> struct mx_arg_f {
  MX_DEV mx_arg<T> operator()(mx_arg<T> a, mx_arg<T> b) const {
    if (a.i < 0 || b.i < 0) return a.i < 0 ? b : a;
    const bool an = mx_isnan(a.v), bn = mx_isnan(b.v);
    bool a_wins;
    if (an != bn) a_wins = bn;
    else if (an) a_wins = a.i < b.i;
    else if (a.v == b.v) a_wins = LAST ? a.i > b.i : a.i < b.i;
    else a_wins = MAX ? a.v > b.v : a.v < b.v;
    return a_wins ? a : b;
  }
};

#endif  // MX_PRELUDE_CUH
