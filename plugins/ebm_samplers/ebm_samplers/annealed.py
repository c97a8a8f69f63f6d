"""Annealed Langevin dynamics (Song & Ermon 2019, NCSN): Langevin steps over a decreasing
schedule of noise levels ``σ₁ > … > σ_L``, ``n_steps_each`` steps per level, with step size
``h_i = step_size·(σ_i/σ_L)²`` (``step_size`` is the last level's).

A noise-conditional energy (``noise_conditional = True``) is called as ``compute_energy(x, sigma)``
with ``sigma: (n,)``: its gradient at level ``i`` is that of the data smoothed by ``N(0, σ_i²I)``, as
for an NCSN score model. An ordinary energy is used at every level; the schedule then only
shrinks the step size, which explores with large steps first and ends with small, less biased ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel
from ebmcore.errors import InputError
from ebm_samplers.base import MCMCSampler
from ebm_samplers.tunables import as_chain_scalar

__all__ = ["AnnealedState", "AnnealedInfo", "AnnealedLangevinSampler", "geometric_sigmas"]


def geometric_sigmas(sigma_max: float = 1.0, sigma_min: float = 0.01, n_levels: int = 10) -> list[float]:
    """``n_levels`` noise levels from ``sigma_max`` down to ``sigma_min``, geometrically spaced."""
    if not (sigma_max > sigma_min > 0) or n_levels < 1:
        raise InputError(f"need sigma_max > sigma_min > 0 and n_levels >= 1, got {sigma_max}, {sigma_min}, {n_levels}.")
    if n_levels == 1:
        return [float(sigma_min)]
    ratio = (sigma_min / sigma_max) ** (1 / (n_levels - 1))
    return [float(sigma_max * ratio**i) for i in range(n_levels)]


@dataclass(frozen=True)
class AnnealedState:
    """``x: (n, *event_shape)`` and the number of steps taken (which fixes the current level)."""

    x: Tensor
    n_taken: int


@dataclass(frozen=True)
class AnnealedInfo:
    """The level and noise scale of the step just taken."""

    level: int
    sigma: float


class AnnealedLangevinSampler(MCMCSampler):
    """Annealed Langevin over ``sigmas`` (default: 10 geometric levels from 1 to 0.01), ``n_steps_each``
    per level; ``sample(x0, n_steps)`` with ``n_steps = len(sigmas)·n_steps_each`` runs the whole
    schedule (further steps stay at the last level). ``step_size`` (the last level's) defaults to
    ``0.1·σ_L²``, so that every level's step is a tenth of its noise variance."""

    name = "annealed_langevin"
    has_acceptance = False
    uses_noise_buffer = False
    compile_refusal = "its step size and noise level change with the level"

    def __init__(self, energy: EnergyModel, sigmas: Sequence[float] | None = None, *, n_steps_each: int = 100,
                 step_size: float | None = None, **options: Any) -> None:
        super().__init__(energy, **options)
        levels = list(sigmas) if sigmas is not None else geometric_sigmas()
        if not levels or any(not (s > 0) for s in levels) or any(b > a for a, b in zip(levels, levels[1:])):
            raise InputError(f"sigmas must be positive and non-increasing, got {levels!r}.")
        if not isinstance(n_steps_each, int) or n_steps_each < 1:
            raise InputError(f"n_steps_each must be a positive integer, got {n_steps_each!r}.")
        self.sigmas = [float(s) for s in levels]
        self.n_steps_each = n_steps_each
        self.step_size = step_size
        self.conditional = bool(getattr(energy, "noise_conditional", False))

    @property
    def total_steps(self) -> int:
        return len(self.sigmas) * self.n_steps_each

    def tunables(self, x: Tensor, overrides: dict[str, Any]) -> dict[str, Any]:
        """Accepts only ``step_size``, the last level's, one float for all chains (default ``0.1·σ_L²``)."""
        unknown = set(overrides) - {"step_size"}
        if unknown:
            raise InputError(f"AnnealedLangevinSampler: unknown tunable(s) {sorted(unknown)}.")
        step_size = overrides.get("step_size", self.step_size)
        h = as_chain_scalar(0.1 * self.sigmas[-1] ** 2 if step_size is None else step_size, x, "step_size")
        if isinstance(h, Tensor):
            raise InputError("AnnealedLangevinSampler takes one step_size for all chains.")
        return {"step_size": h}

    def init_state(self, x: Tensor, fns: EnergyFunctions) -> AnnealedState:
        """The state at ``x: (n_chains, *event_shape)`` with no steps taken (the first level)."""
        return AnnealedState(x, 0)

    def diagnostic_energy(self, state: AnnealedState, fns: EnergyFunctions) -> Tensor:
        if not self.conditional:
            return fns.energy(state.x)
        level = min(max(state.n_taken - 1, 0) // self.n_steps_each, len(self.sigmas) - 1)
        sigma = torch.full((state.x.shape[0],), self.sigmas[level], dtype=state.x.dtype, device=state.x.device)
        return self.energy.compute_energy(state.x, sigma)

    def _gradient(self, fns: EnergyFunctions, x: Tensor, sigma: float) -> Tensor:
        if not self.conditional:
            return fns.gradient(x)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            s = torch.full((x.shape[0],), sigma, dtype=x.dtype, device=x.device)
            (grad,) = torch.autograd.grad(self.energy.compute_energy(xg, s).sum(), xg)
        return grad

    def step_fn(self, state: AnnealedState, fns: EnergyFunctions, *, step_size: float,
                generator: torch.Generator | None = None) -> tuple[AnnealedState, AnnealedInfo]:
        """One Langevin step ``x' = x − h_i∇ₓE(x) + √(2h_i)·ξ`` of every chain at the current level ``i``
        (``h_i = step_size·(σ_i/σ_L)²``; the gradient at ``σ_i`` for a noise-conditional energy)."""
        level = min(state.n_taken // self.n_steps_each, len(self.sigmas) - 1)
        sigma = self.sigmas[level]
        h = step_size * (sigma / self.sigmas[-1]) ** 2
        x = state.x
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        new = x.add(self._gradient(fns, x, sigma), alpha=-h).add_(noise, alpha=math.sqrt(2.0 * h))
        return AnnealedState(new, state.n_taken + 1), AnnealedInfo(level, sigma)
