// Fused bf16 kernels of the target's forward pass, the drafter's per-head norms and the
// loss, compiled at run time with NVRTC (src/cuda/kernels.cpp) for the device in use.
// Each replaces a chain of ATen kernels that reads and writes the whole activation once
// per link:
//
//   norm_rope_cN  per-head RMSNorm (optional) and rotary embedding of q or k:
//                 rms_norm, mul, roll, addcmul (four passes) -> one
//   norm_rope_bwd_cN  its backward with a weight (the drafter's): mul, roll, mul, add,
//                 rms_norm's backward and its weight-gradient kernel -> one
//   add_rms_norm  residual sum and the next RMSNorm: add, rms_norm (two) -> one
//   silu_mul      SwiGLU's silu(gate) * up: silu, mul (two) -> one
//   silu_mul_bwd  its backward (the drafter's): mul, mul, silu_backward (three) -> one
//   softmax_xent  the drafter loss's pass over a chunk of logits (no autograd there):
//                 softmax, argmax, gather, scatter, sum (five passes) -> two reads, one
//                 write
//
// Every kernel rounds to bf16 where the ATen chain does (each ATen kernel rounds its
// output), so the results equal ATen's up to the order of fp32 sums: the loss curves do
// not move. Self-contained on purpose (no CUDA headers): bf16 is handled as its bits.

typedef unsigned short bf16_t;

__device__ __forceinline__ float bf2f(unsigned int bits) { return __uint_as_float(bits << 16); }

// Round to nearest even, as ATen's float -> bf16 conversion; NaN stays NaN.
__device__ __forceinline__ unsigned int f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

// The value an ATen kernel with a bf16 output would store.
__device__ __forceinline__ float rnd(float f) { return bf2f(f2bf(f)); }

template <int W>
struct alignas(4 * W) Words {
  unsigned int w[W];
};

// Loads C (2, 4 or 8) consecutive bf16 values, 4*C/2-byte aligned, as floats.
template <int C>
__device__ __forceinline__ void load(const bf16_t* p, float* v) {
  Words<C / 2> w = *reinterpret_cast<const Words<C / 2>*>(p);
#pragma unroll
  for (int i = 0; i < C / 2; ++i) {
    v[2 * i] = bf2f(w.w[i] & 0xffffu);
    v[2 * i + 1] = bf2f(w.w[i] >> 16);
  }
}

// Stores C floats as bf16 (values already rounded or not: this rounds).
template <int C>
__device__ __forceinline__ void store(bf16_t* p, const float* v) {
  Words<C / 2> w;
#pragma unroll
  for (int i = 0; i < C / 2; ++i) w.w[i] = f2bf(v[2 * i]) | (f2bf(v[2 * i + 1]) << 16);
  *reinterpret_cast<Words<C / 2>*>(p) = w;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per row of D = 32*C values (one head of one token); lane l holds values
// [l*C, (l+1)*C), so the rotary partner of a value (D/2 away) sits in lane l^16.
//   x, y   rows x D, contiguous ([B, L, heads, D])
//   w      the norm's weight [D], or null for no norm
//   cs, sn the cos and signed-sin tables: row (b, l) at b*tab_sb + l*tab_sl, D contiguous
//          values (sn's first half negated: rotate_half folded into the sign)
//   heads, seq  to find a row's token (b, l)
template <int C>
__device__ __forceinline__ void norm_rope(const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
                                          const bf16_t* __restrict__ w,
                                          const bf16_t* __restrict__ cs,
                                          const bf16_t* __restrict__ sn, long long rows, int heads,
                                          long long seq, long long tab_sb, long long tab_sl,
                                          float eps) {
  const int D = 32 * C;
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  // per warp: the shuffles below see whole warps
  const int lane = threadIdx.x & 31;
  float v[C];
  load<C>(x + row * D + lane * C, v);
  if (w != nullptr) {
    // ATen's rms_norm: x * rsqrt(mean(x^2) + eps) * weight in fp32, rounded once
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < C; ++j) ss += v[j] * v[j];
    const float rstd = rsqrtf(warp_sum(ss) / D + eps);
    float g[C];
    load<C>(w + lane * C, g);
#pragma unroll
    for (int j = 0; j < C; ++j) v[j] = rnd(v[j] * rstd * g[j]);
  }
  const long long tok = row / heads;
  const long long b = tok / seq;
  const long long off = b * tab_sb + (tok - b * seq) * tab_sl + lane * C;
  float c[C], s[C];
  load<C>(cs + off, c);
  load<C>(sn + off, s);
#pragma unroll
  for (int j = 0; j < C; ++j) {
    // x * cos (rounded, as ATen's mul), then addcmul's fp32 fma of roll(x) * sin
    const float partner = __shfl_xor_sync(0xffffffffu, v[j], 16);
    v[j] = rnd(v[j] * c[j]) + partner * s[j];
  }
  store<C>(y + row * D + lane * C, v);
}

