// The host (CPU) build of the kernels: the same per-element math and RNG as kernels.cu
// (ebm/*.h), run over tiles of TILE chains in structure-of-arrays layout so the compiler
// vectorises across chains, and over threads with OpenMP. Loaded with ctypes by
// ebm_cuda/library.py; every function returns 0, or 1 with a message in ebm_host_last_error().
#include <stdio.h>
#include <algorithm>
#include <memory>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#else
static int omp_get_thread_num() { return 0; }
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "ebm/chains.h"
#include "ebm/conv_host.h"
#include "ebm/dispatch.h"
#include "ebm/feedforward_host.h"

namespace {

thread_local char error_message[256] = "";

int fail(const char* message) {
  snprintf(error_message, sizeof(error_message), "%s", message);
  return 1;
}

#define EBM_HOST_DTYPES(dtype, S, ...)                  \
  switch (dtype) {                                      \
    EBM_CASE_DTYPE(0, float, S, __VA_ARGS__)            \
    EBM_CASE_DTYPE(1, double, S, __VA_ARGS__)           \
    EBM_CASE_DTYPE(2, ebm::bf16, S, __VA_ARGS__)        \
    EBM_CASE_DTYPE(3, ebm::f16, S, __VA_ARGS__)         \
    default: return fail("unsupported dtype code");     \
  }

constexpr int TILE = 16;
template <typename A> using Tile = ebm::Lanes<A, TILE>;  // one element of TILE chains

// x: (n, d) in storage type S; buf[j] holds element j of chains i0 .. i0 + TILE - 1 (zero past n).
template <typename A, typename S>
void load_tile(Tile<A>* buf, const S* x, int64_t i0, int m, int d) {
  for (int j = 0; j < d; ++j)
    for (int lane = 0; lane < TILE; ++lane) buf[j].v[lane] = lane < m ? ebm::load<A>(x + (i0 + lane) * d + j) : (A)0;
}

template <typename A, typename S>
void store_tile(S* x, const Tile<A>* buf, int64_t i0, int m, int d) {
  for (int lane = 0; lane < m; ++lane)
    for (int j = 0; j < d; ++j) ebm::store<A>(x + (i0 + lane) * d + j, buf[j].v[lane]);
}

template <typename A>
Tile<A> load_lanes(const void* values, A value, int64_t i0, int m) {
  Tile<A> out(value);
  if (values != nullptr)
    for (int lane = 0; lane < TILE; ++lane) out.v[lane] = lane < m ? ((const A*)values)[i0 + lane] : (A)0;
  return out;
}

// Philox4x32-10 (ebm/philox.h) of block b of chains i0 .. i0 + TILE - 1 at step t: w[word][lane].
#if defined(__AVX512F__)
// With AVX-512: the 32-bit words in 64-bit lanes, so each multiply is one vpmuludq (the compiler's
// own vectorisation of the scalar code uses the slower 64-bit vpmullq), two vectors interleaved.
static_assert(TILE == 16, "tile_philox handles 16 chains as two vectors of 8");
void tile_philox(const ebm::Stream& rng, uint32_t b, int64_t i0, uint64_t t, uint32_t w[4][TILE]) {
  const __m512i mask = _mm512_set1_epi64(0xFFFFFFFFll), m0 = _mm512_set1_epi64(0xD2511F53ll),
                m1 = _mm512_set1_epi64(0xCD9E8D57ll), lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  __m512i c0[2], c1[2], c2[2], c3[2];
  for (int h = 0; h < 2; ++h) {
    c0[h] = _mm512_set1_epi64(b);
    c1[h] = _mm512_and_si512(_mm512_add_epi64(_mm512_set1_epi64((uint32_t)i0 + 8ll * h), lanes), mask);
    c2[h] = _mm512_set1_epi64((uint32_t)t);
    c3[h] = _mm512_set1_epi64((uint32_t)(t >> 32));
  }
  uint32_t k0 = rng.k0, k1 = rng.k1;
  for (int round = 0; round < 10; ++round) {
    const __m512i key0 = _mm512_set1_epi64(k0), key1 = _mm512_set1_epi64(k1);
    for (int h = 0; h < 2; ++h) {
      const __m512i p0 = _mm512_mul_epu32(c0[h], m0), p1 = _mm512_mul_epu32(c2[h], m1);
      const __m512i n0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1[h], key0, 0x96);  // a ^ b ^ c
      const __m512i n2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3[h], key1, 0x96);
      c1[h] = _mm512_and_si512(p1, mask);
      c3[h] = _mm512_and_si512(p0, mask);
      c0[h] = n0;
      c2[h] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int h = 0; h < 2; ++h) {
    _mm256_storeu_si256((__m256i*)(w[0] + 8 * h), _mm512_cvtepi64_epi32(c0[h]));
    _mm256_storeu_si256((__m256i*)(w[1] + 8 * h), _mm512_cvtepi64_epi32(c1[h]));
    _mm256_storeu_si256((__m256i*)(w[2] + 8 * h), _mm512_cvtepi64_epi32(c2[h]));
    _mm256_storeu_si256((__m256i*)(w[3] + 8 * h), _mm512_cvtepi64_epi32(c3[h]));
  }
}
#else
void tile_philox(const ebm::Stream& rng, uint32_t b, int64_t i0, uint64_t t, uint32_t w[4][TILE]) {
#pragma omp simd
  for (int lane = 0; lane < TILE; ++lane) {
    ebm::Philox4 r = ebm::philox4x32_10(b, (uint32_t)(i0 + lane), (uint32_t)t, (uint32_t)(t >> 32), rng.k0, rng.k1);
    w[0][lane] = r.v[0]; w[1][lane] = r.v[1]; w[2][lane] = r.v[2]; w[3][lane] = r.v[3];
  }
}
#endif

