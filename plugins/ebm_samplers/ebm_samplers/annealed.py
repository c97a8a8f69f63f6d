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
from ebmcore.validation import check_gradient_output
from ebm_samplers.algorithm import Algorithm, Step
from ebm_samplers.params import checked, for_chains, optional, positive, whole
from ebm_samplers.sampler import AlgorithmSampler

__all__ = ["State", "Info", "Params", "init", "build_kernel", "geometric_sigmas", "ALGORITHM", "AnnealedLangevinSampler"]


def geometric_sigmas(sigma_max: float = 1.0, sigma_min: float = 0.01, n_levels: int = 10) -> list[float]:
    """``n_levels`` noise levels from ``sigma_max`` down to ``sigma_min``, geometrically spaced."""
    if not (sigma_max > sigma_min > 0) or n_levels < 1:
        raise InputError(f"need sigma_max > sigma_min > 0 and n_levels >= 1, got {sigma_max}, {sigma_min}, {n_levels}.")
    if n_levels == 1:
        return [float(sigma_min)]
    ratio = (sigma_min / sigma_max) ** (1 / (n_levels - 1))
    return [float(sigma_max * ratio**i) for i in range(n_levels)]


@dataclass(frozen=True)
class State:
    """``x: (n, *event_shape)`` and the number of steps taken (which fixes the current level)."""

    x: Tensor
    n_taken: int


@dataclass(frozen=True)
class Info:
    """The level and noise scale of the step just taken."""

    level: int
    sigma: float


@dataclass(frozen=True)
class Params:
    """``step_size``: the last level's, one float for all chains (None: ``0.1·σ_L²``, so that every level's step is a
    tenth of its noise variance)."""

    step_size: float | None = None

    def __post_init__(self) -> None:
        checked(self, step_size=optional(positive))
        if isinstance(self.step_size, Tensor):
            raise InputError("AnnealedLangevinSampler takes one step_size for all chains.")

    def resolve(self, x: Tensor) -> "Params":
        """These params, the step size checked against the states' dtype; the default needs the schedule, so the
        kernel fills it."""
        if self.step_size is not None:
            for_chains(self.step_size, x, "step_size")
        return self


def init(x: Tensor, fns: EnergyFunctions) -> State:
    """The state at ``x: (n_chains, *event_shape)`` with no steps taken (the first level)."""
    return State(x, 0)


def options(
    energy: EnergyModel,
    sigmas: Sequence[float] | None = None,
    n_steps_each: int = 100,
    *,
    sigma_max: float | None = None,
    sigma_min: float | None = None,
    n_levels: int | None = None,
) -> dict[str, Any]:
    """``sigmas``: positive, non-increasing noise levels (default: 10 geometric levels from 1 to 0.01), or
    ``sigma_max``, ``sigma_min`` and ``n_levels`` for :func:`geometric_sigmas` (what a TOML configuration gives);
    ``n_steps_each``: Langevin steps per level; a noise-conditional ``energy`` is called with each level's σ."""
    geometric = (sigma_max, sigma_min, n_levels)
    if any(v is not None for v in geometric):
        if sigmas is not None or any(v is None for v in geometric):
            raise InputError(
                "give sigmas (a list of levels), or all of sigma_max, sigma_min and n_levels (a geometric "
                f"schedule), not a mix; got sigmas={sigmas!r}, sigma_max={sigma_max!r}, "
                f"sigma_min={sigma_min!r}, n_levels={n_levels!r}."
            )
        whole(1)(n_levels, "n_levels")
        sigmas = geometric_sigmas(float(sigma_max), float(sigma_min), n_levels)  # type: ignore[arg-type]
    try:
        levels = [float(s) for s in sigmas] if sigmas is not None else geometric_sigmas()
    except (TypeError, ValueError):
        raise InputError(f"sigmas must be a list of positive, non-increasing numbers, got {sigmas!r}.") from None
    if not levels or any(not (0 < s < math.inf) for s in levels) or any(b > a for a, b in zip(levels, levels[1:])):
        raise InputError(f"sigmas must be positive and non-increasing, got {levels!r}.")
    whole(1)(n_steps_each, "n_steps_each")
    conditional = energy if getattr(energy, "noise_conditional", False) else None
    return {"sigmas": tuple(float(s) for s in levels), "n_steps_each": n_steps_each, "conditional": conditional}


def _level(n_taken: int, sigmas: Sequence[float], n_steps_each: int) -> int:
    return min(n_taken // n_steps_each, len(sigmas) - 1)


def _sigma_for(x: Tensor, sigma: float) -> Tensor:
    return torch.full((x.shape[0],), sigma, dtype=x.dtype, device=x.device)


def build_kernel(sigmas: Sequence[float], n_steps_each: int, conditional: EnergyModel | None = None) -> Step:
    """``step(state, fns, generator, params)``: one Langevin step ``x' = x − h_i∇ₓE(x) + √(2h_i)·ξ`` of every chain
    at the current level ``i`` (``h_i = step_size·(σ_i/σ_L)²``; the gradient at ``σ_i`` for a noise-conditional energy)."""

    def gradient(fns: EnergyFunctions, x: Tensor, sigma: float) -> Tensor:  # at σ for a noise-conditional energy
        if conditional is None:
            return fns.gradient(x)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(conditional.compute_energy(xg, _sigma_for(x, sigma)).sum(), xg)
        return grad

    def step(state: State, fns: EnergyFunctions, generator: torch.Generator | None, params: Params) -> tuple[State, Info]:
        level = _level(state.n_taken, sigmas, n_steps_each)
        sigma = sigmas[level]
        last = 0.1 * sigmas[-1] ** 2 if params.step_size is None else params.step_size
        h = last * (sigma / sigmas[-1]) ** 2
        x = state.x
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        grad = check_gradient_output(gradient(fns, x, sigma), x, owner="the energy")  # shapes only: (n, 1) would broadcast
        new = x.add(grad, alpha=-h).add_(noise, alpha=math.sqrt(2.0 * h))
        return State(new, state.n_taken + 1), Info(level, sigma)

    return step


def energy_of(
    state: State, fns: EnergyFunctions, sigmas: Sequence[float], n_steps_each: int, conditional: EnergyModel | None
) -> Tensor:
    """``E`` at the state's positions, for diagnostics: at the level of the last step for a noise-conditional energy."""
    if conditional is None:
        return fns.energy(state.x)
    sigma = sigmas[_level(max(state.n_taken - 1, 0), sigmas, n_steps_each)]
    return conditional.compute_energy(state.x, _sigma_for(state.x, sigma))


ALGORITHM = Algorithm(
    "annealed_langevin",
    Params,
    init,
    build_kernel,
    has_acceptance=False,
    options=options,
    energy_of=energy_of,
    compile_refusal="its step size and noise level change with the level",
)


class AnnealedLangevinSampler(AlgorithmSampler):
    """Annealed Langevin: ``AnnealedLangevinSampler(energy, sigmas=None, *, n_steps_each=100, step_size=None)``;
    ``sample(x0, total_steps)`` runs the whole schedule (further steps stay at the last level)."""

    algorithm = ALGORITHM
    positional = ("sigmas",)

    @property
    def total_steps(self) -> int:
        """``len(sigmas)·n_steps_each``: the steps of the whole schedule."""
        return len(self.options["sigmas"]) * self.options["n_steps_each"]
