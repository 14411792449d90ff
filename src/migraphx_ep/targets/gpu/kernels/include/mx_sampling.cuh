// mx_sampling.cuh: GridSample's per-axis taps and RoiAlign's bins (kernels/sampling.py generates the
// kernels that call these).
//
// Each step is the ref's numpy (ops/sampling.py) in the same order and type F (float, or double for
// double inputs), so the results agree bit for bit:
// - every product goes through mx_mul_rn, because NVRTC would otherwise fuse a product and a following
//   add into one fma (one rounding where numpy rounds twice);
// - the ref's Python-float constants (-0.5, size - 0.5, the cubic a = -0.75) are rounded to F where
//   numpy casts them;
// - a float -> int64 conversion gives numpy's x86 answer out of range or for NaN (mx_cvtt64), and int64
//   sums wrap as numpy's do, so a NaN or huge grid coordinate lands on the pixel the ref picks.
#ifndef MX_SAMPLING_CUH
#define MX_SAMPLING_CUH
#include "mx_prelude.cuh"

template <class F> MX_DEV F mx_floor(F x) {
  if constexpr (mx_same<F, float>) return floorf(x);
  else return floor(x);
}
template <class F> MX_DEV F mx_ceil(F x) {
  if constexpr (mx_same<F, float>) return ceilf(x);
  else return ceil(x);
}
template <class F> MX_DEV F mx_trunc(F x) {
  if constexpr (mx_same<F, float>) return truncf(x);
  else return trunc(x);
}
template <class F> MX_DEV F mx_rint(F x) {  // half to even, as np.rint
  if constexpr (mx_same<F, float>) return rintf(x);
  else return rint(x);
}
template <class F> MX_DEV bool mx_even(F n) {  // numpy's n % 2 == 0 (false for inf and NaN)
  if constexpr (mx_same<F, float>) return fmodf(n, 2.0f) == 0.0f;
  else return fmod(n, 2.0) == 0.0;
}
template <class F> MX_DEV bool mx_finite(F x) { return x - x == (F)0; }
MX_DEV i64 mx_add_wrap(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
MX_DEV i64 mx_clip_index(i64 i, i64 size) { return i < 0 ? 0 : i >= size ? size - 1 : i; }

// The ref's _reflect: v folded back into [lo, hi] (bounds given as the ref's Python floats).
template <class F> MX_DEV F mx_reflect(F v, double lo_d, double hi_d) {
  const F lo = (F)lo_d, hi = (F)hi_d;
  if (hi_d - lo_d <= 0.0) return lo;
  const F rng = (F)(hi_d - lo_d);
  const F dx = v < lo ? lo - v : v - hi;
  const F n = mx_trunc(dx / rng);
  const F r = dx - mx_mul_rn(n, rng);
  const bool even = mx_even(n);
  if (v < lo) return even ? lo + r : hi - r;
  if (v > hi) return even ? hi - r : lo + r;
  return v;
}

// The ref's _cubic_coeffs (a = -0.75) for the fraction t.
template <class F> MX_DEV void mx_cubic_coeffs(F t, F* w) {
  const F a = (F)-0.75, a5 = (F)-3.75, a8 = (F)-6.0, a4 = (F)-3.0, a2 = (F)1.25, a3 = (F)2.25;
  t = t < (F)0 ? -t : t;
  const F t1 = t + (F)1, u = (F)1 - t, t2 = (F)2 - t;
  w[0] = mx_mul_rn(mx_mul_rn(mx_mul_rn(a, t1) - a5, t1) + a8, t1) - a4;
  w[1] = mx_mul_rn(mx_mul_rn(mx_mul_rn(a2, t) - a3, t), t) + (F)1;
  w[2] = mx_mul_rn(mx_mul_rn(mx_mul_rn(a2, u) - a3, u), u) + (F)1;
  w[3] = mx_mul_rn(mx_mul_rn(mx_mul_rn(a, t2) - a5, t2) + a8, t2) - a4;
}

// GridSample on one axis of ``size`` pixels: the normalised coordinate v becomes TAPS (index, weight,
// inside) triples. MODE 0 nearest (1 tap), 1 linear (2), 2 cubic (4); PAD 0 zeros, 1 border,
// 2 reflection. Indices come back clipped into [0, size), so reading them is always in bounds; a tap
// of zeros padding that fell outside has ok false and adds 0 * weight (NaN for an inf weight, as the ref).
template <int MODE> struct mx_grid_taps { enum : int { n = MODE == 0 ? 1 : MODE == 1 ? 2 : 4 }; };
template <class F, int MODE, int PAD, bool ALIGN>
MX_DEV void mx_grid_axis(F v, i64 size, i64* ix, F* wt, bool* ok) {
  const double lo = ALIGN ? 0.0 : -0.5, hi = ALIGN ? (double)size - 1.0 : (double)size - 0.5;
  F c = ALIGN ? mx_mul_rn((v + (F)1) / (F)2, (F)(size - 1)) : (mx_mul_rn(v + (F)1, (F)size) - (F)1) / (F)2;
  if constexpr (MODE == 0) c = mx_rint(c);
  if (c < (F)lo || c > (F)hi) {
    if (PAD == 1) c = c < (F)0 ? (F)0 : c > (F)(size - 1) ? (F)(size - 1) : c;
    if (PAD == 2) c = mx_reflect<F>(c, lo, hi);
  }
  if constexpr (MODE == 0) {
    ix[0] = mx_cvtt64(c);
    wt[0] = (F)1;
  } else {
    const F f = mx_floor(c);
    const i64 fi = mx_cvtt64(f);
    if constexpr (MODE == 1) {
      const F t = c - f;
      ix[0] = fi, wt[0] = (F)1 - t;
      ix[1] = mx_add_wrap(fi, 1), wt[1] = t;
    } else {
      mx_cubic_coeffs(c - f, wt);
      for (int j = 0; j < 4; ++j) ix[j] = mx_add_wrap(fi, j - 1);
    }
  }
  for (int j = 0; j < mx_grid_taps<MODE>::n; ++j) {
    i64 i = ix[j];
    ok[j] = PAD != 0 || (i >= 0 && i < size);
    if (PAD == 2) i = mx_cvtt64(mx_trunc(mx_reflect<double>((double)i, lo, hi)));
    ix[j] = mx_clip_index(i, size);
  }
}

// RoiAlign's _bilinear_taps: the four (row, col, weight) taps of the sample point (y, x).
template <class F> MX_DEV void mx_roi_taps(F y, F x, i64 h, i64 w, i64* ty, i64* tx, F* tw) {
  if (y < (F)-1 || y > (F)h || x < (F)-1 || x > (F)w) {
    for (int q = 0; q < 4; ++q) ty[q] = 0, tx[q] = 0, tw[q] = (F)0;
    return;
  }
  y = (F)0 > y ? (F)0 : y;  // Python's max(y, 0) keeps y unless 0 is greater
  x = (F)0 > x ? (F)0 : x;
  i64 yl = (i64)y, xl = (i64)x, yh, xh;
  if (yl >= h - 1) yh = yl = h - 1, y = (F)yl;
  else yh = yl + 1;
  if (xl >= w - 1) xh = xl = w - 1, x = (F)xl;
  else xh = xl + 1;
  const F ly = y - (F)yl, lx = x - (F)xl, hy = (F)1 - ly, hx = (F)1 - lx;
  ty[0] = yl, tx[0] = xl, tw[0] = mx_mul_rn(hy, hx);
  ty[1] = yl, tx[1] = xh, tw[1] = mx_mul_rn(hy, lx);
  ty[2] = yh, tx[2] = xl, tw[2] = mx_mul_rn(ly, hx);
  ty[3] = yh, tx[3] = xh, tw[3] = mx_mul_rn(ly, lx);
}

// One RoiAlign output: bin (ph, pw) of a roi starting at (y1, x1) with bins bh x bw, sampled on a
// gh x gw grid of the image ``img`` (one channel; row and column strides sy, sx). MAX takes, like the
// ref (and ORT), the max over samples of the max of the weighted taps; no sample at all gives 0.
template <class F, bool MAX, class T>
MX_DEV F mx_roi_bin(const T* img, i64 sy, i64 sx, i64 h, i64 w, F y1, F x1, F bh, F bw, i64 ph, i64 pw,
                    i64 gh, i64 gw) {
  F acc = (F)0;
  bool first = true;
  for (i64 iy = 0; iy < gh; ++iy) {
    const F yy = y1 + mx_mul_rn((F)ph, bh) + mx_mul_rn((F)((double)iy + 0.5), bh) / (F)gh;
    for (i64 jx = 0; jx < gw; ++jx) {
      const F xx = x1 + mx_mul_rn((F)pw, bw) + mx_mul_rn((F)((double)jx + 0.5), bw) / (F)gw;
      i64 ty[4], tx[4];
      F tw[4], t[4];
      mx_roi_taps(yy, xx, h, w, ty, tx, tw);
      for (int q = 0; q < 4; ++q) t[q] = mx_mul_rn(tw[q], (F)mx_ld(img[ty[q] * sy + tx[q] * sx]));
      const F v = MAX ? mx_max(mx_max(mx_max(t[0], t[1]), t[2]), t[3]) : t[0] + t[1] + t[2] + t[3];
      acc = first ? v : MAX ? mx_max(acc, v) : acc + v;
      first = false;
    }
  }
  if (first) return (F)0;
  return MAX ? acc : acc / (F)(gh * gw);
}

#endif  // MX_SAMPLING_CUH