#define NORM_ROPE(C)                                                                              \
  extern "C" __global__ void norm_rope_c##C(const bf16_t* x, bf16_t* y, const bf16_t* w,         \
                                            const bf16_t* cs, const bf16_t* sn, long long rows,   \
                                            int heads, long long seq, long long tab_sb,           \
                                            long long tab_sl, float eps) {                        \
    norm_rope<C>(x, y, w, cs, sn, rows, heads, seq, tab_sb, tab_sl, eps);                         \
  }
NORM_ROPE(2)
NORM_ROPE(4)
NORM_ROPE(8)

// The backward of norm_rope with a weight: given dy (rows x D, contiguous), x, w and the
// tables, dx (rows x D) and the weight's gradient summed into dw (D floats, zeroed by the
// caller). Rounds where ATen's backward of the chain does: each rotary half-gradient
// (dy * cos, dy * sin rolled back) and their sum to bf16, then rms_norm's backward in fp32
// from x, rounded once. Warps stride over the rows; each keeps its lanes' share of dw in
// registers, the block sums its warps' shares in shared memory and adds them to dw once
// (ATen's weight-gradient kernel runs ceil(D / 32) blocks: 4 for D = 128).
template <int C>
__device__ __forceinline__ void norm_rope_bwd(const bf16_t* __restrict__ dy,
                                              const bf16_t* __restrict__ x,
                                              const bf16_t* __restrict__ w,
                                              const bf16_t* __restrict__ cs,
                                              const bf16_t* __restrict__ sn, bf16_t* __restrict__ dx,
                                              float* __restrict__ dw, long long rows, int heads,
                                              long long seq, long long tab_sb, long long tab_sl,
                                              float eps) {
  const int D = 32 * C;
  __shared__ float part[8 * 256];  // blockDim.x <= 256: up to 8 warps of D <= 256 values
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float g[C], acc[C];
  load<C>(w + lane * C, g);
#pragma unroll
  for (int j = 0; j < C; ++j) acc[j] = 0.f;
  for (long long row = (long long)blockIdx.x * warps + warp; row < rows;
       row += (long long)gridDim.x * warps) {
    float d[C], v[C], c[C], s[C];
    load<C>(dy + row * D + lane * C, d);
    load<C>(x + row * D + lane * C, v);
    const long long tok = row / heads;
    const long long b = tok / seq;
    const long long off = b * tab_sb + (tok - b * seq) * tab_sl + lane * C;
    load<C>(cs + off, c);
    load<C>(sn + off, s);
    // rotary: du[j] = dy[j] * cos[j] + dy[p] * sin[p], p the partner D/2 away
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const float from_partner = __shfl_xor_sync(0xffffffffu, rnd(d[j] * s[j]), 16);
      d[j] = rnd(rnd(d[j] * c[j]) + from_partner);
      ss += v[j] * v[j];
    }
    // rms_norm: n = x * rstd; dx = rstd * (du*w - n * mean(du*w*n)); dw += du * n
    const float rstd = rsqrtf(warp_sum(ss) / D + eps);
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < C; ++j) {
      v[j] *= rstd;
      acc[j] += d[j] * v[j];
      d[j] *= g[j];
      dot += d[j] * v[j];
    }
    dot = warp_sum(dot) / D;
#pragma unroll
    for (int j = 0; j < C; ++j) d[j] = rstd * (d[j] - v[j] * dot);
    store<C>(dx + row * D + lane * C, d);
  }
#pragma unroll
  for (int j = 0; j < C; ++j) part[warp * D + lane * C + j] = acc[j];
  __syncthreads();
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float t = 0.f;
    for (int k = 0; k < warps; ++k) t += part[k * D + i];
    atomicAdd(dw + i, t);
  }
}

