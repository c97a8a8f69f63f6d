// Fused multi-step chains for one chain, for host and device: K Langevin steps, K HMC
// transitions, or K NUTS iterations, with the noise drawn from the Philox stream (philox.h) and the state touched in
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

// ---- NUTS (multinomial, iterative, identity mass): the algorithm of ebm_samplers/nuts.py, one chain at a time ----
//
// The random draws of iteration t (stream step offset + t) of chain i:
//   - the momentum: the normals of step t, blocks 0 .. ceil(d/4) - 1 (as hmc_chain);
//   - the direction of doubling j: bit j of word 0 of block 0xFFFFFFFF (forward if set);
//   - uniform k of the iteration: word k % 4 of block NUTS_UNIFORMS + k / 4, as Stream::unit; k = the
//     leaf's index among the iteration's leapfrog steps (< 2^20) for the progressive sampling within a
//     subtree, k = 2^20 + j for the (biased) merge of doubling j.

constexpr uint32_t NUTS_UNIFORMS = 0x80000000u;
constexpr uint32_t NUTS_MERGE = 1u << 20;
constexpr int NUTS_MAX_DEPTH = 20;

// Checkpoint slots a tree of depth max_depth needs (leaf momenta and partial sums of the last subtree).
EBM_HD int nuts_checkpoints(int max_depth) { return max_depth > 1 ? max_depth - 1 : 1; }

// The uniforms of one iteration, one Philox call per four (the last block kept).
struct NutsUniforms {
  const Stream* rng; uint32_t chain; uint64_t t; uint32_t cached; uint32_t w[4];
  EBM_HD NutsUniforms(const Stream* r, uint32_t i, uint64_t step) : rng(r), chain(i), t(step), cached(0xFFFFFFFFu) {}
  EBM_HD float operator()(uint32_t k) {
    const uint32_t b = NUTS_UNIFORMS + k / 4;
    if (b != cached) {
      const Philox4 r = rng->block(b, chain, t);
      w[0] = r.v[0]; w[1] = r.v[1]; w[2] = r.v[2]; w[3] = r.v[3];
      cached = b;
    }
    return Stream::unit(w[k % 4]);
  }
};

// For leaf `leaf` (0-based) of a subtree: the checkpoints [lo, hi] whose sub-subtrees end there (empty if lo > hi);
// an even leaf stores its momentum and partial sum at checkpoint hi (Phan, Pradhan & Jankowiak 2019).
EBM_HD void nuts_checkpoint_range(uint32_t leaf, int* lo, int* hi) {
  int ones = 0, trailing = 0;
  for (uint32_t v = leaf >> 1; v; v >>= 1) ones += (int)(v & 1u);
  for (uint32_t v = leaf; v & 1u; v >>= 1) ++trailing;
  *hi = ones;
  *lo = ones - trailing + 1;
}

// Generalised U-turn (identity mass) between end momenta a and b, with rho - minus + plus the sum of the
// momenta from a to b (ends included; minus, plus may be null): (rho' · a <= 0) or (rho' · b <= 0),
// rho' = that sum - (a + b) / 2.
template <typename A, int MAXD>
EBM_HD bool nuts_turning(const A* a, const A* b, const A* rho, const A* minus, const A* plus, int d) {
  A da = (A)0, db = (A)0;
  EBM_LOOP(j, MAXD, d) {
    A r = rho[j] - (A)0.5 * (a[j] + b[j]);
    if (minus) r = r - minus[j] + plus[j];
    da += a[j] * r;
    db += b[j] * r;
  }
  return da <= (A)0 || db <= (A)0;
}

