"""Metropolis-adjusted Langevin (MALA): the Langevin move ``y = x − h∇E(x) + √(2hT)·ξ`` as a proposal,
accepted with probability ``min(1, exp(−(E(y) − E(x))/T) q(x|y) / q(y|x))``.

The state carries ``E(x)`` and ``∇E(x)``: an accepted proposal costs no recomputation. A proposal
whose energy or gradient is non-finite is rejected and counted as divergent, and so is one whose
log acceptance ratio is below ``−1000`` (HMC's threshold on the energy error).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ebmcore import EnergyFunctions
from ebmcore.kernels.torch_backend import add_scaled_
from ebm_samplers import langevin
from ebm_samplers.algorithm import DIVERGENCE_THRESHOLD, Algorithm, GradientState, Step, compiled, draw_then, init_gradient_state
from ebm_samplers.integrators import EulerMaruyama
from ebm_samplers.integrators.euler_maruyama import SDEUpdate
from ebm_samplers.params import per_chain
from ebm_samplers.sampler import AlgorithmSampler

__all__ = ["State", "Info", "Params", "init", "transition", "build_kernel", "ALGORITHM", "MALASampler"]

State = GradientState
"""``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``."""

init = init_gradient_state


@dataclass(frozen=True)
class Info:
    """Per chain ``(n,)``: ``accepted`` (bool), ``acceptance_prob``, ``divergent`` (bool)."""

    accepted: Tensor
    acceptance_prob: Tensor
    divergent: Tensor


@dataclass(frozen=True)
class Params(langevin.Params):
    """``step_size`` (None: ``0.5·d^(−1/3)``, the optimal MALA step shrinks like ``d^(−1/3)``; tune it for an
    acceptance near 0.57) and ``temperature``: floats or ``(n_chains,)`` tensors."""

    step_factor = 0.5


def _sum_sq(t: Tensor, dtype: torch.dtype) -> Tensor:
    t = t.to(dtype)
    return (t * t).flatten(1).sum(1)


def transition(
    state: State, noise: Tensor, uniform: Tensor, fns: EnergyFunctions, params: Params, move: SDEUpdate
) -> tuple[State, Info]:
    """One MALA step given standard normal ``noise`` (like ``x``) and ``uniform ~ U[0, 1)``: ``(n,)``;
    ``move`` is the Langevin (Euler–Maruyama) update bound to the states.

    Accept iff ``uniform < α``. The ratio is computed in at least float32 whatever the state's dtype.
    A non-finite gradient at the proposal makes the ratio non-finite (it enters ``q(x|y)``), so one
    finiteness test on the ratio covers the energy and the gradient.
    """
    x, energy, grad = state.x, state.energy, state.grad
    acc = uniform.dtype
    h = per_chain(params.step_size, x)
    t = per_chain(params.temperature, x)
    y = move(x, grad, noise, h, langevin.noise_scale(h, t))
    energy_y, grad_y = fns.energy_and_gradient(y)
    # log q(y|x) = −|ξ|²/2;  log q(x|y) = −|x − y + h∇E(y)|² / (4hT)
    back = torch.sub(x, y)
    back = add_scaled_(back, grad_y, h) if isinstance(h, float) else back.addcmul_(h, grad_y)
    h_chain = h if isinstance(h, float) else h.reshape(-1).to(acc)
    t_chain = t if isinstance(t, float) else t.reshape(-1).to(acc)
    log_ratio = (
        (energy.to(acc) - energy_y.to(acc)) / t_chain - _sum_sq(back, acc) / (4.0 * h_chain * t_chain) + 0.5 * _sum_sq(noise, acc)
    )
    finite = torch.isfinite(log_ratio)
    prob = torch.where(finite, log_ratio.clamp(max=0.0).exp(), torch.zeros_like(log_ratio))
    accepted = uniform < prob
    mask = accepted.view(-1, *([1] * (x.dim() - 1)))
    new = State(torch.where(mask, y, x), torch.where(accepted, energy_y, energy), torch.where(mask, grad_y, grad))
    return new, Info(accepted, prob, ~finite | (log_ratio < -DIVERGENCE_THRESHOLD))


def build_kernel(compile: bool = False) -> Step:
    """``step(state, fns, generator, params)``: draws ``ξ`` then ``u`` into kept buffers, then :func:`transition`
    (through ``torch.compile`` with ``compile``) with the Langevin move bound to the states."""
    move = EulerMaruyama()
    return draw_then(compiled(transition) if compile else transition, uniform=True, bind=lambda x: (move.bind(x),))


ALGORITHM = Algorithm("mala", Params, init, build_kernel, has_acceptance=True)


class MALASampler(AlgorithmSampler):
    """MALA over a batch of chains: ``MALASampler(energy, step_size=None, *, temperature=1.0, autocast=None,
    compile=False)``. ``step_size`` defaults to ``0.5·d^(−1/3)`` (``d`` elements per chain); tune it for an
    acceptance near 0.57."""

    algorithm = ALGORITHM
