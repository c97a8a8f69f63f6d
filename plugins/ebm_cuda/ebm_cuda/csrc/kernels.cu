// The CUDA build of the kernels: the per-element math and RNG of ebm/*.h, one thread per chain.
// Includes no torch headers (the CPU torch wheel lacks parts of the CUDA headers); loaded with
// ctypes by ebm_cuda/library.py and launched on the caller's stream. Every function returns 0,
// or 1 with a message in ebm_cuda_last_error(). Launches and dynamic shared memory go through EBM_LAUNCH and
// EBM_DYNAMIC_SHARED, which ebm/cuda_emulation.h defines for the host (-x c++ -DEBM_CUDA_EMULATION: the sanitizer checks).
#include <stdio.h>
#ifndef EBM_CUDA_EMULATION
#include <cuda_runtime.h>
#define EBM_LAUNCH(grid, block, shared, stream, ...) __VA_ARGS__<<<grid, block, shared, stream>>>
#define EBM_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#else
#include "ebm/cuda_emulation.h"
#endif

#include "ebm/chains.h"
#include "ebm/dispatch.h"

namespace {

thread_local char error_message[256] = "";

int fail(const char* message) {
  snprintf(error_message, sizeof(error_message), "%s", message);
  return 1;
}

int launched() {
  cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? 0 : fail(cudaGetErrorString(status));
}

#define EBM_LARGE_D(MAXD, ...) \
  return fail("the CUDA chain kernels keep a chain in registers and take d <= 64 elements per chain (the samplers then use their per-step loop)");
// float64 chains run on the torch backend: the CUDA kernels take float32, bfloat16 and float16.
#define EBM_CUDA_DTYPES(dtype, S, ...)                  \
  switch (dtype) {                                      \
    EBM_CASE_DTYPE(0, float, S, __VA_ARGS__)            \
    EBM_CASE_DTYPE(2, ebm::bf16, S, __VA_ARGS__)        \
    EBM_CASE_DTYPE(3, ebm::f16, S, __VA_ARGS__)         \
    default: return fail("unsupported dtype code (CUDA kernels take float32, bfloat16, float16)"); \
  }

constexpr int THREADS = 256;

int blocks_for(int64_t n, int threads) { return (int)((n + threads - 1) / threads); }

template <int KIND, typename S>
__global__ void energy_kernel(ebm::Params<float> p, const S* x, int64_t n, S* energy, S* grad) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const ebm::Energy<KIND, float, 0> E{p};
  const float e = E(x + i * p.d, 1, grad ? grad + i * p.d : (S*)nullptr, 1);
  if (energy) ebm::store<float>(energy + i, e);
}

// Shared memory: the energy's parameter tensors (v0, then v1, those whose pointers are set: the
// Gaussian's mean and precision, the harmonic center), then the block's chains, loaded and stored
// coalesced; each thread then holds its chain in registers. Each parameter tensor takes whole 16-byte
// groups, zero-padded: nvcc reads staged parameters as 16-byte vectors, up to the end of a group
// (ebm::param), and an unpadded tensor's last group reached into the first chain's tile row, which
// its thread writes (compute-sanitizer racecheck, the harmonic energy at d = 17 and 40).
constexpr int GROUP_FLOATS = 4;
__host__ __device__ int whole_groups(int floats) { return (floats + GROUP_FLOATS - 1) / GROUP_FLOATS * GROUP_FLOATS; }
__host__ __device__ int param_floats(const void* v0, const void* v1, int d) {
  return (v0 ? whole_groups(d) : 0) + (v1 ? whole_groups(d * d) : 0);
}

__device__ ebm::Params<float> stage_params(ebm::Params<float> p, float* shared) {
  const int d = p.d, n0 = p.v0 ? whole_groups(d) : 0;
  const int count = param_floats(p.v0, p.v1, d);
  for (int k = threadIdx.x; k < count; k += blockDim.x) {
    const int j = k < n0 ? k : k - n0, used = k < n0 ? d : d * d;
    shared[k] = j < used ? (k < n0 ? p.v0 : p.v1)[j] : 0.0f;
  }
  if (p.v0) p.v0 = shared;
  if (p.v1) p.v1 = shared + n0;
  return p;
}

// A thread's chain sits in the tile at row threadIdx.x with an odd row stride, so that the threads
// of a warp reading element j hit distinct shared-memory banks.
__host__ __device__ int tile_stride(int d) { return d | 1; }

// The block's chains x[base .. base + blockDim.x) into the tile, coalesced; returns the element count.
template <typename S>
__device__ int load_tile(float* tile, const S* x, int64_t base, int64_t n, int d) {
  const int count = (int)min((int64_t)blockDim.x, n - base) * d, stride = tile_stride(d);
  for (int k = threadIdx.x; k < count; k += blockDim.x) tile[(k / d) * stride + k % d] = ebm::load<float>(x + base * d + k);
  __syncthreads();
  return count;
}

