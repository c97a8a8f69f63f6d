"""Metropolis-adjusted Langevin (MALA): the ULA move ``y = x − h∇E(x) + √(2hT)·ξ`` as a proposal,
accepted with probability ``min(1, exp(−(E(y) − E(x))/T) q(x|y) / q(y|x))``.

The state carries ``E(x)`` and ``∇E(x)``: an accepted proposal costs no recomputation. A proposal
whose energy or gradient is non-finite is rejected and counted as divergent, and so is one whose
log acceptance ratio is below ``−1000`` (HMC's threshold on the energy error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebmcore.kernels.torch_backend import add_scaled, add_scaled_
from ebmcore import EnergyFunctions, EnergyModel
from ebm_samplers.state import GradientState, init_gradient_state
from ebm_samplers.base import DIVERGENCE_THRESHOLD, MCMCSampler
from ebm_samplers.tunables import ChainScalar, as_chain_scalar, event_size, per_chain

__all__ = ["MALAState", "MALAInfo", "init", "step", "transition", "MALASampler"]


MALAState = GradientState
"""``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``."""


@dataclass(frozen=True)
class MALAInfo:
    """Per chain ``(n,)``: ``accepted`` (bool), ``acceptance_prob``, ``divergent`` (bool)."""

    accepted: Tensor
    acceptance_prob: Tensor
    divergent: Tensor


init = init_gradient_state


def _sum_sq(t: Tensor, dtype: torch.dtype) -> Tensor:
    t = t.to(dtype)
    return (t * t).flatten(1).sum(1)


def transition(state: MALAState, noise: Tensor, uniform: Tensor, fns: EnergyFunctions, *,
               step_size: ChainScalar, temperature: ChainScalar = 1.0) -> tuple[MALAState, MALAInfo]:
    """One MALA step given standard normal ``noise`` (like ``x``) and ``uniform ~ U[0, 1)``: ``(n,)``.

    Accept iff ``uniform < α``. The ratio is computed in at least float32 whatever the state's dtype.
    A non-finite gradient at the proposal makes the ratio non-finite (it enters ``q(x|y)``), so one
    finiteness test on the ratio covers the energy and the gradient.
    """
    x, energy, grad = state.x, state.energy, state.grad
    acc = uniform.dtype
    h = per_chain(step_size, x)
    t = per_chain(temperature, x)
    if isinstance(h, float) and isinstance(t, float):
        y = add_scaled_(add_scaled(x, grad, -h), noise, math.sqrt(2.0 * h * t))
    else:
        y = x - h * grad + torch.sqrt(2.0 * h * t) * noise
    energy_y, grad_y = fns.energy_and_gradient(y)
    # log q(y|x) = −|ξ|²/2;  log q(x|y) = −|x − y + h∇E(y)|² / (4hT)
    back = torch.sub(x, y)
    back = add_scaled_(back, grad_y, h) if isinstance(h, float) else back.addcmul_(h, grad_y)
    h_chain = h if isinstance(h, float) else h.reshape(-1).to(acc)
    t_chain = t if isinstance(t, float) else t.reshape(-1).to(acc)
    log_ratio = (energy.to(acc) - energy_y.to(acc)) / t_chain - _sum_sq(back, acc) / (4.0 * h_chain * t_chain) + 0.5 * _sum_sq(noise, acc)
    finite = torch.isfinite(log_ratio)
    prob = torch.where(finite, log_ratio.clamp(max=0.0).exp(), torch.zeros_like(log_ratio))
    accepted = uniform < prob
    mask = accepted.view(-1, *([1] * (x.dim() - 1)))
    new = MALAState(torch.where(mask, y, x), torch.where(accepted, energy_y, energy), torch.where(mask, grad_y, grad))
    return new, MALAInfo(accepted, prob, ~finite | (log_ratio < -DIVERGENCE_THRESHOLD))


def step(state: MALAState, fns: EnergyFunctions, *, step_size: ChainScalar, temperature: ChainScalar = 1.0,
         generator: torch.Generator | None = None) -> tuple[MALAState, MALAInfo]:
    """One MALA step of every chain. ``step_size``, ``temperature``: floats or ``(n_chains,)`` tensors."""
    x = state.x
    noise = torch.randn(x.shape, dtype=x.dtype, device=x.device, generator=generator)
    uniform = torch.rand(x.shape[0], dtype=torch.promote_types(x.dtype, torch.float32), device=x.device, generator=generator)
    return transition(state, noise, uniform, fns, step_size=step_size, temperature=temperature)


class MALASampler(MCMCSampler):
    """MALA over a batch of chains. ``step_size`` defaults to ``0.5·d^(−1/3)`` (``d`` elements per
    chain; the optimal MALA step shrinks like ``d^(−1/3)``); tune it for an acceptance near 0.57."""

    name = "mala"

    def __init__(self, energy: EnergyModel, step_size: Any = None, *, temperature: Any = 1.0, **options: Any) -> None:
        super().__init__(energy, **options)
        self.step_size = step_size
        self.temperature = temperature

    def default_step_size(self, x: Tensor) -> float:
        """``0.5·d^(−1/3)`` for ``x: (n_chains, *event_shape)`` with ``d`` elements per chain."""
        return 0.5 * event_size(x) ** (-1.0 / 3.0)

    def tunables(self, x: Tensor, overrides: dict[str, Any]) -> dict[str, Any]:
        """Accepts ``step_size`` (default :meth:`default_step_size`) and ``temperature`` (default 1), each a
        float or a ``(n_chains,)`` tensor."""
        unknown = set(overrides) - {"step_size", "temperature"}
        if unknown:
            raise InputError(f"MALASampler: unknown tunable(s) {sorted(unknown)}; MALA takes step_size and temperature.")
        step_size = overrides.get("step_size", self.step_size)
        return {
            "step_size": as_chain_scalar(self.default_step_size(x) if step_size is None else step_size, x, "step_size"),
            "temperature": as_chain_scalar(overrides.get("temperature", self.temperature), x, "temperature"),
        }

    init_fn = staticmethod(init)
    transition_fn = staticmethod(transition)
    step_fn = staticmethod(step)
