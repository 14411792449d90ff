"""The GroupQueryAttention device code (``kernels/gqa.py`` generates the kernels that call it).

A generated kernel defines the constants this code reads (``T``, ``IDX``, ``WARPS``, ``D``, ``HQ``,
``HKV``, ``G``, ``HALF``, ``RD``, the flags, ``SCALE``, ``CAP``, ``WINDOW``, ``EXTRA``; for the attend
kernel ``E``, ``HW``, ``KU``, ``VEC``, ``SPLIT`` and ``OUT``), then calls one of ``mx_gqa_update``,
``mx_gqa_attend`` or ``mx_gqa_combine`` with its pointers and run-time sizes (null pointers for absent
inputs). Each kernel's source holds ``GQA_COMMON`` and its own section.
"""

GQA_COMMON = r"""
constexpr u32 V = 16u / sizeof(T);  // elements per 16-byte chunk: D and HALF are multiples of it
MX_DEV float mx_ninf() { return __int_as_float((int)0xff800000u); }

// P_b of batch b (T_b in *t), or -1 where its lengths are out of range (the update kernel reports it):
// nothing is then read or written for that batch entry.
MX_DEV i64 mx_gqa_past(const i32* sk, u64 b, bool first, i64 S, i64 LP, i64 L, i64* t) {
  *t = (i64)sk[b] + 1;
  const i64 p = first ? 0 : *t - S;
  return (*t < 1 || p < 0 || p > LP || p + S > L || *t > p + S) ? -1 : p;
}

// Element d < RD of row x rotated by the cos/sin table rows cr, sr: numpy's float32 products, no fma.
MX_DEV float mx_gqa_rot(const T* x, u32 d, const T* cr, const T* sr) {
  u32 j, i1, i2;
  bool re;
  if (INTERLEAVED) { j = d / 2u; i1 = d & ~1u; i2 = i1 + 1u; re = (d & 1u) == 0u; }
  else { re = d < HALF; j = re ? d : d - HALF; i1 = j; i2 = j + HALF; }
  const float c = mx_ld(cr[j]), s = mx_ld(sr[j]), x1 = mx_ld(x[i1]), x2 = mx_ld(x[i2]);
  return re ? mx_mul_rn(c, x1) - mx_mul_rn(s, x2) : mx_mul_rn(s, x1) + mx_mul_rn(c, x2);
}

"""