// The stream's normals 4b .. 4b+3 of chains i0 .. i0 + TILE - 1 at step t: z[l][lane].
// Only the first pair when the chain has no element 4b + 2.
void tile_normals(const ebm::Stream& rng, uint32_t b, int64_t i0, uint64_t t, float z[4][TILE], bool both) {
  alignas(64) uint32_t w[4][TILE];
  tile_philox(rng, b, i0, t, w);
#pragma omp simd
  for (int lane = 0; lane < TILE; ++lane) ebm::box_muller(w[0][lane], w[1][lane], &z[0][lane], &z[1][lane]);
  if (both) {
#pragma omp simd
    for (int lane = 0; lane < TILE; ++lane) ebm::box_muller(w[2][lane], w[3][lane], &z[2][lane], &z[3][lane]);
  }
}

template <int KIND, typename S>
void energy_host(const ebm_energy* spec, const S* x, int64_t n, S* energy, S* grad, int threads) {
  using A = typename ebm::Acc<S>::type;
  const ebm::Energy<KIND, A, 0> E{params_of<A>(spec)};
  const int d = spec->d;
#pragma omp parallel num_threads(threads)
  {
    std::vector<Tile<A>> xb(d), gb(d);
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
      const int m = (int)std::min<int64_t>(TILE, n - i0);
      load_tile(xb.data(), x, i0, m, d);
      const Tile<A> e = E(xb.data(), 1, grad ? gb.data() : (Tile<A>*)nullptr, 1);
      if (energy)
        for (int lane = 0; lane < m; ++lane) ebm::store<A>(energy + i0 + lane, e.v[lane]);
      if (grad) store_tile(grad, gb.data(), i0, m, d);
    }
  }
}

template <int KIND, typename S>
void langevin_chain_host(const ebm_energy* spec, const S* x, S* out, int64_t n, int64_t n_steps, double h, double s,
                         const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset, int threads) {
  using A = typename ebm::Acc<S>::type;
  const ebm::Energy<KIND, A, 0> E{params_of<A>(spec)};
  const ebm::Stream rng(seed);
  const int d = spec->d;
#pragma omp parallel num_threads(threads)
  {
    std::vector<Tile<A>> xb(d), gb(d);
    alignas(64) float z[4][TILE];
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
      const int m = (int)std::min<int64_t>(TILE, n - i0);
      load_tile(xb.data(), x, i0, m, d);
      const Tile<A> hl = load_lanes<A>(h_vec, (A)h, i0, m), sl = load_lanes<A>(s_vec, (A)s, i0, m);
      for (int64_t t = 0; t < n_steps; ++t) {
        E(xb.data(), 1, gb.data(), 1);
        for (int b = 0; b < (d + 3) / 4; ++b) {
          tile_normals(rng, (uint32_t)b, i0, offset + (uint64_t)t, z, 4 * b + 2 < d);
          for (int l = 0; l < 4 && 4 * b + l < d; ++l) {
            Tile<A> zl;
            for (int lane = 0; lane < TILE; ++lane) zl.v[lane] = (A)z[l][lane];
            xb[4 * b + l] = ebm::langevin_move(xb[4 * b + l], gb[4 * b + l], hl, sl, zl);
          }
        }
      }
      store_tile(out, xb.data(), i0, m, d);
    }
  }
}

