"""Noise-contrastive estimation (Gutmann & Hyvärinen 2010) with a learnable log-normaliser.

The model density is ``log p_θ(x) = −E(x) − c`` with ``c`` learned; with ``ν`` noise samples per data
sample the loss is the logistic loss of telling data from noise:
``−mean log σ(G(x)) − ν·mean log σ(−G(y))`` with ``G(u) = log p_θ(u) − log q(u) − log ν``.
At the optimum ``c`` is ``log Z`` of the energy.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.nn.functional import logsigmoid

from ebmcore import EnergyModel, Loss
from ebmcore.errors import InputError
from ebmcore.validation import check_energy_output, check_number, check_positive

__all__ = ["NoiseContrastiveEstimation", "GaussianNoise"]


class GaussianNoise:
    """A diagonal Gaussian ``q = N(mean, diag(std²))`` that samples from a given generator."""

    def __init__(self, mean: Tensor, std: Tensor) -> None:
        self.mean, self.std = mean, std

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws ``mean + std·z``, ``z ~ N(0, I)`` from ``generator``: ``(n, *mean.shape)``."""
        z = torch.randn((n, *self.mean.shape), generator=generator, dtype=self.mean.dtype, device=self.mean.device)
        return self.mean + self.std * z

    def log_prob(self, x: Tensor) -> Tensor:
        """The normalised log density ``log q(x)``: ``x: (n, *mean.shape)`` -> ``(n,)``."""
        z = (x - self.mean) / self.std
        log_det = self.std.log().sum()
        d = self.mean.numel()
        return (-0.5 * z * z).flatten(1).sum(1) - log_det - 0.5 * d * math.log(2 * math.pi)


class NoiseContrastiveEstimation(Loss):
    """NCE. ``noise``: ``"gaussian"`` (a diagonal Gaussian fitted to the first batch, widened by
    ``noise_scale``) or any object with ``sample(n, generator) -> (n, *event_shape)`` and
    ``log_prob(x) -> (n,)``. ``noise_ratio``: ``ν``, noise samples per data sample.
    ``log_normalizer`` (``c``) is a parameter of the loss: train it with the model's
    (``Trainer`` does; by hand, add ``loss.parameters()`` to the optimizer).
    """

    def __init__(
        self, noise: Any = "gaussian", *, noise_ratio: int = 1, noise_scale: float = 1.5, log_normalizer: float = 0.0
    ) -> None:
        if not isinstance(noise_ratio, int) or noise_ratio < 1:
            raise InputError(f"noise_ratio must be a positive integer, got {noise_ratio!r}.")
        if noise != "gaussian" and not (hasattr(noise, "sample") and hasattr(noise, "log_prob")):
            raise InputError("noise must be 'gaussian' or have sample(n, generator) and log_prob(x).")
        self.noise = None if noise == "gaussian" else noise
        self.noise_ratio = noise_ratio
        self.noise_scale = check_positive(noise_scale, "noise_scale")
        self.log_normalizer = torch.nn.Parameter(torch.tensor(check_number(log_normalizer, "log_normalizer")))

    def parameters(self) -> list[torch.nn.Parameter]:
        """``[log_normalizer]``: the learnable ``c`` (a 0-d parameter), to train with the model's parameters."""
        return [self.log_normalizer]

    def __call__(self, energy: EnergyModel, data: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        # the noise is fitted to the first batch: two rows at least
        self.check_data(energy, data, min_rows=2 if self.noise is None else 1, generator=generator)
        x = data.detach()
        if self.noise is None:
            self.noise = GaussianNoise(x.mean(0), self.noise_scale * x.std(0).clamp_min(1e-6))
        y = self.noise.sample(self.noise_ratio * x.shape[0], generator)
        c = self.log_normalizer.to(x.dtype)
        log_nu = math.log(self.noise_ratio)

        def logit(u: Tensor) -> Tensor:
            e = check_energy_output(energy.compute_energy(u), u, owner=type(energy).__name__)
            return -e - c - self.noise.log_prob(u) - log_nu

        return -logsigmoid(logit(x)).mean() - self.noise_ratio * logsigmoid(-logit(y)).mean()

    def state_dict(self) -> dict[str, Any]:
        """``log_normalizer`` (a detached copy), and ``noise_mean``/``noise_std`` once the Gaussian noise is fitted."""
        state: dict[str, Any] = {"log_normalizer": self.log_normalizer.detach().clone()}
        if isinstance(self.noise, GaussianNoise):
            state["noise_mean"], state["noise_std"] = self.noise.mean, self.noise.std
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output: copy ``log_normalizer`` in place and rebuild any saved Gaussian noise."""
        with torch.no_grad():
            self.log_normalizer.copy_(state["log_normalizer"])
        if "noise_mean" in state:
            self.noise = GaussianNoise(state["noise_mean"], state["noise_std"])
