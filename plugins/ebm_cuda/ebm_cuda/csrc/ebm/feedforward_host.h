// Host build only: Langevin chains of a feed-forward energy E(x) = sign · (Linear_L ∘ f ∘ … ∘ f ∘ Linear_1)(x),
// K steps per launch. A tile of 16 chains stays in the core's L1 cache for all K steps: the forward pass, the
// chain rule backwards and the move run on it with no trip to memory, the matrix products register-blocked
// (4 chains × 64 outputs per pass), the activations and their derivatives computed together (one exp each).
// float32 only. Widths are padded to multiples of 16 with zero weights, which changes no result.
#pragma once
#include <stdint.h>
#include <string.h>

#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ebm {
namespace ff {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

constexpr int ROWS = 16;  // chains per tile (the Philox tile of host.cpp)
enum Activation { SILU = 0, TANH = 1, SIGMOID = 2, RELU = 3 };
constexpr int N_ACTIVATIONS = 4;

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

// exp(x) for float32, ~2 ulp (Cody–Waite reduction, degree-6 polynomial), clamped to finite results outside
// [-87.3, 88.7] (all that sigmoid, SiLU and tanh need).
inline v16 vexp(v16 x) {
#if defined(__AVX512F__)  // one instruction each (NaN becomes the bound: a NaN chain stays NaN through its state)
  x = (v16)_mm512_min_ps(_mm512_max_ps((__m512)x, (__m512)splat(-87.3f)), (__m512)splat(88.7f));
#else
  x = x < -87.3f ? splat(-87.3f) : x;
  x = x > 88.7f ? splat(88.7f) : x;
#endif
  const v16 magic = splat(12582912.0f);  // 1.5·2^23: adding it rounds to an integer
  const v16 t = x * 1.44269504088896341f + magic;
  const v16 n = t - magic;
  v16 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
  v16 scale;
  memcpy(&scale, &e, sizeof scale);
  return p * scale;
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

// f(z) into *a (when a is given) and f'(z) · g into *d: one exp per element.
template <int ACT>
inline void activate(v16 z, v16 g, v16* a, v16* d) {
  if (ACT == SILU) {
    const v16 s = reciprocal(1.0f + vexp(-z));
    if (a) *a = z * s;
    *d = g * (s * (1.0f + z * (1.0f - s)));
  } else if (ACT == TANH) {
    const v16 t = 1.0f - 2.0f * reciprocal(vexp(2.0f * z) + 1.0f);
    if (a) *a = t;
    *d = g * (1.0f - t * t);
  } else if (ACT == SIGMOID) {
    const v16 s = reciprocal(1.0f + vexp(-z));
    if (a) *a = s;
    *d = g * (s * (1.0f - s));
  } else {  // RELU
    if (a) *a = z > 0.0f ? z : v16{};
    *d = z > 0.0f ? g : v16{};
  }
}

// f(z), f'(z) and f''(z) (for losses that differentiate the gradient in the parameters).
template <int ACT>
inline void activate2(v16 z, v16* a, v16* d1, v16* d2) {
  if (ACT == SILU) {
    const v16 s = reciprocal(1.0f + vexp(-z)), f = z * s;
    *a = f;
    *d1 = s * (1.0f + z * (1.0f - s));
    *d2 = (s - s * s) * (2.0f + z - 2.0f * f);
  } else if (ACT == TANH) {
    const v16 t = 1.0f - 2.0f * reciprocal(vexp(2.0f * z) + 1.0f);
    *a = t;
    *d1 = 1.0f - t * t;
    *d2 = -2.0f * t * *d1;
  } else if (ACT == SIGMOID) {
    const v16 s = reciprocal(1.0f + vexp(-z));
    *a = s;
    *d1 = s * (1.0f - s);
    *d2 = *d1 * (1.0f - 2.0f * s);
  } else {  // RELU
    *a = z > 0.0f ? z : v16{};
    *d1 = z > 0.0f ? splat(1.0f) : v16{};
    *d2 = v16{};
  }
}

// Over the ROWS × nb vectors z of a layer: a <- f(z), d1 <- f'(z), d2 <- f''(z) (z may be a).
inline void activate2_rows(int act, const v16* z, int nb, v16* a, v16* d1, v16* d2) {
  for (int i = 0; i < ROWS * nb; ++i) {
    const v16 zz = z[i];
    switch (act) {
      case SILU: activate2<SILU>(zz, &a[i], &d1[i], &d2[i]); break;
      case TANH: activate2<TANH>(zz, &a[i], &d1[i], &d2[i]); break;
      case SIGMOID: activate2<SIGMOID>(zz, &a[i], &d1[i], &d2[i]); break;
      default: activate2<RELU>(zz, &a[i], &d1[i], &d2[i]);
    }
  }
}

// Over the ROWS × nb vectors z of a layer: z <- f'(z) · (top, or 1), and a <- f(z) unless a is null.
template <int ACT>
inline void activate_rows(v16* z, int nb, const v16* top, v16* a) {
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < nb; ++j) {
      const int i = r * nb + j;
      activate<ACT>(z[i], top ? top[j] : splat(1.0f), a ? &a[i] : nullptr, &z[i]);
    }
}

inline void activate_rows(int act, v16* z, int nb, const v16* top, v16* a) {
  switch (act) {
    case SILU: return activate_rows<SILU>(z, nb, top, a);
    case TANH: return activate_rows<TANH>(z, nb, top, a);
    case SIGMOID: return activate_rows<SIGMOID>(z, nb, top, a);
    default: return activate_rows<RELU>(z, nb, top, a);
  }
}

// C[r][jb] = (bias[jb] or 0) + Σ_k A[r][k] · B[k][jb] for the ROWS rows of a tile: A rows of lda floats,
// B k-major in blocks of 16 (nb blocks per k), C rows of nb blocks. RB rows × J blocks per pass: 16
// accumulators, so the FMA latency is hidden whatever the width.
template <int J>
inline void product_strip(const float* A, int lda, int K, const v16* B, int nb, int jb, const v16* bias, v16* C) {
  constexpr int RB = 16 / J;
  static_assert(ROWS % RB == 0, "a tile is whole passes");
  for (int r0 = 0; r0 < ROWS; r0 += RB) {
    v16 acc[RB][J];
    for (int r = 0; r < RB; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = bias ? bias[jb + j] : v16{};
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
// P rows of ldp floats (j < rows_out), Q and C rows of qb blocks.
inline void accumulate_outer(const float* P, int ldp, int rows_out, const v16* Q, int qb, v16* C) {
  int j0 = 0;
  for (; j0 + 4 <= rows_out; j0 += 4)
    for (int kb = 0; kb < qb; ++kb) {
      v16 acc[4] = {C[(j0 + 0) * qb + kb], C[(j0 + 1) * qb + kb], C[(j0 + 2) * qb + kb], C[(j0 + 3) * qb + kb]};
      for (int r = 0; r < ROWS; ++r) {
        const v16 q = Q[r * qb + kb];
        for (int j = 0; j < 4; ++j) acc[j] += P[r * ldp + j0 + j] * q;
      }
      for (int j = 0; j < 4; ++j) C[(j0 + j) * qb + kb] = acc[j];
    }
  for (; j0 < rows_out; ++j0)
    for (int kb = 0; kb < qb; ++kb) {
      v16 acc = C[j0 * qb + kb];
      for (int r = 0; r < ROWS; ++r) acc += P[r * ldp + j0] * Q[r * qb + kb];
      C[j0 * qb + kb] = acc;
    }
}

inline void product(const float* A, int lda, int K, const v16* B, int nb, const v16* bias, v16* C) {
  int jb = 0;
  for (; jb + 4 <= nb; jb += 4) product_strip<4>(A, lda, K, B, nb, jb, bias, C);
  for (; jb + 2 <= nb; jb += 2) product_strip<2>(A, lda, K, B, nb, jb, bias, C);
  for (; jb < nb; ++jb) product_strip<1>(A, lda, K, B, nb, jb, bias, C);
}

// The network, its weights packed once per launch: for layer l (in_l -> out_l), forward[l] is W_lᵀ (in_l rows
// of blocks(out_l) blocks), backward[l] is W_l (out_l rows of blocks(in_l) blocks), bias[l] blocks(out_l).
struct Network {
  int n_hidden = 0;
  float sign = 1.0f;
  std::vector<int> widths;        // in_0 = d, out_0, …, out_{n_hidden-1}
  std::vector<int> activations;   // one per hidden layer
  std::vector<std::vector<v16>> forward, backward, bias;
  std::vector<v16> top;           // sign · w_out: ∂E/∂(last hidden activation)
  std::vector<v16> input_columns; // for d <= SMALL_INPUT: column i of W_0 in blocks(out_0) blocks

  // weights[l]: (widths[l+1], widths[l]) row-major; weights[n_hidden]: (1, widths[n_hidden]); biases may be null.
  Network(int n_hidden_, const int64_t* widths_, const float* const* weights, const float* const* biases,
          const int* activations_, float sign)
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
  }
};

// One thread's buffers for a tile: the state, per hidden layer its activation and f'(z)·(upstream), two
// gradient buffers, all ROWS rows of blocks(width) vectors.
struct Workspace {
  std::vector<v16> x, grad, g0, g1;
  std::vector<std::vector<v16>> act, deriv;

  explicit Workspace(const Network& net) {
    int widest = 1;
    for (int w : net.widths) widest = w > widest ? w : widest;
    x.assign((size_t)ROWS * blocks(net.widths[0]), v16{});
    grad.assign(x.size(), v16{});
    g0.assign((size_t)ROWS * blocks(widest), v16{});
    g1.assign(g0.size(), v16{});
    for (int l = 0; l < net.n_hidden; ++l) {
      act.emplace_back((size_t)ROWS * blocks(net.widths[l + 1]), v16{});
      deriv.emplace_back((size_t)ROWS * blocks(net.widths[l + 1]), v16{});
    }
  }
};

// ∇E of the tile's ROWS chains in ws.x into ws.grad.
inline void gradient(const Network& net, Workspace& ws) {
  const int L = net.n_hidden;
  const float* h = (const float*)ws.x.data();
  int lda = 16 * blocks(net.widths[0]);
  for (int l = 0; l < L; ++l) {  // forward: z = h W_lᵀ + b_l; keep f(z) (not for the last layer) and f'(z)
    const int ob = blocks(net.widths[l + 1]);
    v16* z = ws.deriv[l].data();
    product(h, lda, net.widths[l], net.forward[l].data(), ob, net.bias[l].data(), z);
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
    product((const float*)e, 16 * ob, net.widths[l + 1], net.backward[l].data(), ib, nullptr, g);
    const v16* d = ws.deriv[l - 1].data();
    for (int i = 0; i < ROWS * ib; ++i) g[i] *= d[i];
    e = g;
  }
  const int w1 = net.widths[1], d = net.widths[0];
  if (d > SMALL_INPUT) {
    product((const float*)e, 16 * blocks(w1), w1, net.backward[0].data(), blocks(d), nullptr, ws.grad.data());
    return;
  }
  // few inputs: ∇E[r][i] = e_0[r] · W_0[:, i] as dot products (a 16-wide product would be mostly padding)
  const int kb = blocks(w1), db = blocks(d);
  float* grad = (float*)ws.grad.data();
  for (int r = 0; r < ROWS; ++r)
    for (int i = 0; i < d; ++i) {
      v16 acc = v16{};
      for (int k = 0; k < kb; ++k) acc += e[r * kb + k] * net.input_columns[i * kb + k];
      grad[r * 16 * db + i] = sum(acc);
    }
}

// ---- denoising score matching: L = (1/2n) Σ_r |a_r ∇E(x_r) − b_r|², and its gradient in the weights ----
//
// With c_r = a_r (a_r ∇E(x_r) − b_r) held fixed, ∂L/∂θ = (1/n) Σ_r ∂u_r/∂θ where u_r = ∇E(x_r) · c_r is the
// derivative of E along c_r: the tangent τ_l = W_l σ_{l−1} (σ_0 = c), σ_l = f'(z_l) τ_l, u = sign · w_out · σ_L,
// then reverse mode through the primal and the tangent: τ̄_l = σ̄_l f'(z_l), z̄_l = σ̄_l f''(z_l) τ_l + h̄_l f'(z_l),
// ∂W_l += τ̄_l σ_{l−1}ᵀ + z̄_l h_{l−1}ᵀ, ∂b_l += z̄_l, σ̄_{l−1} = W_lᵀ τ̄_l, h̄_{l−1} = W_lᵀ z̄_l.

// One thread's sums: ∂W_l as out_l rows of blocks(in_l), ∂b_l, ∂w_out; and the tile buffers.
struct ScoreWorkspace {
  std::vector<std::vector<v16>> dW, db, h, d1, d2, tau, sigma;  // h[0], sigma[0]: the inputs x and c
  std::vector<v16> dw_out, delta0, delta1, bar0, bar1, hbar0, hbar1;
  double loss = 0.0;

  explicit ScoreWorkspace(const Network& net) {
    const int L = net.n_hidden;
    int widest = 1;
    for (int w : net.widths) widest = w > widest ? w : widest;
    const size_t wide = (size_t)ROWS * blocks(widest);
    for (int l = 0; l <= L; ++l) {
      const size_t rows = (size_t)ROWS * blocks(net.widths[l]);
      h.emplace_back(rows, v16{});
      sigma.emplace_back(rows, v16{});
      d1.emplace_back(rows, v16{});
      d2.emplace_back(rows, v16{});
      tau.emplace_back(rows, v16{});
    }
    for (int l = 0; l < L; ++l) {
      dW.emplace_back((size_t)net.widths[l + 1] * blocks(net.widths[l]), v16{});
      db.emplace_back((size_t)blocks(net.widths[l + 1]), v16{});
    }
    dw_out.assign((size_t)blocks(net.widths[L]), v16{});
    for (auto* b : {&delta0, &delta1, &bar0, &bar1, &hbar0, &hbar1}) b->assign(wide, v16{});
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
    activate2_rows(net.activations[l], z, ob, z, ws.d1[l + 1].data(), ws.d2[l + 1].data());
  }
  // ∇E: δ_L = top · f'(z_L), δ_{l−1} = (δ_l W_l) f'(z_{l−1}), ∇E = δ_1 W_0
  {
    const int ob = blocks(net.widths[L]);
    v16* e = ws.delta0.data();
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) e[r * ob + j] = net.top[j] * ws.d1[L][r * ob + j];
    for (int l = L - 1; l >= 1; --l) {
      const int ib = blocks(net.widths[l]), lb = blocks(net.widths[l + 1]);
      v16* g = (e == ws.delta0.data()) ? ws.delta1.data() : ws.delta0.data();
      product((const float*)e, 16 * lb, net.widths[l + 1], net.backward[l].data(), ib, nullptr, g);
      for (int i = 0; i < ROWS * ib; ++i) g[i] *= ws.d1[l][i];
      e = g;
    }
    // c = a (a ∇E − b) into sigma[0]; the loss
    v16* c = ws.sigma[0].data();
    product((const float*)e, 16 * blocks(net.widths[1]), net.widths[1], net.backward[0].data(), db0, nullptr, c);
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
  const v16* sbar = nullptr;  // σ̄_l (nullptr: top, the same for every row)
  const v16* hbar = nullptr;  // h̄_l (nullptr: zero)
  for (int l = L; l >= 1; --l) {
    const int ob = blocks(net.widths[l]), ib = blocks(net.widths[l - 1]);
    v16* tbar = (sbar == ws.bar0.data()) ? ws.bar1.data() : ws.bar0.data();
    v16* zbar = (hbar == ws.hbar0.data()) ? ws.hbar1.data() : ws.hbar0.data();
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) {
        const int i = r * ob + j;
        const v16 sb = sbar ? sbar[i] : net.top[j];
        tbar[i] = sb * ws.d1[l][i];
        zbar[i] = sb * ws.d2[l][i] * ws.tau[l][i] + (hbar ? hbar[i] * ws.d1[l][i] : v16{});
      }
    accumulate_outer((const float*)tbar, 16 * ob, net.widths[l], ws.sigma[l - 1].data(), ib, ws.dW[l - 1].data());
    accumulate_outer((const float*)zbar, 16 * ob, net.widths[l], ws.h[l - 1].data(), ib, ws.dW[l - 1].data());
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) ws.db[l - 1][j] += zbar[r * ob + j];
    if (l >= 2) {
      v16* ns = (tbar == ws.bar0.data()) ? ws.bar1.data() : ws.bar0.data();
      v16* nh = (zbar == ws.hbar0.data()) ? ws.hbar1.data() : ws.hbar0.data();
      product((const float*)tbar, 16 * ob, net.widths[l], net.backward[l - 1].data(), ib, nullptr, ns);
      product((const float*)zbar, 16 * ob, net.widths[l], net.backward[l - 1].data(), ib, nullptr, nh);
      sbar = ns;
      hbar = nh;
    }
  }
}

}  // namespace ff
}  // namespace ebm