#define NORM_ROPE_BWD(C)                                                                          \
  extern "C" __global__ void norm_rope_bwd_c##C(                                                 \
      const bf16_t* dy, const bf16_t* x, const bf16_t* w, const bf16_t* cs, const bf16_t* sn,     \
      bf16_t* dx, float* dw, long long rows, int heads, long long seq, long long tab_sb,          \
      long long tab_sl, float eps) {                                                              \
    norm_rope_bwd<C>(dy, x, w, cs, sn, dx, dw, rows, heads, seq, tab_sb, tab_sl, eps);            \
  }
NORM_ROPE_BWD(2)
NORM_ROPE_BWD(4)
NORM_ROPE_BWD(8)

// s = a + b (rounded, as ATen's add) and y = rms_norm(s) * w, one warp per row of H
// values (H a multiple of 8). The second pass re-reads the sums this thread wrote.
extern "C" __global__ void add_rms_norm(const bf16_t* __restrict__ a, const bf16_t* __restrict__ b,
                                        bf16_t* s, bf16_t* __restrict__ y,
                                        const bf16_t* __restrict__ w, long long rows, int h,
                                        float eps) {
  const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const long long base = row * h;
  float ss = 0.f;
  for (int i = lane * 8; i < h; i += 256) {
    float va[8], vb[8];
    load<8>(a + base + i, va);
    load<8>(b + base + i, vb);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      va[j] = rnd(va[j] + vb[j]);
      ss += va[j] * va[j];
    }
    store<8>(s + base + i, va);
  }
  const float rstd = rsqrtf(warp_sum(ss) / h + eps);
  for (int i = lane * 8; i < h; i += 256) {
    float v[8], g[8];
    load<8>(s + base + i, v);
    load<8>(w + i, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * rstd * g[j];
    store<8>(y + base + i, v);
  }
}

// y = silu(g) * u over n8 groups of 8 values; silu rounded first, as ATen's silu.
extern "C" __global__ void silu_mul(const bf16_t* __restrict__ g, const bf16_t* __restrict__ u,
                                    bf16_t* __restrict__ y, long long n8) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  float vg[8], vu[8];
  load<8>(g + i * 8, vg);
  load<8>(u + i * 8, vu);
#pragma unroll
  for (int j = 0; j < 8; ++j) vg[j] = rnd(vg[j] / (1.0f + expf(-vg[j]))) * vu[j];
  store<8>(y + i * 8, vg);
}

// silu_mul's backward over n8 groups of 8 values: du = dy * silu(g) and
// dg = silu'(g) * (dy * u), rounded where ATen's chain rounds (the saved silu(g), dy * u,
// and each gradient).
extern "C" __global__ void silu_mul_bwd(const bf16_t* __restrict__ g, const bf16_t* __restrict__ u,
                                        const bf16_t* __restrict__ dy, bf16_t* __restrict__ dg,
                                        bf16_t* __restrict__ du, long long n8) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  float vg[8], vu[8], vd[8];
  load<8>(g + i * 8, vg);
  load<8>(u + i * 8, vu);
  load<8>(dy + i * 8, vd);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float sg = 1.0f / (1.0f + expf(-vg[j]));
    const float da = rnd(vd[j] * vu[j]);
    vu[j] = vd[j] * rnd(vg[j] * sg);
    vg[j] = da * (sg * (1.0f + vg[j] * (1.0f - sg)));
  }
  store<8>(dg + i * 8, vg);
  store<8>(du + i * 8, vu);
}

// Block-wide reductions over blockDim.x threads (a multiple of 32, at most 1024); every
// thread gets the result. `scratch` holds 32 entries.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// (max, sum of exp(x - max)) pairs, merged; a pair with no values is (-inf, 0).
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  if (s2 == 0.f) return;
  if (s == 0.f) {
    m = m2;
    s = s2;
    return;
  }
  const float mm = fmaxf(m, m2);
  s = s * expf(m - mm) + s2 * expf(m2 - mm);
  m = mm;
}

// exp2(x), MUFU's approximation (relative error ~2^-22, below bf16's 2^-8): one
// instruction where expf takes a range reduction around it.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to bf16 (nearest even) as one word, `lo` in the low half: one
// conversion instruction on Ampere and later.
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  unsigned int w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
#else
  return f2bf(lo) | (f2bf(hi) << 16);
#endif
}

