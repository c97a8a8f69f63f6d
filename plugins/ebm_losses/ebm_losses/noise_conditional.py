"""A noise-conditional scalar energy ``E(x, σ)`` for multi-level denoising score matching (NCSN-style, with an
energy in place of a score network), sampled by annealed Langevin, and the final denoising step.

``E(x, σ) = f([x, φ(σ)]) / σ``: an MLP ``f`` of the flattened input and a fixed Fourier embedding ``φ`` of
``log σ``; dividing by ``σ`` keeps ``σ∇ₓE`` (what the σ²-weighted loss matches to the noise ``ε``) of order one at
every level, as NCSN v2 divides its score by ``σ``. Called without ``σ``, the energy is that of the smallest
level, ``E(x) = E(x, σ_min)``: a model of the data smoothed by ``N(0, σ_min²I)``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from ebmcore import EnergyModel
from ebmcore.energies.mlp import ACTIVATIONS
from ebmcore.errors import InputError
from ebmcore.validation import check_number, check_seed

__all__ = ["NoiseConditionalEnergy", "denoise"]


class NoiseConditionalEnergy(EnergyModel):
    """``NoiseConditionalEnergy(event_shape=(2,), hidden=(256, 256), embedding_dim=16, activation="silu",
    sigma_min=0.02, sigma_max=1.0, seed=0)``: ``E(x, σ) = MLP([x.flatten(1), φ(log σ)]) / σ``, ``x: (n, *event_shape)``,
    ``σ: (n,)`` or a number (default ``sigma_min``) ``-> (n,)``.

    ``φ`` holds ``embedding_dim / 2`` sines and cosines of ``log σ`` mapped onto ``[0, π]`` over
    ``[sigma_min, sigma_max]``, at frequencies 1, 2, …, ``embedding_dim / 2``: fixed and smooth in ``σ``, so that
    neighbouring levels share what they learn.
    """

    noise_conditional = True

    def __init__(
        self,
        event_shape: Sequence[int] = (2,),
        hidden: Sequence[int] = (256, 256),
        embedding_dim: int = 16,
        activation: str = "silu",
        *,
        sigma_min: float = 0.02,
        sigma_max: float = 1.0,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        shape = tuple(event_shape) if isinstance(event_shape, (list, tuple)) else (event_shape,)
        if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
            raise InputError(
                f"NoiseConditionalEnergy: event_shape must be positive integers, e.g. [2] or [1, 8, 8], got {event_shape!r}."
            )
        widths = list(hidden) if isinstance(hidden, (list, tuple)) else [None]
        if not widths or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths):
            raise InputError(f"NoiseConditionalEnergy: hidden must be positive integers, got {hidden!r}.")
        if not isinstance(embedding_dim, int) or embedding_dim < 2 or embedding_dim % 2:
            raise InputError(f"NoiseConditionalEnergy: embedding_dim must be an even integer >= 2, got {embedding_dim!r}.")
        if activation not in ACTIVATIONS:
            raise InputError(
                f"NoiseConditionalEnergy: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}."
            )
        sigma_min = check_number(sigma_min, "NoiseConditionalEnergy: sigma_min")
        sigma_max = check_number(sigma_max, "NoiseConditionalEnergy: sigma_max")
        seed = check_seed(seed, "NoiseConditionalEnergy: seed")
        if not (0 < sigma_min < sigma_max < math.inf):
            raise InputError(f"NoiseConditionalEnergy: need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}.")
        self.event_shape = shape
        self.sigma_min, self.sigma_max = float(sigma_min), float(sigma_max)
        self.register_buffer("frequencies", torch.arange(1, embedding_dim // 2 + 1, dtype=torch.float32), persistent=False)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        d = math.prod(shape)
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip([d + embedding_dim, *widths], [*widths, 1]):
            linear = nn.Linear(fan_in, fan_out)
            if generator is not None:  # PyTorch's default scale from a local generator: the global RNG stays untouched
                with torch.no_grad():
                    for p in (linear.weight, linear.bias):
                        p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * fan_in**-0.5)
            layers += [linear, ACTIVATIONS[activation]()]
        self.net = nn.Sequential(*layers[:-1])

    def embed(self, sigma: Tensor) -> Tensor:
        """``φ(σ): (n, embedding_dim)`` for ``σ: (n,)``."""
        u = (sigma.log() - math.log(self.sigma_min)) / math.log(self.sigma_max / self.sigma_min) * math.pi
        angles = u.unsqueeze(1) * self.frequencies.to(sigma.dtype)
        return torch.cat([angles.sin(), angles.cos()], 1)

    def compute_energy(self, x: Tensor, sigma: Tensor | float | None = None) -> Tensor:
        """``E(x, σ): (n,)`` for ``x: (n, *event_shape)`` and ``σ: (n,)``, a number, or None (``sigma_min``)."""
        if tuple(x.shape[1:]) != self.event_shape:
            raise InputError(
                f"NoiseConditionalEnergy: x has event shape {tuple(x.shape[1:])}, the energy "
                f"{self.event_shape}; give x of shape (n, {', '.join(map(str, self.event_shape))})."
            )
        s = torch.as_tensor(self.sigma_min if sigma is None else sigma, dtype=x.dtype, device=x.device)
        s = s.expand(x.shape[0]) if s.dim() == 0 else s.reshape(x.shape[0])
        h = torch.cat([x.flatten(1), self.embed(s)], 1)
        return self.net(h).squeeze(1) / s

    def extra_repr(self) -> str:
        return f"event_shape={self.event_shape}, sigma_min={self.sigma_min}, sigma_max={self.sigma_max}"


def denoise(energy: EnergyModel, x: Tensor, sigma: float) -> Tensor:
    """The final denoising step of annealed Langevin (Tweedie's formula): ``x − σ²∇ₓE(x, σ)``, the posterior mean of
    the clean point given ``x`` at noise level ``σ``. ``x: (n, *event_shape) -> (n, *event_shape)``, detached."""
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        if getattr(energy, "noise_conditional", False):
            e = energy.compute_energy(xg, torch.full((x.shape[0],), float(sigma), dtype=x.dtype, device=x.device))
        else:
            e = energy.compute_energy(xg)
        (grad,) = torch.autograd.grad(e.sum(), xg)
    return (x - sigma * sigma * grad).detach()
