// Host build only: ∇ₓE of a small convolutional energy E(x) = sign · (w · mean_p f(conv_L(… f(conv_1(x)) …)) + b)
// (3×3 convolutions, padding 1, stride s_l; ebm_losses.ConvEnergy), one image at a time, float32. Activations are
// channels-last (a position's channels padded to blocks of 16); a convolution is an im2col buffer times the packed
// weights with the register-blocked product() of feedforward_host.h, 16 positions per call, and its input gradient
// the output gradient times the transposed weights, scattered back (col2im).
#pragma once
#include <algorithm>
#include <vector>

#include "feedforward_host.h"

namespace ebm {
namespace conv {

using ff::blocks;
using ff::ROWS;
using ff::v16;

constexpr int K_PART = 64;

inline int rounded(int rows) { return (rows + ROWS - 1) / ROWS * ROWS; }

// Convolution l: c_in × h_in × w_in -> c_out × h_out × w_out; an input position is `pad` floats (the image's c_in, a
// hidden layer's channels in whole blocks of 16, copied and scattered a block at a time). forward: K = 9·pad rows
// ((ky·3 + kx)·pad + c; zero for padding channels) of blocks(c_out); backward: c_out rows of blocks(K); bias: blocks(c_out).
struct Layer {
  int c_in, c_out, h_in, w_in, h_out, w_out, stride, pad, K;
  ff::ActivationCode activation;
  std::vector<v16> forward, backward, bias;
  std::vector<int> source;  // [p·9 + tap]: the input position output position p reads at the tap, or −1 (padding)
  std::vector<int> reader;  // [q·9 + tap]: the output position reading input position q at the tap, or −1

  int positions() const { return h_out * w_out; }
};

struct Network {
  std::vector<Layer> layers;
  std::vector<v16> top;  // sign · w_head / positions of the last layer: ∂E/∂(its activation) at each position

  // channels: c_0 .. c_L; weights[l]: (c_{l+1}, c_l, 3, 3) for l < L, weights[L]: the head (1, c_L); biases[l]
  // (c_{l+1},) or null (the head's bias does not move ∇E).
  Network(int n_layers, const int64_t* channels, int height, int width, const int* strides, const float* const* weights,
          const float* const* biases, const int64_t* activations, float sign) {
    int h = height, w = width;
    for (int l = 0; l < n_layers; ++l) {
      Layer layer;
      layer.c_in = (int)channels[l];
      layer.c_out = (int)channels[l + 1];
      layer.h_in = h;
      layer.w_in = w;
      layer.stride = strides[l];
      layer.h_out = (h - 1) / layer.stride + 1;
      layer.w_out = (w - 1) / layer.stride + 1;
      layer.activation = ff::ActivationCode(activations[l]);
      layer.pad = l == 0 ? layer.c_in : 16 * blocks(layer.c_in);
      layer.K = 9 * layer.pad;
      const int ob = blocks(layer.c_out), kb = blocks(layer.K);
      layer.forward.assign((size_t)layer.K * ob, v16{});
      layer.backward.assign((size_t)layer.c_out * kb, v16{});
      layer.bias.assign((size_t)ob, v16{});
      float* fp = (float*)layer.forward.data();
      float* bp = (float*)layer.backward.data();
      for (int o = 0; o < layer.c_out; ++o)
        for (int c = 0; c < layer.c_in; ++c)
          for (int k = 0; k < 9; ++k) {
            const float v = weights[l][((size_t)o * layer.c_in + c) * 9 + k];
            const int row = k * layer.pad + c;
            fp[(size_t)row * ob * 16 + o] = v;
            bp[(size_t)o * kb * 16 + row] = v;
          }
      if (biases[l])
        for (int o = 0; o < layer.c_out; ++o) ((float*)layer.bias.data())[o] = biases[l][o];
      layer.source.assign((size_t)layer.positions() * 9, -1);
      layer.reader.assign((size_t)h * w * 9, -1);
      for (int oy = 0; oy < layer.h_out; ++oy)
        for (int ox = 0; ox < layer.w_out; ++ox)
          for (int k = 0; k < 9; ++k) {
            const int iy = oy * layer.stride - 1 + k / 3, ix = ox * layer.stride - 1 + k % 3;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            layer.source[(size_t)(oy * layer.w_out + ox) * 9 + k] = iy * w + ix;
            layer.reader[(size_t)(iy * w + ix) * 9 + k] = oy * layer.w_out + ox;
          }
      h = layer.h_out;
      w = layer.w_out;
      layers.push_back(std::move(layer));
    }
    const Layer& last = layers.back();
    top.assign((size_t)blocks(last.c_out), v16{});
    for (int c = 0; c < last.c_out; ++c) ((float*)top.data())[c] = sign * weights[n_layers][c] / (float)last.positions();
  }
};

// One thread's buffers: the image channels-last (image), per layer the im2col rows and f'(z) (deriv; f(z) in act),
// the output gradient times the transposed weights (gcols), the input gradient (gin), and ∇ₓE channels-last (grad).
struct Workspace {
  std::vector<float> image, grad;
  std::vector<std::vector<float>> cols;
  std::vector<std::vector<v16>> act, deriv, gin;
  std::vector<v16> gcols;

