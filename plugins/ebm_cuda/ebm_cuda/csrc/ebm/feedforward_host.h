// Host build only: Langevin chains of a feed-forward energy E(x) = sign · (Linear_L ∘ f ∘ … ∘ f ∘ Linear_1)(x),
// K steps per launch. A tile of 16 chains stays in the core's L1 cache for all K steps: the forward pass, the
// chain rule backwards and the move run on it with no trip to memory, the matrix products register-blocked
// (4 chains × 64 outputs per pass), the activations and their derivatives computed together (one exp each).
// float32 states. Widths are padded to multiples of 16 with zero weights, which changes no result. The hidden-to-
// hidden products of the chain's gradient (forward and backward, not the first layer's or the input gradient's) can
// take bfloat16 operands summed in float32 (Products below); activations and moves stay float32.
#pragma once
#include <stdint.h>
#include <string.h>

#include <initializer_list>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ebm {
namespace ff {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));

constexpr int ROWS = 16;  // chains per tile (the Philox tile of host.cpp)
// The hidden-layer activations the kernels run (the host build's and the Triton kernels'), X(NAME, code) with codes
// 0, 1, ...: NAME is the member of ebmcore's ActivationKind (ebm_cuda.activations reads this list: the one table of
// activations). An activation code is an int64: the code in its low 32 bits and, for a kind with one parameter (leaky
// ReLU's slope, ELU's alpha), the parameter's float32 bits in its high 32 (ActivationCode). Adding an activation is a
// line here with its case in activation<ACT, ORDER> below, and its branch in ebm_cuda/_triton_kernels.py.
#define EBM_ACTIVATIONS(X) \
  X(SILU, 0)               \
  X(TANH, 1)               \
  X(SIGMOID, 2)            \
  X(RELU, 3)               \
  X(LEAKY_RELU, 4)         \
  X(ELU, 5)

#define EBM_ACTIVATION_ENUM(NAME, CODE) NAME = CODE,
enum Activation { EBM_ACTIVATIONS(EBM_ACTIVATION_ENUM) };
#undef EBM_ACTIVATION_ENUM
#define EBM_ACTIVATION_COUNT(NAME, CODE) +1
constexpr int N_ACTIVATIONS = 0 EBM_ACTIVATIONS(EBM_ACTIVATION_COUNT);
#undef EBM_ACTIVATION_COUNT

// An activation as the C API passes it (int64: kind in the low word, the parameter's float32 bits in the high word).
struct ActivationCode {
  int kind = 0;
  float param = 0.0f;
  ActivationCode() = default;
  explicit ActivationCode(int64_t code) : kind((int)(uint32_t)(uint64_t)code) {
    const int32_t bits = (int32_t)(code >> 32);
    memcpy(&param, &bits, sizeof param);
  }
  bool known() const { return (uint64_t)(uint32_t)kind < (uint64_t)N_ACTIVATIONS; }
};

inline int blocks(int width) { return (width + 15) / 16; }

inline v16 splat(float a) { return v16{} + a; }

inline float sum(v16 v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
#endif
}

constexpr int SMALL_INPUT = 8;  // inputs up to this many: the last product of the gradient as dot products

// exp(S·z) for float32 and S = ±1, within 1.5 ulp: Cody–Waite reduction, a degree-6 minimax polynomial (relative
// error 1.9e-9 before its coefficients' rounding to float32), |z| clamped to 87.3 (finite results: all that sigmoid,
// SiLU and tanh need; a NaN stays NaN). The sign is folded into the constants, so exp(−z) costs no negation: with
// r = S·z − n ln 2 and q = S·r = z − S·n ln 2, the polynomial in r is one in q whose odd coefficients carry S.
template <int S>
inline v16 vexp(v16 z) {
  static_assert(S == 1 || S == -1, "exp(z) or exp(-z)");
  constexpr float L = S * 1.44269504088896341f, C1 = S * 0.693359375f, C2 = S * -2.12194440e-4f;
#if defined(__AVX512F__)  // max and min return their second operand when either is NaN: a NaN stays NaN, as in torch
  z = (v16)_mm512_min_ps((__m512)splat(87.3f), _mm512_max_ps((__m512)splat(-87.3f), (__m512)z));
#else
  z = z < -87.3f ? splat(-87.3f) : z;
  z = z > 87.3f ? splat(87.3f) : z;
#endif
  const v16 magic = splat(12582912.0f);  // 1.5·2^23: adding it rounds to an integer (an FMA and a subtraction,
  const v16 n = (z * L + magic) - magic;  // cheaper than a round instruction)
  v16 q = z - n * C1;
  q = q - n * C2;
  v16 p = splat(1.383684576e-3f);  // Horner in q: coefficient k of the polynomial in r, times S^k
  p = p * q + S * 8.374815807e-3f;
  p = p * q + 4.166822508e-2f;
  p = p * q + S * 1.666641980e-1f;
  p = p * q + 4.999999106e-1f;
  p = p * q + (float)S;
  p = p * q + 1.0f;
#if defined(__AVX512F__)
  return (v16)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
  const v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
  v16 scale;
  memcpy(&scale, &e, sizeof scale);
  return p * scale;
#endif
}

// 1 / y: with AVX-512 the 14-bit estimate and one Newton step (within 2 ulp, a third of a division's cost).
inline v16 reciprocal(v16 y) {
#if defined(__AVX512F__)
  const v16 r = (v16)_mm512_rcp14_ps((__m512)y);
  return r * (2.0f - y * r);
#else
  return 1.0f / y;
#endif
}

inline v16 vsigmoid(v16 z) { return reciprocal(1.0f + vexp<-1>(z)); }
inline v16 vtanh(v16 z) { return 1.0f - 2.0f * reciprocal(vexp<1>(z + z) + 1.0f); }

