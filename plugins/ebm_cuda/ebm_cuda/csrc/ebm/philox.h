// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// noise stream of the fused kernels, defined once for host and device.
//
// The stream: for chain i, step t (the kernel's offset plus the step within the launch) and
// element j, the 128-bit counter is (j / 4, i, low 32 bits of t, high 32 bits of t) under the key
// (low, high 32 bits of the seed). The four outputs give four normals by Box-Muller on the pairs
// (w0, w1) and (w2, w3): element j takes normal j % 4 of block j / 4. The Metropolis uniform of
// chain i at step t uses block 0xFFFFFFFF, word w0. ebm_cuda.reference reproduces it in PyTorch.
#pragma once
#include "common.h"

namespace ebm {

struct Philox4 { uint32_t v[4]; };

EBM_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  Philox4 out = {{c0, c1, c2, c3}};
  return out;
}

// Two standard normals from two words: u1 in (0, 1], u2 in [0, 1) on a 2^-24 grid.
EBM_HD void box_muller_unit(float u1, float u2, float* z0, float* z1) {
  float r = sqrt_f(-2.0f * log_unit(u1));
  float s, c;
  sincos_turns(u2, &s, &c);
  *z0 = r * c; *z1 = r * s;
}

// The uniforms Box-Muller takes from two words.
EBM_HD float box_muller_u1(uint32_t a) { return (float)((a >> 8) + 1u) * 5.9604644775390625e-08f; }
EBM_HD float box_muller_u2(uint32_t b) { return (float)(b >> 8) * 5.9604644775390625e-08f; }

EBM_HD void box_muller(uint32_t a, uint32_t b, float* z0, float* z1) {
  box_muller_unit(box_muller_u1(a), box_muller_u2(b), z0, z1);
}

struct Stream {
  uint32_t k0, k1;
  EBM_HD explicit Stream(uint64_t seed) : k0((uint32_t)seed), k1((uint32_t)(seed >> 32)) {}

  // Normals 4b .. 4b+3 of chain i at step t.
  EBM_HD void normal4(uint32_t b, uint32_t i, uint64_t t, float z[4]) const {
    Philox4 w = philox4x32_10(b, i, (uint32_t)t, (uint32_t)(t >> 32), k0, k1);
    box_muller(w.v[0], w.v[1], &z[0], &z[1]);
    box_muller(w.v[2], w.v[3], &z[2], &z[3]);
  }

  // The four words of block b of chain i at step t.
  EBM_HD Philox4 block(uint32_t b, uint32_t i, uint64_t t) const {
    return philox4x32_10(b, i, (uint32_t)t, (uint32_t)(t >> 32), k0, k1);
  }

  // The Metropolis uniform in [0, 1) of chain i at step t.
  EBM_HD float uniform(uint32_t i, uint64_t t) const { return unit(block(0xFFFFFFFFu, i, t).v[0]); }

  // A word as a uniform in [0, 1) on a 2^-24 grid.
  EBM_HD static float unit(uint32_t w) { return (float)(w >> 8) * 5.9604644775390625e-08f; }
};

}  // namespace ebm
