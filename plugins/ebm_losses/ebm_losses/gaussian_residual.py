"""``gaussian_residual``: an energy whose base is a normalised Gaussian fitted to the training data, plus a learned
correction, ``E(x) = ½|z|² + log Z_G + g_θ(z)`` with ``z = L⁻¹(x − μ)`` the whitened input (``Σ = LLᵀ``).

At ``g_θ = 0`` the model *is* the fitted Gaussian, normalised (``log Z = 0``); the correction's last layer starts
at zero, so training starts from the Gaussian's held-out log-likelihood and AIS can anneal from the Gaussian
itself (:meth:`GaussianResidualEnergy.ais_base`), which converges while the correction stays moderate.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from ebmcore import EnergyModel, MLPEnergy
from ebmcore.errors import InputError

__all__ = ["GaussianResidualEnergy"]


class GaussianResidualEnergy(EnergyModel):
    """``GaussianResidualEnergy(event_shape=(1, 8, 8), hidden=(256, 256), activation="silu", *, covariance="full",
    seed=0)``: ``E(x) = ½|z|² + log Z_G + g_θ(z)``, ``x: (n, *event_shape) -> (n,)``, where ``z = L⁻¹(x − μ): (n, d)``
    (``d = prod(event_shape)``), ``log Z_G = Σᵢ log Lᵢᵢ + ½·d·log 2π`` and ``g_θ`` an :class:`~ebmcore.MLPEnergy`
    ``d → hidden → 1`` whose last layer starts at zero.

    ``μ: (d,)`` and ``L: (d, d)`` (lower triangular; diagonal with ``covariance="diagonal"``) are buffers set by
    ``fit_base`` from the training data (``ebm train`` calls it before the first step; a checkpoint keeps them):
    until then ``μ = 0``, ``L = I``. ``exp(−E)`` integrates to ``exp(−g)``'s mean under the Gaussian, 1 at
    ``g = 0``."""

    def __init__(
        self,
        event_shape: Sequence[int] = (1, 8, 8),
        hidden: Sequence[int] = (256, 256),
        activation: str = "silu",
        *,
        covariance: str = "full",
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        shape = tuple(event_shape) if isinstance(event_shape, (list, tuple)) else ()
        if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
            raise InputError(
                f"GaussianResidualEnergy: event_shape must be positive integers, e.g. [1, 8, 8], got {event_shape!r}."
            )
        if covariance not in ("full", "diagonal"):
            raise InputError(f"GaussianResidualEnergy: covariance must be 'full' or 'diagonal', got {covariance!r}.")
        self.event_shape = shape
        self.covariance = covariance
        d = math.prod(shape)
        self.dim = d
        self.correction = MLPEnergy(dim=d, hidden=tuple(hidden), activation=activation, seed=seed)
        last = [m for m in self.correction.modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.zero_()
        self.register_buffer("loc", torch.zeros(d))
        self.register_buffer("scale_tril", torch.eye(d))
        self.register_buffer("inverse_tril", torch.eye(d))
        self.register_buffer("fitted", torch.tensor(False))

    def fit_base(self, train: Tensor, ridge: float | None = None) -> "GaussianResidualEnergy":
        """Set ``μ`` and ``L`` to the maximum-likelihood Gaussian of ``train: (n, *event_shape)`` (``covariance``: full
        or diagonal) with ``ridge`` added to the variances; default ``δ²/12``, ``δ`` the data's pixel step
        (:func:`ebm_losses.likelihood.quantum`), as the project's Gaussian baselines do. Returns ``self``."""
        from ebm_losses.likelihood import quantum

        if tuple(train.shape[1:]) != self.event_shape or train.shape[0] < 2:
            raise InputError(
                f"GaussianResidualEnergy.fit_base: train must have shape (n >= 2, "
                f"{', '.join(map(str, self.event_shape))}), got {tuple(train.shape)}."
            )
        if ridge is None:
            step = quantum(train)
            ridge = step * step / 12 if step is not None else 1e-6
        x = train.detach().flatten(1).double()
        centred = x - x.mean(0)
        if self.covariance == "diagonal":
            cov = torch.diag(centred.square().mean(0) + ridge)
        else:
            cov = centred.T @ centred / x.shape[0] + ridge * torch.eye(self.dim, dtype=x.dtype, device=x.device)
        chol, info = torch.linalg.cholesky_ex(cov)
        if int(info) != 0:
            raise InputError("GaussianResidualEnergy.fit_base: the covariance is singular; give a ridge > 0.")
        inverse = torch.linalg.solve_triangular(chol, torch.eye(self.dim, dtype=x.dtype, device=x.device), upper=False)
        with torch.no_grad():
            self.loc.copy_(x.mean(0))
            self.scale_tril.copy_(chol)
            self.inverse_tril.copy_(inverse)
            self.fitted.fill_(True)
        return self

    def log_normalizer(self) -> Tensor:
        """``log Z_G = Σᵢ log Lᵢᵢ + ½·d·log 2π``, the Gaussian's: ``()``."""
        return self.scale_tril.diagonal().log().sum() + 0.5 * self.dim * math.log(2 * math.pi)

    def whiten(self, x: Tensor) -> Tensor:
        """``z = L⁻¹(x − μ)``: ``(n, *event_shape) -> (n, d)``."""
        return (x.flatten(1) - self.loc) @ self.inverse_tril.T

    def unwhiten(self, z: Tensor) -> Tensor:
        """``x = μ + Lz``: ``(n, d) -> (n, *event_shape)``."""
        return (self.loc + z @ self.scale_tril.T).reshape(z.shape[0], *self.event_shape)

    def whitened_energy(self, z: Tensor) -> Tensor:
        """``½|z|² + g_θ(z)``: ``(n, d) -> (n,)``, the energy in whitened coordinates without its constants
        (``E(x) = whitened_energy(z) + log Z_G``); what the negatives are sampled on."""
        return 0.5 * z.square().sum(1) + self.correction.compute_energy(z)

    def ais_base(self) -> tuple[Tensor, Tensor]:
        """``(μ: (d,), L: (d, d))``: the fitted Gaussian, the base AIS anneals from (its ``log Z`` is known)."""
        return self.loc, self.scale_tril

    def compute_energy(self, x: Tensor) -> Tensor:
        if tuple(x.shape[1:]) != self.event_shape:
            raise InputError(
                f"GaussianResidualEnergy: x has event shape {tuple(x.shape[1:])}, the energy "
                f"{self.event_shape}; give x of shape (n, {', '.join(map(str, self.event_shape))})."
            )
        return self.whitened_energy(self.whiten(x)) + self.log_normalizer()

    def extra_repr(self) -> str:
        return f"event_shape={self.event_shape}, covariance={self.covariance!r}, fitted={bool(self.fitted)}"
