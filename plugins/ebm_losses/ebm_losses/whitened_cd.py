"""``whitened_contrastive_divergence``: persistent contrastive divergence at temperature 1 for an energy with a fitted
Gaussian base (:class:`ebm_losses.gaussian_residual.GaussianResidualEnergy`), its chains run by MALA in the base's
whitened coordinates ``z = L⁻¹(x − μ)``, where the base is ``N(0, I)`` and one step size suits every direction.

The loss is ``mean E(x⁺) − mean E(x⁻) + α·mean(g(z⁺)² + g(z⁻)²)``: data ``x⁺`` (dequantised by uniform noise of
one pixel step, so the density cannot grow spikes on the pixel grid), negatives ``x⁻`` from ``n_steps`` MALA steps
of persistent chains (a ``reinit_fraction`` restarted from the base Gaussian each call), ``g`` the learned
correction, kept small by ``α`` so that the model stays close enough to its base for AIS from the base to converge.
MALA is Metropolis-adjusted: its chains target ``exp(−E)`` itself, not a tempered or step-biased version of it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyFunctions, EnergyModel, Loss
from ebmcore.errors import InputError
from ebmcore.validation import check_number, check_positive
from ebm_samplers import mala
from ebm_samplers.algorithm import GradientState
from ebm_samplers.params import with_fields

__all__ = ["WhitenedContrastiveDivergence"]


class WhitenedContrastiveDivergence(Loss):
    """``WhitenedContrastiveDivergence(n_steps=10, *, step_size=0.3, target_accept=0.6, buffer_size=2000,
    reinit_fraction=0.05, regularization=0.1, dequantize=0.125, sample_steps=1000)`` for an energy with ``whiten(x)
    -> z: (n, d)``, ``unwhiten(z)``, ``whitened_energy(z): (n,)`` and a ``correction`` energy of ``z``
    (``gaussian_residual``).

    ``step_size`` is MALA's first step in whitened units, adapted after each call towards ``target_accept``;
    ``buffer_size`` persistent chains ``(buffer_size, d)`` start from the base (``N(0, I)``, or the energy's
    ``sample_base``: a fitted mixture); ``dequantize`` is the
    width of the uniform noise added to each data coordinate (the pixel step: ``2/16`` for the digits on ``[−1, 1]``;
    0: none). :meth:`generate` draws fresh samples of ``exp(−E)``: ``sample_steps`` MALA steps from the base's.
    The chains and the step size are part of :meth:`state_dict`."""

    def __init__(
        self,
        n_steps: int = 10,
        *,
        step_size: float = 0.3,
        target_accept: float = 0.6,
        buffer_size: int = 2000,
        reinit_fraction: float = 0.05,
        regularization: float = 0.1,
        dequantize: float = 0.125,
        sample_steps: int = 1000,
    ) -> None:
        for name, value in (("n_steps", n_steps), ("buffer_size", buffer_size), ("sample_steps", sample_steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}.")
        if not (isinstance(target_accept, (int, float)) and 0 < target_accept < 1):
            raise InputError(f"target_accept must be in (0, 1), got {target_accept!r}.")
        if not (isinstance(reinit_fraction, (int, float)) and 0 <= reinit_fraction <= 1):
            raise InputError(f"reinit_fraction must be in [0, 1], got {reinit_fraction!r}.")
        self.n_steps, self.buffer_size, self.sample_steps = n_steps, buffer_size, sample_steps
        self.step_size = check_positive(step_size, "step_size")
        self.target_accept = float(target_accept)
        self.reinit_fraction = float(reinit_fraction)
        self.regularization = check_number(regularization, "regularization", minimum=0)
        self.dequantize = check_number(dequantize, "dequantize", minimum=0)
        self.chains: Tensor | None = None  # the persistent chains, in whitened coordinates (buffer_size, d)
        self.acceptance: float | None = None  # the last call's mean MALA acceptance
        self.last_negatives: Tensor | None = None
        self._kernel = mala.build_kernel()

    @staticmethod
    def _check(energy: EnergyModel) -> None:
        missing = [name for name in ("whiten", "unwhiten", "whitened_energy", "correction") if not hasattr(energy, name)]
        if missing:
            raise InputError(
                f"whitened_contrastive_divergence needs an energy with a fitted base in whitened "
                f"coordinates (gaussian_residual); {type(energy).__name__} lacks {', '.join(missing)}."
            )
        if not bool(getattr(energy, "fitted", True)):
            raise InputError(
                f"whitened_contrastive_divergence: the base of {type(energy).__name__} is not fitted, so it "
                "would train against N(0, I) in pixel space; call energy.fit_base(train) first (ebm train "
                "does so before the first step)."
            )

    @staticmethod
    def _functions(energy: EnergyModel) -> EnergyFunctions:
        """``z -> (½|z|² + g(z), its gradient)``, detached, by autograd."""

        def energy_and_gradient(z: Tensor) -> tuple[Tensor, Tensor]:
            with torch.enable_grad():
                z = z.detach().requires_grad_(True)
                e = energy.whitened_energy(z)
                (grad,) = torch.autograd.grad(e.sum(), z)
            return e.detach(), grad

        def value(z: Tensor) -> Tensor:
            with torch.no_grad():
                return energy.whitened_energy(z)

        return EnergyFunctions(value, lambda z: energy_and_gradient(z)[1], energy_and_gradient, "autograd")

    def _mala(self, energy: EnergyModel, z: Tensor, n_steps: int, generator: torch.Generator | None, adapt: bool) -> Tensor:
        """``n_steps`` MALA steps of ``exp(−whitened_energy)`` from ``z: (n, d)``; with ``adapt``, the step size moves
        towards ``target_accept`` after each step (from the batch's mean acceptance)."""
        fns = self._functions(energy)
        e, grad = fns.energy_and_gradient(z)
        state = GradientState(z.detach(), e, grad)
        params = mala.Params().resolve(z)
        total = 0.0
        for _ in range(n_steps):
            state, info = self._kernel(state, fns, generator, with_fields(params, step_size=self.step_size))
            accept = float(info.acceptance_prob.mean())
            total += accept
            if adapt:
                self.step_size *= math.exp(0.5 * (accept - self.target_accept))
        self.acceptance = total / n_steps
        return state.x.detach()

    @staticmethod
    def _base(energy: EnergyModel, n: int, d: int, like: Tensor, generator: torch.Generator | None) -> Tensor:
        """``n`` draws of the energy's base in whitened coordinates (``sample_base``, e.g. a fitted mixture), else of
        ``N(0, I)``: ``(n, d)``."""
        if callable(getattr(energy, "sample_base", None)):
            return energy.sample_base(n, generator, like=like)
        return torch.randn((n, d), generator=generator, dtype=like.dtype, device=like.device)

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        self.check_data(energy, data, generator=generator)
        self._check(energy)
        n = data.shape[0]
        if self.dequantize:
            data = (
                data + (torch.rand(data.shape, generator=generator, dtype=data.dtype, device=data.device) - 0.5) * self.dequantize
            )
        z_pos = energy.whiten(data)
        d = z_pos.shape[1]
        if self.chains is None:
            self.chains = self._base(energy, self.buffer_size, d, data, generator)
        index = torch.randint(0, self.buffer_size, (n,), generator=generator, device=data.device)
        restart = torch.rand(n, generator=generator, device=data.device) < self.reinit_fraction
        fresh = self._base(energy, n, d, data, generator)
        starts = torch.where(restart[:, None], fresh, self.chains[index])
        z_neg = self._mala(energy, starts, self.n_steps, generator, adapt=True)
        self.chains[index] = z_neg
        self.last_negatives = energy.unwhiten(z_neg)
        g = energy.correction.compute_energy(torch.cat((z_pos, z_neg)))
        g_pos, g_neg = g[:n], g[n:]
        # ½|z|² and log Z_G carry no parameter: E(x⁺) − E(x⁻) has the gradient of g(z⁺) − g(z⁻); the value reported
        # is the energies' difference
        with torch.no_grad():
            quadratic = 0.5 * (z_pos.square().sum(1).mean() - z_neg.square().sum(1).mean())
        loss = g_pos.mean() - g_neg.mean() + quadratic
        if self.regularization:
            loss = loss + self.regularization * (g_pos.square().mean() + g_neg.square().mean())
        return loss

    def generate(self, energy: EnergyModel, n: int, like: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``n`` samples of ``exp(−E)``: ``sample_steps`` MALA steps (at the trained step size, not adapted) from exact
        samples of the base (the Gaussian, or the energy's ``sample_base``); ``(n, *event_shape)``, like ``like``'s dtype and device."""
        self._check(energy)
        d = math.prod(like.shape[1:])
        z = self._base(energy, n, d, like, generator)
        with torch.no_grad():
            return energy.unwhiten(self._mala(energy, z, self.sample_steps, generator, adapt=False))

    def negatives_report(self) -> dict[str, Any]:
        """How the negatives were drawn, for ``metrics.json``."""
        return {
            "sampler": "mala in the base's whitened coordinates",
            "n_steps": self.n_steps,
            "step_size": self.step_size,
            "acceptance": self.acceptance,
            "persistent_chains": self.buffer_size,
            "reinit_fraction": self.reinit_fraction,
            "samples_model_density": True,
            "why": "Metropolis-adjusted chains at temperature 1 target exp(-E) itself; persistent, so they are "
            "near equilibrium only as far as the model moves slowly",
        }

    def state_dict(self) -> dict[str, Any]:
        return {"chains": self.chains, "step_size": self.step_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.chains = state["chains"]
        self.step_size = float(state["step_size"])
