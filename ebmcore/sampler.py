"""The sampler base class: ``init(x) -> state`` and ``step(state) -> (state, info)`` over a batch of chains."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch
from torch import Tensor

from ebmcore.energies.base import EnergyModel
from ebmcore.errors import InputError
from ebmcore.validation import check_finite

__all__ = ["Sampler", "SamplerState"]


class SamplerState(Protocol):
    """Any sampler state: a plain container whose ``x: (n_chains, *event_shape)`` are the current positions."""

    x: Tensor


class Sampler(ABC):
    """Draws samples from ``p(x) ∝ exp(−E(x))`` with many chains in parallel.

    A sampler *uses* an energy, it never owns it: it is not an ``nn.Module``,
    so moving or casting a sampler cannot touch the model. Subclasses
    implement :meth:`init` and :meth:`step`; tunables are arguments of
    ``step``, so adaptation can change them every step.
    """

    def __init__(self, energy: EnergyModel) -> None:
        if not isinstance(energy, EnergyModel):
            raise InputError(
                f"{type(self).__name__} needs an ebmcore.EnergyModel, got {type(energy).__name__}; "
                "subclass EnergyModel and implement compute_energy(x)."
            )
        self.energy = energy

    @abstractmethod
    def init(self, x: Tensor) -> SamplerState:
        """The state at positions ``x: (n_chains, *event_shape)`` (energy and gradient included where needed)."""

    @abstractmethod
    def step(self, state: Any, *, generator: torch.Generator | None = None, **tunables: Any) -> tuple[Any, Any]:
        """One transition of every chain: ``(new_state, info)``. No host sync, no hook call."""

    def check_initial_state(self, x0: Tensor) -> Tensor:
        """Check ``x0`` against the energy (shape, dtype, device) and that it is finite (one sync)."""
        self.energy.validate(x0, name="x0")
        return check_finite(x0, what="initial state x0", fix="Start every chain from a finite point.")

    def sample(self, x0: Tensor, n_steps: int, *, generator: torch.Generator | None = None) -> Tensor:
        """Run ``n_steps`` transitions from ``x0: (n_chains, *event_shape)``; return the final positions."""
        if not isinstance(n_steps, int) or n_steps < 0:
            raise InputError(f"n_steps must be a non-negative integer, got {n_steps!r}.")
        state = self.init(self.check_initial_state(x0))
        for _ in range(n_steps):
            state, _ = self.step(state, generator=generator)
        return state.x