// HMC over tiles: the trajectories vectorised across the tile's chains, the Metropolis test per chain.
template <int KIND, typename S>
void hmc_chain_host(const ebm_energy* spec, const S* x, S* out, int64_t n, int64_t n_steps, double h, const void* h_vec,
                    int n_leapfrog, double beta, uint64_t seed, uint64_t offset, int32_t* accepted,
                    int32_t* divergent, int threads) {
  using A = typename ebm::Acc<S>::type;
  const ebm::Energy<KIND, A, 0> E{params_of<A>(spec)};
  const ebm::Stream rng(seed);
  const int d = spec->d;
#pragma omp parallel num_threads(threads)
  {
    std::vector<Tile<A>> buf(5 * d);
    alignas(64) float z[4][TILE];
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
      const int m = (int)std::min<int64_t>(TILE, n - i0);
      Tile<A> *xb = buf.data(), *gb = xb + d, *xn = gb + d, *gn = xn + d, *p = gn + d;
      load_tile(xb, x, i0, m, d);
      const Tile<A> hl = load_lanes<A>(h_vec, (A)h, i0, m);
      Tile<A> e = E(xb, 1, gb, 1);
      for (int64_t t = 0; t < n_steps; ++t) {
        for (int b = 0; b < (d + 3) / 4; ++b) {
          tile_normals(rng, (uint32_t)b, i0, offset + (uint64_t)t, z, 4 * b + 2 < d);
          for (int l = 0; l < 4 && 4 * b + l < d; ++l)
            for (int lane = 0; lane < TILE; ++lane) p[4 * b + l].v[lane] = (A)z[l][lane];
        }
        const Tile<A> k0 = ebm::kinetic<A, 0>(p, 1, d);
        for (int j = 0; j < d; ++j) xn[j] = xb[j];
        const Tile<A> en = ebm::leapfrog(E, xn, gn, p, gb, 1, n_leapfrog, hl, (A)beta);
        const Tile<A> delta = ((A)beta * en + ebm::kinetic<A, 0>(p, 1, d)) - ((A)beta * e + k0);
        for (int lane = 0; lane < m; ++lane) {
          bool diverged;
          if (ebm::metropolis<A>(delta.v[lane], rng.uniform((uint32_t)(i0 + lane), offset + (uint64_t)t), &diverged)) {
            for (int j = 0; j < d; ++j) { xb[j].v[lane] = xn[j].v[lane]; gb[j].v[lane] = gn[j].v[lane]; }
            e.v[lane] = en.v[lane];
            accepted[i0 + lane] += 1;
          }
          divergent[i0 + lane] += diverged ? 1 : 0;
        }
      }
      store_tile(out, xb, i0, m, d);
    }
  }
}

// NUTS one chain at a time (trajectories differ in length: no lockstep across chains), chains spread
// over the threads dynamically; each thread's scratch in one buffer.
template <int KIND, typename S>
void nuts_chain_host(const ebm_energy* spec, const S* x, S* out, int64_t n, int64_t n_steps, double h, const void* h_vec,
                     int max_depth, double beta, uint64_t seed, uint64_t offset, void* acceptance, int32_t* divergent,
                     int64_t* n_leapfrog, int64_t* tree_depth, int threads) {
  using A = typename ebm::Acc<S>::type;
  const ebm::Energy<KIND, A, 0> E{params_of<A>(spec)};
  const ebm::Stream rng(seed);
  const int d = spec->d, slots = ebm::nuts_checkpoints(max_depth);
#pragma omp parallel num_threads(threads)
  {
    std::vector<A> buf((size_t)(12 + 2 * slots) * d);
    A* b = buf.data();
    const ebm::NutsScratch<A> s{b + 2 * d, b + 3 * d, b + 4 * d, b + 5 * d, b + 6 * d, b + 7 * d, b + 8 * d,
                                b + 9 * d, b + 10 * d, b + 11 * d, b + 12 * d, b + (12 + slots) * d};
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      for (int j = 0; j < d; ++j) b[j] = ebm::load<A>(x + i * d + j);
      ebm::nuts_chain(E, b, b + d, s, n_steps, h_vec ? ((const A*)h_vec)[i] : (A)h, max_depth, (A)beta, rng, (uint32_t)i,
                      offset, (A*)acceptance + i, divergent + i, n_leapfrog + i, tree_depth + i);
      for (int j = 0; j < d; ++j) ebm::store<A>(out + i * d + j, b[j]);
    }
  }
}

// Rows i0 .. i0 + m − 1 of x: (n, d) into a tile of rows of `stride` floats, zero elsewhere.
void load_rows(float* tile, int stride, const float* x, int64_t i0, int m, int d) {
  std::fill(tile, tile + TILE * stride, 0.0f);
  for (int lane = 0; lane < m; ++lane)
    for (int j = 0; j < d; ++j) tile[lane * stride + j] = x[(i0 + lane) * d + j];
}

// Checks shared by the feed-forward entry points; "" when the network is well formed.
const char* network_problem(int n_hidden, const int64_t* widths, const int64_t* activations) {
  if (n_hidden < 1) return "a feed-forward network needs at least one hidden layer";
  for (int l = 0; l <= n_hidden; ++l)
    if (widths[l] < 1 || widths[l] > (1 << 16)) return "layer widths must be in [1, 65536]";
  for (int l = 0; l < n_hidden; ++l)
    if (!ebm::ff::ActivationCode(activations[l]).known()) return "unknown activation code";
  return "";
}