// (value, index) of the largest value, the first index on ties (as ATen's argmax).
__device__ __forceinline__ void arg_merge(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// The loss's pass over one chunk of logits, one block per row of v values (v a multiple
// of 8, below 2^31), in place: the row becomes p = softmax(z) in bf16 (ATen's bf16
// softmax: fp32 max and sum, exp(z - max) / sum rounded once), except that p's label
// entry becomes -rest, the loss's gradient there; `p_label` gets p at the label, `rest`
// the fp32 sum of the other entries of p, `argmax` the first index of p's largest entry
// (ATen's argmax of p). Two reads and one write of the row instead of ATen's softmax,
// argmax, gather, scatter and sum (five passes).
//
// Bound by issue, not memory, as first written (expf, a division and bf16 rounding by
// integer arithmetic on every value, 64-bit indices: 1.7 ms a realistic step on one H100
// for 2.3 GB of traffic): here a value costs an FMA and MUFU's exp2 each pass, a multiply
// by 1/sum, a half of a bf16x2 conversion and 32-bit index arithmetic. The second pass
// runs backwards, so it starts on the values the first read last, the likeliest still in
// L2.
extern "C" __global__ void softmax_xent(bf16_t* __restrict__ z, const long long* __restrict__ labels,
                                        long long v64, float* __restrict__ p_label,
                                        float* __restrict__ rest, long long* __restrict__ argmax) {
  constexpr float L2E = 1.4426950408889634f;
  const float NEG_INF = __int_as_float(0xff800000);
  __shared__ float scratch[32];
  __shared__ float scratch_m[32];
  __shared__ int scratch_i[32];
  __shared__ float shared_py;
  const int v = (int)v64;
  const long long row = blockIdx.x;
  bf16_t* r = z + row * v64;
  const long long y64 = labels[row];
  const int y = (y64 >= 0 && y64 < v64) ? (int)y64 : -1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int stride = blockDim.x * 8;
  if (threadIdx.x == 0) shared_py = 0.f;
  // 1. max and sum of exp, online: s = sum exp(x - m) for this thread's values
  float m = NEG_INF, s = 0.f;
  for (int i = threadIdx.x * 8; i < v; i += stride) {
    float x[8];
    load<8>(r + i, x);
    float mx = x[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) mx = fmaxf(mx, x[j]);
    if (mx > m) {
      s *= ex2((m - mx) * L2E);  // 0 while m is -inf
      m = mx;
    }
    if (m != NEG_INF) {
      const float mb = m * L2E;
#pragma unroll
      for (int j = 0; j < 8; ++j) s += ex2(fmaf(x[j], L2E, -mb));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
  if (lane == 0) {
    scratch_m[warp] = m;
    scratch[warp] = s;
  }
  __syncthreads();
  m = NEG_INF;
  s = 0.f;
  for (int w = 0; w < warps; ++w) lse_merge(m, s, scratch_m[w], scratch[w]);
  __syncthreads();
  // 2. p, its argmax and the sum of the non-label entries
  const float mb = m * L2E, inv = 1.f / s;
  float best = -1.f, acc = 0.f;
  int best_i = 0;
  const int first = threadIdx.x * 8;
  const int count = first < v ? (v - 1 - first) / stride + 1 : 0;
  for (int k = 0; k < count; ++k) {
    const int i = first + (count - 1 - k) * stride;
    float x[8];
    load<8>(r + i, x);
    Words<4> w;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w.w[j] = pack_bf16x2(ex2(fmaf(x[2 * j], L2E, -mb)) * inv, ex2(fmaf(x[2 * j + 1], L2E, -mb)) * inv);
      x[2 * j] = bf2f(w.w[j] & 0xffffu);
      x[2 * j + 1] = bf2f(w.w[j] >> 16);
    }
    *reinterpret_cast<Words<4>*>(r + i) = w;
    // backwards, so an equal value wins: the first index on ties
#pragma unroll
    for (int j = 7; j >= 0; --j) {
      if (x[j] >= best) {
        best = x[j];
        best_i = i + j;
      }
    }
    if ((unsigned)(y - i) < 8u) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (i + j == y) {
          shared_py = x[j];
        } else {
          acc += x[j];
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc += x[j];
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, best_i, o);
    arg_merge(best, best_i, b2, i2);
  }
  if (lane == 0) {
    scratch_m[warp] = best;
    scratch_i[warp] = best_i;
  }
  const float total = block_sum(acc, scratch);  // its barriers order the writes above
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w) arg_merge(best, best_i, scratch_m[w], scratch_i[w]);
    // scratch_m[0] is warp 0's, which is thread 0's own after the shuffles
    rest[row] = total;
    p_label[row] = shared_py;
    argmax[row] = best_i;
    if (y >= 0) r[y] = (bf16_t)f2bf(-total);
  }
}
