"""Equilibrium matching with an explicit energy, EqM-E (Wang & Du 2025, "Equilibrium Matching"): a time-independent
gradient field ``∇ₓE`` learns to point from data towards noise along the interpolants, with a magnitude that vanishes
at the data, so that gradient descent on ``E`` from noise ends at data.

With data ``x``, noise ``ε ~ N(0, s²I)``, ``γ ~ U[0, 1]`` and ``x_γ = γx + (1 − γ)ε``, the loss is
``mean ‖∇ₓE(x_γ) − λ·c(γ)·(ε − x)‖²`` (summed over event dimensions), with the truncated decay
``c(γ) = 1`` for ``γ ≤ a`` and ``(1 − γ)/(1 − a)`` above (the paper's ``a = 0.8``, ``λ = 4``). Samples come from
gradient descent on ``E`` (:func:`descend`, optionally with Nesterov momentum).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ebmcore import EnergyModel, Loss
from ebmcore.errors import InputError
from ebmcore.validation import check_count, check_energy_output, check_generator, check_number, check_positive, check_start

__all__ = ["EquilibriumMatching", "descend"]


class EquilibriumMatching(Loss):
    """``EquilibriumMatching(a=0.8, multiplier=4.0, source_scale=1.0, sample_steps=200, sample_step_size=0.01,
    sample_momentum=0.0)``: EqM-E's loss for any scalar energy (module docstring). ``a`` in ``[0, 1)`` is where the
    target's magnitude starts to decay to zero at the data; the ``sample_*`` settings are those of :meth:`generate`."""

    def __init__(
        self,
        a: float = 0.8,
        multiplier: float = 4.0,
        *,
        source_scale: float = 1.0,
        sample_steps: int = 200,
        sample_step_size: float = 0.01,
        sample_momentum: float = 0.0,
    ) -> None:
        if not (isinstance(a, (int, float)) and 0 <= a < 1):
            raise InputError(f"a must lie in [0, 1), got {a!r}.")
        self.a = float(a)
        self.multiplier = check_positive(multiplier, "multiplier")
        self.source_scale = check_positive(source_scale, "source_scale")
        if not isinstance(sample_steps, int) or sample_steps < 1:
            raise InputError(f"sample_steps must be a positive integer, got {sample_steps!r}.")
        if not 0 <= sample_momentum < 1:
            raise InputError(f"sample_momentum must lie in [0, 1), got {sample_momentum!r}.")
        self.sample_steps, self.sample_momentum = sample_steps, float(sample_momentum)
        self.sample_step_size = check_positive(sample_step_size, "sample_step_size")

    def generate(self, energy: EnergyModel, n: int, like: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``n`` samples ``(n, *like.shape[1:])``: :func:`descend` from the training's noise ``N(0, s²I)`` with the
        ``sample_*`` settings (what ``ebm train`` draws for an image report)."""
        check_generator(generator, like, name="like")
        x0 = self.source_scale * torch.randn((n, *like.shape[1:]), generator=generator, dtype=like.dtype, device=like.device)
        return descend(energy, x0, n_steps=self.sample_steps, step_size=self.sample_step_size, momentum=self.sample_momentum)

    def weight(self, gamma: Tensor) -> Tensor:
        """``λ·c(γ)``: ``λ`` up to ``a``, then falling linearly to 0 at ``γ = 1``. ``gamma: (n,) -> (n,)``."""
        return self.multiplier * torch.where(gamma <= self.a, torch.ones_like(gamma), (1 - gamma) / (1 - self.a))

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        self.check_data(energy, data, generator=generator)
        x = data.detach()
        eps = self.source_scale * torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        gamma = torch.rand((x.shape[0],), generator=generator, dtype=x.dtype, device=x.device)
        g = gamma.view(-1, *([1] * (x.dim() - 1)))
        xg = (g * x + (1 - g) * eps).requires_grad_(True)
        e = check_energy_output(energy.compute_energy(xg), xg, owner=type(energy).__name__)
        (grad,) = torch.autograd.grad(e.sum(), xg, create_graph=True)
        target = self.weight(gamma).view_as(g) * (eps - x)
        return (grad - target).flatten(1).square().sum(1).mean()


def descend(energy: EnergyModel, x0: Tensor, *, n_steps: int = 200, step_size: float = 0.01, momentum: float = 0.0) -> Tensor:
    """EqM's sampler: ``n_steps`` of gradient descent ``x ← x − η∇E(x)`` from ``x0: (n, *event_shape)`` (noise like the
    training's source), with Nesterov ``momentum`` in ``[0, 1)`` (0: plain descent). Returns ``(n, *event_shape)``."""
    check_count(n_steps, "n_steps", minimum=1)
    step_size = check_number(step_size, "step_size", minimum=0)
    momentum = check_number(momentum, "momentum", minimum=0)
    if step_size == 0 or momentum >= 1:
        raise InputError(
            f"descend needs step_size > 0 and momentum in [0, 1), got step_size={step_size!r}, momentum={momentum!r}."
        )
    x = check_start(energy, x0).detach().clone()
    velocity = torch.zeros_like(x)
    for _ in range(n_steps):
        with torch.enable_grad():
            look = (x + momentum * velocity).requires_grad_(True)
            (grad,) = torch.autograd.grad(energy.compute_energy(look).sum(), look)
        velocity = momentum * velocity - step_size * grad
        x = x + velocity
    return x.detach()