// f(z) and its first ORDER derivatives into d[0 .. ORDER] (d[0] = f): one exp per element. ORDER 1 for ∇E, 2 for
// the losses that differentiate ∇E in the weights, 3 for sliced score matching (it differentiates vᵀ∇²E v).
template <int ACT, int ORDER>
inline void activation(v16 z, float p, v16* d) {
  static_assert(ORDER >= 1 && ORDER <= 3, "f and up to three derivatives");
  if constexpr (ACT == SILU) {  // s' = s(1 − s), q = 1 − 2s: f' = s + f(1 − s), f'' = s'(2 + zq), f''' = s'(q(3 + zq) − 2zs')
    const v16 s = vsigmoid(z);
    d[0] = z * s;
    d[1] = d[0] * (1.0f - s) + s;
    if constexpr (ORDER >= 2) {
      const v16 sp = s - s * s, q = 1.0f - 2.0f * s;
      d[2] = sp * (2.0f + z * q);
      if constexpr (ORDER >= 3) d[3] = sp * (q * (3.0f + z * q) - 2.0f * z * sp);
    }
  } else if constexpr (ACT == TANH) {  // t' = 1 − t², t'' = −2t t', t''' = t'(6t² − 2)
    const v16 t = vtanh(z);
    d[0] = t;
    d[1] = 1.0f - t * t;
    if constexpr (ORDER >= 2) d[2] = -2.0f * t * d[1];
    if constexpr (ORDER >= 3) d[3] = d[1] * (6.0f * t * t - 2.0f);
  } else if constexpr (ACT == SIGMOID) {  // s' = s(1 − s), s'' = s'(1 − 2s), s''' = s'(1 − 6s + 6s²)
    const v16 s = vsigmoid(z);
    d[0] = s;
    d[1] = s - s * s;
    if constexpr (ORDER >= 2) d[2] = d[1] * (1.0f - 2.0f * s);
    if constexpr (ORDER >= 3) d[3] = d[1] * (1.0f - 6.0f * s + 6.0f * s * s);
  } else if constexpr (ACT == RELU) {
    d[0] = z < 0.0f ? v16{} : z;  // a NaN stays NaN, as in torch
    d[1] = z > 0.0f ? splat(1.0f) : v16{};
    for (int k = 2; k <= ORDER; ++k) d[k] = v16{};
  } else if constexpr (ACT == LEAKY_RELU) {  // p: the negative slope
    d[0] = z > 0.0f ? z : z * p;
    d[1] = z > 0.0f ? splat(1.0f) : splat(p);
    for (int k = 2; k <= ORDER; ++k) d[k] = v16{};
  } else if constexpr (ACT == ELU) {  // p: alpha; for z <= 0 every derivative is p·exp(z)
    const v16 e = p * vexp<1>(z < 0.0f ? z : v16{});
    d[0] = z > 0.0f ? z : e - p;
    d[1] = z > 0.0f ? splat(1.0f) : e;
    for (int k = 2; k <= ORDER; ++k) d[k] = z > 0.0f ? v16{} : e;
  } else {
    static_assert(ACT < 0, "an activation of EBM_ACTIVATIONS without its case here");
  }
}

// Over the ROWS × nb vectors z of a layer: out[k][i] <- the k-th derivative of f at z[i], k = 0 .. ORDER (out[0]
// may be z).
template <int ORDER, int ACT>
inline void activation_rows(const v16* z, float p, int nb, v16* const* out) {
  for (int i = 0; i < ROWS * nb; ++i) {
    v16 d[ORDER + 1];
    activation<ACT, ORDER>(z[i], p, d);
    for (int k = 0; k <= ORDER; ++k) out[k][i] = d[k];
  }
}

template <int ORDER>
inline void activation_rows(ActivationCode act, const v16* z, int nb, v16* const* out) {
  switch (act.kind) {  // codes are checked by the callers (host.cpp)
#define EBM_ACTIVATION_CASE(NAME, CODE) \
  case NAME:                            \
    return activation_rows<ORDER, NAME>(z, act.param, nb, out);
    EBM_ACTIVATIONS(EBM_ACTIVATION_CASE)
#undef EBM_ACTIVATION_CASE
  }
}

// Over the ROWS × nb vectors z of a layer: with top (the last hidden layer) z <- f'(z) · top; without,
// a <- f(z) and z <- f'(z). Exactly one of top and a is given.
template <int ACT, bool TOP>
inline void activate_rows(v16* z, float p, int nb, const v16* top, v16* a) {
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < nb; ++j) {
      const int i = r * nb + j;
      v16 d[2];
      activation<ACT, 1>(z[i], p, d);
      if (TOP) {
        z[i] = d[1] * top[j];
      } else {
        a[i] = d[0];
        z[i] = d[1];
      }
    }
}

template <int ACT>
inline void activate_rows(v16* z, float p, int nb, const v16* top, v16* a) {
  if (top) return activate_rows<ACT, true>(z, p, nb, top, nullptr);
  activate_rows<ACT, false>(z, p, nb, nullptr, a);
}

inline void activate_rows(ActivationCode act, v16* z, int nb, const v16* top, v16* a) {
  switch (act.kind) {  // codes are checked by the callers (host.cpp)
#define EBM_ACTIVATION_CASE(NAME, CODE) \
  case NAME:                            \
    return activate_rows<NAME>(z, act.param, nb, top, a);
    EBM_ACTIVATIONS(EBM_ACTIVATION_CASE)
#undef EBM_ACTIVATION_CASE
  }
}