// Why the feed-forward chain does not take the products `kind` (ebm::ff::Products).
const char* products_problem(int kind) {
  if (kind == ebm::ff::PRODUCTS_BF16_DOT)
    return "bfloat16 dot products (vdpbf16ps) need a build for a CPU with avx512_bf16 (this one was compiled without "
           "__AVX512BF16__)";
  return "unknown products code (0: IEEE float32, 1: bfloat16 operands by float32 FMAs, 2: by vdpbf16ps)";
}

// One Langevin move of the tile of chains i0 .. i0 + TILE − 1 in ws.x, by the gradient in ws.grad, with the stream's
// noise for `step`.
void feedforward_tile_move(const ebm::Stream& rng, ebm::ff::Workspace& ws, int d, int64_t i0, uint64_t step,
                           const Tile<float>& hl, const Tile<float>& sl) {
  const int stride = 16 * ebm::ff::blocks(d);
  float* xs = (float*)ws.x.data();
  const float* g = (const float*)ws.grad.data();
  alignas(64) float z[4][TILE];
  for (int b = 0; b < (d + 3) / 4; ++b) {
    tile_normals(rng, (uint32_t)b, i0, step, z, 4 * b + 2 < d);
    for (int l = 0; l < 4 && 4 * b + l < d; ++l)
      for (int lane = 0; lane < TILE; ++lane) {
        const int k = lane * stride + 4 * b + l;
        xs[k] = ebm::langevin_move<float>(xs[k], g[k], hl.v[lane], sl.v[lane], z[l][lane]);
      }
  }
}

// The first m rows of a tile of rows of `stride` floats into rows i0 .. i0 + m − 1 of out: (n, d).
void store_rows(float* out, const float* tile, int stride, int64_t i0, int m, int d) {
  for (int lane = 0; lane < m; ++lane)
    for (int j = 0; j < d; ++j) out[(i0 + lane) * d + j] = tile[lane * stride + j];
}

// Langevin chains of a feed-forward energy (ebm/feedforward_host.h): each tile of TILE chains runs all
// n_steps with its state, activations and gradient in cache; the noise is the stream's, as in
// langevin_chain_host, so a chain here and there differ only by rounding in the gradient.
void feedforward_langevin_host(const ebm::ff::Network& net, const float* x, float* out, int64_t n, int64_t n_steps, double h,
                               double s, const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset, int threads) {
  static_assert(ebm::ff::ROWS == TILE, "a feed-forward tile is a Philox tile");
  const ebm::Stream rng(seed);
  const int d = net.widths[0], stride = 16 * ebm::ff::blocks(d);
#pragma omp parallel num_threads(threads)
  {
    ebm::ff::Workspace ws(net);
    float* xs = (float*)ws.x.data();
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
      const int m = (int)std::min<int64_t>(TILE, n - i0);
      load_rows(xs, stride, x, i0, m, d);
      const Tile<float> hl = load_lanes<float>(h_vec, (float)h, i0, m), sl = load_lanes<float>(s_vec, (float)s, i0, m);
      for (int64_t t = 0; t < n_steps; ++t) {
        ebm::ff::gradient(net, ws);
        feedforward_tile_move(rng, ws, d, i0, offset + (uint64_t)t, hl, sl);
      }
      store_rows(out, xs, stride, i0, m, d);
    }
  }
}

// Langevin chains of a convolutional energy (ebm/conv_host.h): each thread takes tiles of TILE images, and at every
// step the gradient of each image, then the move of the tile with the stream's normals for element
// j = c·H·W + y·W + x (the (C, H, W) order of the state), as in feedforward_langevin_host.
void conv_langevin_host(const ebm::conv::Network& net, const float* x, float* out, int64_t n, int64_t n_steps, double h, double s,
                        const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset, int threads) {
  const ebm::Stream rng(seed);
  const ebm::conv::Layer& first = net.layers[0];
  const int C = first.c_in, HW = first.h_in * first.w_in, d = C * HW;
#pragma omp parallel num_threads(threads)
  {
    ebm::conv::Workspace ws(net);
    std::vector<float> xs((size_t)TILE * d), gs((size_t)TILE * d);
    alignas(64) float z[4][TILE];
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
      const int m = (int)std::min<int64_t>(TILE, n - i0);
      std::copy(x + i0 * d, x + (i0 + m) * d, xs.data());
      const Tile<float> hl = load_lanes<float>(h_vec, (float)h, i0, m), sl = load_lanes<float>(s_vec, (float)s, i0, m);
      for (int64_t t = 0; t < n_steps; ++t) {
        for (int r = 0; r < m; ++r) {
          const float* xr = xs.data() + (size_t)r * d;
          for (int c = 0; c < C; ++c)
            for (int p = 0; p < HW; ++p) ws.image[(size_t)p * C + c] = xr[c * HW + p];
          ebm::conv::gradient(net, ws);
          float* gr = gs.data() + (size_t)r * d;
          for (int c = 0; c < C; ++c)
            for (int p = 0; p < HW; ++p) gr[c * HW + p] = ws.grad[(size_t)p * C + c];
        }
        for (int b = 0; b < (d + 3) / 4; ++b) {
          tile_normals(rng, (uint32_t)b, i0, offset + (uint64_t)t, z, 4 * b + 2 < d);
          for (int l = 0; l < 4 && 4 * b + l < d; ++l)
            for (int lane = 0; lane < m; ++lane) {
              const size_t k = (size_t)lane * d + 4 * b + l;
              xs[k] = ebm::langevin_move<float>(xs[k], gs[k], hl.v[lane], sl.v[lane], z[l][lane]);
            }
        }
      }
      std::copy(xs.data(), xs.data() + (size_t)m * d, out + i0 * d);
    }
  }
}