// The tile back to x, coalesced, once every thread has written its chain.
template <typename S>
__device__ void store_tile(S* x, const float* tile, int64_t base, int count, int d) {
  const int stride = tile_stride(d);
  __syncthreads();
  for (int k = threadIdx.x; k < count; k += blockDim.x) ebm::store<float>(x + base * d + k, tile[(k / d) * stride + k % d]);
}

template <int KIND, typename S, int MAXD>
__global__ void langevin_chain_kernel(ebm::Params<float> p, const S* x, S* out, int64_t n, int64_t n_steps, float h, float s,
                                      const float* h_vec, const float* s_vec, uint64_t seed, uint64_t offset) {
  EBM_DYNAMIC_SHARED(float, shared);
  const int d = p.d;
  float* tile = shared + param_floats(p.v0, p.v1, d);
  const ebm::Energy<KIND, float, MAXD> E{stage_params(p, shared)};
  const int64_t base = (int64_t)blockIdx.x * blockDim.x, i = base + threadIdx.x;
  const int count = load_tile(tile, x, base, n, d);
  if (i < n) {
    constexpr int CAP = MAXD > 0 ? MAXD : EBM_MAX_D;
    float xr[CAP], gr[CAP];
    EBM_LOOP(j, MAXD, d) { xr[j] = tile[threadIdx.x * tile_stride(d) + j]; }
    ebm::langevin_chain(E, xr, gr, 1, n_steps, h_vec ? h_vec[i] : h, s_vec ? s_vec[i] : s, ebm::Stream(seed),
                        (uint32_t)i, offset);
    EBM_LOOP(j, MAXD, d) { tile[threadIdx.x * tile_stride(d) + j] = xr[j]; }
  }
  store_tile(out, tile, base, count, d);
}

template <int KIND, typename S, int MAXD>
__global__ void hmc_chain_kernel(ebm::Params<float> p, const S* x, S* out, int64_t n, int64_t n_steps, float h, const float* h_vec,
                                 int n_leapfrog, float beta, uint64_t seed, uint64_t offset, int32_t* accepted,
                                 int32_t* divergent) {
  EBM_DYNAMIC_SHARED(float, shared);
  const int d = p.d;
  float* tile = shared + param_floats(p.v0, p.v1, d);
  const ebm::Energy<KIND, float, MAXD> E{stage_params(p, shared)};
  const int64_t base = (int64_t)blockIdx.x * blockDim.x, i = base + threadIdx.x;
  const int count = load_tile(tile, x, base, n, d);
  if (i < n) {
    constexpr int CAP = MAXD > 0 ? MAXD : EBM_MAX_D;
    float xr[CAP], gr[CAP], xn[CAP], gn[CAP], pr[CAP];
    EBM_LOOP(j, MAXD, d) { xr[j] = tile[threadIdx.x * tile_stride(d) + j]; }
    ebm::hmc_chain(E, xr, gr, xn, gn, pr, 1, n_steps, h_vec ? h_vec[i] : h, n_leapfrog, beta, ebm::Stream(seed),
                   (uint32_t)i, offset, accepted + i, divergent + i);
    EBM_LOOP(j, MAXD, d) { tile[threadIdx.x * tile_stride(d) + j] = xr[j]; }
  }
  store_tile(out, tile, base, count, d);
}

// One thread per chain, which runs its own trajectories; the checkpoints of its trees in `workspace`
// (2 * nuts_checkpoints(max_depth) * d floats per chain), the rest of its scratch in local memory.
template <int KIND, typename S, int MAXD>
__global__ void nuts_chain_kernel(ebm::Params<float> p, const S* x, S* out, int64_t n, int64_t n_steps, float h, const float* h_vec,
                                  int max_depth, float beta, uint64_t seed, uint64_t offset, float* acceptance,
                                  int32_t* divergent, int64_t* n_leapfrog, int64_t* tree_depth, float* workspace) {
  EBM_DYNAMIC_SHARED(float, shared);
  const int d = p.d;
  float* tile = shared + param_floats(p.v0, p.v1, d);
  const ebm::Energy<KIND, float, MAXD> E{stage_params(p, shared)};
  const int64_t base = (int64_t)blockIdx.x * blockDim.x, i = base + threadIdx.x;
  const int count = load_tile(tile, x, base, n, d);
  if (i < n) {
    constexpr int CAP = MAXD > 0 ? MAXD : EBM_MAX_D;
    float xr[CAP], gr[CAP], w[10][CAP];
    const int slots = ebm::nuts_checkpoints(max_depth);
    float* ck = workspace + i * 2 * slots * d;
    const ebm::NutsScratch<float> s{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9], ck, ck + slots * d};
    EBM_LOOP(j, MAXD, d) { xr[j] = tile[threadIdx.x * tile_stride(d) + j]; }
    ebm::nuts_chain(E, xr, gr, s, n_steps, h_vec ? h_vec[i] : h, max_depth, beta, ebm::Stream(seed), (uint32_t)i, offset,
                    acceptance + i, divergent + i, n_leapfrog + i, tree_depth + i);
    EBM_LOOP(j, MAXD, d) { tile[threadIdx.x * tile_stride(d) + j] = xr[j]; }
  }
  store_tile(out, tile, base, count, d);
}

