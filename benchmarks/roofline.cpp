// The microkernels of benchmarks/roofline.py, compiled with the host build's flags (-O3 -march=native ...) and the
// host build's own header: this core's peak float32 FMA rate (independent chains of vfmadd231ps on zmm registers,
// enough of them to cover the FMA latency times its ports), the peak rate of AVX512-BF16's vdpbf16ps likewise, and
// the host chain's own pieces on one tile of 16 chains: the 64x64 layer's product, and the whole gradient of a
// 2-64-64-1 SiLU network (forward and backward). Each returns the thread's CPU seconds its loop took
// (CLOCK_THREAD_CPUTIME_ID: on a shared machine the time another process holds the core is not counted).
#include <stdint.h>
#include <time.h>

#include <vector>

#include "ebm/feedforward_host.h"

namespace {
double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

constexpr int CHAINS = 24;  // independent accumulators: > latency (4 cycles) x ports (2) for vfmadd, and for vdpbf16ps
}  // namespace

extern "C" {

int roofline_accumulators() { return CHAINS; }

// iters x CHAINS vfmadd231ps zmm: 32 FLOP each.
double roofline_fma(int64_t iters, float* sink) {
  __m512 acc[CHAINS];
  const __m512 m = _mm512_set1_ps(sink[0]), c = _mm512_set1_ps(sink[1]);
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_ps(sink[2] + (float)i);
  const double t0 = cpu_now();
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, c);
  }
  const double t = cpu_now() - t0;
  __m512 s = acc[0];
  for (int i = 1; i < CHAINS; ++i) s = _mm512_add_ps(s, acc[i]);
  sink[3] = _mm512_reduce_add_ps(s);
  return t;
}

// iters x CHAINS vdpbf16ps zmm: 64 FLOP each (32 products, 32 sums); -1 where the build has no AVX512-BF16.
double roofline_dpbf16(int64_t iters, float* sink) {
#if defined(__AVX512BF16__)
  __m512 acc[CHAINS];
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(sink[0]), _mm512_set1_ps(sink[1]));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(sink[1]), _mm512_set1_ps(sink[0]));
  for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_set1_ps(sink[2] + (float)i);
  const double t0 = cpu_now();
  for (int64_t k = 0; k < iters; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < CHAINS; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  const double t = cpu_now() - t0;
  __m512 s = acc[0];
  for (int i = 1; i < CHAINS; ++i) s = _mm512_add_ps(s, acc[i]);
  sink[3] = _mm512_reduce_add_ps(s);
  return t;
#else
  (void)iters;
  (void)sink;
  return -1.0;
#endif
}

// iters gradients (forward and backward) of one tile of 16 chains of the 2-64-64-1 SiLU network with the weights
// weights (w0: 64x2, w1: 64x64, w2: 1x64, then the biases 64, 64, 1), products `products` (ebm::ff::Products); with
// product_only, only the 64x64 layer's forward product instead. -1 where the build does not run those products.
double roofline_tile(int64_t iters, const float* weights, int products, int product_only, float* sink) {
  const int64_t widths[3] = {2, 64, 64};
  const int64_t acts[2] = {0, 0};
  const float* w[3] = {weights, weights + 128, weights + 128 + 4096};
  const float* b[3] = {weights + 128 + 4096 + 64, weights + 128 + 4096 + 128, weights + 128 + 4096 + 192};
  ebm::ff::Network net(2, widths, w, b, acts, 1.0f);
  if (!net.use_products(products)) return -1.0;
  ebm::ff::Workspace ws(net);
  float* x = (float*)ws.x.data();
  for (int r = 0; r < ebm::ff::ROWS; ++r)
    for (int j = 0; j < 2; ++j) x[r * 16 + j] = 0.1f * (float)(r - 8) + 0.3f * (float)j;
  for (int r = 0; r < ebm::ff::ROWS * 4; ++r) ws.act[0][r] = ebm::ff::splat(0.01f * (float)(r % 7));
  const double t0 = cpu_now();
  for (int64_t k = 0; k < iters; ++k) {
    if (product_only)
      ebm::ff::hidden_product(net, ws, (const float*)ws.act[0].data(), 64, 64, net.forward[1].data(), 4, net.bias[1].data(),
                              ws.deriv[1].data());
    else
      ebm::ff::gradient(net, ws);
    __asm__ volatile("" ::: "memory");
  }
  const double t = cpu_now() - t0;
  sink[3] = ((float*)ws.grad.data())[0] + ((float*)ws.deriv[1].data())[0];
  return t;
}
}