// C[r][jb] = (bias[jb] or 0) + Σ_k A[r][k] · B[k][jb] for the ROWS rows of a tile: A rows of lda floats,
// B k-major in blocks of 16 (nb blocks per k), C rows of nb blocks. RB rows × J blocks per pass: 16
// accumulators, so the FMA latency is hidden whatever the width. With add, C += A·B instead (bias unused): a
// product split along K, each part's strip of B small enough to stay in L1 for all the passes over the rows.
template <int J>
inline void product_strip(const float* A, int lda, int K, const v16* B, int nb, int jb, const v16* bias, v16* C, bool add) {
  constexpr int RB = 16 / J;
  static_assert(ROWS % RB == 0, "a tile is whole passes");
  for (int r0 = 0; r0 < ROWS; r0 += RB) {
    v16 acc[RB][J];
    for (int r = 0; r < RB; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = add ? C[(r0 + r) * nb + jb + j] : bias ? bias[jb + j] : v16{};
    for (int k = 0; k < K; ++k) {
      v16 b[J];
      for (int j = 0; j < J; ++j) b[j] = B[k * nb + jb + j];
      for (int r = 0; r < RB; ++r) {
        const float a = A[(r0 + r) * lda + k];
        for (int j = 0; j < J; ++j) acc[r][j] += a * b[j];
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int j = 0; j < J; ++j) C[(r0 + r) * nb + jb + j] = acc[r][j];
  }
}

// C[j][kb] += Σ_r P[r][j] · Q[r][kb] over the ROWS rows of a tile (a weight's gradient, outer products summed):
// P rows of ldp floats (j < rows_out), Q and C rows of qb blocks. JR rows × KB blocks of C per pass.
template <int JR, int KB>
inline void outer_strip(const float* P, int ldp, int j0, const v16* Q, int qb, int kb0, v16* C) {
  v16 acc[JR][KB];
  for (int j = 0; j < JR; ++j)
    for (int k = 0; k < KB; ++k) acc[j][k] = C[(j0 + j) * qb + kb0 + k];
  for (int r = 0; r < ROWS; ++r) {
    v16 q[KB];
    for (int k = 0; k < KB; ++k) q[k] = Q[r * qb + kb0 + k];
    for (int j = 0; j < JR; ++j) {
      const float p = P[r * ldp + j0 + j];
      for (int k = 0; k < KB; ++k) acc[j][k] += p * q[k];
    }
  }
  for (int j = 0; j < JR; ++j)
    for (int k = 0; k < KB; ++k) C[(j0 + j) * qb + kb0 + k] = acc[j][k];
}

template <int JR>
inline void outer_rows(const float* P, int ldp, int j0, const v16* Q, int qb, v16* C) {
  int kb = 0;
  for (; kb + 4 <= qb; kb += 4) outer_strip<JR, 4>(P, ldp, j0, Q, qb, kb, C);
  for (; kb < qb; ++kb) outer_strip<JR, 1>(P, ldp, j0, Q, qb, kb, C);
}

inline void accumulate_outer(const float* P, int ldp, int rows_out, const v16* Q, int qb, v16* C) {
  int j0 = 0;
  for (; j0 + 4 <= rows_out; j0 += 4) outer_rows<4>(P, ldp, j0, Q, qb, C);
  for (; j0 < rows_out; ++j0) outer_rows<1>(P, ldp, j0, Q, qb, C);
}

// C[j][kb] += Σ_r P1[r][j] · Q1[r][kb] + P2[r][j] · Q2[r][kb]: two outer-product sums into one gradient in one pass
// (C's blocks loaded and stored once). Arguments as outer_strip's, P1 and P2 with one ldp, Q1 and Q2 with one qb.
template <int JR, int KB>
inline void outer_pair_strip(const float* P1, const float* P2, int ldp, int j0, const v16* Q1, const v16* Q2, int qb, int kb0,
                             v16* C) {
  v16 acc[JR][KB];
  for (int j = 0; j < JR; ++j)
    for (int k = 0; k < KB; ++k) acc[j][k] = C[(j0 + j) * qb + kb0 + k];
  for (int r = 0; r < ROWS; ++r) {
    v16 q[KB];
    for (int k = 0; k < KB; ++k) q[k] = Q1[r * qb + kb0 + k];
    for (int j = 0; j < JR; ++j) {
      const float p = P1[r * ldp + j0 + j];
      for (int k = 0; k < KB; ++k) acc[j][k] += p * q[k];
    }
    for (int k = 0; k < KB; ++k) q[k] = Q2[r * qb + kb0 + k];
    for (int j = 0; j < JR; ++j) {
      const float p = P2[r * ldp + j0 + j];
      for (int k = 0; k < KB; ++k) acc[j][k] += p * q[k];
    }
  }
  for (int j = 0; j < JR; ++j)
    for (int k = 0; k < KB; ++k) C[(j0 + j) * qb + kb0 + k] = acc[j][k];
}

template <int JR>
inline void outer_pair_rows(const float* P1, const float* P2, int ldp, int j0, const v16* Q1, const v16* Q2, int qb, v16* C) {
  int kb = 0;
  for (; kb + 4 <= qb; kb += 4) outer_pair_strip<JR, 4>(P1, P2, ldp, j0, Q1, Q2, qb, kb, C);
  for (; kb < qb; ++kb) outer_pair_strip<JR, 1>(P1, P2, ldp, j0, Q1, Q2, qb, kb, C);
}

inline void accumulate_outer_pair(const float* P1, const float* P2, int ldp, int rows_out, const v16* Q1, const v16* Q2, int qb,
                                  v16* C) {
  int j0 = 0;
  for (; j0 + 4 <= rows_out; j0 += 4) outer_pair_rows<4>(P1, P2, ldp, j0, Q1, Q2, qb, C);
  for (; j0 < rows_out; ++j0) outer_pair_rows<1>(P1, P2, ldp, j0, Q1, Q2, qb, C);
}

// The first layer's gradient for few inputs (d <= SMALL_INPUT): C[j][i] += Σ_r P1[r][j] · q1[r][i] + P2[r][j] · q2[r][i]
// with P1, P2 rows of pb blocks (j < width) and q1, q2 rows of 16 · blocks(d) floats, C rows of blocks(d) blocks. Summed
// as columns over j, 16 outputs per vector (a 16-wide outer product over i would be mostly padding), then added to C.
inline void input_outer(const v16* P1, const v16* P2, int pb, int width, const float* q1, const float* q2, int d, v16* C) {
  const int ld = 16 * blocks(d);
  float* c = (float*)C;
  for (int i = 0; i < d; ++i)
    for (int jb0 = 0; jb0 < pb; jb0 += 4) {
      const int J = pb - jb0 < 4 ? pb - jb0 : 4;
      v16 acc[4] = {};
      for (int r = 0; r < ROWS; ++r) {
        const float a = q1[r * ld + i], b = q2[r * ld + i];
        for (int j = 0; j < J; ++j) {
          acc[j] += P1[r * pb + jb0 + j] * a;
          acc[j] += P2[r * pb + jb0 + j] * b;
        }
      }
      for (int j = 0; j < J; ++j)
        for (int k = 0; k < 16 && 16 * (jb0 + j) + k < width; ++k) c[(size_t)(16 * (jb0 + j) + k) * ld + i] += acc[j][k];
    }
}

// The products of the hidden-to-hidden layers of a chain's gradient (Network::products): IEEE float32 FMAs, or
// bfloat16 operands (rounded to nearest even) summed in float32, either as float32 FMAs on the rounded operands (their
// products are exact in float32: 8-bit by 8-bit significands) or as AVX512-BF16 dot products (vdpbf16ps: pairs of
// products summed into float32, denormals flushed), built only where the compiler targets avx512_bf16.
enum Products { PRODUCTS_IEEE = 0, PRODUCTS_BF16_FMA = 1, PRODUCTS_BF16_DOT = 2 };

#if defined(__AVX512BF16__)
constexpr bool HAS_BF16_DOT = true;
#else
constexpr bool HAS_BF16_DOT = false;
#endif

// float32 -> bfloat16 bits, rounded to nearest even (a NaN stays a quiet NaN), as vcvtne2ps2bf16 does.
inline uint16_t bf16_bits(float a) {
  uint32_t u;
  memcpy(&u, &a, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16_rounded(float a) {
  const uint32_t u = (uint32_t)bf16_bits(a) << 16;
  float r;
  memcpy(&r, &u, sizeof r);
  return r;
}

// v rounded to bfloat16 (nearest even), kept as float32; a NaN stays NaN.
inline v16 bf16_rounded(v16 v) {
  v16u u;
  memcpy(&u, &v, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  v16 r;
  memcpy(&r, &u, sizeof r);
  return v != v ? v : r;
}

inline void product(const float* A, int lda, int K, const v16* B, int nb, const v16* bias, v16* C, bool add = false) {
  int jb = 0;
  for (; jb + 4 <= nb; jb += 4) product_strip<4>(A, lda, K, B, nb, jb, bias, C, add);
  for (; jb + 2 <= nb; jb += 2) product_strip<2>(A, lda, K, B, nb, jb, bias, C, add);
  for (; jb < nb; ++jb) product_strip<1>(A, lda, K, B, nb, jb, bias, C, add);
}

// product() with bfloat16 operands as float32 FMAs: A's ROWS rows rounded into `rounded` (rows of lda floats), B
// rounded already (Network::use_products).
inline void product_bf16_fma(const float* A, int lda, int K, const v16* B, int nb, const v16* bias, v16* C, v16* rounded) {
  const int kb = blocks(K);
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < kb; ++k) rounded[r * (lda / 16) + k] = bf16_rounded(((const v16*)(A + r * lda))[k]);
  product((const float*)rounded, lda, K, B, nb, bias, C);
}

#if defined(__AVX512BF16__)
// C[r][jb] = (bias[jb] or 0) + Σ_p A[r][2p]·B[2p][jb] + A[r][2p+1]·B[2p+1][jb] by vdpbf16ps: A as ROWS rows of lda2
// bfloat16 pairs (one uint32 each), B as pairs of rows of k-major blocks (P = ceil(K/2) rows of nb vectors of 32
// bfloat16, pair-interleaved). RB rows × J blocks per pass, as product_strip.
template <int J>
inline void dot_strip(const uint32_t* A, int lda2, int P, const v16* B, int nb, int jb, const v16* bias, v16* C) {
  constexpr int RB = 16 / J;
  for (int r0 = 0; r0 < ROWS; r0 += RB) {
    __m512 acc[RB][J];
    for (int r = 0; r < RB; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = bias ? (__m512)bias[jb + j] : _mm512_setzero_ps();
    for (int p = 0; p < P; ++p) {
      __m512bh b[J];
      for (int j = 0; j < J; ++j) b[j] = (__m512bh)_mm512_load_si512((const void*)(B + p * nb + jb + j));
      for (int r = 0; r < RB; ++r) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[(r0 + r) * lda2 + p]);
        for (int j = 0; j < J; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, b[j]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int j = 0; j < J; ++j) C[(r0 + r) * nb + jb + j] = (v16)acc[r][j];
  }
}

// product() by vdpbf16ps: A's ROWS rows (lda floats, K used) converted to bfloat16 pairs in `pairs` (columns from K
// on zero), B packed by Network::use_products.
inline void product_bf16_dot(const float* A, int lda, int K, const v16* B, int nb, const v16* bias, v16* C, v16* pairs) {
  const int kb = blocks(K), lda2 = 8 * kb, P = (K + 1) / 2;
  uint32_t* a2 = (uint32_t*)pairs;
  for (int r = 0; r < ROWS; ++r) {
    const float* row = A + r * lda;
    for (int k = 0; k < kb; k += 2) {
      const __mmask16 lo = 16 * k + 16 <= K ? (__mmask16)0xffff : (__mmask16)((1u << (K - 16 * k)) - 1u);
      const int rest = K - 16 * (k + 1);
      const __mmask16 hi = rest >= 16 ? (__mmask16)0xffff : rest <= 0 ? (__mmask16)0 : (__mmask16)((1u << rest) - 1u);
      const __m512 l = _mm512_maskz_loadu_ps(lo, row + 16 * k), h = _mm512_maskz_loadu_ps(hi, row + 16 * k + 16);
      _mm512_storeu_si512((void*)(a2 + r * lda2 + 8 * k), (__m512i)_mm512_cvtne2ps_pbh(h, l));
    }
  }
  int jb = 0;
  for (; jb + 4 <= nb; jb += 4) dot_strip<4>(a2, lda2, P, B, nb, jb, bias, C);
  for (; jb + 2 <= nb; jb += 2) dot_strip<2>(a2, lda2, P, B, nb, jb, bias, C);
  for (; jb < nb; ++jb) dot_strip<1>(a2, lda2, P, B, nb, jb, bias, C);
}
#endif

// B (K rows of nb blocks, k-major, float32) as product_bf16_dot takes it: ceil(K/2) rows of nb vectors, element
// (p, 16·jb + j) the pair (B[2p][16·jb + j], B[2p+1][16·jb + j]) in bfloat16 (low half first).
inline std::vector<v16> bf16_pairs(const std::vector<v16>& B, int K, int nb) {
  const int P = (K + 1) / 2;
  std::vector<v16> out((size_t)P * nb, v16{});
  const float* b = (const float*)B.data();
  uint32_t* o = (uint32_t*)out.data();
  for (int p = 0; p < P; ++p)
    for (int j = 0; j < 16 * nb; ++j) {
      const uint32_t lo = bf16_bits(b[(size_t)(2 * p) * nb * 16 + j]);
      const uint32_t hi = 2 * p + 1 < K ? bf16_bits(b[(size_t)(2 * p + 1) * nb * 16 + j]) : 0u;
      o[(size_t)p * nb * 16 + j] = lo | (hi << 16);
    }
  return out;
}

// The network, its weights packed once per launch: for layer l (in_l -> out_l), forward[l] is W_lᵀ (in_l rows
// of blocks(out_l) blocks), backward[l] is W_l (out_l rows of blocks(in_l) blocks), bias[l] blocks(out_l).
struct Network {
  int n_hidden = 0;
  float sign = 1.0f;
  std::vector<int> widths;        // in_0 = d, out_0, …, out_{n_hidden-1}
  std::vector<ActivationCode> activations;  // one per hidden layer
  std::vector<std::vector<v16>> forward, backward, bias;
  std::vector<v16> top;           // sign · w_out: ∂E/∂(last hidden activation)
  float top_bias = 0.0f;          // sign · b_out
  std::vector<v16> input_columns; // for d <= SMALL_INPUT: column i of W_0 in blocks(out_0) blocks
  int products = PRODUCTS_IEEE;   // the hidden-to-hidden layers' products (use_products)

  Network() = default;  // no layers: a probe of use_products
  // weights[l]: (widths[l+1], widths[l]) row-major; weights[n_hidden]: (1, widths[n_hidden]); biases may be null.
  Network(int n_hidden_, const int64_t* widths_, const float* const* weights, const float* const* biases,
          const int64_t* activations_, float sign)
      : n_hidden(n_hidden_), sign(sign), widths(widths_, widths_ + n_hidden_ + 1), activations(activations_, activations_ + n_hidden_) {
    for (int l = 0; l < n_hidden; ++l) {
      const int in = widths[l], out = widths[l + 1], ib = blocks(in), ob = blocks(out);
      std::vector<v16> f((size_t)in * ob, v16{}), b((size_t)out * ib, v16{}), c((size_t)ob, v16{});
      float* fp = (float*)f.data();
      float* bp = (float*)b.data();
      for (int j = 0; j < out; ++j)
        for (int k = 0; k < in; ++k) {
          const float w = weights[l][(size_t)j * in + k];
          fp[(size_t)k * ob * 16 + j] = w;
          bp[(size_t)j * ib * 16 + k] = w;
        }
      if (biases[l])
        for (int j = 0; j < out; ++j) ((float*)c.data())[j] = biases[l][j];
      forward.push_back(std::move(f));
      backward.push_back(std::move(b));
      bias.push_back(std::move(c));
    }
    const int d = widths[0], w1 = widths[1];
    if (d <= SMALL_INPUT) {
      input_columns.assign((size_t)d * blocks(w1), v16{});
      for (int i = 0; i < d; ++i)
        for (int k = 0; k < w1; ++k) ((float*)input_columns.data())[(size_t)i * blocks(w1) * 16 + k] = weights[0][(size_t)k * d + i];
    }
    const int last = widths[n_hidden];
    top.assign((size_t)blocks(last), v16{});
    for (int j = 0; j < last; ++j) ((float*)top.data())[j] = sign * weights[n_hidden][j];
    if (biases[n_hidden]) top_bias = sign * biases[n_hidden][0];
  }

  // Take `kind` (Products) for the products of layers 1 .. n_hidden − 1 (forward[l] and backward[l], l >= 1) in
  // gradient(): their weights rounded to bfloat16 in place (BF16_FMA) or packed in pairs (BF16_DOT). Returns false,
  // changing nothing, for BF16_DOT where the build has no vdpbf16ps.
  bool use_products(int kind) {
    if (kind == PRODUCTS_BF16_DOT && !HAS_BF16_DOT) return false;
    if (kind != PRODUCTS_IEEE && kind != PRODUCTS_BF16_FMA && kind != PRODUCTS_BF16_DOT) return false;
    products = kind;
    for (int l = 1; l < n_hidden && kind != PRODUCTS_IEEE; ++l) {
      const int in = widths[l], out = widths[l + 1];
      for (auto* m : {&forward[l], &backward[l]}) {
        const bool fw = m == &forward[l];
        if (kind == PRODUCTS_BF16_FMA)
          for (v16& v : *m) v = bf16_rounded(v);
        else
          *m = bf16_pairs(*m, fw ? in : out, blocks(fw ? out : in));
      }
    }
    return true;
  }

  int widest() const {  // the widest layer
    int w = 1;
    for (int v : widths) w = v > w ? v : w;
    return w;
  }
};

// One thread's buffers for a tile: the state, per hidden layer its activation and f'(z)·(upstream), two
// gradient buffers, all ROWS rows of blocks(width) vectors.
struct Workspace {
  std::vector<v16> x, grad, g0, g1, operands;  // operands: a product's rows in bfloat16 (bf16 products only)
  std::vector<std::vector<v16>> act, deriv;

  explicit Workspace(const Network& net) {
    const int widest = net.widest();
    x.assign((size_t)ROWS * blocks(net.widths[0]), v16{});
    grad.assign(x.size(), v16{});
    g0.assign((size_t)ROWS * blocks(widest), v16{});
    g1.assign(g0.size(), v16{});
    if (net.products != PRODUCTS_IEEE) operands.assign(g0.size() + 1, v16{});
    for (int l = 0; l < net.n_hidden; ++l) {
      act.emplace_back((size_t)ROWS * blocks(net.widths[l + 1]), v16{});
      deriv.emplace_back((size_t)ROWS * blocks(net.widths[l + 1]), v16{});
    }
  }
};

// ∇E = e_0 W_0 of a tile from e_0 = ∂E/∂z at the first hidden layer (ROWS rows of blocks(widths[1])) into grad
// (ROWS rows of blocks(d)): the last product of the chain rule, shared by every pass that needs the input gradient.
inline void input_gradient(const Network& net, const v16* e, v16* grad_out) {
  const int w1 = net.widths[1], d = net.widths[0];
  if (d > SMALL_INPUT) {
    product((const float*)e, 16 * blocks(w1), w1, net.backward[0].data(), blocks(d), nullptr, grad_out);
    return;
  }
  // few inputs: ∇E[r][i] = e_0[r] · W_0[:, i] as dot products (a 16-wide product would be mostly padding)
  const int kb = blocks(w1), db = blocks(d);
  float* grad = (float*)grad_out;
  for (int r = 0; r < ROWS; ++r)
    for (int i = 0; i < d; ++i) {
      v16 acc = v16{};
      for (int k = 0; k < kb; ++k) acc += e[r * kb + k] * net.input_columns[i * kb + k];
      grad[r * 16 * db + i] = sum(acc);
    }
}

// A product of layer l >= 1 in gradient() (forward: h W_lᵀ + b_l; backward: e W_l), with the network's products.
inline void hidden_product(const Network& net, Workspace& ws, const float* A, int lda, int K, const v16* B, int nb,
                           const v16* bias, v16* C) {
  if (net.products == PRODUCTS_BF16_FMA) return product_bf16_fma(A, lda, K, B, nb, bias, C, ws.operands.data());
#if defined(__AVX512BF16__)
  if (net.products == PRODUCTS_BF16_DOT) return product_bf16_dot(A, lda, K, B, nb, bias, C, ws.operands.data());
#endif
  product(A, lda, K, B, nb, bias, C);
}

// ∇E of the tile's ROWS chains in ws.x into ws.grad.
inline void gradient(const Network& net, Workspace& ws) {
  const int L = net.n_hidden;
  const float* h = (const float*)ws.x.data();
  int lda = 16 * blocks(net.widths[0]);
  for (int l = 0; l < L; ++l) {  // forward: z = h W_lᵀ + b_l; keep f(z) (not for the last layer) and f'(z)
    const int ob = blocks(net.widths[l + 1]);
    v16* z = ws.deriv[l].data();
    if (l == 0)
      product(h, lda, net.widths[l], net.forward[l].data(), ob, net.bias[l].data(), z);
    else
      hidden_product(net, ws, h, lda, net.widths[l], net.forward[l].data(), ob, net.bias[l].data(), z);
    const bool last = l == L - 1;
    v16* a = ws.act[l].data();
    activate_rows(net.activations[l], z, ob, last ? net.top.data() : nullptr, last ? nullptr : a);
    h = (const float*)a;
    lda = 16 * ob;
  }
  // backward: e_L = f'(z_L)·top is in deriv[L-1]; e_{l-1} = (e_l W_l) ⊙ f'(z_{l-1}); ∇E = e_0 W_0
  const v16* e = ws.deriv[L - 1].data();
  for (int l = L - 1; l >= 1; --l) {
    const int ib = blocks(net.widths[l]), ob = blocks(net.widths[l + 1]);
    v16* g = (l % 2) ? ws.g0.data() : ws.g1.data();
    hidden_product(net, ws, (const float*)e, 16 * ob, net.widths[l + 1], net.backward[l].data(), ib, nullptr, g);
    const v16* d = ws.deriv[l - 1].data();
    for (int i = 0; i < ROWS * ib; ++i) g[i] *= d[i];
    e = g;
  }
  input_gradient(net, e, ws.grad.data());
}

// ---- denoising score matching: L = (1/2n) Σ_r |a_r ∇E(x_r) − b_r|², and its gradient in the weights ----
//
// With c_r = a_r (a_r ∇E(x_r) − b_r) held fixed, ∂L/∂θ = (1/n) Σ_r ∂u_r/∂θ where u_r = ∇E(x_r) · c_r is the
// derivative of E along c_r: the tangent τ_l = W_l σ_{l−1} (σ_0 = c), σ_l = f'(z_l) τ_l, u = sign · w_out · σ_L,
// then reverse mode through the primal and the tangent: τ̄_l = σ̄_l f'(z_l), z̄_l = σ̄_l f''(z_l) τ_l + h̄_l f'(z_l),
// ∂W_l += τ̄_l σ_{l−1}ᵀ + z̄_l h_{l−1}ᵀ, ∂b_l += z̄_l, σ̄_{l−1} = W_lᵀ τ̄_l, h̄_{l−1} = W_lᵀ z̄_l.

// One thread's sums of a loss's gradient in the weights (∂W_l as out_l rows of blocks(in_l), ∂b_l, ∂w_out) and of the
// loss, which network_loss_host adds over threads; and the allocation of a loss's tile buffers.
struct WeightSums {
  std::vector<std::vector<v16>> dW, db;
  std::vector<v16> dw_out;
  double loss = 0.0;

  explicit WeightSums(const Network& net) {
    const int L = net.n_hidden;
    for (int l = 0; l < L; ++l) {
      dW.emplace_back((size_t)net.widths[l + 1] * blocks(net.widths[l]), v16{});
      db.emplace_back((size_t)blocks(net.widths[l + 1]), v16{});
    }
    dw_out.assign((size_t)blocks(net.widths[L]), v16{});
  }

  // each buffer: one ROWS × blocks(width) tile per level 0 .. n_hidden
  static void per_level(const Network& net, std::initializer_list<std::vector<std::vector<v16>>*> buffers) {
    for (int l = 0; l <= net.n_hidden; ++l)
      for (auto* b : buffers) b->emplace_back((size_t)ROWS * blocks(net.widths[l]), v16{});
  }

  // each buffer: one ROWS × blocks(widest layer) tile
  static void widest_rows(const Network& net, std::initializer_list<std::vector<v16>*> buffers) {
    for (auto* b : buffers) b->assign((size_t)ROWS * blocks(net.widest()), v16{});
  }
};

// The DSM (and energy-gradient) tile's buffers, with the sums of WeightSums. The reverse pass
// needs, per level, σ̄_l and τ̄_l = σ̄_l f'(z_l): those are the backward pass of ∇E itself (σ̄_L = top, then
// σ̄_{l−1} = W_lᵀ τ̄_l), so they are kept from it (gamma: σ̄_l, delta: τ̄_l) rather than computed twice.
struct ScoreWorkspace : WeightSums {
  std::vector<std::vector<v16>> h, d1, d2, tau, sigma, gamma, delta;  // h[0], sigma[0]: the inputs x and c
  std::vector<v16> hbar0, hbar1;

  explicit ScoreWorkspace(const Network& net) : WeightSums(net) {
    per_level(net, {&h, &sigma, &d1, &d2, &tau, &gamma, &delta});
    widest_rows(net, {&hbar0, &hbar1});
  }
};

// The tile's rows in ws.h[0] (x) with targets b and scales a (rows past m: zero scale, no contribution).
inline void denoising_tile(const Network& net, ScoreWorkspace& ws, const float* b, const float* a, int m, int64_t i0) {
  const int L = net.n_hidden, d = net.widths[0], db0 = blocks(d);
  // primal forward: h_l = f(z_l) with f', f''; layer l (0-based) maps h[l] to h[l+1]
  for (int l = 0; l < L; ++l) {
    const int ob = blocks(net.widths[l + 1]);
    v16* z = ws.h[l + 1].data();
    product((const float*)ws.h[l].data(), 16 * blocks(net.widths[l]), net.widths[l], net.forward[l].data(), ob,
            net.bias[l].data(), z);
    v16* const out[] = {z, ws.d1[l + 1].data(), ws.d2[l + 1].data()};
    activation_rows<2>(net.activations[l], z, ob, out);
  }
  // ∇E backwards: delta_L = top · f'(z_L); gamma_{l−1} = delta_l W_l, delta_{l−1} = gamma_{l−1} f'(z_{l−1}); ∇E = delta_1 W_0
  {
    const int ob = blocks(net.widths[L]);
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) ws.delta[L][r * ob + j] = net.top[j] * ws.d1[L][r * ob + j];
    for (int l = L - 1; l >= 1; --l) {
      const int ib = blocks(net.widths[l]), lb = blocks(net.widths[l + 1]);
      v16 *g = ws.gamma[l].data(), *e = ws.delta[l].data();
      product((const float*)ws.delta[l + 1].data(), 16 * lb, net.widths[l + 1], net.backward[l].data(), ib, nullptr, g);
      for (int i = 0; i < ROWS * ib; ++i) e[i] = g[i] * ws.d1[l][i];
    }
    // c = a (a ∇E − b) into sigma[0]; the loss
    v16* c = ws.sigma[0].data();
    input_gradient(net, ws.delta[1].data(), c);
    float* cf = (float*)c;
    for (int r = 0; r < ROWS; ++r) {
      const float ar = r < m ? (a ? a[i0 + r] : 1.0f) : 0.0f;
      double sq = 0.0;
      for (int i = 0; i < d; ++i) {
        const float res = r < m ? ar * cf[r * 16 * db0 + i] - b[(i0 + r) * d + i] : 0.0f;
        sq += (double)res * res;
        cf[r * 16 * db0 + i] = ar * res;
      }
      ws.loss += 0.5 * sq;
    }
  }
  // tangent forward along c: τ_{l+1} = σ_l W_lᵀ (no bias), σ_{l+1} = f'(z_{l+1}) τ_{l+1}
  for (int l = 0; l < L; ++l) {
    const int ob = blocks(net.widths[l + 1]);
    v16* t = ws.tau[l + 1].data();
    product((const float*)ws.sigma[l].data(), 16 * blocks(net.widths[l]), net.widths[l], net.forward[l].data(), ob, nullptr, t);
    for (int i = 0; i < ROWS * ob; ++i) ws.sigma[l + 1][i] = ws.d1[l + 1][i] * t[i];
  }
  // reverse: u = top · σ_L
  {
    const int ob = blocks(net.widths[L]);
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) ws.dw_out[j] += ws.sigma[L][r * ob + j];
  }
  const v16* hbar = nullptr;  // h̄_l (nullptr: zero)
  for (int l = L; l >= 1; --l) {
    const int ob = blocks(net.widths[l]), ib = blocks(net.widths[l - 1]);
    const v16* tbar = ws.delta[l].data();
    v16* zbar = (hbar == ws.hbar0.data()) ? ws.hbar1.data() : ws.hbar0.data();
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) {
        const int i = r * ob + j;
        const v16 sb = l == L ? net.top[j] : ws.gamma[l][i];
        zbar[i] = sb * ws.d2[l][i] * ws.tau[l][i] + (hbar ? hbar[i] * ws.d1[l][i] : v16{});
      }
    if (l == 1 && d <= SMALL_INPUT)
      input_outer(tbar, zbar, ob, net.widths[1], (const float*)ws.sigma[0].data(), (const float*)ws.h[0].data(), d,
                  ws.dW[0].data());
    else
      accumulate_outer_pair((const float*)tbar, (const float*)zbar, 16 * ob, net.widths[l], ws.sigma[l - 1].data(),
                            ws.h[l - 1].data(), ib, ws.dW[l - 1].data());
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) ws.db[l - 1][j] += zbar[r * ob + j];
    if (l >= 2) {
      v16* nh = (zbar == ws.hbar0.data()) ? ws.hbar1.data() : ws.hbar0.data();
      product((const float*)zbar, 16 * ob, net.widths[l], net.backward[l - 1].data(), ib, nullptr, nh);
      hbar = nh;
    }
  }
}

// ---- E(x_r) and Σ_r c_r ∇_θ E(x_r) with c_r = a_r + b_r E(x_r): the gradient in the weights of a loss that is
// linear or quadratic in the energies (contrastive divergence with its energy regularisation), in one pass ----

// The tile's rows in ws.h[0] (x); energies written to e (rows i0 .. i0 + m − 1); b may be null (zero). Reuses the
// DSM workspace: per level the activation h, f'(z) in d1, the backward pass of E itself in delta (∂E/∂z, with the
// arithmetic of gradient(), so input_grad, when given, is its ∇E to the bit), and c_r·delta in tau.
inline void energy_gradient_tile(const Network& net, ScoreWorkspace& ws, const float* a, const float* b, float* e, int m,
                                 int64_t i0, v16* input_grad = nullptr) {
  const int L = net.n_hidden;
  for (int l = 0; l < L; ++l) {
    const int ob = blocks(net.widths[l + 1]);
    v16* z = ws.d1[l + 1].data();
    product((const float*)ws.h[l].data(), 16 * blocks(net.widths[l]), net.widths[l], net.forward[l].data(), ob,
            net.bias[l].data(), z);
    activate_rows(net.activations[l], z, ob, nullptr, ws.h[l + 1].data());  // z <- f'(z), h <- f(z)
  }
  const int ob = blocks(net.widths[L]);
  float c[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    v16 acc = v16{};
    for (int j = 0; j < ob; ++j) acc += net.top[j] * ws.h[L][r * ob + j];
    const float energy = sum(acc) + net.top_bias;
    c[r] = r < m ? a[i0 + r] + (b ? b[i0 + r] * energy : 0.0f) : 0.0f;
    if (r < m) e[i0 + r] = energy;
    for (int j = 0; j < ob; ++j) {
      const int i = r * ob + j;
      ws.delta[L][i] = ws.d1[L][i] * net.top[j];
      ws.dw_out[j] += c[r] * ws.h[L][i];
    }
  }
  for (int l = L; l >= 1; --l) {
    const int nb = blocks(net.widths[l]), ib = blocks(net.widths[l - 1]);
    v16* scaled = ws.tau[l].data();
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < nb; ++j) {
        scaled[r * nb + j] = c[r] * ws.delta[l][r * nb + j];
        ws.db[l - 1][j] += scaled[r * nb + j];
      }
    accumulate_outer((const float*)scaled, 16 * nb, net.widths[l], ws.h[l - 1].data(), ib, ws.dW[l - 1].data());
    if (l >= 2) {
      v16* dl = ws.delta[l - 1].data();
      product((const float*)ws.delta[l].data(), 16 * nb, net.widths[l], net.backward[l - 1].data(), ib, nullptr, dl);
      for (int i = 0; i < ROWS * ib; ++i) dl[i] *= ws.d1[l - 1][i];
    }
  }
  if (input_grad) input_gradient(net, ws.delta[1].data(), input_grad);
}