// One thread per block of four elements of one chain.
template <typename S>
__global__ void langevin_update_kernel(const S* x, const S* grad, S* out, int64_t n, int d, float h, float s, const float* h_vec,
                                       const float* s_vec, uint64_t seed, uint64_t offset) {
  const int nb = (d + 3) / 4;
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = k / nb;
  if (i >= n) return;
  ebm::langevin_block<float>(x + i * d, grad + i * d, out + i * d, 1, d, (int)(k % nb), h_vec ? h_vec[i] : h,
                             s_vec ? s_vec[i] : s, ebm::Stream(seed), (uint32_t)i, offset);
}

template <typename S>
__global__ void langevin_step_kernel(S* out, const S* x, const S* grad, const S* noise, int64_t n, int d, float h,
                                     float s, const float* h_vec, const float* s_vec) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = k / d;
  if (i >= n) return;
  const float hi = h_vec ? h_vec[i] : h, si = s_vec ? s_vec[i] : s;
  ebm::store<float>(out + k, ebm::langevin_move<float>(ebm::load<float>(x + k), ebm::load<float>(grad + k), hi, si,
                                                       ebm::load<float>(noise + k)));
}

__global__ void philox_kernel(const uint32_t* counters, const uint32_t* keys, uint32_t* out, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t* c = counters + 4 * i;
  ebm::Philox4 w = ebm::philox4x32_10(c[0], c[1], c[2], c[3], keys[2 * i], keys[2 * i + 1]);
  for (int k = 0; k < 4; ++k) out[4 * i + k] = w.v[k];
}

__global__ void normal_kernel(float* out, int64_t n, int d, uint64_t seed, uint64_t step) {
  const int nb = (d + 3) / 4;
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = k / nb;
  if (i >= n) return;
  const int b = (int)(k % nb);
  float z[4];
  ebm::Stream(seed).normal4((uint32_t)b, (uint32_t)i, step, z);
  for (int l = 0; l < 4 && 4 * b + l < d; ++l) out[i * d + 4 * b + l] = z[l];
}

// Threads per block and shared memory of the chain kernels: the parameters, then the block's chains.
void chain_launch_shape(const ebm_energy* spec, int* threads, size_t* shared_bytes) {
  const int d = spec->d;
  *threads = d > 32 ? 64 : 128;
  *shared_bytes = (size_t)(param_floats(spec->v0, spec->v1, d) + *threads * tile_stride(d)) * sizeof(float);
}
// The largest case (both v0 and v1, as the Gaussian's, at d = EBM_MAX_D, 64 threads) fits the 48 KB
// of shared memory a launch gets without opting in.
static_assert((EBM_MAX_D + EBM_MAX_D * EBM_MAX_D + 64 * (EBM_MAX_D | 1)) * sizeof(float) <= 48 * 1024,
              "EBM_MAX_D too large for the chain kernels' shared memory");

}  // namespace

extern "C" {

const char* ebm_cuda_last_error(void) { return error_message; }

int ebm_cuda_energy(const ebm_energy* spec, int dtype, const void* x, int64_t n, void* energy, void* grad,
                    void* stream) {
  if (n == 0) return 0;
  EBM_CUDA_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND,
      EBM_LAUNCH(blocks_for(n, THREADS), THREADS, 0, (cudaStream_t)stream, energy_kernel<KIND, S>)(
          params_of<float>(spec), (const S*)x, n, (S*)energy, (S*)grad)))
  return launched();
}

int ebm_cuda_langevin_chain(const ebm_energy* spec, int dtype, const void* x, void* out, int64_t n, int64_t n_steps, double h,
                            double s, const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset,
                            void* stream) {
  if (n == 0 || n_steps == 0) return 0;
  int threads; size_t shared;
  EBM_CUDA_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND, EBM_DISPATCH_MAXD(spec->d, MAXD,
      chain_launch_shape(spec, &threads, &shared);
      EBM_LAUNCH(blocks_for(n, threads), threads, shared, (cudaStream_t)stream, langevin_chain_kernel<KIND, S, MAXD>)(
          params_of<float>(spec), (const S*)x, (S*)out, n, n_steps, (float)h, (float)s, (const float*)h_vec, (const float*)s_vec,
          seed, offset))))
  return launched();
}