GQA_UPDATE = r"""
// ---- update: a thread per V-element chunk of present (grid-stride) --------------------------------
struct mx_gqa_update_args {
  const T *k, *v, *pk, *pv;
  const i32 *sk, *tot;
  const T *cs, *sn;
  T *ok, *ov;
  i32* err;
  IDX B, S, L, LP, M;
  IDX KS0, KS1, VS0, VS1, PKS0, PKS1, PKS2, PVS0, PVS1, PVS2;  // strides (b, s) and (b, h, l)
};

// A chunk: one vector access where the address allows it (strided inputs may not allow it).
MX_DEV mx_vec<T, V> mx_gqa_vec(const T* p) {
  if (((u64)p & (sizeof(mx_vec<T, V>) - 1u)) == 0u) return *reinterpret_cast<const mx_vec<T, V>*>(p);
  mx_vec<T, V> w;
  MX_UNROLL for (u32 q = 0; q < V; ++q) w.v[q] = p[q];
  return w;
}

// The ref's run-time checks in its order (GroupQueryAttention.run_lengths): the first failing code.
MX_DEV i32 mx_gqa_check(const mx_gqa_update_args& a) {
  const i64 total = a.tot[0], S = a.S, B = a.B, LP = a.LP, L = a.L;
  const i64 want = HAS_PAST ? (total > LP ? total : LP) : total;
  if (want != L) return 1;
  const bool first = total == S;
  if (!first && S > 1 && B != 1) return 2;
  i64 maxp = 0;
  for (i64 b = 0; b < B; ++b) {
    const i64 t = (i64)a.sk[b] + 1, p = first ? 0 : t - S;
    if (t < 1 || p < 0 || p > LP || p + S > L) return 3;
    if (p > maxp) maxp = p;
  }
  for (i64 b = 0; b < B; ++b) {
    const i64 t = (i64)a.sk[b] + 1, p = first ? 0 : t - S;
    if (t > p + S) return 4;
  }
  if (ROTARY && maxp + S - 1 >= (i64)a.M) return 5;
  return 0;
}

// present[b, h, l] = past[b, h, l] for l < P_b, the new row l - P_b (keys rotated at position l, rounded
// to T as ORT stores them) for l < P_b + S, else zero.
MX_DEV void mx_gqa_update(const mx_gqa_update_args& a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const i32 code = mx_gqa_check(a);
    if (code) mx_fail(a.err, code);
  }
  const bool first = (i64)a.tot[0] == (i64)a.S;
  const IDX n = a.B * HKV * a.L * (D / V);
  for (IDX c = blockIdx.x * blockDim.x + threadIdx.x; c < n; c += gridDim.x * blockDim.x) {
    const u32 d0 = (u32)(c % (D / V)) * V;
    IDX r = c / (D / V);
    const IDX l = r % a.L;
    r /= a.L;
    const IDX h = r % HKV, b = r / HKV;
    i64 t;
    const i64 p = mx_gqa_past(a.sk, b, first, a.S, a.LP, a.L, &t);
    if (p < 0) continue;
    mx_vec<T, V> kw, vw;
    if ((i64)l < p) {
      kw = mx_gqa_vec(a.pk + b * a.PKS0 + h * a.PKS1 + l * a.PKS2 + d0);
      vw = mx_gqa_vec(a.pv + b * a.PVS0 + h * a.PVS1 + l * a.PVS2 + d0);
    } else if ((i64)l < p + (i64)a.S) {
      const IDX s = (IDX)((i64)l - p);
      const T* kr = a.k + b * a.KS0 + s * a.KS1 + h * D;
      kw = mx_gqa_vec(kr + d0);
      vw = mx_gqa_vec(a.v + b * a.VS0 + s * a.VS1 + h * D + d0);
      if (ROTARY && d0 < RD) {
        if (l >= a.M) continue;  // reported by check 5
        const T* cr = a.cs + (u64)l * HALF;
        const T* sr = a.sn + (u64)l * HALF;
        MX_UNROLL for (u32 q = 0; q < V; ++q) kw.v[q] = mx_cvt<T>(mx_gqa_rot(kr, d0 + q, cr, sr));
      }
    } else {
      MX_UNROLL for (u32 q = 0; q < V; ++q) kw.v[q] = vw.v[q] = mx_cvt<T>(0.0f);
    }
    *reinterpret_cast<mx_vec<T, V>*>(a.ok + c * V) = kw;
    *reinterpret_cast<mx_vec<T, V>*>(a.ov + c * V) = vw;
  }
}

"""

