// Shared by the host build (host.cpp, any C++17 compiler) and the CUDA build (kernels.cu, nvcc).
// No torch headers: these files compile on machines whose torch wheel lacks the CUDA headers.
#pragma once
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define EBM_HD __host__ __device__ __forceinline__
#define EBM_UNROLL _Pragma("unroll")
#else
#define EBM_HD inline __attribute__((always_inline))
#define EBM_UNROLL
#endif

namespace ebm {

// ---- storage types: the chain state may be stored in 16 bits, the math is always float or double ----

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

template <typename S> struct Acc { using type = float; };   // float, bf16, f16 -> float math
template <> struct Acc<double> { using type = double; };    // double -> double math

EBM_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u; memcpy(&u, &f, 4); return u;
#endif
}

EBM_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f; memcpy(&f, &u, 4); return f;
#endif
}

// Round to nearest even, as torch's .to(torch.bfloat16) does; NaN stays NaN.
EBM_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// IEEE binary16, round to nearest even, subnormals, overflow to inf, NaN kept.
EBM_HD uint16_t float_to_f16_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u));
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);           // rounds to >= 65520: inf
  if (ax < 0x33000000u) return (uint16_t)sign;                         // below 2^-25: zero
  if (ax < 0x38800000u) {                                              // half subnormal
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u, s = 126u - (ax >> 23);
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return (uint16_t)(sign | q);
  }
  uint32_t bits = (((ax >> 23) - 112u) << 10) | ((ax & 0x7FFFFFu) >> 13), rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (bits & 1u))) ++bits;
  return (uint16_t)(sign | bits);
}

EBM_HD float f16_bits_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) { float v = (float)m * 5.9604644775390625e-08f; return sign ? -v : v; }
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

template <typename A> EBM_HD A load(const float* p) { return (A)*p; }
template <typename A> EBM_HD A load(const double* p) { return (A)*p; }
template <typename A> EBM_HD A load(const bf16* p) { return (A)bits_float((uint32_t)p->bits << 16); }
template <typename A> EBM_HD A load(const f16* p) { return (A)f16_bits_to_float(p->bits); }
template <typename A> EBM_HD void store(float* p, A v) { *p = (float)v; }
template <typename A> EBM_HD void store(double* p, A v) { *p = (double)v; }
template <typename A> EBM_HD void store(bf16* p, A v) { p->bits = float_to_bf16_bits((float)v); }
template <typename A> EBM_HD void store(f16* p, A v) { p->bits = float_to_f16_bits((float)v); }

#if !defined(__CUDACC__)
// W values side by side, for the host build: the energies of energies.h evaluated on Lanes
// compute W chains at once, each operation one vector instruction (GCC/Clang vector extensions).
template <typename A, int W> struct Lanes {
  typedef A vec __attribute__((vector_size(sizeof(A) * W)));
  vec v;
  Lanes() = default;
  Lanes(A s) : v(vec{} + s) {}
  static Lanes of(vec x) { Lanes r; r.v = x; return r; }
};
#define EBM_LANES_OP(op)                                                                            \
  template <typename A, int W> inline Lanes<A, W> operator op(const Lanes<A, W>& a, const Lanes<A, W>& b) { return Lanes<A, W>::of(a.v op b.v); } \
  template <typename A, int W> inline Lanes<A, W> operator op(A a, const Lanes<A, W>& b) { return Lanes<A, W>::of(a op b.v); }                    \
  template <typename A, int W> inline Lanes<A, W> operator op(const Lanes<A, W>& a, A b) { return Lanes<A, W>::of(a.v op b); }                    \
  template <typename A, int W> inline Lanes<A, W>& operator op##=(Lanes<A, W>& a, const Lanes<A, W>& b) { a.v op##= b.v; return a; }
EBM_LANES_OP(+)
EBM_LANES_OP(-)
EBM_LANES_OP(*)
#undef EBM_LANES_OP
template <typename A, int W> inline Lanes<A, W> load(const Lanes<A, W>* p) { return *p; }
template <typename A, int W> inline void store(Lanes<A, W>* p, const Lanes<A, W>& v) { *p = v; }
#endif

template <typename A> EBM_HD bool is_finite(A v) { return v - v == v - v; }  // false for inf and NaN

// ---- float math that is identical on host and device, branch-free so the host build vectorises ----

// Natural log for x in (0, 1] (Cephes logf polynomial; ~1 ulp).
EBM_HD float log_unit(float x) {
  uint32_t u = float_bits(x);
  int e = (int)((u >> 23) & 0xFFu) - 126;
  float m = bits_float((u & 0x007FFFFFu) | 0x3F000000u);  // in [0.5, 1)
  bool small = m < 0.70710678118654752f;
  e -= small ? 1 : 0;
  m = small ? m + m - 1.0f : m - 1.0f;
  float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f; y = y * m + 1.1676998740e-1f; y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f; y = y * m - 1.6668057665e-1f; y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f; y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  float fe = (float)e;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  return m + y + 0.693359375f * fe;
}

// cos and sin of 2*pi*u for u in [0, 1), reduced exactly in turns (Cephes minimax on [-pi/4, pi/4]).
EBM_HD void sincos_turns(float u, float* s_out, float* c_out) {
  float v = 4.0f * u;                     // exact
  int q = (int)(v + 0.5f);                // quadrant 0..4
  float a = (v - (float)q) * 1.57079632679489662f;  // in [-pi/4, pi/4]
  float z = a * a;
  float s = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * a + a;
  float c = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z - 0.5f * z + 1.0f;
  int r = q & 3;
  float sr = (r == 0) ? s : (r == 1) ? c : (r == 2) ? -s : -c;
  float cr = (r == 0) ? c : (r == 1) ? -s : (r == 2) ? -c : s;
  *s_out = sr; *c_out = cr;
}

EBM_HD float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return __builtin_sqrtf(x);
#endif
}

EBM_HD float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return __builtin_expf(x);
#endif
}

EBM_HD double exp_f(double x) {
#if defined(__CUDA_ARCH__)
  return exp(x);
#else
  return __builtin_exp(x);
#endif
}

template <typename A> EBM_HD A neg_inf() { return (A)bits_float(0xFF800000u); }

}  // namespace ebm