// ---- sliced score matching: L = (1/n) Σ_r ½ u_r² − w_r with u = vᵀ∇E(x), w = vᵀ∇²E(x) v, and its gradient ----
//
// u and w are the first and second derivatives of E(x + t v) at t = 0: forward in t, ż_l = W_l ḣ_{l−1},
// ḣ_l = f'(z_l) ż_l, z̈_l = W_l ḧ_{l−1}, ḧ_l = f''(z_l) ż_l² + f'(z_l) z̈_l (ḣ_0 = v, ḧ_0 = 0), u = top · ḣ_L,
// w = top · ḧ_L. Reverse from ḣ̄_L = u·top, ḧ̄_L = −top: z̈̄ = ḧ̄ f', ż̄ = 2 ḧ̄ f'' ż + ḣ̄ f',
// z̄ = ḧ̄ (f''' ż² + f'' z̈) + ḣ̄ f'' ż + h̄ f'; ∂W_l += z̄ h_{l−1}ᵀ + ż̄ ḣ_{l−1}ᵀ + z̈̄ ḧ_{l−1}ᵀ, ∂b_l += z̄; the adjoints
// of level l − 1 are W_lᵀ times z̄, ż̄, z̈̄.

struct SlicedWorkspace : WeightSums {
  std::vector<std::vector<v16>> h, hd, hdd, zd, zdd, d1, d2, d3;  // h[0] = x, hd[0] = v (the caller's)
  std::vector<v16> hbar, hdbar, hddbar, zbar, zdbar, zddbar;

