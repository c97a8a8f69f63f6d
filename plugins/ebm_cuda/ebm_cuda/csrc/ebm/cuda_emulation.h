// What kernels.cu takes from CUDA, for the host: with -x c++ -DEBM_CUDA_EMULATION, g++ compiles kernels.cu as C++
// (ebm_cuda/build.py: build_cuda_emulated), so that its own indexing, shared-memory tiles and launch shapes run under
// AddressSanitizer, UBSan or ThreadSanitizer on a machine without a GPU (tests/test_cuda_emulation.py).
//
// A launch runs its blocks one after another, each on OS threads (std::thread, one per thread of the block, kept for
// later launches), which meet at __syncthreads(), a real barrier that a thread leaves when it returns (it no longer
// holds the others up). Each block's dynamic shared memory is a fresh heap buffer of exactly the launch's bytes,
// shared by its threads and freed when the block is done: an access past it is a heap-buffer-overflow for ASan, and
// two threads touching one element without a barrier between them a data race for TSan.
// Loads of staged parameters read whole 16-byte groups, as the GPU's vector loads do (read_shared_group).
// Not emulated: warps (no warp-level operation, no lock-step execution), the GPU's memory model and caches, timing;
// blocks running at once (they run one after another, so a race between blocks goes unseen); barriers reached at
// different places by the threads of a block (they all count toward one); the device-only branches of ebm/*.h
// (__CUDA_ARCH__ is not defined here) and nvcc's contraction of multiply-adds.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

// Each emulated thread's own coordinates, set before it enters the kernel.
inline thread_local dim3 threadIdx{0, 0, 0};
inline thread_local dim3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

typedef struct CUstream_st* cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };

// CUDA's integer min and max (device functions for every integer type); std::min would need equal reference types.
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }

namespace ebm_emulation {

// A defect planted at run time, which only tests/test_cuda_emulation.py asks for (the same library, run with
// EBM_CUDA_EMULATION_PLANT set), to show that the sanitizers report it: "short-shared", each block's shared memory 4
// bytes short of the launch's; "no-barrier", a __syncthreads() that waits for no one.
inline bool planted(const char* defect) {
  static const char* const plant = getenv("EBM_CUDA_EMULATION_PLANT");
  return plant != nullptr && strcmp(plant, defect) == 0;
}

// The limits a launch is checked against, as on every GPU since compute capability 2.0.
constexpr unsigned int MAX_THREADS_PER_BLOCK = 1024;
constexpr size_t MAX_DYNAMIC_SHARED = 48 * 1024;  // what a launch gets without cudaFuncSetAttribute

inline thread_local cudaError_t last_error = cudaSuccess;

// __syncthreads() of one block: every thread still in the kernel waits until all of them have arrived.
class Barrier {
 public:
  explicit Barrier(unsigned int threads) : expected_(threads) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long generation = generation_;
    if (++arrived_ == expected_) {
      release();
      return;
    }
    released_.wait(lock, [&] { return generation_ != generation; });
  }
  // A thread that returned from the kernel: the others no longer wait for it.
  void drop() {
    std::lock_guard<std::mutex> lock(mutex_);
    --expected_;
    if (expected_ > 0 && arrived_ == expected_) release();
  }

 private:
  void release() {  // with mutex_ held
    arrived_ = 0;
    ++generation_;
    released_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable released_;
  unsigned int expected_, arrived_ = 0;
  unsigned long generation_ = 0;
};

// The block the calling thread belongs to: its barrier and its dynamic shared memory.
inline thread_local Barrier* block_barrier = nullptr;
inline thread_local unsigned char* block_shared = nullptr;
inline thread_local size_t block_shared_bytes = 0;

// The GPU's widest shared-memory load (LDS.128): 16 bytes from a 16-byte boundary. nvcc vectorises loops over
// staged parameters into such loads, which read a group's every element, past the last one the loop uses
// (compute-sanitizer racecheck saw the harmonic centre's last group reach into the first chain's tile row). ebm::param
// reads through here: for an element in the block's shared memory, the whole group it lies in, so that a group
// reaching memory other threads write is a data race for ThreadSanitizer (and, past the buffer, an overflow for ASan).
constexpr size_t WIDEST_SHARED_LOAD = 16;
inline thread_local volatile unsigned char shared_group_sink;
inline void read_shared_group(const void* element) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(element), begin = reinterpret_cast<uintptr_t>(block_shared);
  if (block_shared == nullptr || at < begin || at >= begin + block_shared_bytes) return;  // not shared memory
  const unsigned char* group = reinterpret_cast<const unsigned char*>(at & ~(uintptr_t)(WIDEST_SHARED_LOAD - 1));
  unsigned char folded = 0;
  for (size_t k = 0; k < WIDEST_SHARED_LOAD; ++k) folded ^= group[k];
  shared_group_sink = folded;
}