GQA_ATTEND = r"""
// ---- attend: a warp per (b, s, kv head, group of HW query heads); lanes hold E elements of D --------
struct mx_gqa_attend_args {
  const T *q, *pk, *pv;
  const i32 *sk, *tot;
  const T *cs, *sn, *sink;
  OUT* out;
  IDX S, L, LP, M, QS0, QS1, NROWS, MINC;
};

// Row j's E elements of lane e0 / E (zero where !ok or past D). Present rows are 256-byte aligned
// buffers and E divides D when VEC, so the vector load is aligned.
MX_DEV void mx_gqa_row(const T* p, u32 e0, float* x, bool ok) {
  if (VEC && ok) { mx_ldv<(int)(VEC ? E : 1u)>(p, x); return; }
  MX_UNROLL for (u32 e = 0; e < E; ++e) x[e] = ok && e0 + e < D ? mx_ld(p[e]) : 0.0f;
}

MX_DEV void mx_gqa_attend(const mx_gqa_attend_args& a) {
  const u32 lane = threadIdx.x % 32u;
  const u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32u;
  if (row >= a.NROWS) return;  // whole warps leave: the shuffles below need every lane
  constexpr u32 NSUB = G / HW;
  const u32 sub = (u32)(row % NSUB);
  u64 r = row / NSUB;
  const u32 h = (u32)(r % HKV);
  r /= HKV;
  const u64 s = r % a.S, b = r / a.S;
  i64 t;
  const i64 p = mx_gqa_past(a.sk, b, (i64)a.tot[0] == (i64)a.S, a.S, a.LP, a.L, &t);
  if (p < 0) return;  // the update kernel reports it
  const i64 pos = p + (i64)s;
  if (ROTARY && pos >= (i64)a.M) return;
  i64 hi = CAUSAL && pos + 1 < t ? pos + 1 : t;
  i64 lo = WINDOW > 0 && pos - WINDOW + 1 > 0 ? pos - WINDOW + 1 : 0;
  if (lo >= hi) { lo = 0; hi = 1; }  // nothing to attend (a padding row): key 0, as the ref does
  // This block's share of the keys: gridDim.y splits of at least MINC keys (flash decoding).
  const i64 ns = gridDim.y;
  i64 chunk = (hi - lo + ns - 1) / ns;
  if (chunk < (i64)a.MINC) chunk = (i64)a.MINC;
  const i64 j0 = lo + (i64)blockIdx.y * chunk, j1 = hi < j0 + chunk ? hi : j0 + chunk;
  const u32 hq0 = h * G + sub * HW, e0 = lane * E;
  const u64 orow = (b * a.S + s) * HQ + hq0;  // output row (b, s, hq0)
  if (SPLIT && j0 >= j1) {  // no keys here: an empty partial (max -inf), which the combine skips
    MX_UNROLL for (u32 i = 0; i < HW; ++i) {
      float* o = (float*)a.out + ((orow + i) * gridDim.y + blockIdx.y) * (D + 2u);
      if (lane == 0u) { o[0] = mx_ninf(); o[1] = 0.0f; }
    }
    return;
  }
  float qv[HW][E], m[HW], l[HW], acc[HW][E];
  MX_UNROLL for (u32 i = 0; i < HW; ++i) {  // queries rotated and rounded like the keys
    const T* qr = a.q + b * a.QS0 + s * a.QS1 + (hq0 + i) * D;
    MX_UNROLL for (u32 e = 0; e < E; ++e) {
      const u32 d = e0 + e;
      float x = 0.0f;
      if (d < D) {
        if (ROTARY && d < RD) x = mx_round<T>(mx_gqa_rot(qr, d, a.cs + pos * HALF, a.sn + pos * HALF));
        else x = mx_ld(qr[d]);
      }
      qv[i][e] = x;
      acc[i][e] = 0.0f;
    }
    m[i] = mx_ninf();
    l[i] = 0.0f;
  }
  const bool mine = e0 < D;
  const u64 base = ((u64)b * HKV + h) * a.L * D + e0;
  for (i64 j = j0; j < j1; j += KU) {  // KU keys a step: their warp reductions overlap
    float sc[KU][HW];
    MX_UNROLL for (u32 u = 0; u < KU; ++u) {
      float kv[E];
      mx_gqa_row(a.pk + base + (u64)(j + u) * D, e0, kv, mine && j + u < j1);
      MX_UNROLL for (u32 i = 0; i < HW; ++i) {
        float x = 0.0f;
        MX_UNROLL for (u32 e = 0; e < E; ++e) x += qv[i][e] * kv[e];
        sc[u][i] = x;
      }
    }
    MX_UNROLL for (int w = 16; w > 0; w >>= 1)
      MX_UNROLL for (u32 u = 0; u < KU; ++u)
        MX_UNROLL for (u32 i = 0; i < HW; ++i) sc[u][i] += mx_shfl_xor(sc[u][i], w);
    MX_UNROLL for (u32 i = 0; i < HW; ++i) {  // online softmax: rescale by the new running max
      float mx = m[i];
      MX_UNROLL for (u32 u = 0; u < KU; ++u) {
        float x = sc[u][i] * SCALE;
        if (CAP > 0.0f) x = tanhf(x / CAP) * CAP;
        sc[u][i] = j + u < j1 ? x : mx_ninf();
        mx = fmaxf(mx, sc[u][i]);
      }
      const float corr = expf(m[i] - mx);
      m[i] = mx;
      l[i] *= corr;
      MX_UNROLL for (u32 e = 0; e < E; ++e) acc[i][e] *= corr;
      MX_UNROLL for (u32 u = 0; u < KU; ++u) {
        sc[u][i] = expf(sc[u][i] - mx);
        l[i] += sc[u][i];
      }
    }
    MX_UNROLL for (u32 u = 0; u < KU; ++u) {
      float vv[E];
      mx_gqa_row(a.pv + base + (u64)(j + u) * D, e0, vv, mine && j + u < j1);
      MX_UNROLL for (u32 i = 0; i < HW; ++i)
        MX_UNROLL for (u32 e = 0; e < E; ++e) acc[i][e] += sc[u][i] * vv[e];
    }
  }
  MX_UNROLL for (u32 i = 0; i < HW; ++i) {
    if (SPLIT) {  // (max, sum, acc[D]) of this split
      float* o = (float*)a.out + ((orow + i) * gridDim.y + blockIdx.y) * (D + 2u);
      if (lane == 0u) { o[0] = m[i]; o[1] = l[i]; }
      MX_UNROLL for (u32 e = 0; e < E; ++e) if (e0 + e < D) o[2u + e0 + e] = acc[i][e];
    } else {
      float den = l[i], c = 1.0f;
      if (EXTRA) {  // the extra logit joins the denominator (smooth softmax: 0; head sink: per head)
        const float x = EXTRA == 2 ? mx_ld(a.sink[hq0 + i]) : 0.0f, m2 = fmaxf(m[i], x);
        c = expf(m[i] - m2);
        den = den * c + expf(x - m2);
      }
      T* o = (T*)a.out + (orow + i) * D;
      MX_UNROLL for (u32 e = 0; e < E; ++e) if (e0 + e < D) o[e0 + e] = mx_cvt<T>(acc[i][e] * c / den);
    }
  }
}

"""

