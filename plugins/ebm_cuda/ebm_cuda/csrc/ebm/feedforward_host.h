// Host build only: Langevin chains of a feed-forward energy E(x) = sign · (Linear_L ∘ f ∘ … ∘ f ∘ Linear_1)(x),
// K steps per launch. A tile of 16 chains stays in the core's L1 cache for all K steps: the forward pass, the
// chain rule backwards and the move run on it with no trip to memory, the matrix products register-blocked
// (4 chains × 64 outputs per pass), the activations and their derivatives computed together (one exp each).
// float32 only. Widths are padded to multiples of 16 with zero weights, which changes no result.
#pragma once
#include <stdint.h>
#include <string.h>

#include <vector>

namespace ebm {
namespace ff {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

constexpr int ROWS = 16;  // chains per tile (the Philox tile of host.cpp)
enum Activation { SILU = 0, TANH = 1, SIGMOID = 2, RELU = 3 };
constexpr int N_ACTIVATIONS = 4;

inline int blocks(int width) { return (width + 15) / 16; }

inline v16 splat(float a) { return v16{} + a; }

// exp(x) for float32, ~2 ulp (Cody–Waite reduction, degree-6 polynomial); NaN stays NaN, clamped to finite
// results outside [-87.3, 88.7] (all that sigmoid, SiLU and tanh need).
inline v16 vexp(v16 x) {
  x = x < -87.3f ? splat(-87.3f) : x;
  x = x > 88.7f ? splat(88.7f) : x;
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

// f(z) into *a (when a is given) and f'(z) · g into *d: one exp per element.
inline void activate(int act, v16 z, v16 g, v16* a, v16* d) {
  switch (act) {
    case SILU: {
      const v16 s = 1.0f / (1.0f + vexp(-z));
      if (a) *a = z * s;
      *d = g * (s * (1.0f + z * (1.0f - s)));
      return;
    }
    case TANH: {
      const v16 t = 1.0f - 2.0f / (vexp(2.0f * z) + 1.0f);
      if (a) *a = t;
      *d = g * (1.0f - t * t);
      return;
    }
    case SIGMOID: {
      const v16 s = 1.0f / (1.0f + vexp(-z));
      if (a) *a = s;
      *d = g * (s * (1.0f - s));
      return;
    }
    default: {  // RELU
      if (a) *a = z > 0.0f ? z : v16{};
      *d = z > 0.0f ? g : v16{};
      return;
    }
  }
}

// C[r][jb] = (bias[jb] or 0) + Σ_k A[r][k] · B[k][jb] for the ROWS rows of a tile: A rows of lda floats,
// B k-major in blocks of 16 (nb blocks per k), C rows of nb blocks.
template <int J>
inline void product_strip(const float* A, int lda, int K, const v16* B, int nb, int jb, const v16* bias, v16* C) {
  for (int r0 = 0; r0 < ROWS; r0 += 4) {
    v16 acc[4][J];
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < J; ++j) acc[r][j] = bias ? bias[jb + j] : v16{};
    for (int k = 0; k < K; ++k) {
      v16 b[J];
      for (int j = 0; j < J; ++j) b[j] = B[k * nb + jb + j];
      for (int r = 0; r < 4; ++r) {
        const float a = A[(r0 + r) * lda + k];
        for (int j = 0; j < J; ++j) acc[r][j] += a * b[j];
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < J; ++j) C[(r0 + r) * nb + jb + j] = acc[r][j];
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
  std::vector<int> widths;        // in_0 = d, out_0, …, out_{n_hidden-1}
  std::vector<int> activations;   // one per hidden layer
  std::vector<std::vector<v16>> forward, backward, bias;
  std::vector<v16> top;           // sign · w_out: ∂E/∂(last hidden activation)

  // weights[l]: (widths[l+1], widths[l]) row-major; weights[n_hidden]: (1, widths[n_hidden]); biases may be null.
  Network(int n_hidden_, const int64_t* widths_, const float* const* weights, const float* const* biases,
          const int* activations_, float sign)
      : n_hidden(n_hidden_), widths(widths_, widths_ + n_hidden_ + 1), activations(activations_, activations_ + n_hidden_) {
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
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < ob; ++j) {
        const v16 zz = z[r * ob + j];
        activate(net.activations[l], zz, last ? net.top[j] : splat(1.0f), last ? nullptr : &a[r * ob + j], &z[r * ob + j]);
      }
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
  product((const float*)e, 16 * blocks(net.widths[1]), net.widths[1], net.backward[0].data(), blocks(net.widths[0]), nullptr,
          ws.grad.data());
}

}  // namespace ff
}  // namespace ebm