// The OS threads that run the blocks, created as launches first need them and kept for later launches (never
// destroyed: at exit they still wait for work). run() runs one block: a fresh barrier and a fresh buffer of exactly
// `shared` bytes (freed when the block is done); it returns when each of the block's threads has returned.
class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool;
    return *pool;
  }
  void run(dim3 grid, dim3 block, dim3 b, size_t shared, const std::function<void()>& body) {
    std::unique_lock<std::mutex> lock(mutex_);
    threads_ = block.x * block.y * block.z;
    while (started_threads_ < threads_) {
      const unsigned int t = started_threads_++;
      std::thread([this, t] { work(t); }).detach();
    }
    Barrier barrier(threads_);
    const size_t bytes = planted("short-shared") && shared > 4 ? shared - 4 : shared > 0 ? shared : 1;  // 0: a heap block still
    std::unique_ptr<unsigned char[]> memory(new unsigned char[bytes]);
    memset(memory.get(), 0xFF, bytes);  // as a GPU leaves it: not zeros; a read of an unwritten float is a NaN
    grid_ = grid, block_ = block, block_index_ = b;
    barrier_ = &barrier, memory_ = memory.get(), bytes_ = bytes, body_ = &body;
    finished_ = 0;
    ++generation_;
    started_.notify_all();
    finished_cv_.wait(lock, [&] { return finished_ == threads_; });
  }

 private:
  void work(unsigned int t) {
    unsigned long seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      started_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (t >= threads_) continue;  // not a thread of this block
      const dim3 block = block_;
      threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
      blockIdx = block_index_, blockDim = block, gridDim = grid_;
      block_barrier = barrier_, block_shared = memory_, block_shared_bytes = bytes_;
      const std::function<void()>& body = *body_;
      lock.unlock();
      body();
      block_barrier->drop();
      lock.lock();
      if (++finished_ == threads_) finished_cv_.notify_one();
    }
  }
  std::mutex mutex_;
  std::condition_variable started_, finished_cv_;
  unsigned int started_threads_ = 0, threads_ = 0, finished_ = 0;
  unsigned long generation_ = 0;
  dim3 grid_, block_, block_index_;
  Barrier* barrier_ = nullptr;
  unsigned char* memory_ = nullptr;
  size_t bytes_ = 0;
  const std::function<void()>* body_ = nullptr;
};

inline std::mutex launching;  // one launch at a time (from any host thread), as on one stream

template <typename... P>
struct Launch {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared;

  void operator()(P... args) const {
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > MAX_THREADS_PER_BLOCK || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535) {
      last_error = cudaErrorInvalidConfiguration;
      return;
    }
    if (shared > MAX_DYNAMIC_SHARED) {
      last_error = cudaErrorInvalidValue;
      return;
    }
    void (*const k)(P...) = kernel;
    const std::function<void()> body = [&] { k(args...); };
    std::lock_guard<std::mutex> lock(launching);
    for (unsigned int bz = 0; bz < grid.z; ++bz)
      for (unsigned int by = 0; by < grid.y; ++by)
        for (unsigned int bx = 0; bx < grid.x; ++bx) Pool::get().run(grid, block, dim3(bx, by, bz), shared, body);
  }
};

template <typename... P>
Launch<P...> launch(dim3 grid, dim3 block, size_t shared, cudaStream_t, void (*kernel)(P...)) {
  return Launch<P...>{kernel, grid, block, shared};
}

}  // namespace ebm_emulation

inline void __syncthreads() {
  if (!ebm_emulation::planted("no-barrier")) ebm_emulation::block_barrier->arrive_and_wait();
}

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = ebm_emulation::last_error;
  ebm_emulation::last_error = cudaSuccess;
  return e;
}

inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  }
  return "unrecognized error code";
}

// kernels.cu's EBM_LAUNCH and EBM_DYNAMIC_SHARED, emulated: the launch runs its blocks before it returns (streams are
// ignored: every launch is synchronous), and the block's shared memory is the calling thread's block's buffer.
#define EBM_LAUNCH(grid, block, shared, stream, ...) ebm_emulation::launch((grid), (block), (shared), (stream), __VA_ARGS__)
#define EBM_DYNAMIC_SHARED(T, name) T* const name = reinterpret_cast<T*>(ebm_emulation::block_shared)
