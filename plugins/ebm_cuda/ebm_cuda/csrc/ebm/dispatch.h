// Turning the runtime codes of the C API into template arguments; shared by host.cpp and kernels.cu.
#pragma once
#include "energies.h"

// dtype codes of the C API (ebm_cuda/library.py): 0 float32, 1 float64, 2 bfloat16, 3 float16.
#define EBM_CASE_DTYPE(code, T, S, ...) case code: { using S = T; __VA_ARGS__; } break;
// One case per line of EBM_ENERGIES (energies.h): the runtime code as the constexpr KIND.
#define EBM_KIND_CASE(ENUM, CODE, NAME, KIND, ...) case ebm::ENUM: { constexpr int KIND = ebm::ENUM; __VA_ARGS__; } break;
#define EBM_DISPATCH_KIND(kind, KIND, ...)                                  \
  switch (kind) {                                                           \
    EBM_ENERGIES(EBM_KIND_CASE, KIND, __VA_ARGS__)                          \
    default: return fail("unknown energy kind");                            \
  }
// A chain of d <= 16 elements lives in registers (loops unrolled to MAXD, the next power of two);
// up to EBM_MAX_D = 64 in a thread's local memory (MAXD = 0: loops to d); beyond, EBM_LARGE_D.
#define EBM_MAX_D 64
#define EBM_DISPATCH_MAXD(d, MAXD, ...)                                         \
  if ((d) <= 2) { constexpr int MAXD = 2; __VA_ARGS__; }                        \
  else if ((d) <= 4) { constexpr int MAXD = 4; __VA_ARGS__; }                   \
  else if ((d) <= 8) { constexpr int MAXD = 8; __VA_ARGS__; }                   \
  else if ((d) <= 16) { constexpr int MAXD = 16; __VA_ARGS__; }                 \
  else if ((d) <= EBM_MAX_D) { constexpr int MAXD = 0; __VA_ARGS__; }           \
  else { EBM_LARGE_D(MAXD, __VA_ARGS__) }

// The C API's description of an energy: parameters in the math type of the state's dtype.
extern "C" typedef struct {
  int kind;
  int d;
  const void* v0;
  const void* v1;
  double a;
  double b;
} ebm_energy;

template <typename A> ebm::Params<A> params_of(const ebm_energy* E) {
  ebm::Params<A> p;
  p.v0 = (const A*)E->v0; p.v1 = (const A*)E->v1; p.a = (A)E->a; p.b = (A)E->b; p.d = E->d;
  return p;
}