// A sum of weights e^{lw} kept as e^m * s (m the largest log-weight added: no overflow, one exp per add).
template <typename A> struct NutsWeight {
  A m, s;
  // Adds e^{lw}; returns its share of the new sum (0 for lw = -inf).
  EBM_HD A add(A lw) {
    if (lw > m) {
      s = s * exp_f(m - lw) + (A)1;  // exp(-inf) = 0 on the first add
      m = lw;
      return (A)1 / s;
    }
    const A a = lw == neg_inf<A>() ? (A)0 : exp_f(lw - m);
    s += a;
    return a > (A)0 ? a / s : (A)0;
  }
  // e^{other} / e^{this}, other non-empty.
  EBM_HD A ratio(const NutsWeight& other) const { return exp_f(other.m - m) * other.s / s; }
  EBM_HD void merge(const NutsWeight& other) {
    if (other.m > m) { s = s * exp_f(m - other.m) + other.s; m = other.m; }
    else s += other.s * exp_f(other.m - m);
  }
};

#if defined(__CUDACC__)
#define EBM_SIMD
#else
#define EBM_SIMD _Pragma("omp simd")
#endif

// The stream's normals of chain i at step t into p (d elements, as normal4 draws them), the Box-Muller
// transforms in one loop that the host build vectorises; u1, u2: scratch of (d + 1) / 2 elements.
template <typename A, int MAXD>
EBM_HD void stream_normals(const Stream& rng, uint32_t chain, uint64_t t, A* p, A* u1, A* u2, int d) {
  EBM_BLOCKS(b, MAXD, d) {
    const Philox4 w = rng.block((uint32_t)b, chain, t);
    u1[2 * b] = (A)box_muller_u1(w.v[0]);
    u2[2 * b] = (A)box_muller_u2(w.v[1]);
    if (4 * b + 2 < d) {
      u1[2 * b + 1] = (A)box_muller_u1(w.v[2]);
      u2[2 * b + 1] = (A)box_muller_u2(w.v[3]);
    }
  }
  const int pairs = (d + 1) / 2;
  EBM_SIMD for (int q = 0; q < pairs; ++q) {
    float z0, z1;
    box_muller_unit((float)u1[q], (float)u2[q], &z0, &z1);
    u1[q] = (A)z0;
    u2[q] = (A)z1;
  }
  EBM_LOOP(j, MAXD, d) { p[j] = (j & 1) ? u2[j / 2] : u1[j / 2]; }
}

// The scratch of one chain's NUTS: d elements each, and ckp, ckr nuts_checkpoints(max_depth) * d each.
template <typename A> struct NutsScratch {
  A *xl, *pl, *gl, *xr, *pr, *gr, *xs, *gs, *rho, *srho, *ckp, *ckr;
};

