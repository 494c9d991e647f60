// Fused bf16 kernels of the frozen target's forward pass, compiled at run time with NVRTC
// (src/cuda/kernels.cpp) for the device in use. Each replaces a chain of ATen kernels
// that reads and writes the whole activation once per link:
//
//   norm_rope_cN  per-head RMSNorm (optional) and rotary embedding of q or k:
//                 rms_norm, mul, roll, addcmul (four passes) -> one
//   add_rms_norm  residual sum and the next RMSNorm: add, rms_norm (two) -> one
//   silu_mul      SwiGLU's silu(gate) * up: silu, mul (two) -> one
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