  explicit Workspace(const Network& net) {
    const Layer& first = net.layers[0];
    image.assign((size_t)first.h_in * first.w_in * first.c_in, 0.0f);
    grad.assign(image.size(), 0.0f);
    size_t widest = 0;
    for (size_t l = 0; l < net.layers.size(); ++l) {
      const Layer& L = net.layers[l];
      const size_t rows = (size_t)rounded(L.positions());
      cols.emplace_back(rows * L.K, 0.0f);  // rows past the positions stay zero
      act.emplace_back(rows * blocks(L.c_out), v16{});
      deriv.emplace_back(rows * blocks(L.c_out), v16{});
      gin.emplace_back(l == 0 ? 0 : (size_t)L.h_in * L.w_in * blocks(L.c_in), v16{});
      widest = std::max(widest, rows * blocks(L.K));
    }
    gcols.assign(widest, v16{});
  }
};

inline v16 load(const float* p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, v16 v) { memcpy(p, &v, sizeof v); }

// ∇ₓE of the image in ws.image ((h·w) positions × c channels) into ws.grad (same layout). The copies are loops of
// their own: as memcpy calls (GCC's loop distribution) a few floats each would cost more than the products.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) inline void gradient(const Network& net, Workspace& ws) {
  const int n_layers = (int)net.layers.size();
  const float* in = ws.image.data();
  for (int l = 0; l < n_layers; ++l) {  // forward: im2col, z = cols · W + b, act <- f(z), deriv <- f'(z) (· top at the last)
    const Layer& L = net.layers[l];
    const int ob = blocks(L.c_out), P = L.positions();
    float* cols = ws.cols[l].data();  // im2col: row p, columns tap·pad + c
    const int* source = L.source.data();
    if (l > 0)
      for (int i = 0; i < P * 9; ++i)
        for (int b = 0; b < L.pad / 16; ++b)
          store(cols + (size_t)i * L.pad + 16 * b, source[i] < 0 ? v16{} : load(in + (size_t)source[i] * L.pad + 16 * b));
    else if (L.pad == 1)
      for (int i = 0; i < P * 9; ++i) cols[i] = source[i] < 0 ? 0.0f : in[source[i]];
    else
      for (int i = 0; i < P * 9; ++i)
        for (int c = 0; c < L.pad; ++c) cols[(size_t)i * L.pad + c] = source[i] < 0 ? 0.0f : in[(size_t)source[i] * L.pad + c];
    const bool last = l == n_layers - 1;
    for (int r0 = 0; r0 < P; r0 += ROWS) {
      v16* z = ws.deriv[l].data() + (size_t)r0 * ob;
      for (int k0 = 0; k0 < L.K; k0 += K_PART)  // W's rows in parts of K_PART: 4 blocks of them fill a third of L1
        ff::product(cols + (size_t)r0 * L.K + k0, L.K, std::min(K_PART, L.K - k0), L.forward.data() + (size_t)k0 * ob, ob,
                    L.bias.data(), z, k0 > 0);
      ff::activate_rows(L.activation, z, ob, last ? net.top.data() : nullptr, last ? nullptr : ws.act[l].data() + (size_t)r0 * ob);
    }
    in = (const float*)ws.act[l].data();
  }
  // backward: gcols = δ_l · W_lᵀ, scattered into the input gradient; times f'(z_{l−1}) it is δ_{l−1}
  for (int l = n_layers - 1; l >= 0; --l) {
    const Layer& L = net.layers[l];
    const int ob = blocks(L.c_out), kb = blocks(L.K), P = L.positions();
    float* g = l == 0 ? ws.grad.data() : (float*)ws.gin[l].data();
    for (int r0 = 0; r0 < P; r0 += ROWS)
      ff::product((const float*)(ws.deriv[l].data() + (size_t)r0 * ob), 16 * ob, L.c_out, L.backward.data(), kb, nullptr,
                  ws.gcols.data() + (size_t)r0 * kb);
    const float* gc = (const float*)ws.gcols.data();
    if (l == 0) {  // the image's gradient gathered per input position (the few channels make a scatter slow)
      const int Q = L.h_in * L.w_in, row = 16 * kb;
      const int* reader = L.reader.data();
      for (int q = 0; q < Q; ++q)
        for (int c = 0; c < L.pad; ++c) {
          float acc = 0.0f;
          for (int k = 0; k < 9; ++k) {
            const int p = reader[q * 9 + k];
            acc += p < 0 ? 0.0f : gc[(size_t)p * row + k * L.pad + c];
          }
          g[(size_t)q * L.pad + c] = acc;
        }
      continue;
    }
    for (size_t i = 0; i < (size_t)L.h_in * L.w_in * L.pad; ++i) g[i] = 0.0f;
    const int* source = L.source.data();  // a hidden layer's: rows of K = 16·kb floats, scattered a block at a time
    for (int i = 0; i < P * 9; ++i)
      if (source[i] >= 0)
        for (int b = 0; b < L.pad / 16; ++b) {
          float* dst = g + (size_t)source[i] * L.pad + 16 * b;
          store(dst, load(dst) + load(gc + (size_t)i * L.pad + 16 * b));
        }
    v16* d = ws.deriv[l - 1].data();  // δ_{l−1} = (input gradient) ⊙ f'(z_{l−1}), over the previous layer's positions
    const v16* gv = ws.gin[l].data();
    for (size_t i = 0; i < (size_t)L.h_in * L.w_in * blocks(L.c_in); ++i) d[i] *= gv[i];
  }
}

}  // namespace conv
}  // namespace ebm