int ebm_cuda_hmc_chain(const ebm_energy* spec, int dtype, const void* x, void* out, int64_t n, int64_t n_steps, double h,
                       const void* h_vec, int n_leapfrog, double beta, uint64_t seed, uint64_t offset,
                       int32_t* accepted, int32_t* divergent, void* stream) {
  if (n == 0 || n_steps == 0) return 0;
  int threads; size_t shared;
  EBM_CUDA_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND, EBM_DISPATCH_MAXD(spec->d, MAXD,
      chain_launch_shape(spec, &threads, &shared);
      EBM_LAUNCH(blocks_for(n, threads), threads, shared, (cudaStream_t)stream, hmc_chain_kernel<KIND, S, MAXD>)(
          params_of<float>(spec), (const S*)x, (S*)out, n, n_steps, (float)h, (const float*)h_vec, n_leapfrog, (float)beta, seed,
          offset, accepted, divergent))))
  return launched();
}

int ebm_cuda_nuts_chain(const ebm_energy* spec, int dtype, const void* x, void* out, int64_t n, int64_t n_steps, double h,
                        const void* h_vec, int max_tree_depth, double beta, uint64_t seed, uint64_t offset, void* acceptance,
                        int32_t* divergent, int64_t* n_leapfrog, int64_t* tree_depth, void* workspace, void* stream) {
  if (max_tree_depth < 1 || max_tree_depth > ebm::NUTS_MAX_DEPTH) return fail("max_tree_depth must be in [1, 20]");
  if (n == 0 || n_steps == 0) return 0;
  int threads; size_t shared;
  EBM_CUDA_DTYPES(dtype, S, EBM_DISPATCH_KIND(spec->kind, KIND, EBM_DISPATCH_MAXD(spec->d, MAXD,
      chain_launch_shape(spec, &threads, &shared);
      EBM_LAUNCH(blocks_for(n, threads), threads, shared, (cudaStream_t)stream, nuts_chain_kernel<KIND, S, MAXD>)(
          params_of<float>(spec), (const S*)x, (S*)out, n, n_steps, (float)h, (const float*)h_vec, max_tree_depth, (float)beta, seed,
          offset, (float*)acceptance, divergent, n_leapfrog, tree_depth, (float*)workspace))))
  return launched();
}

int ebm_cuda_langevin_update(int dtype, const void* x, const void* grad, void* out, int64_t n, int d, double h, double s,
                             const void* h_vec, const void* s_vec, uint64_t seed, uint64_t offset, void* stream) {
  if (n == 0) return 0;
  const int64_t work = n * ((d + 3) / 4);
  EBM_CUDA_DTYPES(dtype, S, EBM_LAUNCH(blocks_for(work, THREADS), THREADS, 0, (cudaStream_t)stream, langevin_update_kernel<S>)(
      (const S*)x, (const S*)grad, (S*)out, n, d, (float)h, (float)s, (const float*)h_vec, (const float*)s_vec, seed, offset))
  return launched();
}

int ebm_cuda_langevin_step(int dtype, void* out, const void* x, const void* grad, const void* noise, int64_t n,
                           int d, double h, double s, const void* h_vec, const void* s_vec, void* stream) {
  if (n == 0) return 0;
  EBM_CUDA_DTYPES(dtype, S, EBM_LAUNCH(blocks_for(n * d, THREADS), THREADS, 0, (cudaStream_t)stream, langevin_step_kernel<S>)(
      (S*)out, (const S*)x, (const S*)grad, (const S*)noise, n, d, (float)h, (float)s, (const float*)h_vec,
      (const float*)s_vec))
  return launched();
}

int ebm_cuda_philox(const uint32_t* counters, const uint32_t* keys, uint32_t* out, int64_t n, void* stream) {
  if (n == 0) return 0;
  EBM_LAUNCH(blocks_for(n, THREADS), THREADS, 0, (cudaStream_t)stream, philox_kernel)(counters, keys, out, n);
  return launched();
}

int ebm_cuda_normal(float* out, int64_t n, int d, uint64_t seed, uint64_t step, void* stream) {
  if (n == 0) return 0;
  EBM_LAUNCH(blocks_for(n * ((d + 3) / 4), THREADS), THREADS, 0, (cudaStream_t)stream, normal_kernel)(out, n, d, seed, step);
  return launched();
}

}  // extern "C"
