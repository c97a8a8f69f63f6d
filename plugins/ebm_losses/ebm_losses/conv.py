"""A small convolutional energy ``E_θ(x)`` for images ``x: (n, C, H, W)``, registered as ``conv``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ebmcore import EnergyModel
from ebmcore.energies.mlp import ACTIVATIONS
from ebmcore.errors import InputError

__all__ = ["ConvEnergy", "ConvPlan"]


def _positive_ints(value: Any, name: str) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise InputError(f"ConvEnergy: {name} must be positive integers, got {value!r}.")
    return values


@dataclass(frozen=True)
class ConvPlan:
    """The layers of a :class:`ConvEnergy` for kernels that run the network themselves (``conv_langevin_chain``):
    ``weights[l]: (C_{l+1}, C_l, 3, 3)`` and ``biases[l]: (C_{l+1},)`` of the 3×3 convolutions (padding 1, stride
    ``strides[l]``), ``activation`` (a name of :data:`ebmcore.energies.mlp.ACTIVATIONS`) after each, then the spatial
    mean and the head ``head_weight: (1, C_L)``, ``head_bias: (1,)``; ``E = head(mean(features))``."""

    weights: tuple[Tensor, ...]
    biases: tuple[Tensor, ...]
    strides: tuple[int, ...]
    activation: str
    head_weight: Tensor
    head_bias: Tensor


class ConvEnergy(EnergyModel):
    """``len(widths)`` 3×3 convolutions (stride 1, then 2 from the second on) with ``activation`` after each,
    global average pooling over space, and a linear map to the scalar ``E(x): (n,)``.

    ``image_shape`` is ``(C, H, W)`` (``event_shape``). ``spectral_norm`` wraps every convolution and the last
    linear map in :func:`torch.nn.utils.parametrizations.spectral_norm` (one power iteration per forward pass in
    training mode), which bounds the network's Lipschitz constant and keeps short-run Langevin stable. Use a
    smooth activation (``silu``, the default, or ``softplus``, ``elu``, ``tanh``): Langevin follows ``∇ₓE``.
    ``seed`` initialises every weight from a local generator with PyTorch's default scale ``U(±1/√fan_in)``
    (the global RNG is left untouched); without it PyTorch's default initialisation draws from the global RNG.
    """

    def __init__(self, image_shape: Sequence[int] = (1, 8, 8), widths: Sequence[int] = (32, 64, 64), activation: str = "silu",
                 *, spectral_norm: bool = False, seed: int | None = None, dtype: torch.dtype | None = None,
                 device: Any = None) -> None:
        super().__init__()
        shape = _positive_ints(image_shape, "image_shape")
        if len(shape) != 3:
            raise InputError(f"ConvEnergy: image_shape must be (C, H, W), got {image_shape!r}; a grey 8×8 image is (1, 8, 8).")
        widths = _positive_ints(widths, "widths")
        if activation not in ACTIVATIONS:
            raise InputError(f"ConvEnergy: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}.")
        self.event_shape = tuple(shape)
        self.activation = activation
        self.spectral_norm = bool(spectral_norm)
        build_on = "meta" if seed is not None else device
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip([shape[0], *widths], widths)):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=1 if i == 0 else 2, padding=1, dtype=dtype, device=build_on),
                       ACTIVATIONS[activation]()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], 1, dtype=dtype, device=build_on)
        if seed is not None:
            self.to_empty(device=device if device is not None else "cpu")
            generator = torch.Generator(device="cpu").manual_seed(seed)
            with torch.no_grad():
                for layer in [*self.features, self.head]:
                    if isinstance(layer, (nn.Conv2d, nn.Linear)):
                        bound = (layer.weight[0].numel()) ** -0.5
                        for p in (layer.weight, layer.bias):
                            p.copy_((torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound)
        if self.spectral_norm:
            # the power iteration's initial vectors come from the RNG: a fork keeps the global stream untouched
            with torch.random.fork_rng(devices=[]):
                if seed is not None:
                    torch.manual_seed(seed)
                for i, layer in enumerate(self.features):
                    if isinstance(layer, nn.Conv2d):
                        self.features[i] = nn.utils.parametrizations.spectral_norm(layer)
                self.head = nn.utils.parametrizations.spectral_norm(self.head)

    def compute_energy(self, x: Tensor) -> Tensor:
        """``x: (n, C, H, W)`` -> ``(n,)``."""
        return self.head(self.features(x).mean((-2, -1))).squeeze(-1)

    def conv_plan(self) -> ConvPlan | str:
        """The layers as a :class:`ConvPlan`, or why a kernel must not run them itself: ``spectral_norm`` (the
        weights are re-normalised on every forward pass), hooks or parametrizations on a module, an overridden
        :meth:`compute_energy`, a convolution changed after construction."""
        if self.spectral_norm:
            return "spectral_norm re-normalises the weights on every forward pass"
        if type(self).compute_energy is not ConvEnergy.compute_energy:
            return f"{type(self).__name__} overrides compute_energy"
        if any(m._forward_hooks or m._forward_pre_hooks for m in self.modules()):
            return "a module of the network has forward hooks"
        if any(nn.utils.parametrize.is_parametrized(m) for m in self.modules()):
            return "a module of the network is parametrized (its weights are computed on every forward pass)"
        convs = [m for m in self.features if isinstance(m, nn.Conv2d)]
        if any(m.kernel_size != (3, 3) or m.padding != (1, 1) or m.dilation != (1, 1) or m.groups != 1
               or m.stride[0] != m.stride[1] for m in convs):
            return "a convolution was changed from 3×3, padding 1, square stride"
        return ConvPlan(tuple(m.weight for m in convs), tuple(m.bias for m in convs), tuple(m.stride[0] for m in convs),
                        self.activation, self.head.weight, self.head.bias)
