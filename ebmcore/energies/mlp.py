"""A multilayer-perceptron energy ``E_θ(x)``, the usual neural energy for low-dimensional data."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ebmcore.energies.sequential import SequentialEnergy
from ebmcore.errors import InputError
from ebmcore.validation import check_placement, check_positive_int

__all__ = ["MLPEnergy", "ACTIVATIONS"]

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "softplus": nn.Softplus,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
}


class MLPEnergy(SequentialEnergy):
    """``dim -> hidden[0] -> ... -> 1`` with ``activation`` between layers; ``E(x): (n,)``.

    ``seed`` initialises the weights from a local generator with PyTorch's default
    scale (the global RNG is left untouched); without it, PyTorch's default
    initialisation draws from the global RNG as usual.
    A :class:`SequentialEnergy`: its gradient comes in closed form (ebm reads the network's
    layers, :meth:`program`), equal to autograd's. Prefer smooth activations (SiLU, softplus)
    for Langevin sampling: ReLU energies have piecewise-constant gradients.
    """

    def __init__(
        self,
        dim: int = 2,
        hidden: Sequence[int] = (64, 64),
        activation: str = "silu",
        *,
        seed: int | None = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        check_positive_int(dim, "MLPEnergy: dim")
        dtype, device = check_placement(dtype, device, "MLPEnergy")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise InputError(f"MLPEnergy: seed must be an integer or None, got {seed!r}.")
        widths = list(hidden) if isinstance(hidden, (list, tuple)) else [None]
        if not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths):
            raise InputError(f"MLPEnergy: hidden must be positive integers, got {hidden!r}.")
        if activation not in ACTIVATIONS:
            raise InputError(f"MLPEnergy: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}.")
        # With a seed, build on the meta device (no draw from the global RNG) and fill the
        # weights from a local generator with PyTorch's default scale, U(-1/√fan_in, 1/√fan_in).
        build_on = "meta" if seed is not None else device
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip([dim, *widths], widths):
            layers += [nn.Linear(fan_in, fan_out, dtype=dtype, device=build_on), ACTIVATIONS[activation]()]
        layers.append(nn.Linear(widths[-1] if widths else dim, 1, dtype=dtype, device=build_on))
        super().__init__(nn.Sequential(*layers), event_shape=(dim,))
        self.dim = dim
        if seed is not None:
            self.net.to_empty(device=device if device is not None else "cpu")
            generator = torch.Generator(device="cpu").manual_seed(seed)
            with torch.no_grad():
                for layer in self.net:
                    if isinstance(layer, nn.Linear):
                        bound = layer.in_features**-0.5
                        for p in (layer.weight, layer.bias):
                            values = torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1
                            p.copy_(values * bound)
