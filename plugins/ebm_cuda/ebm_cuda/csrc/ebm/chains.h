// Fused multi-step chains for one chain, for host and device: K Langevin steps, or K HMC
// transitions, with the noise drawn from the Philox stream (philox.h) and the state touched in
// memory only by the caller, once before and once after. Buffers are strided like energies.h.
#pragma once
#include "energies.h"
#include "philox.h"

namespace ebm {

// Blocks of four elements (one Philox call each), unrolled like EBM_LOOP so a chain stays in registers.
#define EBM_BLOCKS(b, MAXD, d) EBM_UNROLL for (int b = 0; b < ((MAXD) > 0 ? ((MAXD) + 3) / 4 : ((d) + 3) / 4); ++b) if (4 * b < (d))

// One element of a Langevin step: x - h g + s z (V: the math type, or host Lanes of it).
template <typename V> EBM_HD V langevin_move(V x, V g, V h, V s, V z) { return (x - h * g) + s * z; }

// Elements 4b .. 4b+3 of one Langevin step out <- x - h g + s ξ, ξ the stream's normals of this
// chain at step t (out may be x). X, Y: the math type A (a chain in registers) or a storage type.
template <typename A, typename X, typename G, typename Y>
EBM_HD void langevin_block(const X* x, const G* g, Y* out, int st, int d, int b, A h, A s, const Stream& rng,
                           uint32_t chain, uint64_t t) {
  float z[4];
  rng.normal4((uint32_t)b, chain, t, z);
  EBM_UNROLL for (int l = 0; l < 4; ++l) {
    int j = 4 * b + l;
    if (j < d) store<A>(out + j * st, langevin_move<A>(load<A>(x + j * st), load<A>(g + j * st), h, s, (A)z[l]));
  }
}

// K steps of x <- x - h ∇E(x) + s ξ_t, ξ_t the stream's normals of this chain at step offset + t.
// x: the chain (math type A), g: scratch for the gradient.
template <int KIND, typename A, int MAXD>
EBM_HD void langevin_chain(const Energy<KIND, A, MAXD>& E, A* x, A* g, int st, int64_t n_steps, A h, A s,
                           const Stream& rng, uint32_t chain, uint64_t offset) {
  const int d = E.p.d;
  for (int64_t t = 0; t < n_steps; ++t) {
    E(x, st, g, st);
    EBM_BLOCKS(b, MAXD, d) langevin_block<A>(x, g, x, st, d, b, h, s, rng, chain, offset + (uint64_t)t);
  }
}

// One leapfrog trajectory (merged kicks) of n_leapfrog steps of size h from xn with momentum p and
// gradient g at xn (inverse temperature beta): moves xn and p, leaves ∇E at the end in gn and
// returns E there. V: the math type A, or host Lanes of it (one step size per chain).
template <int KIND, typename A, int MAXD, typename V>
EBM_HD V leapfrog(const Energy<KIND, A, MAXD>& E, V* xn, V* gn, V* p, const V* g, int st, int n_leapfrog, V h, A beta) {
  const int d = E.p.d;
  const V half = (A)0.5 * h * beta, full = h * beta;
  EBM_LOOP(j, MAXD, d) { p[j * st] -= half * g[j * st]; }
  V en = (A)0;
  for (int l = 0; l < n_leapfrog; ++l) {
    EBM_LOOP(j, MAXD, d) { xn[j * st] += h * p[j * st]; }
    en = E(xn, st, gn, st);
    const V kick = (l + 1 == n_leapfrog) ? half : full;
    EBM_LOOP(j, MAXD, d) { p[j * st] -= kick * gn[j * st]; }
  }
  return en;
}

// ½|p|² of one chain (or host Lanes of chains).
template <typename A, int MAXD, typename V>
EBM_HD V kinetic(const V* p, int st, int d) {
  V k = (A)0;
  EBM_LOOP(j, MAXD, d) { k += p[j * st] * p[j * st]; }
  return (A)0.5 * k;
}

// The Metropolis test of one chain on ΔH = delta against the uniform u: accept with probability
// min(1, exp(-delta)); a non-finite delta is rejected. *divergent: non-finite, or delta > 1000.
template <typename A>
EBM_HD bool metropolis(A delta, float u, bool* divergent) {
  const bool finite = is_finite(delta);
  *divergent = !finite || delta > (A)1000;
  const A prob = !finite ? (A)0 : (delta > 0 ? exp_f(-delta) : (A)1);
  return (A)u < prob;
}

// K HMC transitions (identity mass, L leapfrog steps of size h, inverse temperature beta):
// momentum from the stream's normals at step offset + t, Metropolis test with its uniform.
// Counts accepted and divergent transitions. Scratch: xn, gn, p.
template <int KIND, typename A, int MAXD>
EBM_HD void hmc_chain(const Energy<KIND, A, MAXD>& E, A* x, A* g, A* xn, A* gn, A* p, int st, int64_t n_steps,
                      A h, int n_leapfrog, A beta, const Stream& rng, uint32_t chain, uint64_t offset,
                      int32_t* accepted, int32_t* divergent) {
  const int d = E.p.d;
  int32_t n_accepted = 0, n_divergent = 0;  // counted in registers, added to memory once
  A e = E(x, st, g, st);
  for (int64_t t = 0; t < n_steps; ++t) {
    EBM_BLOCKS(b, MAXD, d) {
      float z[4];
      rng.normal4((uint32_t)b, chain, offset + (uint64_t)t, z);
      EBM_UNROLL for (int l = 0; l < 4; ++l) {
        if (4 * b + l < d) p[(4 * b + l) * st] = (A)z[l];
      }
    }
    const A k0 = kinetic<A, MAXD>(p, st, d);
    EBM_LOOP(j, MAXD, d) { xn[j * st] = x[j * st]; }
    const A en = leapfrog(E, xn, gn, p, g, st, n_leapfrog, h, beta);
    const A delta = (beta * en + kinetic<A, MAXD>(p, st, d)) - (beta * e + k0);
    bool diverged;
    if (metropolis(delta, rng.uniform(chain, offset + (uint64_t)t), &diverged)) {
      EBM_LOOP(j, MAXD, d) { x[j * st] = xn[j * st]; g[j * st] = gn[j * st]; }
      e = en;
      ++n_accepted;
    }
    n_divergent += diverged ? 1 : 0;
  }
  *accepted += n_accepted;
  *divergent += n_divergent;
}

}  // namespace ebm