  explicit SlicedWorkspace(const Network& net) : WeightSums(net) {
    per_level(net, {&h, &hd, &hdd, &zd, &zdd, &d1, &d2, &d3});
    widest_rows(net, {&hbar, &hdbar, &hddbar, &zbar, &zdbar, &zddbar});
  }
};

// The tile's rows in ws.h[0] (x) and ws.hd[0] (v); rows from m on are padding (no contribution).
inline void sliced_tile(const Network& net, SlicedWorkspace& ws, int m) {
  const int L = net.n_hidden;
  for (int l = 0; l < L; ++l) {  // level l -> l + 1: primal, first and second derivative in t
    const int ob = blocks(net.widths[l + 1]), lda = 16 * blocks(net.widths[l]), K = net.widths[l];
    v16* z = ws.h[l + 1].data();
    product((const float*)ws.h[l].data(), lda, K, net.forward[l].data(), ob, net.bias[l].data(), z);
    v16* const out[] = {z, ws.d1[l + 1].data(), ws.d2[l + 1].data(), ws.d3[l + 1].data()};
    activation_rows<3>(net.activations[l], z, ob, out);
    v16 *zd = ws.zd[l + 1].data(), *zdd = ws.zdd[l + 1].data();
    product((const float*)ws.hd[l].data(), lda, K, net.forward[l].data(), ob, nullptr, zd);
    if (l == 0)
      std::fill(zdd, zdd + ROWS * ob, v16{});
    else
      product((const float*)ws.hdd[l].data(), lda, K, net.forward[l].data(), ob, nullptr, zdd);
    const v16 *f1 = ws.d1[l + 1].data(), *f2 = ws.d2[l + 1].data();
    for (int i = 0; i < ROWS * ob; ++i) {
      ws.hd[l + 1][i] = f1[i] * zd[i];
      ws.hdd[l + 1][i] = f2[i] * zd[i] * zd[i] + f1[i] * zdd[i];
    }
  }
  const int ob = blocks(net.widths[L]);
  float ubar[ROWS], wbar[ROWS];  // ∂L_r/∂u = u, ∂L_r/∂w = −1 (zero for padding rows)
  for (int r = 0; r < ROWS; ++r) {
    v16 u = v16{}, w = v16{};
    for (int j = 0; j < ob; ++j) {
      u += net.top[j] * ws.hd[L][r * ob + j];
      w += net.top[j] * ws.hdd[L][r * ob + j];
    }
    const float uu = sum(u), ww = sum(w);
    if (r < m) ws.loss += 0.5 * (double)uu * uu - (double)ww;
    ubar[r] = r < m ? uu : 0.0f;
    wbar[r] = r < m ? -1.0f : 0.0f;
  }
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < ob; ++j) {
      const int i = r * ob + j;
      ws.dw_out[j] += ubar[r] * ws.hd[L][i] + wbar[r] * ws.hdd[L][i];
      ws.hdbar[i] = ubar[r] * net.top[j];
      ws.hddbar[i] = wbar[r] * net.top[j];
      ws.hbar[i] = v16{};
    }
  for (int l = L; l >= 1; --l) {
    const int nb = blocks(net.widths[l]), ib = blocks(net.widths[l - 1]), width = net.widths[l];
    const v16 *f1 = ws.d1[l].data(), *f2 = ws.d2[l].data(), *f3 = ws.d3[l].data(), *zd = ws.zd[l].data(),
              *zdd = ws.zdd[l].data();
    for (int i = 0; i < ROWS * nb; ++i) {
      const v16 a2 = ws.hddbar[i], a1 = ws.hdbar[i], a0 = ws.hbar[i];
      ws.zddbar[i] = a2 * f1[i];
      ws.zdbar[i] = 2.0f * a2 * f2[i] * zd[i] + a1 * f1[i];
      ws.zbar[i] = a2 * (f3[i] * zd[i] * zd[i] + f2[i] * zdd[i]) + a1 * f2[i] * zd[i] + a0 * f1[i];
    }
    const int ldz = 16 * nb;
    accumulate_outer((const float*)ws.zbar.data(), ldz, width, ws.h[l - 1].data(), ib, ws.dW[l - 1].data());
    accumulate_outer((const float*)ws.zdbar.data(), ldz, width, ws.hd[l - 1].data(), ib, ws.dW[l - 1].data());
    if (l >= 2)
      accumulate_outer((const float*)ws.zddbar.data(), ldz, width, ws.hdd[l - 1].data(), ib, ws.dW[l - 1].data());
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < nb; ++j) ws.db[l - 1][j] += ws.zbar[r * nb + j];
    if (l >= 2) {
      const v16* W = net.backward[l - 1].data();
      product((const float*)ws.zbar.data(), ldz, width, W, ib, nullptr, ws.hbar.data());
      product((const float*)ws.zdbar.data(), ldz, width, W, ib, nullptr, ws.hdbar.data());
      product((const float*)ws.zddbar.data(), ldz, width, W, ib, nullptr, ws.hddbar.data());
    }
  }
}

}  // namespace ff
}  // namespace ebm
