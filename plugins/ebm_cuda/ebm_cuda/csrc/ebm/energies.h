// The analytic energies, per chain, for host and device. An energy evaluates E(x) of one chain and,
// if g is not null, writes ∇E(x). x and g are strided (stride xs, gs) so the same code serves a
// chain held in registers (stride 1, device) and a tile of chains in structure-of-arrays layout
// (stride = tile width, host). MAXD > 0 unrolls the loops to MAXD with a guard j < d (the chain then
// lives in registers); MAXD == 0 loops to d. The value type V follows x: the math type A for one
// chain, or ebm::Lanes<A, W> (W chains at once, the host build's vectorised tiles).
#pragma once
#include "common.h"

// The energies the kernels implement, written once: X(ENUM, code, name, ...) gives the enumerator of
// enum Kind, the integer code of the C API and the op of the energy's Python AnalyticEnergy (whose
// declared parameters fill Params, below). The enum and the dispatch switch of dispatch.h are
// generated from this list, and ebm_cuda/energies.py reads these lines at import. The trailing
// arguments pass through to X. Adding an energy: one line here and its struct Energy<ENUM, A, MAXD>.
#define EBM_ENERGIES(X, ...)                    \
  X(GAUSSIAN, 0, gaussian, __VA_ARGS__)         \
  X(DOUBLE_WELL, 1, double_well, __VA_ARGS__)   \
  X(ROSENBROCK, 2, rosenbrock, __VA_ARGS__)     \
  X(HARMONIC, 3, harmonic, __VA_ARGS__)

namespace ebm {

#define EBM_KIND_ENUMERATOR(ENUM, CODE, NAME, ...) ENUM = CODE,
enum Kind : int { EBM_ENERGIES(EBM_KIND_ENUMERATOR, ) };
#undef EBM_KIND_ENUMERATOR

// The parameters of any energy, in the math type A, filled from the energy's declared parameters in
// order (ebm_cuda/energies.py): a (d,) vector goes to v0 (mean / center), a (d, d) matrix to v1
// (precision, row-major), scalars to a, then b (barrier / a / stiffness; Rosenbrock's b). A pointer
// the energy does not use is null.
template <typename A> struct Params {
  const A* v0; const A* v1; A a; A b; int d;
};

// Element j of a parameter tensor v (Params::v0 or v1). Compiled for a GPU, a loop over parameters staged in shared
// memory may read them as 16-byte vectors (LDS.128: the four floats of an aligned group), past the last element up to
// the group's end; kernels.cu pads each staged tensor to whole groups so that such a read never reaches memory other
// threads write. The CUDA emulation (ebm/cuda_emulation.h) reads the whole group too, where v lies in the block's
// shared memory, so that ThreadSanitizer sees what the GPU reads.
template <typename A> EBM_HD A param(const A* v, int j) {
#if defined(EBM_CUDA_EMULATION)
  ebm_emulation::read_shared_group(v + j);
#endif
  return v[j];
}

#define EBM_LOOP(j, MAXD, d) EBM_UNROLL for (int j = 0; j < ((MAXD) > 0 ? (MAXD) : (d)); ++j) if ((MAXD) == 0 || j < (d))

template <int KIND, typename A, int MAXD> struct Energy;

// 0.5 (x - m)^T P (x - m); gradient P (x - m), P symmetric.
template <typename A, int MAXD> struct Energy<GAUSSIAN, A, MAXD> {
  Params<A> p;
  template <typename X, typename G> EBM_HD auto operator()(const X* x, int xs, G* g, int gs) const {
    using V = decltype(load<A>(x));
    const int d = p.d;
    V e = (A)0;
    EBM_LOOP(j, MAXD, d) {
      V gj = (A)0;
      EBM_LOOP(k, MAXD, d) { gj += param(p.v1, j * d + k) * (load<A>(x + k * xs) - param(p.v0, k)); }
      if (g) store<A>(g + j * gs, gj);
      e += (load<A>(x + j * xs) - param(p.v0, j)) * gj;
    }
    return (A)0.5 * e;
  }
};

// barrier * sum (x_i^2 - 1)^2; gradient 4 barrier x_i (x_i^2 - 1).
template <typename A, int MAXD> struct Energy<DOUBLE_WELL, A, MAXD> {
  Params<A> p;
  template <typename X, typename G> EBM_HD auto operator()(const X* x, int xs, G* g, int gs) const {
    using V = decltype(load<A>(x));
    V e = (A)0;
    EBM_LOOP(j, MAXD, p.d) {
      V xj = load<A>(x + j * xs), t = xj * xj - (A)1;
      e += t * t;
      if (g) store<A>(g + j * gs, t * xj * ((A)4 * p.a));
    }
    return p.a * e;
  }
};

// sum_{i<d-1} b (x_{i+1} - x_i^2)^2 + (a - x_i)^2.
template <typename A, int MAXD> struct Energy<ROSENBROCK, A, MAXD> {
  Params<A> p;
  template <typename X, typename G> EBM_HD auto operator()(const X* x, int xs, G* g, int gs) const {
    using V = decltype(load<A>(x));
    const int d = p.d;
    V e = (A)0, t_prev = (A)0, xi = load<A>(x);
    EBM_LOOP(i, MAXD, d) {
      V xn = (i + 1 < d) ? load<A>(x + (i + 1) * xs) : V((A)0);
      V t = xn - xi * xi, u = p.a - xi;
      V gi = (i > 0) ? (A)2 * p.b * t_prev : V((A)0);
      if (i + 1 < d) {
        e += p.b * t * t + u * u;
        gi += (A)-4 * p.b * xi * t - (A)2 * u;
      }
      if (g) store<A>(g + i * gs, gi);
      t_prev = t;
      xi = xn;
    }
    return e;
  }
};

// 0.5 k |x - c|^2; gradient k (x - c).
template <typename A, int MAXD> struct Energy<HARMONIC, A, MAXD> {
  Params<A> p;
  template <typename X, typename G> EBM_HD auto operator()(const X* x, int xs, G* g, int gs) const {
    using V = decltype(load<A>(x));
    V e = (A)0;
    EBM_LOOP(j, MAXD, p.d) {
      V r = load<A>(x + j * xs) - param(p.v0, j);
      e += r * r;
      if (g) store<A>(g + j * gs, p.a * r);
    }
    return (A)0.5 * p.a * e;
  }
};

}  // namespace ebm