// A loss of a feed-forward energy and its gradient in the weights (ebm/feedforward_host.h), summed over tiles of
// TILE rows: run_tile(ws, i0, m) loads a tile into the thread's workspace and adds its loss and gradients there;
// the threads' sums are then added, and multiplied by scale (the output weights' also by the energy's sign); loss may be
// null (a pass that computes no loss of its own).
template <typename Workspace, typename RunTile>
void network_loss_host(const ebm::ff::Network& net, int64_t n, double scale, RunTile run_tile, double* loss,
                       float* const* grad_weights, float* const* grad_biases, int threads) {
  const int L = net.n_hidden;
  for (int l = 0; l <= L; ++l) {
    std::fill(grad_weights[l], grad_weights[l] + (size_t)(l < L ? net.widths[l + 1] : 1) * net.widths[l], 0.0f);
    if (l < L && grad_biases[l]) std::fill(grad_biases[l], grad_biases[l] + net.widths[l + 1], 0.0f);
  }
  // each thread's sums kept apart, then added in thread order: the same bits for the same thread count
  std::vector<std::unique_ptr<Workspace>> parts((size_t)std::max(threads, 1));
#pragma omp parallel num_threads(threads)
  {
    auto ws = std::make_unique<Workspace>(net);
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += TILE) run_tile(*ws, i0, (int)std::min<int64_t>(TILE, n - i0));
    parts[(size_t)omp_get_thread_num()] = std::move(ws);
  }
  double total = 0.0;
  for (const auto& ws : parts) {
    if (!ws) continue;  // OpenMP gave fewer threads than asked
    total += ws->loss;
    for (int l = 0; l < L; ++l) {
      const int in = net.widths[l], out = net.widths[l + 1], ib = ebm::ff::blocks(in);
      const float* dw = (const float*)ws->dW[l].data();
      for (int j = 0; j < out; ++j)
        for (int k = 0; k < in; ++k) grad_weights[l][(size_t)j * in + k] += dw[(size_t)j * ib * 16 + k];
      if (grad_biases[l])
        for (int j = 0; j < out; ++j) grad_biases[l][j] += ((const float*)ws->db[l].data())[j];
    }
    for (int j = 0; j < net.widths[L]; ++j) grad_weights[L][j] += ((const float*)ws->dw_out.data())[j];
  }
  const float inv = (float)scale;
  for (int l = 0; l < L; ++l) {
    for (int64_t i = 0; i < (int64_t)net.widths[l + 1] * net.widths[l]; ++i) grad_weights[l][i] *= inv;
    if (grad_biases[l])
      for (int j = 0; j < net.widths[l + 1]; ++j) grad_biases[l][j] *= inv;
  }
  for (int j = 0; j < net.widths[L]; ++j) grad_weights[L][j] *= inv * net.sign;
  if (loss) *loss = total * scale;
}

// L = Σ_r a_r e_r + ½ b_r e_r² (the loss whose gradient in the energies is c = a + b e) and Σ_r c_r (its output
// bias's gradient, over the sign), added to loss (when not null) and c_sum in double, in row order; b may be null (zero).
void energy_loss_sums(const float* a, const float* b, const float* e, int64_t n, double* loss, double* c_sum) {
  for (int64_t r = 0; r < n; ++r) {
    const double ar = a[r], br = b ? b[r] : 0.0, er = e[r];
    if (loss) *loss += er * (ar + 0.5 * br * er);
    *c_sum += ar + br * er;
  }
}

// The energy-gradient pass's buffers and a chain's, for feedforward_contrastive_host.
struct ContrastiveWorkspace : ebm::ff::ScoreWorkspace {
  ebm::ff::Workspace chain;
  explicit ContrastiveWorkspace(const ebm::ff::Network& net) : ebm::ff::ScoreWorkspace(net), chain(net) {}
};