// K NUTS iterations of the chain x (energy e and gradient g at x are computed first), identity mass,
// step size h, inverse temperature beta, trees of at most 2^max_depth - 1 leapfrog steps, stream steps
// offset .. offset + K - 1. Adds up over its iterations: the acceptance statistic (the mean of
// min(1, e^{-ΔH}) over each trajectory), divergent iterations, leapfrog steps and tree depths (doublings
// merged). A leaf whose ΔH is not finite has weight 0 and is divergent, as is one with
// -ΔH < -1000; a divergent or U-turning subtree ends the iteration and is not merged.
template <int KIND, typename A, int MAXD>
EBM_HD void nuts_chain(const Energy<KIND, A, MAXD>& E, A* x, A* g, const NutsScratch<A>& s, int64_t n_steps, A h,
                       int max_depth, A beta, const Stream& rng, uint32_t chain, uint64_t offset, A* acceptance, int32_t* divergent_count, int64_t* n_leapfrog,
                       int64_t* tree_depth) {
  const int d = E.p.d;
  A *xl = s.xl, *pl = s.pl, *gl = s.gl, *xr = s.xr, *pr = s.pr, *gr = s.gr, *xs = s.xs, *gs = s.gs;
  A *rho = s.rho, *srho = s.srho;
  A e = E(x, 1, g, 1);
  A total_accept = (A)0;  // counted in registers, added to memory once
  int32_t total_divergent = 0;
  int64_t total_leapfrog = 0, total_depth = 0;
  for (int64_t t = 0; t < n_steps; ++t) {
    const uint64_t step = offset + (uint64_t)t;
    stream_normals<A, MAXD>(rng, chain, step, pl, xs, gs, d);  // xs, gs: free until the first leaf is drawn
    const A h0 = beta * e + kinetic<A, MAXD>(pl, 1, d);
    EBM_LOOP(j, MAXD, d) { xl[j] = xr[j] = x[j]; gl[j] = gr[j] = g[j]; pr[j] = rho[j] = pl[j]; }
    const uint32_t directions = rng.block(0xFFFFFFFFu, chain, step).v[0];
    NutsUniforms leaf_uniform(&rng, chain, step), merge_uniform(&rng, chain, step);
    NutsWeight<A> tree = {(A)0, (A)1};  // the initial point, weight e^0
    A sum_accept = (A)0;
    uint32_t n_leaves = 0;
    int depth = 0;
    bool divergent = false;
    for (int level = 0; level < max_depth; ++level) {
      const bool forward = (directions >> level) & 1u;
      A *xw = forward ? xr : xl, *pw = forward ? pr : pl, *gw = forward ? gr : gl;
      const A sign = forward ? (A)1 : (A)-1, drift = sign * h, half = (A)0.5 * sign * h * beta;
      NutsWeight<A> sub = {neg_inf<A>(), (A)0};
      A sub_e = e;
      bool valid = true;
      EBM_LOOP(j, MAXD, d) { srho[j] = (A)0; }
      const uint32_t n_sub = 1u << level;
      for (uint32_t leaf = 0; leaf < n_sub; ++leaf) {
        EBM_LOOP(j, MAXD, d) { pw[j] -= half * gw[j]; xw[j] += drift * pw[j]; }
        const A e_leaf = E(xw, 1, gw, 1);
        EBM_LOOP(j, MAXD, d) { pw[j] -= half * gw[j]; srho[j] += pw[j]; }
        A leaf_log_w = h0 - (beta * e_leaf + kinetic<A, MAXD>(pw, 1, d));
        if (!is_finite(leaf_log_w)) leaf_log_w = neg_inf<A>();
        const bool diverged = leaf_log_w < (A)-1000;
        sum_accept += leaf_log_w < (A)0 ? exp_f(leaf_log_w) : (A)1;
        if ((A)leaf_uniform(n_leaves) < sub.add(leaf_log_w)) {  // progressive sampling within the subtree
          EBM_LOOP(j, MAXD, d) { xs[j] = xw[j]; gs[j] = gw[j]; }
          sub_e = e_leaf;
        }
        ++n_leaves;
        int lo, hi;
        nuts_checkpoint_range(leaf, &lo, &hi);
        bool stop = diverged;
        if ((leaf & 1u) == 0) {
          if (level > 0) {
            A *cp = s.ckp + hi * d, *cr = s.ckr + hi * d;
            EBM_LOOP(j, MAXD, d) { cp[j] = pw[j]; cr[j] = srho[j]; }
          }
        } else {
          for (int i = hi; i >= lo && !stop; --i)
            stop = nuts_turning<A, MAXD>(s.ckp + i * d, pw, srho, s.ckr + i * d, s.ckp + i * d, d);
        }
        divergent = divergent || diverged;
        if (stop) { valid = false; break; }
      }
      if (!valid) break;
      if ((A)merge_uniform(NUTS_MERGE + (uint32_t)level) < tree.ratio(sub)) {  // biased progressive sampling
        EBM_LOOP(j, MAXD, d) { x[j] = xs[j]; g[j] = gs[j]; }
        e = sub_e;
      }
      tree.merge(sub);
      EBM_LOOP(j, MAXD, d) { rho[j] += srho[j]; }
      depth = level + 1;
      if (nuts_turning<A, MAXD>(pl, pr, rho, (const A*)nullptr, (const A*)nullptr, d)) break;
    }
    total_accept += sum_accept / (A)n_leaves;
    total_divergent += divergent ? 1 : 0;
    total_leapfrog += n_leaves;
    total_depth += depth;
  }
  *acceptance += total_accept;
  *divergent_count += total_divergent;
  *n_leapfrog += total_leapfrog;
  *tree_depth += total_depth;
}

}  // namespace ebm
