"""``image_mlp``: a multilayer-perceptron energy of flattened images, ``E(x) = MLP(x.flatten(1))`` for
``x: (n, *image_shape)``, for the losses that need no convolution (equilibrium matching on digits)."""

from __future__ import annotations

import math
from typing import Sequence

from torch import Tensor

from ebmcore import EnergyModel, MLPEnergy
from ebmcore.errors import InputError

__all__ = ["ImageMLPEnergy"]


class ImageMLPEnergy(EnergyModel):
    """``ImageMLPEnergy(image_shape=(1, 8, 8), hidden=(256, 256), activation="silu", seed=0)``: ``MLPEnergy`` over the
    ``prod(image_shape)`` flattened pixels; ``x: (n, *image_shape) -> (n,)``."""

    def __init__(
        self,
        image_shape: Sequence[int] = (1, 8, 8),
        hidden: Sequence[int] = (256, 256),
        activation: str = "silu",
        *,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        shape = tuple(image_shape) if isinstance(image_shape, (list, tuple)) else ()
        if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
            raise InputError(f"ImageMLPEnergy: image_shape must be positive integers, e.g. [1, 8, 8], got {image_shape!r}.")
        self.event_shape = shape
        self.flat = MLPEnergy(dim=math.prod(shape), hidden=tuple(hidden), activation=activation, seed=seed)

    def compute_energy(self, x: Tensor) -> Tensor:
        if tuple(x.shape[1:]) != self.event_shape:
            raise InputError(
                f"ImageMLPEnergy: x has event shape {tuple(x.shape[1:])}, the energy {self.event_shape}; "
                f"give x of shape (n, {', '.join(map(str, self.event_shape))})."
            )
        return self.flat.compute_energy(x.flatten(1))