// Contrastive divergence's chains and gradient in one pass per tile: E and Σ c ∂E/∂θ at the starts x (the pass's
// ∇E is the chain's first gradient, to the bit), n_steps >= 1 Langevin moves as feedforward_langevin_host makes
// them, then E and Σ c ∂E/∂θ at the ends; c = a + bE with (a0, b0) at the starts and (a1, b1) at the ends; the loss
// Σ aE + ½bE² over both ends into loss, and the output bias's gradient sign·Σ c into bias_grad (when not null).
void feedforward_contrastive_host(const ebm::ff::Network& net, const float* x, float* out, int64_t n, int64_t n_steps, double h,
                                  double s, const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset,
                                  const float* a0, const float* b0, const float* a1, const float* b1, float* e0, float* e1,
                                  float* loss, float* bias_grad, float* const* grad_weights, float* const* grad_biases,
                                  int threads) {
  const ebm::Stream rng(seed);
  const int d = net.widths[0], stride = 16 * ebm::ff::blocks(d);
  network_loss_host<ContrastiveWorkspace>(net, n, 1.0, [&](ContrastiveWorkspace& ws, int64_t i0, int m) {
    float *rows = (float*)ws.h[0].data(), *xs = (float*)ws.chain.x.data();
    load_rows(rows, stride, x, i0, m, d);
    ebm::ff::energy_gradient_tile(net, ws, a0, b0, e0, m, i0, ws.chain.grad.data());
    std::copy(rows, rows + TILE * stride, xs);
    const Tile<float> hl = load_lanes<float>(h_vec, (float)h, i0, m), sl = load_lanes<float>(s_vec, (float)s, i0, m);
    for (int64_t t = 0; t < n_steps; ++t) {
      if (t > 0) ebm::ff::gradient(net, ws.chain);
      feedforward_tile_move(rng, ws.chain, d, i0, offset + (uint64_t)t, hl, sl);
    }
    store_rows(out, xs, stride, i0, m, d);
    load_rows(rows, stride, out, i0, m, d);  // the ends, padding rows zero (the chain moved them too)
    ebm::ff::energy_gradient_tile(net, ws, a1, b1, e1, m, i0);
  }, nullptr, grad_weights, grad_biases, threads);
  double total = 0.0, c_sum = 0.0;
  energy_loss_sums(a0, b0, e0, n, &total, &c_sum);
  energy_loss_sums(a1, b1, e1, n, &total, &c_sum);
  *loss = (float)total;
  if (bias_grad) *bias_grad = (float)(net.sign * c_sum);
}

template <typename S>
void langevin_update_host(const S* x, const S* grad, S* out, int64_t n, int d, double h, double s, const void* h_vec,
                          const void* s_vec, uint64_t seed, uint64_t offset, int threads) {
  using A = typename ebm::Acc<S>::type;
  const ebm::Stream rng(seed);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const A hi = h_vec ? ((const A*)h_vec)[i] : (A)h, si = s_vec ? ((const A*)s_vec)[i] : (A)s;
    for (int b = 0; b < (d + 3) / 4; ++b)
      ebm::langevin_block<A>(x + i * d, grad + i * d, out + i * d, 1, d, b, hi, si, rng, (uint32_t)i, offset);
  }
}

template <typename S>
void langevin_step_host(S* out, const S* x, const S* grad, const S* noise, int64_t n, int d, double h, double s,
                        const void* h_vec, const void* s_vec, int threads) {
  using A = typename ebm::Acc<S>::type;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const A hi = h_vec ? ((const A*)h_vec)[i] : (A)h, si = s_vec ? ((const A*)s_vec)[i] : (A)s;
    for (int j = 0; j < d; ++j) {
      const int64_t k = i * d + j;
      ebm::store<A>(out + k, (ebm::load<A>(x + k) - hi * ebm::load<A>(grad + k)) + si * ebm::load<A>(noise + k));
    }
  }
}

}  // namespace

extern "C" {

const char* ebm_host_last_error(void) { return error_message; }

int ebm_host_energy(const ebm_energy* spec, int dtype, const void* x, int64_t n, void* energy, void* grad,
                    int threads) {
  EBM_HOST_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND,
      energy_host<KIND, S>(spec, (const S*)x, n, (S*)energy, (S*)grad, threads)))
  return 0;
}

int ebm_host_langevin_chain(const ebm_energy* spec, int dtype, const void* x, void* out, int64_t n, int64_t n_steps, double h,
                            double s, const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset,
                            int threads) {
  EBM_HOST_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND,
      langevin_chain_host<KIND, S>(spec, (const S*)x, (S*)out, n, n_steps, h, s, h_vec, s_vec, seed, offset, threads)))
  return 0;
}

int ebm_host_hmc_chain(const ebm_energy* spec, int dtype, const void* x, void* out, int64_t n, int64_t n_steps, double h,
                       const void* h_vec, int n_leapfrog, double beta, uint64_t seed, uint64_t offset,
                       int32_t* accepted, int32_t* divergent, int threads) {
  EBM_HOST_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND,
      hmc_chain_host<KIND, S>(spec, (const S*)x, (S*)out, n, n_steps, h, h_vec, n_leapfrog, beta, seed, offset, accepted,
                                    divergent, threads)))
  return 0;
}

