"""Parallel tempering (replica exchange): replicas of every chain at temperatures ``1 = T₁ < … < T_K``
move with any base sampler, and adjacent replicas swap states with probability
``min(1, exp((E_k − E_{k+1})(1/T_k − 1/T_{k+1})))``. Samples are the ``T = 1`` replicas.

Replicas are rows of one batch (replica-major, ``K·n`` rows) with a per-row temperature, so one
base step moves all of them. Each step attempts every adjacent pair: even pairs, then odd pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, registry
from ebmcore.errors import InputError
from ebm_samplers.base import MCMCSampler

__all__ = ["TemperingState", "TemperingInfo", "ParallelTemperingSampler", "geometric_temperatures"]


def geometric_temperatures(n_replicas: int, max_temperature: float) -> list[float]:
    """``n_replicas`` temperatures from 1 to ``max_temperature``, geometrically spaced."""
    if n_replicas == 1:
        return [1.0]
    return [float(max_temperature ** (k / (n_replicas - 1))) for k in range(n_replicas)]


@dataclass(frozen=True)
class TemperingState:
    """``replicas``: the base sampler's state over ``K·n`` rows (replica-major); ``x`` is the ``T = 1`` block."""

    replicas: Any
    n_chains: int

    @property
    def x(self) -> Tensor:
        return self.replicas.x[: self.n_chains]

    @property
    def energy(self) -> Tensor:
        return self.replicas.energy[: self.n_chains]


@dataclass(frozen=True)
class TemperingInfo:
    """``swap_accepted: (K−1, n)`` per adjacent pair and chain; ``base``: the base sampler's info for
    all replicas; ``accepted``/``divergent``: the base's, for the ``T = 1`` replicas."""

    swap_accepted: Tensor
    base: Any
    accepted: Tensor | None
    divergent: Tensor | None


def _swap(state: Any, n: int, k: int, accept: Tensor) -> Any:
    """Exchange the rows of replica blocks ``k`` and ``k+1`` where ``accept`` (``(n,)``)."""
    fields = {}
    for name, value in vars(state).items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] >= (k + 2) * n:
            a, b = value[k * n:(k + 1) * n], value[(k + 1) * n:(k + 2) * n]
            mask = accept.view(-1, *([1] * (a.dim() - 1)))
            new = value.clone()
            new[k * n:(k + 1) * n] = torch.where(mask, b, a)
            new[(k + 1) * n:(k + 2) * n] = torch.where(mask, a, b)
            fields[name] = new
        else:
            fields[name] = value
    return type(state)(**fields)


class ParallelTemperingSampler(MCMCSampler):
    """Replica exchange around a base sampler given by name (built on the same energy with
    ``base_options``) or as a ready object-API sampler.

    ``temperatures`` (ascending, starting at 1) default to ``n_replicas`` geometric steps up to
    ``max_temperature``. Returned samples, trajectory and diagnostics are those of ``T = 1``.
    """

    name = "parallel_tempering"
    uses_noise_buffer = False
    compile_refusal = "compile its base sampler instead (base_options={'compile': True})"

    def __init__(self, energy: EnergyModel, base: Any = "mala", *, temperatures: list[float] | None = None,
                 n_replicas: int = 4, max_temperature: float = 10.0, base_options: dict[str, Any] | None = None,
                 **options: Any) -> None:
        super().__init__(energy, **options)
        temps = temperatures if temperatures is not None else geometric_temperatures(n_replicas, max_temperature)
        if len(temps) < 2 or abs(temps[0] - 1.0) > 1e-12 or any(b <= a for a, b in zip(temps, temps[1:])):
            raise InputError(f"temperatures must be ascending, start at 1 and number at least 2, got {temps!r}.")
        self.temperatures = [float(t) for t in temps]
        self.base = registry.get("sampler", base)(energy, **(base_options or {})) if isinstance(base, str) else base
        if not isinstance(self.base, MCMCSampler) or self.base.energy is not energy:
            raise InputError("base must be a registered sampler name or an object-API sampler on the same energy.")
        if not (self.base.has_acceptance and self.base.uses_noise_buffer is not None and hasattr(self.base, "temperature")):
            raise InputError(f"parallel tempering needs a base sampler with a temperature whose state carries the energy "
                             f"(mala, hmc or nuts); {type(self.base).__name__} is not one.")
        self.has_acceptance = self.base.has_acceptance

    def _temperatures(self, n: int, like: Tensor) -> Tensor:
        return torch.tensor(self.temperatures, dtype=like.dtype, device=like.device).repeat_interleave(n)

    def tunables(self, x: Tensor, overrides: dict[str, Any]) -> dict[str, Any]:
        """Accepts the base sampler's tunables, validated by its ``tunables`` for the ``K·n`` replica rows with the
        replicas' per-row temperatures (a ``temperature`` override is replaced); adds ``inv_temperatures: (K,)``."""
        n, k = x.shape[0], len(self.temperatures)
        replicas = x.repeat(k, *([1] * (x.dim() - 1)))
        params = self.base.tunables(replicas, dict(overrides, temperature=self._temperatures(n, x)))
        return {"base_params": params, "inv_temperatures": 1.0 / torch.tensor(self.temperatures, dtype=torch.float64)}

    def init_state(self, x: Tensor, fns: EnergyFunctions) -> TemperingState:
        """Every replica starts at ``x: (n_chains, *event_shape)``: the base sampler's state over ``K·n_chains`` rows."""
        replicas = x.repeat(len(self.temperatures), *([1] * (x.dim() - 1)))
        return TemperingState(self.base.init_state(replicas, fns), x.shape[0])

    def step_fn(self, state: TemperingState, fns: EnergyFunctions, *, base_params: dict[str, Any],
                inv_temperatures: Tensor, generator: torch.Generator | None = None) -> tuple[TemperingState, TemperingInfo]:
        """One base step of all ``K·n`` replicas, then a swap attempt for every adjacent pair of temperatures
        (even pairs, then odd pairs)."""
        n, k = state.n_chains, len(self.temperatures)
        replicas, base_info = self.base.step_fn(state.replicas, fns, generator=generator, **base_params)
        acc = torch.promote_types(replicas.x.dtype, torch.float32)
        swaps = torch.zeros((k - 1, n), dtype=torch.bool, device=replicas.x.device)
        gaps = (inv_temperatures[:-1] - inv_temperatures[1:]).tolist()  # Python floats: no sync in the loop
        for parity in (0, 1):
            for pair in range(parity, k - 1, 2):
                e = replicas.energy.to(acc)
                e_lo, e_hi = e[pair * n:(pair + 1) * n], e[(pair + 1) * n:(pair + 2) * n]
                log_ratio = (e_lo - e_hi) * gaps[pair]
                u = torch.rand(n, generator=generator, device=replicas.x.device, dtype=acc)
                accept = torch.isfinite(log_ratio) & (u.log() < log_ratio)
                replicas = _swap(replicas, n, pair, accept)
                swaps[pair] = accept
        accepted = getattr(base_info, "accepted", None)
        divergent = getattr(base_info, "divergent", None)
        return TemperingState(replicas, n), TemperingInfo(swaps, base_info, None if accepted is None else accepted[:n],
                                                          None if divergent is None else divergent[:n])
