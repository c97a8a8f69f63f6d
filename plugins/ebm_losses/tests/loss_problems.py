"""Test energies with known closed forms, and a grid estimate of held-out likelihood for 2-d models."""

from __future__ import annotations

from pathlib import Path

import math

import torch
from torch import nn

import ebmcore


class LearnableGaussian(ebmcore.EnergyModel):
    """``E(x) = ½ (x−m)ᵀ P (x−m)`` with learnable ``m`` and ``P = L Lᵀ`` (autograd gradients)."""

    def __init__(self, mean: torch.Tensor, precision: torch.Tensor) -> None:
        super().__init__()
        self.event_shape = (mean.shape[0],)
        self.mean = nn.Parameter(mean.clone())
        self.chol = nn.Parameter(torch.linalg.cholesky(precision))

    @property
    def precision(self) -> torch.Tensor:
        return self.chol @ self.chol.T

    def compute_energy(self, x):
        d = x - self.mean
        return 0.5 * ((d @ self.precision) * d).sum(-1)


def random_spd(d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    return a @ a.T / d + 0.5 * torch.eye(d, dtype=torch.float64)


def grid_nll(energy: ebmcore.EnergyModel, test: torch.Tensor, lim: float = 4.5, n: int = 150) -> float:
    """Held-out negative log-likelihood of ``test: (m, 2)`` under ``exp(−E)`` normalised on a grid over ``[−lim, lim]²``."""
    g = torch.linspace(-lim, lim, n)
    xx, yy = torch.meshgrid(g, g, indexing="ij")
    points = torch.stack([xx.flatten(), yy.flatten()], 1)
    with torch.no_grad():
        log_z = torch.logsumexp(-energy.compute_energy(points), 0) + 2 * math.log(float(g[1] - g[0]))
        return float((energy.compute_energy(test) + log_z).mean())


def shortened_config(name: str, replacements: list[tuple[str, str]], path: Path) -> Path:
    """The bundled ``train_<name>.toml`` with each ``(old, new)`` replaced once (each ``old`` must occur: a test notices
    when the bundled file changes under it), written to ``path``; returns ``path``."""
    from ebm_losses import train_job

    text = train_job.bundled_config_path(name).read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text)
    return path
