"""The state shared by the samplers that accept or reject (MALA, HMC, NUTS), and their divergence threshold."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ebmcore import EnergyFunctions

__all__ = ["GradientState", "init_gradient_state", "DIVERGENCE_THRESHOLD"]

DIVERGENCE_THRESHOLD = 1000.0
"""A transition whose energy error (``−log`` of its acceptance ratio) exceeds this is divergent (as in Stan)."""


@dataclass(frozen=True)
class GradientState:
    """``x: (n, *event_shape)``, ``energy = E(x): (n,)``, ``grad = ∇E(x)`` like ``x``: what the next
    step needs, so that an accepted proposal costs no recomputation."""

    x: Tensor
    energy: Tensor
    grad: Tensor


def init_gradient_state(x: Tensor, fns: EnergyFunctions) -> GradientState:
    """The state at ``x`` (one energy-and-gradient evaluation)."""
    energy, grad = fns.energy_and_gradient(x)
    return GradientState(x, energy, grad)
