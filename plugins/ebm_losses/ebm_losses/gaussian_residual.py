"""``gaussian_residual``: an energy whose base is a normalised Gaussian fitted to the training data, plus a learned
correction, ``E(x) = ½|z|² + log Z_G + g_θ(z)`` with ``z = L⁻¹(x − μ)`` the whitened input (``Σ = LLᵀ``).

At ``g_θ = 0`` the model *is* the fitted Gaussian, normalised (``log Z = 0``); the correction's last layer starts
at zero, so training starts from the Gaussian's held-out log-likelihood and AIS can anneal from the Gaussian
itself (:meth:`GaussianResidualEnergy.ais_base`), which converges while the correction stays moderate.

With ``components = K > 1`` the base is a ``K``-component Gaussian mixture fitted to the training data (scikit-learn's
``GaussianMixture``, full covariances) instead: ``E(x) = −log p_mix(x) + g_θ(z)``, ``z`` still whitened by the single
Gaussian. Its exact samples (:meth:`GaussianResidualEnergy.sample_base`) start the chains, and AIS and the
importance-sampling cross-check start from the mixture itself (:meth:`GaussianResidualEnergy.exact_base`).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from ebmcore import EnergyModel, MLPEnergy
from ebmcore.errors import InputError
from ebm_samplers.ais import ExactBase

__all__ = ["GaussianResidualEnergy"]


class GaussianResidualEnergy(EnergyModel):
    """``GaussianResidualEnergy(event_shape=(1, 8, 8), hidden=(256, 256), activation="silu", *, covariance="full",
    seed=0, components=1, ridge=None)``: ``E(x) = ½|z|² + log Z_G + g_θ(z)``, ``x: (n, *event_shape) -> (n,)``, where ``z = L⁻¹(x − μ): (n, d)``
    (``d = prod(event_shape)``), ``log Z_G = Σᵢ log Lᵢᵢ + ½·d·log 2π`` and ``g_θ`` an :class:`~ebmcore.MLPEnergy`
    ``d → hidden → 1`` whose last layer starts at zero.

    ``μ: (d,)`` and ``L: (d, d)`` (lower triangular; diagonal with ``covariance="diagonal"``) are buffers set by
    ``fit_base`` from the training data (``ebm train`` calls it before the first step; a checkpoint keeps them):
    until then ``μ = 0``, ``L = I``. ``exp(−E)`` integrates to ``exp(−g)``'s mean under the Gaussian, 1 at
    ``g = 0``.

    ``components = K > 1``: ``½|z|²`` becomes ``−log Σₖ πₖ N(z; mₖ, CₖCₖᵀ) − ½·d·log 2π``, the mixture fitted by
    ``fit_base`` seen in the whitened coordinates (``mₖ = L⁻¹(μₖ − μ)``, ``Cₖ = L⁻¹Lₖ``), so at ``g = 0`` the model is the
    fitted mixture, normalised. ``ridge`` (default ``δ²/12``, see ``fit_base``) is added to every variance."""

    def __init__(
        self,
        event_shape: Sequence[int] = (1, 8, 8),
        hidden: Sequence[int] = (256, 256),
        activation: str = "silu",
        *,
        covariance: str = "full",
        seed: int | None = 0,
        components: int = 1,
        ridge: float | None = None,
    ) -> None:
        super().__init__()
        shape = tuple(event_shape) if isinstance(event_shape, (list, tuple)) else ()
        if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
            raise InputError(
                f"GaussianResidualEnergy: event_shape must be positive integers, e.g. [1, 8, 8], got {event_shape!r}."
            )
        if covariance not in ("full", "diagonal"):
            raise InputError(f"GaussianResidualEnergy: covariance must be 'full' or 'diagonal', got {covariance!r}.")
        if not isinstance(components, int) or isinstance(components, bool) or components < 1:
            raise InputError(f"GaussianResidualEnergy: components must be a positive integer, got {components!r}.")
        if components > 1 and covariance != "full":
            raise InputError(
                "GaussianResidualEnergy: a mixture base (components > 1) has full covariances; set covariance = 'full'."
            )
        if ridge is not None and not (isinstance(ridge, (int, float)) and not isinstance(ridge, bool) and ridge >= 0):
            raise InputError(f"GaussianResidualEnergy: ridge must be a number >= 0 or omitted, got {ridge!r}.")
        self.event_shape = shape
        self.components = components
        self.ridge = None if ridge is None else float(ridge)
        self.covariance = covariance
        d = math.prod(shape)
        self.dim = d
        self._seed = 0 if seed is None else int(seed)
        self.correction = MLPEnergy(dim=d, hidden=tuple(hidden), activation=activation, seed=seed)
        last = [m for m in self.correction.modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.zero_()
        self.register_buffer("loc", torch.zeros(d))
        self.register_buffer("scale_tril", torch.eye(d))
        self.register_buffer("inverse_tril", torch.eye(d))
        self.register_buffer("fitted", torch.tensor(False))
        if components > 1:  # the mixture in whitened coordinates: means mₖ, Cₖ⁻¹, Cₖ, log πₖ − Σ log diag Cₖ
            self.register_buffer("mix_loc", torch.zeros(components, d))
            self.register_buffer("mix_inverse", torch.eye(d).repeat(components, 1, 1))
            self.register_buffer("mix_scale", torch.eye(d).repeat(components, 1, 1))
            self.register_buffer("mix_log_weight", torch.full((components,), -math.log(components)))

    def fit_base(self, train: Tensor, ridge: float | None = None) -> "GaussianResidualEnergy":
        """Set ``μ`` and ``L`` to the maximum-likelihood Gaussian of ``train: (n, *event_shape)`` (``covariance``: full
        or diagonal) with ``ridge`` added to the variances; default ``δ²/12``, ``δ`` the data's pixel step
        (:func:`ebm_losses.likelihood.quantum`), as the project's Gaussian baselines do. Returns ``self``."""
        from ebm_losses.likelihood import quantum

        ridge = self.ridge if ridge is None else ridge
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
        if self.components > 1:
            self._fit_mixture(x, ridge)
        return self

    def _fit_mixture(self, x: Tensor, ridge: float) -> None:
        """The ``components``-component mixture of ``x: (n, d)`` (float64), ``reg_covar = ridge``, seeded by the
        correction's seed, stored in the whitened coordinates."""
        try:
            from sklearn.mixture import GaussianMixture
        except ImportError:
            raise InputError(
                "GaussianResidualEnergy: a mixture base needs scikit-learn: pip install 'ebm-losses[images]'."
            ) from None
        fit = GaussianMixture(
            self.components, covariance_type="full", reg_covar=max(ridge, 1e-10), random_state=self._seed, max_iter=200
        ).fit(x.cpu().numpy())
        means = torch.as_tensor(fit.means_, dtype=x.dtype, device=x.device)
        chols = torch.linalg.cholesky(torch.as_tensor(fit.covariances_, dtype=x.dtype, device=x.device))
        scale = self.inverse_tril.to(x.dtype) @ chols  # Cₖ = L⁻¹Lₖ, lower triangular
        eye = torch.eye(self.dim, dtype=x.dtype, device=x.device)
        with torch.no_grad():
            self.mix_loc.copy_((means - self.loc.to(x.dtype)) @ self.inverse_tril.to(x.dtype).T)
            self.mix_scale.copy_(scale)
            self.mix_inverse.copy_(torch.linalg.solve_triangular(scale, eye.expand_as(scale), upper=False))
            weights = torch.as_tensor(fit.weights_, dtype=x.dtype, device=x.device)
            self.mix_log_weight.copy_(weights.log() - scale.diagonal(dim1=1, dim2=2).log().sum(1))

    def base_energy(self, z: Tensor) -> Tensor:
        """The base's whitened energy: ``½|z|²``, or for a mixture ``−log Σₖ πₖ N(z; mₖ, CₖCₖᵀ) − ½·d·log 2π``:
        ``(n, d) -> (n,)``."""
        if self.components == 1:
            return 0.5 * z.square().sum(1)
        u = torch.einsum("kij,nkj->nki", self.mix_inverse, z[:, None, :] - self.mix_loc)
        return -torch.logsumexp(self.mix_log_weight - 0.5 * u.square().sum(2), dim=1)

    def sample_base(self, n: int, generator: torch.Generator | None = None, *, like: Tensor | None = None) -> Tensor:
        """``n`` exact samples of the base in whitened coordinates: ``(n, d)`` (``N(0, I)``, or the mixture)."""
        dtype, device = (like.dtype, like.device) if like is not None else (self.loc.dtype, self.loc.device)
        eps = torch.randn((n, self.dim), generator=generator, dtype=dtype, device=device)
        if self.components == 1:
            return eps
        probs = (self.mix_log_weight + self.mix_scale.diagonal(dim1=1, dim2=2).log().sum(1)).softmax(0)
        k = torch.multinomial(probs.to(device), n, replacement=True, generator=generator)
        return self.mix_loc[k].to(dtype) + torch.einsum("nij,nj->ni", self.mix_scale[k].to(dtype), eps)

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
        """``½|z|² + g_θ(z)`` (a mixture base: :meth:`base_energy` ``+ g_θ(z)``): ``(n, d) -> (n,)``, the energy in
        whitened coordinates without its constants (``E(x) = whitened_energy(z) + log Z_G``); what the negatives are
        sampled on."""
        return self.base_energy(z) + self.correction.compute_energy(z)

    def exact_base(self) -> ExactBase | None:
        """A mixture base in the whitened coordinates, for AIS and importance sampling to start from exactly
        (:class:`ebm_samplers.ais.ExactBase`): :meth:`base_energy`, :meth:`sample_base` and ``log Z₀ = ½·d·log 2π``
        (the mixture's ``E₀`` carries its own normalisation, so ``exp(−E₀)`` integrates to ``(2π)^{d/2}``, as
        ``N(0, I)``'s does). None for one component: the base is then ``N(0, I)``, the estimators' own default."""
        if self.components == 1:
            return None
        return ExactBase(
            self.base_energy, lambda n, generator: self.sample_base(n, generator), 0.5 * self.dim * math.log(2 * math.pi)
        )

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
        mixture = f", components={self.components}" if self.components > 1 else ""
        return f"event_shape={self.event_shape}, covariance={self.covariance!r}{mixture}, fitted={bool(self.fitted)}"
