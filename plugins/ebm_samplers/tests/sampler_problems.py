"""Reusable test problems with known answers (exact moments, quadrature)."""

from __future__ import annotations

import math

import torch

import ebmcore


def correlated_gaussian(dim: int = 10, seed: int = 0) -> ebmcore.GaussianEnergy:
    """A float64 Gaussian with random rotation, eigenvalues of Σ in [0.5, 2] and a non-zero mean."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    eigen = torch.linspace(0.5, 2.0, dim, dtype=torch.float64)
    cov = q @ torch.diag(eigen) @ q.T
    mean = torch.randn(dim, generator=g, dtype=torch.float64) * 0.5
    return ebmcore.GaussianEnergy(mean, covariance=0.5 * (cov + cov.T))


class Banana(ebmcore.EnergyModel):
    """x₁ ~ N(0, 1), x₂ | x₁ ~ N(x₁², σ²): E[x₂] = 1, Var[x₂] = 2 + σ², E[x₁²x₂] = 3 (autograd gradient)."""

    event_shape = (2,)

    def __init__(self, sigma: float = 1.0) -> None:
        super().__init__()
        self.sigma = sigma

    def compute_energy(self, x):
        return 0.5 * x[:, 0] ** 2 + 0.5 * ((x[:, 1] - x[:, 0] ** 2) / self.sigma) ** 2


def gaussian_with_log_z(d: int, seed: int) -> tuple[ebmcore.GaussianEnergy, float]:
    """An unnormalised Gaussian ``½(x−m)ᵀP(x−m)`` with a random SPD covariance ``Σ``, and its exact
    ``log Z = d/2·log 2π + ½ log det Σ`` (for the estimators of ``log Z``: AIS, SMC)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    cov = a @ a.T / d + 0.5 * torch.eye(d, dtype=torch.float64)
    mean = torch.randn(d, generator=g, dtype=torch.float64)
    return ebmcore.GaussianEnergy(mean, covariance=cov), 0.5 * d * math.log(2 * math.pi) + 0.5 * float(torch.logdet(cov))


def double_well_moments(barrier: float = 1.0) -> dict[str, float]:
    """E[x²], E[x⁴], E|x| of one coordinate under p(x) ∝ exp(−barrier (x² − 1)²), by quadrature."""
    xs = torch.linspace(-5, 5, 200_001, dtype=torch.float64)
    w = torch.exp(-barrier * (xs * xs - 1) ** 2)
    z = torch.trapezoid(w, xs)
    return {k: float(torch.trapezoid(f * w, xs) / z) for k, f in (("x2", xs**2), ("x4", xs**4), ("abs", xs.abs()))}


def ula_stationary_covariance(energy: ebmcore.GaussianEnergy, h: float) -> torch.Tensor:
    """The exact law of ULA with step h on a Gaussian: N(m, (P − hP²/2)⁻¹)."""
    p = energy.precision
    return torch.linalg.inv(p - 0.5 * h * p @ p)


def x0_of(n, d, seed=0, dtype=torch.float64, scale=1.0):
    """``scale·N(0, I)`` starts ``(n, d)`` from a seeded generator."""
    return scale * torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_moments(x, mean, cov, what):
    """Mean and covariance of ``x: (n, d)`` within 5 standard errors of the exact ones."""
    n = x.shape[0]
    err = ((x.mean(0) - mean).abs() / (cov.diagonal().sqrt() / math.sqrt(n))).max()
    assert err < 5, f"{what}: mean off by {err:.1f} standard errors"
    se = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / n).sqrt()
    err = ((torch.cov(x.T) - cov).abs() / se).max()
    assert err < 5, f"{what}: covariance off by {err:.1f} standard errors"


class Regression(ebmcore.EnergyModel):
    """The posterior of a linear regression ``y ~ N(Xβ, σ²)`` with a flat prior on ``β`` (and on ``log σ`` when ``σ``
    is not given): ``θ = (β, log σ)`` or ``β``. ``E = n·log σ + |y − Xβ|²/(2σ²)``, through ``XᵀX``, ``Xᵀy``, ``yᵀy``."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor, sigma: float | None = None) -> None:
        super().__init__()
        self.register_buffer("xtx", X.T @ X)
        self.register_buffer("xty", X.T @ y)
        self.yty, self.n, self.sigma = float(y @ y), X.shape[0], sigma
        self.event_shape = (X.shape[1] + (sigma is None),)

    def compute_energy(self, theta):
        beta = theta[:, : self.xtx.shape[0]]
        rss = self.yty - 2 * beta @ self.xty + ((beta @ self.xtx) * beta).sum(1)
        if self.sigma is not None:
            return rss / (2 * self.sigma**2)
        log_sigma = theta[:, -1]
        return self.n * log_sigma + 0.5 * rss * torch.exp(-2 * log_sigma)


def kid_score_regression(sigma: float | None = None, n: int = 434, seed: int = 0):
    """A badly scaled, correlated posterior with an exact answer: a child's test score on the mother's IQ (around 100,
    unstandardised) and a binary indicator, as in Gelman & Hill's kid-IQ example, with data drawn here. Returns the
    :class:`Regression` energy and the posterior mean and standard deviation of each coordinate in closed form: with
    ``sigma`` known, ``β ~ N(β̂, σ²(XᵀX)⁻¹)``; otherwise ``β`` is Student-t with ``ν = n − 3`` degrees of freedom
    around ``β̂`` with scale² ``s²(XᵀX)⁻¹``, and ``σ² = ν s² / χ²_ν``, so ``log σ`` has mean
    ``½(log(ν s²) − log 2 − ψ(ν/2))`` and variance ``¼ψ′(ν/2)``."""
    g = torch.Generator().manual_seed(seed)
    iq = 100 + 15 * torch.randn(n, generator=g, dtype=torch.float64)
    hs = (torch.rand(n, generator=g, dtype=torch.float64) < 0.79).double()
    y = 26 + 6 * hs + 0.56 * iq + 18 * torch.randn(n, generator=g, dtype=torch.float64)
    X = torch.stack([torch.ones_like(iq), hs, iq], 1)
    inv = torch.linalg.inv(X.T @ X)
    beta = inv @ X.T @ y
    if sigma is not None:
        return Regression(X, y, sigma), beta, (sigma**2 * inv.diagonal()).sqrt()
    nu = n - 3
    s2 = float((y - X @ beta).square().sum()) / nu
    half = torch.tensor(nu / 2, dtype=torch.float64)
    mean_log_sigma = 0.5 * (math.log(nu * s2) - math.log(2) - torch.special.digamma(half))
    sd_log_sigma = 0.5 * torch.special.polygamma(1, half).sqrt()
    mean = torch.cat([beta, mean_log_sigma.reshape(1)])
    sd = torch.cat([(s2 * inv.diagonal() * nu / (nu - 2)).sqrt(), sd_log_sigma.reshape(1)])
    return Regression(X, y), mean, sd