int ebm_host_nuts_chain(const ebm_energy* spec, int dtype, const void* x, void* out, int64_t n, int64_t n_steps, double h,
                        const void* h_vec, int max_tree_depth, double beta, uint64_t seed, uint64_t offset, void* acceptance,
                        int32_t* divergent, int64_t* n_leapfrog, int64_t* tree_depth, void* workspace, int threads) {
  (void)workspace;  // the CUDA build's checkpoints; here each thread has its own scratch
  if (max_tree_depth < 1 || max_tree_depth > ebm::NUTS_MAX_DEPTH) return fail("max_tree_depth must be in [1, 20]");
  EBM_HOST_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND,
      nuts_chain_host<KIND, S>(spec, (const S*)x, (S*)out, n, n_steps, h, h_vec, max_tree_depth, beta, seed, offset, acceptance,
                               divergent, n_leapfrog, tree_depth, threads)))
  return 0;
}

int ebm_host_langevin_update(int dtype, const void* x, const void* grad, void* out, int64_t n, int d, double h, double s,
                             const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset, int threads) {
  EBM_HOST_DTYPES(dtype, S, langevin_update_host<S>((const S*)x, (const S*)grad, (S*)out, n, d, h, s, h_vec, s_vec, seed, offset,
                                                    threads))
  return 0;
}

int ebm_host_langevin_step(int dtype, void* out, const void* x, const void* grad, const void* noise, int64_t n,
                           int d, double h, double s, const void* h_vec, const void* s_vec, int threads) {
  EBM_HOST_DTYPES(dtype, S, langevin_step_host<S>((S*)out, (const S*)x, (const S*)grad, (const S*)noise, n, d, h, s,
                                                  h_vec, s_vec, threads))
  return 0;
}

int ebm_host_feedforward_langevin_chain(int n_hidden, const int64_t* widths, const float* const* weights,
                                        const float* const* biases, const int64_t* activations, double sign, const float* x,
                                        float* out, int64_t n, int64_t n_steps, double h, double s, const void* h_vec,
                                        const void* s_vec, uint64_t seed, uint64_t offset, int products, int threads) {
  if (*network_problem(n_hidden, widths, activations)) return fail(network_problem(n_hidden, widths, activations));
  if (n_steps < 0) return fail("n_steps must be >= 0");
  ebm::ff::Network net(n_hidden, widths, weights, biases, activations, (float)sign);
  if (!net.use_products(products)) return fail(products_problem(products));
  feedforward_langevin_host(net, x, out, n, n_steps, h, s, h_vec, s_vec, seed, offset, threads);
  return 0;
}

// 0 when feedforward_langevin_chain runs the products `kind` (ebm::ff::Products) in this build, else why not.
int ebm_host_feedforward_products(int kind) {
  ebm::ff::Network probe;
  return probe.use_products(kind) ? 0 : fail(products_problem(kind));
}

int ebm_host_conv_langevin_chain(int n_layers, const int64_t* channels, int height, int width, const int* strides,
                                 const float* const* weights, const float* const* biases, const int64_t* activations, double sign,
                                 const float* x, float* out, int64_t n, int64_t n_steps, double h, double s, const void* h_vec,
                                 const void* s_vec, uint64_t seed, uint64_t offset, int threads) {
  if (n_layers < 1) return fail("a convolutional energy needs at least one convolution");
  if (height < 1 || width < 1 || height > (1 << 12) || width > (1 << 12)) return fail("image height and width must be in [1, 4096]");
  for (int l = 0; l <= n_layers; ++l)
    if (channels[l] < 1 || channels[l] > (1 << 12)) return fail("channel counts must be in [1, 4096]");
  for (int l = 0; l < n_layers; ++l) {
    if (strides[l] < 1) return fail("strides must be >= 1");
    if (!ebm::ff::ActivationCode(activations[l]).known()) return fail("unknown activation code");
  }
  if (n_steps < 0) return fail("n_steps must be >= 0");
  const ebm::conv::Network net(n_layers, channels, height, width, strides, weights, biases, activations, (float)sign);
  conv_langevin_host(net, x, out, n, n_steps, h, s, h_vec, s_vec, seed, offset, threads);
  return 0;
}

int ebm_host_feedforward_dsm(int n_hidden, const int64_t* widths, const float* const* weights, const float* const* biases,
                             const int64_t* activations, double sign, const float* x, const float* target, const float* scale,
                             int64_t n, double* loss, float* const* grad_weights, float* const* grad_biases, int threads) {
  if (*network_problem(n_hidden, widths, activations)) return fail(network_problem(n_hidden, widths, activations));
  const ebm::ff::Network net(n_hidden, widths, weights, biases, activations, (float)sign);
  const int d = net.widths[0], stride = 16 * ebm::ff::blocks(d);
  network_loss_host<ebm::ff::ScoreWorkspace>(net, n, n > 0 ? 1.0 / (double)n : 0.0, [&](ebm::ff::ScoreWorkspace& ws, int64_t i0, int m) {
    load_rows((float*)ws.h[0].data(), stride, x, i0, m, d);
    ebm::ff::denoising_tile(net, ws, target, scale, m, i0);
  }, loss, grad_weights, grad_biases, threads);
  return 0;
}