GQA_COMBINE = r"""
// ---- combine: a warp per output row (b, s, hq), lanes across D -----------------------------------
struct mx_gqa_combine_args {
  const float* pr;
  const T* sink;
  T* out;
  IDX NROWS, NS;
};

MX_DEV void mx_gqa_combine(const mx_gqa_combine_args& a) {
  const u32 lane = threadIdx.x % 32u;
  const u64 row = (u64)blockIdx.x * WARPS + threadIdx.x / 32u;
  if (row >= a.NROWS) return;
  const float* pr = a.pr + row * a.NS * (D + 2u);
  const float x = EXTRA == 2 ? mx_ld(a.sink[row % HQ]) : EXTRA == 1 ? 0.0f : mx_ninf();
  float mx = x;
  for (u64 k = 0; k < a.NS; ++k) mx = fmaxf(mx, pr[k * (D + 2u)]);
  float den = EXTRA ? expf(x - mx) : 0.0f;
  for (u64 k = 0; k < a.NS; ++k) {
    const float mk = pr[k * (D + 2u)];
    if (mk != mx_ninf()) den += pr[k * (D + 2u) + 1u] * expf(mk - mx);  // empty splits are skipped
  }
  for (u32 d = lane; d < D; d += 32u) {
    float y = 0.0f;
    for (u64 k = 0; k < a.NS; ++k) {
      const float mk = pr[k * (D + 2u)];
      if (mk != mx_ninf()) y += pr[k * (D + 2u) + 2u + d] * expf(mk - mx);
    }
    a.out[row * D + d] = mx_cvt<T>(y / den);
  }
}
"""