int ebm_host_feedforward_ssm(int n_hidden, const int64_t* widths, const float* const* weights, const float* const* biases,
                             const int64_t* activations, double sign, const float* x, const float* v, int64_t n, double* loss,
                             float* const* grad_weights, float* const* grad_biases, int threads) {
  if (*network_problem(n_hidden, widths, activations)) return fail(network_problem(n_hidden, widths, activations));
  const ebm::ff::Network net(n_hidden, widths, weights, biases, activations, (float)sign);
  const int d = net.widths[0], stride = 16 * ebm::ff::blocks(d);
  network_loss_host<ebm::ff::SlicedWorkspace>(net, n, n > 0 ? 1.0 / (double)n : 0.0, [&](ebm::ff::SlicedWorkspace& ws, int64_t i0, int m) {
    load_rows((float*)ws.h[0].data(), stride, x, i0, m, d);
    load_rows((float*)ws.hd[0].data(), stride, v, i0, m, d);
    ebm::ff::sliced_tile(net, ws, m);
  }, loss, grad_weights, grad_biases, threads);
  return 0;
}

int ebm_host_feedforward_energy_gradient(int n_hidden, const int64_t* widths, const float* const* weights,
                                         const float* const* biases, const int64_t* activations, double sign, const float* x,
                                         const float* a, const float* b, int64_t n, float* energies, float* bias_grad,
                                         float* const* grad_weights, float* const* grad_biases, int threads) {
  if (*network_problem(n_hidden, widths, activations)) return fail(network_problem(n_hidden, widths, activations));
  const ebm::ff::Network net(n_hidden, widths, weights, biases, activations, (float)sign);
  const int d = net.widths[0], stride = 16 * ebm::ff::blocks(d);
  network_loss_host<ebm::ff::ScoreWorkspace>(net, n, 1.0, [&](ebm::ff::ScoreWorkspace& ws, int64_t i0, int m) {
    load_rows((float*)ws.h[0].data(), stride, x, i0, m, d);
    ebm::ff::energy_gradient_tile(net, ws, a, b, energies, m, i0);
  }, nullptr, grad_weights, grad_biases, threads);
  double c_sum = 0.0;
  energy_loss_sums(a, b, energies, n, nullptr, &c_sum);
  if (bias_grad) *bias_grad = (float)(net.sign * c_sum);
  return 0;
}

int ebm_host_feedforward_contrastive_chain(int n_hidden, const int64_t* widths, const float* const* weights,
                                           const float* const* biases, const int64_t* activations, double sign, const float* x,
                                           float* out, int64_t n, int64_t n_steps, double h, double s, const void* h_vec,
                                           const void* s_vec, uint64_t seed, uint64_t offset, const float* a0, const float* b0,
                                           const float* a1, const float* b1, float* e0, float* e1, float* loss,
                                           float* bias_grad, float* const* grad_weights, float* const* grad_biases, int threads) {
  if (*network_problem(n_hidden, widths, activations)) return fail(network_problem(n_hidden, widths, activations));
  if (n_steps < 1) return fail("n_steps must be >= 1");
  const ebm::ff::Network net(n_hidden, widths, weights, biases, activations, (float)sign);
  feedforward_contrastive_host(net, x, out, n, n_steps, h, s, h_vec, s_vec, seed, offset, a0, b0, a1, b1, e0, e1, loss,
                               bias_grad, grad_weights, grad_biases, threads);
  return 0;
}

int ebm_host_philox(const uint32_t* counters, const uint32_t* keys, uint32_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t* c = counters + 4 * i;
    ebm::Philox4 w = ebm::philox4x32_10(c[0], c[1], c[2], c[3], keys[2 * i], keys[2 * i + 1]);
    for (int k = 0; k < 4; ++k) out[4 * i + k] = w.v[k];
  }
  return 0;
}

int ebm_host_normal(float* out, int64_t n, int d, uint64_t seed, uint64_t step, int threads) {
  const ebm::Stream rng(seed);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int b = 0; b < (d + 3) / 4; ++b) {
      float z[4];
      rng.normal4((uint32_t)b, (uint32_t)i, step, z);
      for (int l = 0; l < 4 && 4 * b + l < d; ++l) out[i * d + 4 * b + l] = z[l];
    }
  return 0;
}

int ebm_host_uniform(float* out, int64_t n, uint64_t seed, uint64_t step) {
  const ebm::Stream rng(seed);
  for (int64_t i = 0; i < n; ++i) out[i] = rng.uniform((uint32_t)i, step);
  return 0;
}

}  // extern "C"
